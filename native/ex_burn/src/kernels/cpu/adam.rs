//! Adam's per-element pass (both moments, then the parameter's update) over f32 slices, in the
//! CPU's vector registers. The square root and the division dominate it, and one value at a time
//! they weighed on a small MLP's training step (guides/training.md); IEEE rounds `sqrt` and `/`
//! the same in every lane width, so the vector copies give the scalar loop's bits.

use std::mem::MaybeUninit;

#[cfg(target_arch = "x86_64")]
use super::vector::{IsaAvx2, IsaAvx512};
use super::vector::{par_tasks, simd, wide, Isa, IsaBase, SharedMut, Simd};

/// Elements a parallel task updates.
const CHUNK: usize = 1 << 14;

/// For every `i`: `m1 = m[i] b1 + g[i] (1 - b1)`, `m2 = v[i] b2 + g[i]² (1 - b2)` (in that
/// order, as Burn's `AdaptiveMomentum::transform` forms them), and the new parameter
/// `update(p[i], m1, m2)`; returns the new parameters and both moments. The slices must be of
/// one length.
pub(crate) fn adam_pass<F: Fn(f32, f32, f32) -> f32 + Sync>(p: &[f32], g: &[f32], m: &[f32], v: &[f32], (b1, b2): (f32, f32), update: F) -> [Vec<f32>; 3] {
    let n = p.len();
    assert!(g.len() == n && m.len() == n && v.len() == n, "adam_pass: {n} parameters, {} gradients, {} and {} moments", g.len(), m.len(), v.len());
    let mut outs: [Vec<f32>; 3] = std::array::from_fn(|_| Vec::with_capacity(n));
    let ptrs = outs.each_mut().map(|o| SharedMut(o.as_mut_ptr()));
    let level = simd();
    par_tasks(n.div_ceil(CHUNK), &|t| {
        let (lo, hi) = (t * CHUNK, n.min((t + 1) * CHUNK));
        // SAFETY: task `t` alone writes elements lo..hi of each output, inside the capacity
        // reserved above; the lengths are set once par_tasks has returned.
        let [np, nm, nv] = ptrs.each_ref().map(|o| unsafe { std::slice::from_raw_parts_mut(o.get().add(lo) as *mut MaybeUninit<f32>, hi - lo) });
        let ins = [&p[lo..hi], &g[lo..hi], &m[lo..hi], &v[lo..hi]];
        adam_chunk_wide(level, ins, [np, nm, nv], b1, b2, &update);
    });
    // SAFETY: the tasks wrote all n elements of each output
    outs.each_mut().iter_mut().for_each(|o| unsafe { o.set_len(n) });
    outs
}

#[inline(always)]
fn adam_chunk<F: Fn(f32, f32, f32) -> f32, S: Isa>(ins: [&[f32]; 4], outs: [&mut [MaybeUninit<f32>]; 3], b1: f32, b2: f32, update: &F) {
    let [p, g, m, v] = ins;
    let [np, nm, nv] = outs;
    let n = p.len();
    let (g, m, v, np, nm, nv) = (&g[..n], &m[..n], &v[..n], &mut np[..n], &mut nm[..n], &mut nv[..n]);
    let (f1, f2) = (1.0 - b1, 1.0 - b2);
    for i in 0..n {
        let gi = g[i];
        let m1 = m[i] * b1 + gi * f1;
        let m2 = v[i] * b2 + (gi * gi) * f2;
        np[i].write(update(p[i], m1, m2));
        nm[i].write(m1);
        nv[i].write(m2);
    }
}

wide!(fn adam_chunk_wide<F: Fn(f32, f32, f32) -> f32>(ins: [&[f32]; 4], outs: [&mut [MaybeUninit<f32>]; 3], b1: f32, b2: f32, update: &F) = adam_chunk;);

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element through each level's copy equals the scalar arithmetic written out, bit for
    /// bit, over several tasks' worth of values with a partial last one; zero, negative and
    /// tiny gradients and a NaN among them.
    #[test]
    fn every_level_gives_the_scalar_bits() {
        let n = 3 * CHUNK + 37;
        let value = |i: usize, p: usize, q: usize| ((i * p) % q) as f32 / (q as f32) - 0.5;
        let p: Vec<f32> = (0..n).map(|i| value(i, 7919, 1000)).collect();
        let mut g: Vec<f32> = (0..n).map(|i| value(i, 104_729, 997) * 1e-3).collect();
        let m: Vec<f32> = (0..n).map(|i| value(i, 31, 101) * 1e-2).collect();
        let v: Vec<f32> = (0..n).map(|i| value(i, 17, 89).abs() * 1e-4).collect();
        g[5] = 0.0;
        g[6] = -1e-30;
        g[7] = f32::NAN;
        let (b1, b2, cf, e2, lr) = (0.9f32, 0.999f32, 0.31f32, 1e-8f32, 1e-3f32);
        let update = |p: f32, m1: f32, m2: f32| p - ((m1 * cf) / (m2.sqrt() + e2)) * lr;
        let want: Vec<[u32; 3]> = (0..n)
            .map(|i| {
                let m1 = m[i] * b1 + g[i] * (1.0 - b1);
                let m2 = v[i] * b2 + (g[i] * g[i]) * (1.0 - b2);
                [update(p[i], m1, m2).to_bits(), m1.to_bits(), m2.to_bits()]
            })
            .collect();
        let got = adam_pass(&p, &g, &m, &v, (b1, b2), update);
        for (i, w) in want.iter().enumerate() {
            assert_eq!([got[0][i].to_bits(), got[1][i].to_bits(), got[2][i].to_bits()], *w, "element {i}");
        }
        for level in [Simd::Base, Simd::Avx2, Simd::Avx512] {
            if level > simd() {
                continue;
            }
            let mut outs: [Vec<MaybeUninit<f32>>; 3] = std::array::from_fn(|_| vec![MaybeUninit::uninit(); n]);
            let [a, b, c] = outs.each_mut().map(|o| o.as_mut_slice());
            adam_chunk_wide(level, [&p, &g, &m, &v], [a, b, c], b1, b2, &update);
            for (i, w) in want.iter().enumerate() {
                // SAFETY: adam_chunk writes every element
                let got = outs.each_ref().map(|o| unsafe { o[i].assume_init() }.to_bits());
                assert_eq!(got, *w, "{level:?}, element {i}");
            }
        }
    }
}
