//! Attention's two host loops: a query's scores against contiguous key rows, and the scores'
//! weighted sum of value rows. Each is one order of additions that every instruction-set level
//! keeps, bit for bit, without contracting into fused multiply-adds, so a decoder's sequence gets
//! the same scores alone and in a batch, on any machine: `dot` for the scores (AVX2 four keys at
//! a time), `weighted_sum`'s rows in order per column (compiled per level by `wide!`).

use super::vector::{simd, wide, Isa, IsaAvx2, IsaAvx512, IsaBase, Simd};

/// `Σ a·b` in the scores' order: 16 lanes over the chunks of 16 values (lane `i` of 8 sums the
/// values `i` and `i + 8` of each chunk into two sums, `lo` and `hi`), then per lane
/// `l = lo + hi`, the lanes paired `((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))` (AVX2's
/// horizontal additions), then the values past the last chunk in order. Few dependent
/// additions a key, where a sum of the lanes in order took fifteen.
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let (mut lo, mut hi) = ([0f32; 8], [0f32; 8]);
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            lo[i] += x[i] * y[i];
            hi[i] += x[i + 8] * y[i + 8];
        }
    }
    let l: [f32; 8] = std::array::from_fn(|i| lo[i] + hi[i]);
    (((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))) + tail
}

/// `out[j] = (q · key j) · scale` for the first `out.len()` rows of `keys` (rows of `q.len()`
/// values, one after another), each `dot`'s bits.
pub(crate) fn scores(level: Simd, q: &[f32], keys: &[f32], scale: f32, out: &mut [f32]) {
    let dh = q.len();
    assert!(dh > 0 && keys.len() >= out.len() * dh, "scores: {} key values for {} rows of {dh}", keys.len(), out.len());
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if level.min(simd()) >= Simd::Avx2 && dh >= 16 {
        done = out.len() / 4 * 4;
        // SAFETY: `simd()` found AVX2; `keys` holds `done` rows of `dh` (asserted above)
        unsafe { scores_avx2(q, keys, scale, &mut out[..done]) };
    }
    for (j, o) in out.iter_mut().enumerate().skip(done) {
        *o = dot(q, &keys[j * dh..][..dh]) * scale;
    }
}

/// `scores` four keys at a time (`out.len()` a multiple of 4): each key's `lo` and `hi` in
/// registers, and three horizontal additions sum four keys' lanes in `dot`'s pairs.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn scores_avx2(q: &[f32], keys: &[f32], scale: f32, out: &mut [f32]) {
    use std::arch::x86_64::*;
    let dh = q.len();
    let (chunks, full) = (dh / 16, dh / 16 * 16);
    for (j4, o) in out.chunks_exact_mut(4).enumerate() {
        let k = keys.as_ptr().add(4 * j4 * dh);
        let (mut lo, mut hi) = ([_mm256_setzero_ps(); 4], [_mm256_setzero_ps(); 4]);
        for c in 0..chunks {
            let (ql, qh) = (_mm256_loadu_ps(q.as_ptr().add(16 * c)), _mm256_loadu_ps(q.as_ptr().add(16 * c + 8)));
            for r in 0..4 {
                let at = k.add(r * dh + 16 * c);
                lo[r] = _mm256_add_ps(lo[r], _mm256_mul_ps(ql, _mm256_loadu_ps(at)));
                hi[r] = _mm256_add_ps(hi[r], _mm256_mul_ps(qh, _mm256_loadu_ps(at.add(8))));
            }
        }
        let l: [__m256; 4] = std::array::from_fn(|r| _mm256_add_ps(lo[r], hi[r]));
        // per 128-bit half: (l0 + l1, l2 + l3) of keys 0 and 1, then of 2 and 3; then their sums
        let h = _mm256_hadd_ps(_mm256_hadd_ps(l[0], l[1]), _mm256_hadd_ps(l[2], l[3]));
        let sums = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h));
        let mut s = [0f32; 4];
        _mm_storeu_ps(s.as_mut_ptr(), sums);
        for r in 0..4 {
            let key = &keys[(4 * j4 + r) * dh..][..dh];
            let tail: f32 = q[full..].iter().zip(&key[full..]).map(|(x, y)| x * y).sum();
            o[r] = (s[r] + tail) * scale;
        }
    }
}

#[inline(always)]
fn weighted_sum_body<S: Isa>(out: &mut [f32], w: &[f32], rows: &[f32], stride: usize) {
    let n = out.len();
    let wide = n - n % 64;
    for (c, acc) in out[..wide].chunks_exact_mut(64).enumerate() {
        weighted_columns::<64>(acc, w, rows, stride, 64 * c);
    }
    let narrow = wide + (n - wide) / 16 * 16;
    for (c, acc) in out[wide..narrow].chunks_exact_mut(16).enumerate() {
        weighted_columns::<16>(acc, w, rows, stride, wide + 16 * c);
    }
    for (i, wi) in w.iter().enumerate() {
        for (o, v) in out[narrow..].iter_mut().zip(&rows[i * stride + narrow..][..n - narrow]) {
            *o += wi * v;
        }
    }
}

