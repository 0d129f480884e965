//! Fast f32 math for the CPU, the kernels of `MathMode::Fast` (`ops::precision`): exp, log, tanh,
//! erf and sigmoid in f32 lanes (8 per AVX2 register, 16 per AVX-512 one), where the exact path
//! runs glibc's algorithms, which work in f64 (`vector::expf8`) or one value at a time (libm).
//! Every result is within 2 ulp of the correctly rounded one on every f32 input (the exhaustive
//! test below), and ±0, ±Inf, NaN, and inputs past the overflow and underflow thresholds give the
//! exact path's bits. Softmax over the last axis is built on the fast exp.
//!
//! Each function is written once, for one value (`*_lane`: branch-free f32 code, special cases as
//! selects); `wide!` compiles the loop over a slice for AVX-512, AVX2+FMA and the baseline, and
//! LLVM vectorises it there. The baseline copy has no FMA, so its products and sums round
//! separately: its results may differ from the FMA levels' by a bit, within the same bound.

use burn::backend::TensorData;
use std::mem::MaybeUninit;

use super::vector::{as_uninit, flex_f32, max_min_blind, par_chunks_for, par_map_slices, simd, sum_lanes, wide, Isa, Simd, PAR_MIN};
#[cfg(target_arch = "x86_64")]
use super::vector::{IsaAvx2, IsaAvx512};
use super::vector::IsaBase;
use crate::dispatch::{self, Prim};
use crate::ops::vocab::UnaryOp;

/// `a * b + c`, fused (one rounding) where the level has FMA; without it `mul_add` would be a libm
/// call per value.
#[inline(always)]
fn fma<S: Isa>(a: f32, b: f32, c: f32) -> f32 {
    if S::FMA { a.mul_add(b, c) } else { a * b + c }
}

/// `c[0] + c[1] x + c[2] x^2 + ...`
#[inline(always)]
fn horner<S: Isa>(x: f32, c: &[f32]) -> f32 {
    let mut p = c[c.len() - 1];
    for &k in c[..c.len() - 1].iter().rev() {
        p = fma::<S>(p, x, k);
    }
    p
}

/// `m` with the sign of `x`.
#[inline(always)]
fn with_sign_of(m: f32, x: f32) -> f32 {
    f32::from_bits(m.to_bits() | (x.to_bits() & 0x8000_0000))
}

/// glibc's expf thresholds, so both modes overflow and underflow at the same inputs: above the
/// first exp is +inf, below the second +0.
const EXP_OVER: f32 = f32::from_bits(0x42b17217); // 0x1.62e42ep6 ~ 88.72
const EXP_UNDER: f32 = f32::from_bits(0xc2cff1b4); // -0x1.9fe368p6 ~ -103.97

/// e^x as `p 2^k` with p in [sqrt(1/2), sqrt(2)]: k = round(x / ln 2), r = x - k ln 2 in two
/// parts (ln 2's high part has 15 significant bits, so k ln2_hi is exact for |k| < 2^9 with or
/// without FMA), p = e^r by a degree-7 polynomial (SLEEF's expf coefficients, 1 ulp). Wrapping
/// integer arithmetic: an input past the thresholds (or NaN) gives some value, never a panic.
#[inline(always)]
fn exp_parts<S: Isa>(x: f32) -> (i32, f32) {
    // 1.5 * 2^23: adding it rounds to an integer and leaves it in the low mantissa bits
    const SHIFT: f32 = 12582912.0;
    const LN2_HI: f32 = 0.693145751953125;
    const LN2_LO: f32 = 1.428606765330187e-6;
    const P: [f32; 6] = [0.5, 0.16666667, 0.041666485, 0.008333361, 0.0013930436, 0.00019852762];
    let kd = fma::<S>(x, std::f32::consts::LOG2_E, SHIFT);
    let k = (kd.to_bits() as i32).wrapping_sub(SHIFT.to_bits() as i32);
    let kf = kd - SHIFT;
    let r = fma::<S>(kf, -LN2_HI, x);
    let r = fma::<S>(kf, -LN2_LO, r);
    (k, 1.0 + fma::<S>(r * r, horner::<S>(r, &P), r))
}

