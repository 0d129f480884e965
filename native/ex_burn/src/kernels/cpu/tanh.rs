//! f32 tanh with the bits of glibc's `tanhf` up to 2.40 (fdlibm's, on fdlibm's `expm1f`), in f32
//! lanes: flex's tanh is std's, which is that function, one value at a time and several times
//! slower than the same arithmetic written branch-free for vector registers. Every branch of
//! the originals is computed and the lane picks its own, so each value goes through the same
//! roundings as in glibc (no fused multiply-adds, no reassociation).
//!
//! Other libms compute other bits (glibc 2.41 took a correctly rounded tanhf from CORE-MATH):
//! `replica_ok` compares the replica with this process's `f32::tanh` once, and callers keep std's
//! function where it differs.

use burn::backend::TensorData;
use std::mem::MaybeUninit;
use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
use super::vector::{IsaAvx2, IsaAvx512};
use super::vector::{as_uninit, flex_f32, par_map_slices, simd, wide, Isa, IsaBase, Simd};
use crate::dispatch::{self, Prim};

const LN2_HI: f32 = f32::from_bits(0x3f317180);
const LN2_LO: f32 = f32::from_bits(0x3717f7d1);
const INV_LN2: f32 = f32::from_bits(0x3fb8aa3b);
const O_THRESHOLD: f32 = f32::from_bits(0x42b17180);
const Q: [f32; 5] = [f32::from_bits(0xbd088889), f32::from_bits(0x3ad00d01), f32::from_bits(0xb8a670cd), f32::from_bits(0x36867e54), f32::from_bits(0xb457edbb)];

/// fdlibm's `expm1f` on its reduced argument `r`: `r²/2` and the correction term `e` that every
/// case of its branches starts from.
#[inline(always)]
fn reduced_poly(r: f32) -> (f32, f32) {
    let hfx = 0.5 * r;
    let hxs = r * hfx;
    let r1 = 1.0 + hxs * (Q[0] + hxs * (Q[1] + hxs * (Q[2] + hxs * (Q[3] + hxs * Q[4]))));
    let t = 3.0 - r1 * hfx;
    (hxs, hxs * ((r1 - t) / (6.0 - r * t)))
}

/// fdlibm's `expm1f`: every case of its branches, each lane taking its own.
#[inline(always)]
fn expm1_lane(x: f32) -> f32 {
    let bits = x.to_bits();
    let (hx, negative) = (bits & 0x7fff_ffff, bits >> 31 != 0);
    // argument reduction: x = k ln2 + r, r = hi - lo, `c` the error of that subtraction
    let half = if negative { -0.5 } else { 0.5 };
    let reduced = hx > 0x3eb1_7218;
    // within 1.5 ln2, k is ±1 by fdlibm's test, not by the rounding below (they differ at 0.5 ln2)
    let near = if negative { -1 } else { 1 };
    let k = if !reduced { 0 } else if hx < 0x3f85_1592 { near } else { (INV_LN2 * x + half) as i32 };
    let kf = k as f32;
    let (hi, lo) = (x - kf * LN2_HI, kf * LN2_LO);
    let r = if reduced { hi - lo } else { x };
    let c = if reduced { (hi - r) - lo } else { 0.0 };
    let (hxs, e) = reduced_poly(r);
    let unreduced = r - (r * e - hxs);
    let e = (r * (e - c) - c) - hxs;
    // k's exponent added to y's bits (wrapping: lanes that take another branch may hold any k)
    let scale = |y: f32| f32::from_bits(y.to_bits().wrapping_add((k as u32).wrapping_shl(23)));
    let k_minus_one = 0.5 * (r - e) - 0.5;
    let k_one = if r < -0.25 { -2.0 * (e - (r + 0.5)) } else { 1.0 + 2.0 * (r - e) };
    let far = scale(1.0 - (e - r)) - 1.0;
    let small_k = scale(f32::from_bits(0x3f80_0000u32.wrapping_sub(0x0100_0000u32.wrapping_shr(k as u32))) - (e - r));
    let large_k = scale((r - (e + f32::from_bits((0x7f - k as u32).wrapping_shl(23)))) + 1.0);
    let y = if k < 23 { small_k } else { large_k };
    let y = if k <= -2 || k > 56 { far } else { y };
    let y = if k == 1 { k_one } else { y };
    let y = if k == -1 { k_minus_one } else { y };
    let y = if k == 0 { unreduced } else { y };
    // tiny, huge and non-finite arguments
    let y = if !reduced && hx < 0x3300_0000 { x } else { y };
    let y = if hx >= 0x4195_b844 && negative { -1.0 } else { y };
    // past 88.72 (the test on the bits comes first there, then the one on the value)
    let y = if !negative && hx >= 0x42b1_7218 && x > O_THRESHOLD { f32::INFINITY } else { y };
    if hx > 0x7f80_0000 {
        x + x
    } else if hx == 0x7f80_0000 {
        if negative { -1.0 } else { x }
    } else {
        y
    }
}