/// `weighted_sum` for the `W` columns of `out` from column `start`: they stay in registers
/// across every row (a head of 64 values at once, eight independent sums in flight on AVX2).
#[inline(always)]
fn weighted_columns<const W: usize>(out: &mut [f32], w: &[f32], rows: &[f32], stride: usize, start: usize) {
    let mut acc: [f32; W] = out.try_into().unwrap();
    for (i, wi) in w.iter().enumerate() {
        let v: &[f32; W] = rows[i * stride + start..][..W].try_into().unwrap();
        for j in 0..W {
            acc[j] += wi * v[j];
        }
    }
    out.copy_from_slice(&acc);
}

wide!(fn weighted_sum_wide(out: &mut [f32], w: &[f32], rows: &[f32], stride: usize) = weighted_sum_body;);

/// `out[j] += Σᵢ w[i] · rows[i · stride + j]` for the first `w.len()` rows, each element summed
/// over the rows in order: attention's weighted values.
pub(crate) fn weighted_sum(level: Simd, out: &mut [f32], w: &[f32], rows: &[f32], stride: usize) {
    let n = out.len();
    assert!(w.is_empty() || (w.len() - 1) * stride + n <= rows.len(), "weighted_sum: {} values for {} rows of {n} at stride {stride}", rows.len(), w.len());
    weighted_sum_wide(level, out, w, rows, stride)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn levels() -> impl Iterator<Item = Simd> {
        [Simd::Base, Simd::Avx2, Simd::Avx512].into_iter().filter(|l| *l <= simd())
    }

    fn rand_fn(mut seed: u32) -> impl FnMut() -> f32 {
        move || {
            seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        }
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|v| v.to_bits()).collect()
    }

    /// Every level's scores are `dot`'s order written out here, for head widths with and without
    /// a tail past the chunks of 16, and key counts with and without a remainder past fours.
    #[test]
    fn scores_give_the_lane_sums_at_every_level() {
        let mut rand = rand_fn(11);
        for (dh, n) in [(64, 37), (80, 5), (72, 8), (8, 9), (128, 1), (32, 4), (64, 0)] {
            let q: Vec<f32> = (0..dh).map(|_| rand()).collect();
            let keys: Vec<f32> = (0..n * dh).map(|_| rand()).collect();
            let want: Vec<f32> = keys
                .chunks_exact(dh)
                .map(|k| {
                    let mut l = [0f32; 16];
                    let full = dh / 16 * 16;
                    for i in 0..full {
                        l[i % 16] += q[i] * k[i];
                    }
                    let tail: f32 = (full..dh).map(|i| q[i] * k[i]).sum();
                    let h = [0, 1, 2, 3, 4, 5, 6, 7].map(|i| l[i] + l[i + 8]);
                    ((((h[0] + h[1]) + (h[2] + h[3])) + ((h[4] + h[5]) + (h[6] + h[7]))) + tail) * 0.125
                })
                .collect();
            for level in levels() {
                let mut got = vec![f32::NAN; n];
                scores(level, &q, &keys, 0.125, &mut got);
                assert_eq!(bits(&got), bits(&want), "{level:?}, head width {dh}, {n} keys");
            }
        }
    }

    /// The weighted values equal a row-at-a-time sum bit for bit at every level, for widths
    /// with and without a tail past the sixteen-column chunks, rows packed or strided, and into
    /// a non-zero `out`.
    #[test]
    fn weighted_sum_adds_rows_in_order() {
        let mut rand = rand_fn(7);
        for (n, stride, rows) in [(64, 64, 37), (72, 72, 5), (8, 20, 9), (64, 3 * 64 + 5, 11), (16, 16, 0), (96, 96, 3), (149, 160, 6)] {
            let values: Vec<f32> = (0..rows * stride).map(|_| rand()).collect();
            let w: Vec<f32> = (0..rows).map(|_| rand()).collect();
            let start: Vec<f32> = (0..n).map(|_| rand()).collect();
            let mut want = start.clone();
            for (i, wi) in w.iter().enumerate() {
                for (j, o) in want.iter_mut().enumerate() {
                    *o += wi * values[i * stride + j];
                }
            }
            for level in levels() {
                let mut got = start.clone();
                weighted_sum(level, &mut got, &w, &values, stride);
                assert_eq!(bits(&got), bits(&want), "{level:?}: n {n}, stride {stride}, rows {rows}");
                if rows > 0 {
                    assert_ne!(got, start, "n {n}: the rows were added");
                }
            }
        }
    }
}