/// 2^k for k in [-126, 127].
#[inline(always)]
fn pow2(k: i32) -> f32 {
    f32::from_bits((k.wrapping_add(127) as u32) << 23)
}

/// e^x for x in [-104, 89]: 2^k applied as two factors, so results down in the subnormals round
/// once and 2^128 does not overflow a factor.
#[inline(always)]
fn exp_core<S: Isa>(x: f32) -> f32 {
    let (k, p) = exp_parts::<S>(x);
    let k1 = k >> 1;
    p * pow2(k1) * pow2(k.wrapping_sub(k1))
}

#[inline(always)]
fn exp_lane<S: Isa>(x: f32) -> f32 {
    // past the thresholds (and for NaN) the core's value is garbage, replaced below
    let y = exp_core::<S>(x);
    let y = if x > EXP_OVER { f32::INFINITY } else { y };
    // also -inf -> +0
    let y = if x < EXP_UNDER { 0.0 } else { y };
    // NaN -> x + x: quiet, with x's sign and payload, as glibc returns it
    if x.is_nan() { x + x } else { y }
}

/// log1p(f) = f - f^2/2 + f^3 P(f) on f in [sqrt(1/2) - 1, sqrt(2) - 1], a near-minimax fit
/// (relative error 6e-9).
const LOG_P: [f32; 8] = [0.33333331, -0.25000823, 0.20001227, -0.16623357, 0.14201762, -0.13160194, 0.1276155, -0.076344296];

/// ln x = e ln 2 + log1p(m - 1) with x = m 2^e, m in [sqrt(1/2), sqrt(2)) (so m - 1 is exact);
/// subnormals are scaled by 2^23 first. ln 2 in two parts, the high one exact times any e.
#[inline(always)]
fn log_lane<S: Isa>(x: f32) -> f32 {
    let tiny = x < f32::MIN_POSITIVE;
    let xs = if tiny { x * 8388608.0 } else { x };
    let bits = xs.to_bits() as i32;
    // the exponent that brings the mantissa into [sqrt(1/2), sqrt(2)): 0x3f3504f3 is sqrt(1/2)
    let e = bits.wrapping_sub(0x3f3504f3) >> 23;
    let m = f32::from_bits(bits.wrapping_sub(e << 23) as u32);
    let e = e.wrapping_sub(if tiny { 23 } else { 0 }) as f32;
    let f = m - 1.0;
    let f2 = f * f;
    let r = fma::<S>(f2, fma::<S>(f, horner::<S>(f, &LOG_P), -0.5), e * -2.121_944_4e-4);
    let y = fma::<S>(e, 0.693359375, f + r);
    let y = if x == f32::INFINITY { x } else { y };
    let y = if x == 0.0 { f32::NEG_INFINITY } else { y };
    // x < 0 (-inf included) and NaN: glibc's (x - x) / (x - x), the default NaN or x quieted
    if x >= 0.0 { y } else { (x - x) * f32::INFINITY }
}

/// Below this |x| tanh is the odd polynomial; from it on, 1 - 2 / (e^2|x| + 1).
const TANH_SMALL: f32 = 0.625;
/// Below this |x| (2^-12) tanh(x) rounds to x.
const TANH_TINY: f32 = 1.0 / 4096.0;
/// tanh(x) = x + x^3 P(x^2) on |x| < 0.625, a near-minimax fit (relative error 2e-10).
const TANH_P: [f32; 6] = [-0.33333331, 0.13333206, -0.053946763, 0.0217007, -0.008177395, 0.0021429588];