/// fdlibm's `tanhf`.
#[inline(always)]
fn tanh_lane(x: f32) -> f32 {
    let jx = x.to_bits();
    let ix = jx & 0x7fff_ffff;
    let a = x.abs();
    let big = ix >= 0x3f80_0000;
    let t = expm1_lane(if big { 2.0 * a } else { -2.0 * a });
    let z = if big { 1.0 - 2.0 / (t + 2.0) } else { -t / (t + 2.0) };
    // from 22 on (and at ±inf) 1 - 1e-30, which rounds to 1
    let z = if ix >= 0x41b0_0000 { 1.0 } else { z };
    let z = if jx >> 31 == 0 { z } else { -z };
    if ix > 0x7f80_0000 {
        x + x
    } else if ix < 0x2400_0000 {
        // ±0 as they are; below 2^-55, x (1 + x), which is x
        if ix == 0 { x } else { x * (1.0 + x) }
    } else {
        z
    }
}

/// fdlibm's `expm1f` for `y` in (-2, 0] (`small`: `tanh_lane`'s argument below 1, where k is 0,
/// -1, -2 or -3) or in [2, 38) (`!small`: its argument from 1 to 19, k from 3 to 55), with
/// `expm1_lane`'s roundings: only those ranges' cases, on one reduction (one polynomial). A
/// constant `small` leaves one range's cases; a lane's own lets a block mix the two.
#[inline(always)]
fn expm1_range(y: f32, small: bool) -> f32 {
    let hx = y.to_bits() & 0x7fff_ffff;
    // from 2 on (every `!small` lane) the argument is reduced with fdlibm's general k
    let reduced = !small || hx > 0x3eb1_7218;
    let half = if small { -0.5 } else { 0.5 };
    let k = if !reduced { 0 } else if small && hx < 0x3f85_1592 { -1 } else { (INV_LN2 * y + half) as i32 };
    let kf = k as f32;
    let (hi, lo) = (y - kf * LN2_HI, kf * LN2_LO);
    let r = if reduced { hi - lo } else { y };
    let c = if reduced { (hi - r) - lo } else { 0.0 };
    let (hxs, e) = reduced_poly(r);
    let unreduced = r - (r * e - hxs);
    let e = (r * (e - c) - c) - hxs;
    let scale = |v: f32| f32::from_bits(v.to_bits().wrapping_add((k as u32).wrapping_shl(23)));
    // the cases of k <= 0
    let far = scale(1.0 - (e - r)) - 1.0;
    let below = if k == 0 { unreduced } else if k == -1 { 0.5 * (r - e) - 0.5 } else { far };
    let below = if !reduced && hx < 0x3300_0000 { y } else { below };
    // those of k from 3 to 55
    let small_k = scale(f32::from_bits(0x3f80_0000u32.wrapping_sub(0x0100_0000u32.wrapping_shr(k as u32))) - (e - r));
    let large_k = scale((r - (e + f32::from_bits((0x7f - k as u32).wrapping_shl(23)))) + 1.0);
    let above = if k < 23 { small_k } else { large_k };
    if small {
        below
    } else {
        above
    }
}

/// `tanh_lane` for 2^-55 <= |x| < 1 (`small`) or 1 <= |x| < 19 (`!small`), on `expm1_range`, with
/// one division (`-t / d` is `-(t / d)` in IEEE arithmetic).
#[inline(always)]
fn tanh_range(x: f32, small: bool) -> f32 {
    let a = x.abs();
    let t = expm1_range(if small { -2.0 * a } else { 2.0 * a }, small);
    let q = (if small { t } else { 2.0 }) / (t + 2.0);
    let z = if small { -q } else { 1.0 - q };
    if x.to_bits() >> 31 == 0 {
        z
    } else {
        -z
    }
}