#[inline(always)]
fn tanh_lane<S: Isa>(x: f32) -> f32 {
    let a = x.abs();
    let x2 = x * x;
    let small = fma::<S>(x * x2, horner::<S>(x2, &TANH_P), x);
    // glibc returns x there too; the polynomial would turn -0 into -0 + 0 = +0
    let small = if a < TANH_TINY { x } else { small };
    // tanh is 1 in f32 from 9.01 on; the cap keeps e^2|x| finite (and NaN out of the core)
    let ac = if a < 10.0 { a } else { 10.0 };
    let e = exp_core::<S>(ac + ac);
    let large = with_sign_of(1.0 - 2.0 / (e + 1.0), x);
    let y = if a < TANH_SMALL { small } else { large };
    if x.is_nan() { x + x } else { y }
}

/// Below this |x| erf is the odd polynomial; from it on, 1 - erfc(|x|).
const ERF_SMALL: f32 = 1.25;
/// erf(x) = x + x P(x^2) on |x| < 1.25, a near-minimax fit (relative error 1e-9); the leading
/// 1 kept apart so 2/sqrt(pi)'s rounding does not cost an ulp.
const ERF_P: [f32; 8] = [0.12837917, -0.3761263, 0.11283675, -0.026860248, 0.005209016, -0.00083395699, 0.00010393876, -7.572_961_7e-6];
/// Numerical Recipes' erfcc (as in `vector::ERFC_P`): erfc(a) = t exp(-a^2 + P(t)), t = 1/(1 + a/2),
/// relative error below 1.2e-7, which 1 - erfc shrinks to a fraction of an ulp from 1.25 on.
const ERFC_P: [f32; 10] =
    [-1.265_512_2, 1.000_023_7, 0.374_091_96, 0.096_784_18, -0.186_288_06, 0.278_868_07, -1.135_203_98, 1.488_515_87, -0.822_152_23, 0.170_872_77];

#[inline(always)]
fn erf_lane<S: Isa>(x: f32) -> f32 {
    let a = x.abs();
    let small = fma::<S>(x, horner::<S>(x * x, &ERF_P), x);
    // erf is 1 in f32 from 3.92 on
    let ac = if a < 4.0 { a } else { 4.0 };
    let t = 1.0 / fma::<S>(ac, 0.5, 1.0);
    let erfc = t * exp_core::<S>(horner::<S>(t, &ERFC_P) - ac * ac);
    let large = with_sign_of(1.0 - erfc, x);
    let y = if a < ERF_SMALL { small } else { large };
    if x.is_nan() { x + x } else { y }
}

/// flex's sigmoid (`1 / (1 + e^-x)` for x >= 0, `e^x / (1 + e^x)` below) on the fast exp: both
/// forms take e^-|x|, which never overflows.
#[inline(always)]
fn sigmoid_lane<S: Isa>(x: f32) -> f32 {
    let n = -x.abs();
    let nc = if n > -104.0 { n } else { -104.0 };
    let e = exp_core::<S>(nc);
    let e = if n < EXP_UNDER { 0.0 } else { e };
    let d = 1.0 + e;
    let y = if x >= 0.0 { 1.0 / d } else { e / d };
    if x.is_nan() { x + x } else { y }
}

/// One of the functions above, as a type `wide!` can compile the slice loop for.
trait Lane {
    fn lane<S: Isa>(x: f32) -> f32;
}
macro_rules! lane {
    ($name:ident, $f:ident) => {
        struct $name;
        impl Lane for $name {
            #[inline(always)]
            fn lane<S: Isa>(x: f32) -> f32 {
                $f::<S>(x)
            }
        }
    };
}
lane!(Exp, exp_lane);
lane!(Log, log_lane);
lane!(Tanh, tanh_lane);
lane!(Erf, erf_lane);
lane!(Sigmoid, sigmoid_lane);

/// `L` over a slice. A plain loop: LLVM vectorises it, and its scalar remainder runs the same
/// operations, so every position gets the same bits.
#[inline(always)]
fn map_lanes<L: Lane, S: Isa>(xs: &[f32], out: &mut [MaybeUninit<f32>]) {
    for (o, &x) in out.iter_mut().zip(xs) {
        o.write(L::lane::<S>(x));
    }
}

wide!(fn map_wide<L: Lane>(xs: &[f32], out: &mut [MaybeUninit<f32>]) = map_lanes;);

/// The slice kernel of a unary op this file has, for `level`.
fn kernel(op: UnaryOp) -> Option<fn(Simd, &[f32], &mut [MaybeUninit<f32>])> {
    Some(match op {
        UnaryOp::Exp => map_wide::<Exp>,
        UnaryOp::Log => map_wide::<Log>,
        UnaryOp::Tanh => map_wide::<Tanh>,
        UnaryOp::Erf => map_wide::<Erf>,
        UnaryOp::Sigmoid => map_wide::<Sigmoid>,
        _ => return None,
    })
}

/// `out = sigmoid(xs)` and `out = tanh(xs)` on the calling thread.
pub(crate) fn sigmoid_slice(xs: &[f32], out: &mut [f32]) {
    map_wide::<Sigmoid>(simd(), xs, as_uninit(out))
}

pub(crate) fn tanh_slice(xs: &[f32], out: &mut [f32]) {
    map_wide::<Tanh>(simd(), xs, as_uninit(out))
}

/// `op` over a contiguous f32 flex tensor, on rayon's pool for long ones; `None` for other ops,
/// dtypes, devices and strided views.
pub fn unary(op: UnaryOp, x: &Prim) -> Option<Prim> {
    let f = kernel(op)?;
    let xs = flex_f32(x)?;
    let level = simd();
    let out = par_map_slices(xs, |x, o| f(level, x, o));
    Some(dispatch::from_data(TensorData::new(out, dispatch::dims(x)), &burn::tensor::Device::flex()))
}

/// `exp_lane` for x <= 0 (softmax's `x - max`), with the same bits there (NaN stays a NaN):
/// k is in [-150, 0], so 2^k is applied as `2^(k + 24) 2^-24`, one exponent built instead of two,
/// still rounding once. -inf (a row's -inf minus a finite maximum) is caught with the underflow.
#[inline(always)]
fn exp_nonpositive<S: Isa>(x: f32) -> f32 {
    let (k, p) = exp_parts::<S>(x);
    let y = p * pow2(k.wrapping_add(24)) * pow2(-24);
    if x < EXP_UNDER { 0.0 } else { y }
}

/// One softmax row: `out = e^(row - m)` for `m` the row's maximum, summed in f64 (`sum_lanes`:
/// the sum's rounding is the row's only one), then scaled by the f32 reciprocal of the sum. Four
/// passes over a row in L1 cache; summing in the exp's loop was slower. The maximum ignores NaN
/// (one instruction a vector): a NaN in the row makes its sum, and so the whole row, NaN either way.
#[inline(always)]
fn softmax_row<S: Isa>(row: &[f32], out: &mut [MaybeUninit<f32>]) {
    let m = max_min_blind::<S>(row).0;
    for (o, &x) in out.iter_mut().zip(row) {
        o.write(exp_nonpositive::<S>(x - m));
    }
    // SAFETY: the loop above wrote every element of `out`.
    let e: &mut [f32] = unsafe { &mut *(out as *mut [MaybeUninit<f32>] as *mut [f32]) };
    let r = (1.0 / sum_lanes::<f32, S>(e)) as f32;
    e.iter_mut().for_each(|v| *v *= r);
}

wide!(fn softmax_row_wide(row: &[f32], out: &mut [MaybeUninit<f32>]) = softmax_row;);