/// Bits of |x| from which `tanh_range` takes x small (below, `tanh_lane` returns x or x (1 + x)),
/// from which it takes x big, and where that ends.
const SMALL_FROM: u32 = 0x2400_0000;
const BIG_FROM: u32 = 0x3f80_0000;
const BIG_TO: u32 = 0x4198_0000;

/// Values a block whose lanes all take one of `tanh_lane`'s two common branches computes only
/// that branch (`tanh_range` with a constant range), a block mixing those two both of them on
/// one reduction (each lane's range); other blocks compute every branch in every lane.
const BLOCK: usize = 16;

#[inline(always)]
fn tanh_lanes<S: Isa>(xs: &[f32], out: &mut [MaybeUninit<f32>]) {
    let (mut xb, mut ob) = (xs.chunks_exact(BLOCK), out.chunks_exact_mut(BLOCK));
    for (x, o) in (&mut xb).zip(&mut ob) {
        let x: &[f32; BLOCK] = x.try_into().unwrap();
        let (small, big, either) = x.iter().fold((true, true, true), |(s, b, e), v| {
            let ix = v.to_bits() & 0x7fff_ffff;
            (s & (SMALL_FROM..BIG_FROM).contains(&ix), b & (BIG_FROM..BIG_TO).contains(&ix), e & (SMALL_FROM..BIG_TO).contains(&ix))
        });
        if small {
            o.iter_mut().zip(x).for_each(|(o, &x)| {
                o.write(tanh_range(x, true));
            });
        } else if big {
            o.iter_mut().zip(x).for_each(|(o, &x)| {
                o.write(tanh_range(x, false));
            });
        } else if either {
            o.iter_mut().zip(x).for_each(|(o, &x)| {
                o.write(tanh_range(x, x.to_bits() & 0x7fff_ffff < BIG_FROM));
            });
        } else {
            o.iter_mut().zip(x).for_each(|(o, &x)| {
                o.write(tanh_lane(x));
            });
        }
    }
    for (o, &x) in ob.into_remainder().iter_mut().zip(xb.remainder()) {
        o.write(tanh_lane(x));
    }
}

wide!(fn tanh_wide(xs: &[f32], out: &mut [MaybeUninit<f32>]) = tanh_lanes;);

/// Whether the replica gives this process's `f32::tanh` bit for bit: a sweep of the range and
/// every branch's edges, once.
pub(crate) fn replica_ok() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        let mut xs: Vec<f32> = (0..8192u32).map(|i| -24.0 + 48.0 * i as f32 / 8192.0).collect();
        xs.extend((0..200).map(|i| f32::from_bits(0x2300_0000 + i * 0x0080_0000)));
        xs.extend([0.0f32, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1.0, -1.0, 22.0, -22.0, 0.3465736, 1e-20, 5.0e-39]);
        let mut out = vec![0f32; xs.len()];
        slice(&xs, &mut out);
        xs.iter().zip(&out).all(|(x, y)| x.tanh().to_bits() == y.to_bits())
    })
}

/// f32 tanh of a contiguous flex tensor with std's bits, on the pool: `None` for other tensors,
/// or where the replica is not this process's tanh.
pub fn unary(x: &Prim) -> Option<Prim> {
    let xs = flex_f32(x).filter(|_| replica_ok())?;
    let out = par_map_slices(xs, into);
    Some(dispatch::from_data(TensorData::new(out, dispatch::dims(x)), &burn::tensor::Device::flex()))
}

/// `out = tanh(xs)` with the replica, on the calling thread.
fn into(xs: &[f32], out: &mut [MaybeUninit<f32>]) {
    assert_eq!(xs.len(), out.len(), "tanh: {} inputs, {} outputs", xs.len(), out.len());
    tanh_wide(simd(), xs, out)
}

fn slice(xs: &[f32], out: &mut [f32]) {
    into(xs, as_uninit(out))
}