/// Softmax over the last axis of a contiguous f32 flex tensor, row by row on rayon's pool, with
/// the fast exp and a multiplication by the reciprocal of the sum (whichever of Nx's two forms
/// was written). `None` off f32/flex and for an empty tensor.
pub fn softmax_last(x: &Prim) -> Option<Prim> {
    let xs = flex_f32(x)?;
    let shape = dispatch::dims(x);
    let cols = *shape.last()?;
    if xs.is_empty() || cols == 0 {
        return None;
    }
    let level = simd();
    let per_task = (PAR_MIN / cols).max(1);
    let mut out: Vec<f32> = Vec::with_capacity(xs.len());
    par_chunks_for(&mut out.spare_capacity_mut()[..xs.len()], per_task * cols, xs.len(), |t, o| {
        for (row, o) in xs[t * per_task * cols..].chunks(cols).zip(o.chunks_mut(cols)) {
            softmax_row_wide(level, row, o);
        }
    });
    // SAFETY: the tasks wrote all xs.len() elements (each row of each chunk).
    unsafe { out.set_len(xs.len()) };
    Some(dispatch::from_data(TensorData::new(out, shape), &burn::tensor::Device::flex()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{flex_f32s as flex, prim_f32s as values};
    use rayon::prelude::*;

    /// Every level `wide!` can run on this CPU, so each compiled copy is tested.
    fn levels() -> Vec<Simd> {
        [Simd::Base, Simd::Avx2, Simd::Avx512].into_iter().filter(|&l| l <= simd()).collect()
    }

    /// The five functions: the fast slice kernel, the exact path's f32 function (what the CPU
    /// computes in `MathMode::Exact`), and an f64 reference whose value rounded to f32 is the
    /// correctly rounded result but for rare double roundings.
    type Case = (UnaryOp, fn(f32) -> f32, fn(f64) -> f64);
    fn cases() -> Vec<Case> {
        fn sigmoid32(x: f32) -> f32 {
            // flex's sigmoid_f32
            if x >= 0.0 { 1.0 / (1.0 + (-x).exp()) } else { x.exp() / (1.0 + x.exp()) }
        }
        fn sigmoid64(x: f64) -> f64 {
            if x >= 0.0 { 1.0 / (1.0 + (-x).exp()) } else { x.exp() / (1.0 + x.exp()) }
        }
        vec![
            (UnaryOp::Exp, f32::exp, f64::exp),
            (UnaryOp::Log, f32::ln, f64::ln),
            (UnaryOp::Tanh, f32::tanh, f64::tanh),
            (UnaryOp::Erf, libm::erff, libm::erf),
            (UnaryOp::Sigmoid, sigmoid32, sigmoid64),
        ]
    }

    /// Distance in ulps, counting across zero, subnormals included (+0 and -0 are 0 apart).
    fn ulps(a: f32, b: f32) -> u64 {
        let key = |f: f32| {
            let b = f.to_bits() as i64;
            if b & 0x8000_0000 != 0 { -(b & 0x7fff_ffff) } else { b }
        };
        (key(a) - key(b)).unsigned_abs()
    }

    /// Where the exact path's bits are the rule: special inputs, and results that are not finite
    /// nonzero numbers (NaN, ±Inf, ±0 past the thresholds).
    fn special(x: f32, exact: f32) -> bool {
        !x.is_finite() || x == 0.0 || !exact.is_finite() || exact == 0.0
    }

    /// The worst ulp distance from the reference over the f32 inputs with bits `lo..hi` stepping
    /// by `stride`, at `level`; panics on a special input whose bits differ from the exact path's.
    fn worst(case: &Case, level: Simd, lo: u64, hi: u64, stride: u64) -> (u64, f32) {
        let (op, exact, reference) = *case;
        let f = kernel(op).unwrap();
        let xs: Vec<f32> = (lo..hi).step_by(stride as usize).map(|b| f32::from_bits(b as u32)).collect();
        let mut out = vec![MaybeUninit::uninit(); xs.len()];
        f(level, &xs, &mut out);
        let mut worst = (0, 0.0);
        for (&x, y) in xs.iter().zip(out) {
            // SAFETY: the kernel wrote every element
            let y = unsafe { y.assume_init() };
            let e = exact(x);
            if special(x, e) {
                assert!(y.to_bits() == e.to_bits(), "{op:?} {level:?}: x = {x:e} ({:#010x}) gives {y:e} ({:#010x}), the exact path {e:e} ({:#010x})", x.to_bits(), y.to_bits(), e.to_bits());
                continue;
            }
            let r = reference(x as f64) as f32;
            let u = ulps(y, r);
            if u > worst.0 {
                worst = (u, x);
            }
        }
        worst
    }

    /// Every f32 input (the `stride` is 1) or a sample, in parallel chunks, at every level.
    fn sweep(stride: u64) {
        let chunk = 1u64 << 24;
        for case in cases() {
            for level in levels() {
                let (u, x) = (0..(1u64 << 32) / chunk)
                    .into_par_iter()
                    .map(|c| worst(&case, level, c * chunk, (c + 1) * chunk, stride))
                    .reduce(|| (0, 0.0), |a, b| if b.0 > a.0 { b } else { a });
                eprintln!("fast {:?} at {level:?}: at most {u} ulp from the correctly rounded result (worst at x = {x:e}), stride {stride}", case.0);
                assert!(u <= 2, "{:?} {level:?}: {u} ulp at x = {x:e}", case.0);
            }
        }
    }

    /// A dense sample of every f32 bit pattern (all exponents, both signs); the exhaustive run is
    /// the ignored test below.
    #[test]
    fn within_two_ulp_on_a_dense_sweep_of_all_f32() {
        sweep(if cfg!(debug_assertions) { 100_003 } else { 211 });
    }

    /// Every f32 input: `cargo test --release -p ex_burn --no-default-features -- --ignored
    /// every_f32` (minutes per core).
    #[test]
    #[ignore]
    fn within_two_ulp_on_every_f32() {
        sweep(1);
    }

    /// The inputs the exact path treats specially, at every level and through the tensor path.
    #[test]
    fn specials_and_thresholds_give_the_exact_paths_bits() {
        let next = |x: f32| f32::from_bits(x.to_bits() + 1);
        let mut xs = vec![0.0f32, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -f32::NAN, f32::from_bits(0x7fa0_0001), f32::from_bits(0xffc0_1234)];
        xs.extend([f32::MIN_POSITIVE, -f32::MIN_POSITIVE, 1e-45, -1e-45, f32::from_bits(0x007f_ffff), 1e-30, -1e-30, f32::MAX, f32::MIN, 1.0, -1.0]);
        xs.extend([EXP_OVER, next(EXP_OVER), EXP_UNDER, next(EXP_UNDER), -87.33655, -87.5, -100.0, -103.9, 88.7, 89.0, -104.0, 9.0, 9.5, 4.0, 3.92, -3.92]);
        xs.extend([TANH_SMALL, -TANH_SMALL, ERF_SMALL, -ERF_SMALL, 0.6249999, 1.2499999]);
        for case in cases() {
            let (op, exact, reference) = case;
            for level in levels() {
                let mut out = vec![MaybeUninit::uninit(); xs.len()];
                kernel(op).unwrap()(level, &xs, &mut out);
                for (&x, y) in xs.iter().zip(out) {
                    let (y, e) = (unsafe { y.assume_init() }, exact(x));
                    if special(x, e) {
                        assert_eq!(y.to_bits(), e.to_bits(), "{op:?} {level:?} at {x:e}");
                    } else {
                        assert!(ulps(y, reference(x as f64) as f32) <= 2, "{op:?} {level:?} at {x:e}: {y:e}");
                    }
                }
            }
            // the tensor path: the level this CPU runs, every length's tail, both thread paths
            for n in (0..=40).chain([PAR_MIN - 1, 2 * PAR_MIN + 3]) {
                let input: Vec<f32> = (0..n).map(|i| if i < xs.len() { xs[i] } else { ((i as f32) * 0.731).sin() * 30.0 }).collect();
                let got = values(unary(op, &flex(input.clone(), &[n])).expect("f32 takes the kernel"));
                let mut want = vec![MaybeUninit::uninit(); n];
                kernel(op).unwrap()(simd(), &input, &mut want);
                let want: Vec<u32> = want.into_iter().map(|v| unsafe { v.assume_init() }.to_bits()).collect();
                assert_eq!(got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want, "{op:?} n = {n}");
            }
        }
        assert!(unary(UnaryOp::Sin, &flex(vec![1.0], &[1])).is_none());
        let f64s = dispatch::from_data(TensorData::new(vec![1.0f64], [1]), &burn::tensor::Device::flex());
        assert!(unary(UnaryOp::Exp, &f64s).is_none());
    }

    wide!(fn exp_nonpositive_wide(xs: &[f32], out: &mut [f32]) = exp_nonpositive_slice;);
    #[inline(always)]
    fn exp_nonpositive_slice<S: Isa>(xs: &[f32], out: &mut [f32]) {
        for (o, &x) in out.iter_mut().zip(xs) {
            *o = exp_nonpositive::<S>(x);
        }
    }

    /// Softmax's exp gives the fast exp's bits on every x <= 0 (-0 and -inf included).
    #[test]
    fn softmax_exp_equals_the_fast_exp_below_zero() {
        let stride = if cfg!(debug_assertions) { 10_007 } else { 7 };
        let xs: Vec<f32> = (0x8000_0000u32..=0xff80_0000).step_by(stride).chain([0x8000_0000, 0xff80_0000, 0xc2cf_f1b4, 0xc2cf_f1b5]).map(f32::from_bits).collect();
        for level in levels() {
            let mut want = vec![MaybeUninit::uninit(); xs.len()];
            map_wide::<Exp>(level, &xs, &mut want);
            let mut got = vec![0f32; xs.len()];
            exp_nonpositive_wide(level, &xs, &mut got);
            for ((x, w), g) in xs.iter().zip(want).zip(got) {
                assert_eq!(g.to_bits(), unsafe { w.assume_init() }.to_bits(), "{level:?} at {x:e}");
            }
        }
        let mut nan = [0f32];
        exp_nonpositive_wide(simd(), &[f32::NAN], &mut nan);
        assert!(nan[0].is_nan());
    }

    #[test]
    fn softmax_is_within_a_few_ulp_of_an_f64_softmax() {
        for (rows, cols) in [(1, 1), (3, 7), (64, 1000), (2 * PAR_MIN / 100 + 1, 100), (2, 3 * PAR_MIN + 5)] {
            let xs: Vec<f32> = (0..rows * cols).map(|i| ((i as f32) * 0.377).sin() * 20.0 + (i % 7) as f32).collect();
            let got = values(softmax_last(&flex(xs.clone(), &[rows, cols])).unwrap());
            for (row, g) in xs.chunks(cols).zip(got.chunks(cols)) {
                // x - max rounded to f32, as the composition (and so both modes) computes it
                let m = row.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
                let s: f64 = row.iter().map(|&v| ((v - m) as f64).exp()).sum();
                for (&v, &g) in row.iter().zip(g) {
                    let want = (((v - m) as f64).exp() / s) as f32;
                    // the exp's 2 ulp, the f32 reciprocal and the product
                    assert!(ulps(g, want) <= 4, "{rows}x{cols}: {g:e} vs {want:e}");
                }
            }
        }
        // a row of -inf or with NaN is NaN, as in the exact path; an infinity takes the row to NaN too
        let got = values(softmax_last(&flex(vec![f32::NEG_INFINITY, f32::NEG_INFINITY, 1.0, f32::NAN, 0.0, 0.0], &[3, 2])).unwrap());
        assert!(got[..4].iter().all(|v| v.is_nan()), "{got:?}");
        assert_eq!(&got[4..], &[0.5, 0.5]);
        assert!(softmax_last(&flex(vec![], &[0, 3])).is_none());
    }
}