/// `out = tanh(xs)` with std's bits on the calling thread: the replica where it holds.
pub(crate) fn exact_slice(xs: &[f32], out: &mut [f32]) {
    if replica_ok() {
        slice(xs, out)
    } else {
        out.iter_mut().zip(xs).for_each(|(o, x)| *o = x.tanh());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    /// The replica against this process's expm1f and tanhf on every `stride`-th f32 bit pattern,
    /// then in mixed blocks (`mixed_sweep`).
    fn sweep(stride: usize) {
        let bits: Vec<u32> = (0..=u32::MAX).step_by(stride).collect();
        for chunk in bits.chunks(1 << 20) {
            let xs: Vec<f32> = chunk.iter().map(|&b| f32::from_bits(b)).collect();
            for &x in &xs {
                let (e, want) = (expm1_lane(x), x.exp_m1());
                assert!(e.to_bits() == want.to_bits() || (e.is_nan() && want.is_nan()), "expm1({x:e}) = {e:e}, glibc {want:e}");
            }
            let mut out = vec![0f32; xs.len()];
            slice(&xs, &mut out);
            for (x, y) in xs.iter().zip(&out) {
                assert_eq!(y.to_bits(), x.tanh().to_bits(), "tanh({x:e}) = {y:e}, glibc {:e}", x.tanh());
            }
        }
        mixed_sweep(stride);
    }

    /// Whether this libm's tanhf is fdlibm's, judged by the one-lane replica alone (so a fault in
    /// the block kernel, which would turn `replica_ok` off and the kernel with it, fails the
    /// tests below instead of skipping them).
    fn libm_is_fdlibm() -> bool {
        let ok = (0..8192u32).map(|i| -24.0 + 48.0 * i as f32 / 8192.0).all(|x| tanh_lane(x).to_bits() == x.tanh().to_bits());
        if ok {
            assert!(replica_ok(), "the libm's tanhf is fdlibm's, yet the block kernel differs from it");
        } else {
            eprintln!("this libm's tanhf is not fdlibm's: the replica is not used here");
        }
        ok
    }

    /// Every `stride`-th |x| of `tanh_range`'s two ranges, both signs, at the even positions of
    /// blocks whose odd positions alternate 0.5 and 2.0, so each block mixes the two common
    /// branches and takes each lane's range; against this process's tanhf (`sweep`'s inputs lie in
    /// blocks of neighbouring values, mixed ones only where a range ends).
    fn mixed_sweep(stride: usize) {
        let bits: Vec<u32> = (SMALL_FROM..BIG_TO).step_by(stride).flat_map(|b| [b, b | 0x8000_0000]).collect();
        bits.par_chunks(1 << 20).for_each(|chunk| {
            let xs: Vec<f32> = chunk.iter().enumerate().flat_map(|(i, &b)| [f32::from_bits(b), if i % 2 == 0 { 0.5 } else { 2.0 }]).collect();
            let mut out = vec![0f32; xs.len()];
            slice(&xs, &mut out);
            for (x, y) in xs.iter().zip(&out) {
                assert_eq!(y.to_bits(), x.tanh().to_bits(), "tanh({x:e}) = {y:e} in a mixed block, glibc {:e}", x.tanh());
            }
        });
    }

    #[test]
    fn eager_tanh_is_flexs_on_and_off_the_pool() {
        use burn::backend::ops::FloatTensorOps;
        use burn::backend::Dispatch;
        for n in [10, 3 * super::super::vector::PAR_MIN + 5] {
            let mut xs: Vec<f32> = (0..n).map(|i| ((i as f32) * 1.3e-3).sin() * 30.0).collect();
            xs[..6].copy_from_slice(&[0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, 1e-40, -9.0]);
            let x = dispatch::from_data(TensorData::new(xs, [n]), &burn::tensor::Device::flex());
            let bits = |p: Prim| dispatch::into_data(p).unwrap().try_to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            match unary(&x) {
                Some(ours) => assert_eq!(bits(ours), bits(Dispatch::float_tanh(x.clone()))),
                None => assert!(!replica_ok()),
            }
        }
    }

    #[test]
    fn same_bits_as_this_libm_on_a_sweep() {
        if !libm_is_fdlibm() {
            return;
        }
        sweep(97);
    }

    #[test]
    #[ignore]
    fn same_bits_as_this_libm_on_every_f32() {
        sweep(1);
    }
}
