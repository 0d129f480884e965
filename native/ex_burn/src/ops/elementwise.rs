//! Elementwise NIFs: unary math, binary arithmetic/comparison/logic with Nx broadcasting, select,
//! clip and type conversion. Elixir computes the Nx result type; here operands are cast to it and
//! the Burn op of the matching family is applied.

use burn::backend::ops::{ActivationOps, BoolTensorOps, FloatTensorOps, IntTensorOps};
use burn::backend::{Dispatch, Scalar};

use crate::dispatch::{self, by_kind, by_kind2, Prim, BOOL};
use crate::dtype::{NxType, PRED};
use crate::error::{ExError, ExResult};
use crate::ops::precision::MathMode;
use crate::ops::vocab::{BinaryOp, UnaryOp};
use crate::ops::{broadcast_prim, broadcast_shape, cast_to, check_alloc, empty, colocate};
use crate::tensor::{numel, Handle};

type UnaryFn = fn(Prim) -> Prim;

/// Float-only unary ops that map one-to-one onto a Burn kernel.
const FLOAT_UNARY: &[(UnaryOp, UnaryFn)] = &[
    (UnaryOp::Exp, Dispatch::float_exp),
    (UnaryOp::Log, Dispatch::float_log),
    (UnaryOp::Sqrt, Dispatch::float_sqrt),
    (UnaryOp::Sin, Dispatch::float_sin),
    (UnaryOp::Cos, Dispatch::float_cos),
    (UnaryOp::Tan, Dispatch::float_tan),
    (UnaryOp::Asin, Dispatch::float_asin),
    (UnaryOp::Acos, Dispatch::float_acos),
    (UnaryOp::Atan, Dispatch::float_atan),
    (UnaryOp::Sinh, Dispatch::float_sinh),
    (UnaryOp::Cosh, Dispatch::float_cosh),
    (UnaryOp::Tanh, Dispatch::float_tanh),
    (UnaryOp::Floor, Dispatch::float_floor),
    (UnaryOp::Ceil, Dispatch::float_ceil),
];

/// Refuses f64 transcendentals where the device cannot compile them (see `DeviceRef::f64_math`):
/// an error now instead of a poisoned device later.
fn check_f64_math(op: &'static str, exact: bool, ty: NxType, device: crate::device::DeviceRef) -> ExResult<()> {
    if ty == NxType::F(64) && !device.f64_math() && !exact {
        return Err(ExError::invalid_with(
            format!("f64 {op} is not supported on {device}: Vulkan (SPIR-V) has no f64 transcendental functions"),
            vec![("op", crate::error::Detail::Text(op.into())), ("device", crate::error::Detail::Text(device.to_string()))],
        ));
    }
    Ok(())
}

/// Float ops built from several Burn kernels. asinh/acosh/atanh are here because the kernels'
/// textbook formulas overflow (asinh, acosh of huge x), cancel (acosh near 1) or round 1 - x
/// (atanh near -1): Rust's f64 atanh(-(1 - 2^-53)) is 2% off.
const COMPOSITES: &[UnaryOp] = &[UnaryOp::Expm1, UnaryOp::Log1p, UnaryOp::Cbrt, UnaryOp::Erfc, UnaryOp::ErfInv, UnaryOp::Asinh, UnaryOp::Acosh, UnaryOp::Atanh];

fn fscalar(v: f64) -> Scalar {
    Scalar::Float(v)
}

fn float_unary(op: UnaryOp, t: Prim) -> ExResult<Prim> {
    if MathMode::fast() {
        if let Some(p) = crate::kernels::cpu::fast_math::unary(op, &t) {
            return Ok(p);
        }
    }
    if op == UnaryOp::Tanh {
        if let Some(p) = crate::kernels::cpu::tanh::unary(&t) {
            return Ok(p);
        }
    }
    if let Some(p) = crate::kernels::cpu::vector::unary(op, &t) {
        return Ok(p);
    }
    if let Some((_, f)) = FLOAT_UNARY.iter().find(|(name, _)| *name == op) {
        return Ok(f(t));
    }
    let std = std_math(&t);
    Ok(match op {
        UnaryOp::Erf if std => Dispatch::float_erf(t),
        UnaryOp::Erf => erf(&t),
        UnaryOp::Sigmoid if std => Dispatch::sigmoid(t),
        UnaryOp::Sigmoid => sigmoid(t),
        // expm1 = 2t / (1 - t) with t = tanh(x/2) keeps full precision near 0, where exp(x) - 1
        // cancels; far from 0 the direct form is exact enough and does not overflow early.
        UnaryOp::Expm1 => {
            let half = Dispatch::float_tanh(Dispatch::float_mul_scalar(t.clone(), fscalar(0.5)));
            let near = Dispatch::float_div(
                Dispatch::float_mul_scalar(half.clone(), fscalar(2.0)),
                Dispatch::float_add_scalar(Dispatch::float_neg(half), fscalar(1.0)),
            );
            let far = Dispatch::float_sub_scalar(Dispatch::float_exp(t.clone()), fscalar(1.0));
            let small = Dispatch::float_lower_elem(Dispatch::float_abs(t), fscalar(0.5), BOOL);
            Dispatch::float_mask_where(far, small, near)
        }
        UnaryOp::Log1p => log1p(t),
        UnaryOp::Rsqrt => Dispatch::float_recip(Dispatch::float_sqrt(t)),
        UnaryOp::Cbrt => cbrt(t),
        UnaryOp::Erfc => erfc(&t, &erf_ratio(&t)),
        UnaryOp::Asinh => asinh(t, std),
        UnaryOp::Acosh => acosh(t),
        UnaryOp::Atanh => atanh(t, std),
        // Nx rounds half away from zero; Burn rounds half to even.
        UnaryOp::Round => {
            let tr = Dispatch::float_trunc(t.clone());
            let frac = Dispatch::float_abs(Dispatch::float_sub(t.clone(), tr.clone()));
            let bump = Dispatch::float_greater_equal_elem(frac, fscalar(0.5), BOOL);
            let away = Dispatch::float_add(tr.clone(), Dispatch::float_sign(t));
            Dispatch::float_mask_where(tr, bump, away)
        }
        UnaryOp::ErfInv => erf_inv(t),
        UnaryOp::Abs => Dispatch::float_abs(t),
        UnaryOp::Negate => Dispatch::float_neg(t),
        // Burn's sign maps -0 to +0 and NaN to 0; zeros and NaN pass through, as in XLA (EXLA).
        UnaryOp::Sign => {
            let zero = Dispatch::float_equal_elem(t.clone(), fscalar(0.0), BOOL);
            let keep = Dispatch::bool_or(zero, Dispatch::float_is_nan(t.clone(), BOOL));
            Dispatch::float_mask_where(Dispatch::float_sign(t.clone()), keep, t)
        }
        UnaryOp::Square => Dispatch::float_mul(t.clone(), t),
        UnaryOp::IsNan => dispatch::pred(Dispatch::float_is_nan(t, BOOL)),
        UnaryOp::IsInfinity => dispatch::pred(Dispatch::float_is_inf(t, BOOL)),
        _ => return Err(unknown(op.name(), "unary")),
    })
}

/// `on_true` where `cond` holds, else `on_false`.
fn mask(on_false: Prim, cond: Prim, on_true: Prim) -> Prim {
    Dispatch::float_mask_where(on_false, cond, on_true)
}

fn below(t: &Prim, v: f64) -> Prim {
    Dispatch::float_lower_elem(t.clone(), fscalar(v), BOOL)
}

fn mul(a: &Prim, b: &Prim) -> Prim {
    Dispatch::float_mul(a.clone(), b.clone())
}

/// `v - t`.
fn rsub(v: f64, t: Prim) -> Prim {
    Dispatch::float_add_scalar(Dispatch::float_neg(t), fscalar(v))
}

/// Horner's rule, highest-degree coefficient first (at least two coefficients).
fn horner(x: &Prim, coeffs: &[f64]) -> Prim {
    use Dispatch as D;
    let lead = D::float_add_scalar(D::float_mul_scalar(x.clone(), fscalar(coeffs[0])), fscalar(coeffs[1]));
    coeffs[2..].iter().fold(lead, |acc, c| D::float_add_scalar(D::float_mul(acc, x.clone()), fscalar(*c)))
}

/// `mag` (>= 0 or NaN) with the sign of `x`; x's zeros (signed) pass through.
fn with_sign_of(mag: Prim, x: &Prim) -> Prim {
    let signed = mask(mag.clone(), below(x, 0.0), Dispatch::float_neg(mag));
    mask(signed, Dispatch::float_equal_elem(x.clone(), fscalar(0.0), BOOL), x.clone())
}

/// log(w) - ((w - 1) - x) / w with w = 1 + x: the correction term restores what rounding 1 + x
/// lost, so this is accurate near 0 and exact where 1 + x is (Burn's f64 log1p is one ulp off at
/// log1p(2)). Where w is 0 or infinite the correction is 0/0 or inf/inf, so log(w) alone gives
/// log1p(-1) = -inf and log1p(inf) = inf; where w is 1, log1p(x) rounds to x (which keeps -0).
/// In f32 with w in [0.5, 2] the device's log is not used (`log1p_near_one`).
fn log1p(x: Prim) -> Prim {
    use Dispatch as D;
    let w = D::float_add_scalar(x.clone(), fscalar(1.0));
    let log_w = D::float_log(w.clone());
    let lost = D::float_sub(D::float_sub_scalar(w.clone(), fscalar(1.0)), x.clone());
    let corrected = D::float_sub(log_w.clone(), D::float_div(lost, w.clone()));
    let edge = D::bool_or(D::float_equal_elem(w.clone(), fscalar(0.0), BOOL), D::float_is_inf(w.clone(), BOOL));
    let mut out = mask(corrected, edge, log_w);
    if dispatch::dtype(&x) == burn::backend::DType::F32 {
        let inside = D::bool_and(
            D::float_greater_equal_elem(w.clone(), fscalar(0.5), BOOL),
            D::float_lower_equal_elem(w.clone(), fscalar(2.0), BOOL),
        );
        out = mask(out, inside, log1p_near_one(&x, &w));
    }
    mask(out, D::float_equal_elem(w, fscalar(1.0), BOOL), x)
}

/// log1p(x) in f32 for w = 1 + x in [0.5, 2] from arithmetic alone: Vulkan's log need only be
/// within 2^-21 absolute there (the Vulkan specification's precision table), no digit at all of
/// log1p(1e-7). fdlibm's form: f = w - 1 is exact (Sterbenz), s = f / (2 + f), and
/// log(1 + f) = f - (f²/2 - s (f²/2 + R)) with R = 2s²/3 + 2s⁴/5 + ... (|s| ≤ 1/3: the terms past
/// s¹⁴ are below 2^-25 of the result), plus (x - f) / w, what rounding 1 + x lost (also exact).
fn log1p_near_one(x: &Prim, w: &Prim) -> Prim {
    use Dispatch as D;
    let f = D::float_sub_scalar(w.clone(), fscalar(1.0));
    let s = D::float_div(f.clone(), D::float_add_scalar(f.clone(), fscalar(2.0)));
    let z = mul(&s, &s);
    let series: Vec<f64> = (1..=7).rev().map(|k| 2.0 / (2 * k + 1) as f64).collect();
    let r = mul(&z, &horner(&z, &series));
    let hfsq = D::float_mul_scalar(mul(&f, &f), fscalar(0.5));
    let inner = D::float_sub(hfsq.clone(), mul(&s, &D::float_add(hfsq, r)));
    let lost = D::float_div(D::float_sub(x.clone(), f.clone()), w.clone());
    D::float_add(D::float_sub(f, inner), lost)
}

/// |x|^(1/3) by powf, whose exponent is not exactly a third (58 ulps off at 1e-300), then one
/// Newton step y + (|x|/y^2 - y)/3 on y^3 = |x|, which leaves about an ulp. Zeros and
/// infinities pass through (the step would be 0/0 or inf/inf there).
fn cbrt(x: Prim) -> Prim {
    use Dispatch as D;
    let a = D::float_abs(x.clone());
    let y = D::float_powf_scalar(a.clone(), fscalar(1.0 / 3.0));
    let step = D::float_sub(D::float_div(a, mul(&y, &y)), y.clone());
    let y = D::float_add(y, D::float_div_scalar(step, fscalar(3.0)));
    let signed = mask(y.clone(), below(&x, 0.0), D::float_neg(y));
    let edge = D::bool_or(D::float_equal_elem(x.clone(), fscalar(0.0), BOOL), D::float_is_inf(x.clone(), BOOL));
    mask(signed, edge, x)
}

/// Beyond this asinh(x) and acosh(x) are ln 2x to within an ulp (the next term is
/// 1/(4x^2)), and x^2 in their formulas is far from overflow below it.
const LARGE: f64 = 268_435_456.0; // 2^28

/// ln|x| + ln 2: asinh/acosh for |x| > LARGE.
fn ln_2x(a: Prim) -> Prim {
    Dispatch::float_add_scalar(Dispatch::float_log(a), fscalar(std::f64::consts::LN_2))
}

/// Whether Burn's kernels for `t` are flex's, i.e. Rust's std math (asinh, atanh careful near 0).
/// CubeCL's kernels (CUDA, Vulkan, ...) use the textbook formulas, ln(x + sqrt(x^2 + 1)) and
/// 0.5 ln((1 + x) / (1 - x)), which lose every digit that 1 + x rounds away near 0 (CUDA's f64
/// atanh(1e-10) came out 8e-8 off).
fn std_math(t: &Prim) -> bool {
    matches!(t.kind, burn::backend::DispatchTensorKind::Flex(_))
}

/// `std` (Burn's kernel is Rust's std, see `std_math`): that kernel; otherwise
/// log1p(a + a^2 / (1 + sqrt(1 + a^2))) with a = |x|, signed. ln 2|x| (signed) for huge |x| on
/// every device, where x + x/(...) and a^2 overflow (Rust's asinh(f64::MAX) is inf).
fn asinh(x: Prim, std: bool) -> Prim {
    use Dispatch as D;
    let a = D::float_abs(x.clone());
    let huge = D::float_greater_elem(a.clone(), fscalar(LARGE), BOOL);
    let near = if std {
        D::float_asinh(x.clone())
    } else {
        let a2 = mul(&a, &a);
        let root = D::float_add_scalar(D::float_sqrt(D::float_add_scalar(a2.clone(), fscalar(1.0))), fscalar(1.0));
        with_sign_of(log1p(D::float_add(a.clone(), D::float_div(a2, root))), &x)
    };
    mask(near, huge, with_sign_of(ln_2x(a), &x))
}

/// log1p(u + sqrt(u (u + 2))) with u = x - 1 (exact near 1, where Rust's log of
/// x + sqrt(x^2 - 1) loses half the digits: 4e-9 off at 1 + 2^-52), ln 2x for huge x (where the
/// kernel overflows); NaN below 1.
fn acosh(x: Prim) -> Prim {
    use Dispatch as D;
    let u = D::float_sub_scalar(x.clone(), fscalar(1.0));
    let root = D::float_sqrt(D::float_mul(u.clone(), D::float_add_scalar(u.clone(), fscalar(2.0))));
    let near = log1p(D::float_add(u, root));
    let out = mask(near, D::float_greater_elem(x.clone(), fscalar(LARGE), BOOL), ln_2x(x.clone()));
    D::float_mask_fill(out, below(&x, 1.0), fscalar(f64::NAN))
}

/// On |x|, then x's sign: 1 - |x| is exact from 0.5 on, where the kernels' 1 - x rounds for x
/// near -1 (Rust's atanh(-(1 - 2^-53)) is -18.37 for -18.71). `std`: Burn's kernel (Rust's
/// std); otherwise fdlibm's 0.5 log1p(2a / (1 - a)) (see `std_math`), where a > 1 gives a ratio
/// below -1, so log1p's NaN.
fn atanh(x: Prim, std: bool) -> Prim {
    use Dispatch as D;
    let a = D::float_abs(x.clone());
    let mag = if std {
        D::float_atanh(a)
    } else {
        let ratio = D::float_div(D::float_mul_scalar(a.clone(), fscalar(2.0)), rsub(1.0, a));
        D::float_mul_scalar(log1p(ratio), fscalar(0.5))
    };
    with_sign_of(mag, &x)
}

// fdlibm's erf/erfc (FreeBSD s_erf.c), coefficients highest degree first.
#[allow(clippy::excessive_precision)]
mod erf_coeffs {
    pub const ERX: f64 = 8.45062911510467529297e-01;
    // (erf(x) - x) / x = PP(x^2) / QQ(x^2) on |x| < 0.84375, error below 2^-57.90
    pub const PP: [f64; 5] = [
        -2.37630166566501626084e-05, -5.77027029648944159157e-03, -2.84817495755985104766e-02,
        -3.25042107247001499370e-01, 1.28379167095512558561e-01,
    ];
    pub const QQ: [f64; 6] = [
        -3.96022827877536812320e-06, 1.32494738004321644526e-04, 5.08130628187576562776e-03,
        6.50222499887672944485e-02, 3.97917223959155352819e-01, 1.0,
    ];
    // erf(1 + s) - ERX = PA(s) / QA(s) on 0.84375 <= |x| < 1.25, error below 2^-59.06
    pub const PA: [f64; 7] = [
        -2.16637559486879084300e-03, 3.54783043256182359371e-02, -1.10894694282396677476e-01,
        3.18346619901161753674e-01, -3.72207876035701323847e-01, 4.14856118683748331666e-01,
        -2.36211856075265944077e-03,
    ];
    pub const QA: [f64; 7] = [
        1.19844998467991074170e-02, 1.36370839120290507362e-02, 1.26171219808761642112e-01,
        7.18286544141962662868e-02, 5.40397917702171048937e-01, 1.06420880400844228286e-01, 1.0,
    ];
    // log(x erfc(x)) + x^2 + 0.5625 = R(1/x^2) / S(1/x^2): RA/SA on [1.25, 1/0.35] (error below
    // 2^-62.57), RB/SB on [1/0.35, 28] (below 2^-61.52)
    pub const RA: [f64; 8] = [
        -9.81432934416914548592e+00, -8.12874355063065934246e+01, -1.84605092906711035994e+02,
        -1.62396669462573470355e+02, -6.23753324503260060396e+01, -1.05586262253232909814e+01,
        -6.93858572707181764372e-01, -9.86494403484714822705e-03,
    ];
    pub const SA: [f64; 9] = [
        -6.04244152148580987438e-02, 6.57024977031928170135e+00, 1.08635005541779435134e+02,
        4.29008140027567833386e+02, 6.45387271733267880336e+02, 4.34565877475229228821e+02,
        1.37657754143519042600e+02, 1.96512716674392571292e+01, 1.0,
    ];
    pub const RB: [f64; 7] = [
        -4.83519191608651397019e+02, -1.02509513161107724954e+03, -6.37566443368389627722e+02,
        -1.60636384855821916062e+02, -1.77579549177547519889e+01, -7.99283237680523006574e-01,
        -9.86494292470009928597e-03,
    ];
    pub const SB: [f64; 8] = [
        -2.24409524465858183362e+01, 4.74528541206955367215e+02, 2.55305040643316442583e+03,
        3.19985821950859553908e+03, 1.53672958608443695994e+03, 3.25792512996573918826e+02,
        3.03380607434824582924e+01, 1.0,
    ];
}

/// (erf(x) - x) / x for |x| < 0.84375: erf(x) = x + x erf_ratio(x) there.
/// erf off the CPU, where CubeCL's kernel is a short approximation (CUDA: erf(0) = 6e-8, 2 ulps
/// at 0.5): fdlibm's x + x R(x^2) below 0.84375, 1 - erfc(|x|) (signed) above, where erfc is at
/// most 0.23 so the subtraction loses nothing.
fn erf(x: &Prim) -> Prim {
    use Dispatch as D;
    let a = D::float_abs(x.clone());
    let small = D::float_add(x.clone(), mul(x, &erf_ratio(x)));
    let large = with_sign_of(rsub(1.0, erfc(&a, &erf_ratio(&a))), x);
    mask(large, below(&a, 0.84375), small)
}

/// sigmoid off the CPU from exp in the tensor's own type: CubeCL's CUDA sigmoid of f64 came
/// out with f32's precision (0.7310584783554077 at 1.0). 1 / (1 + e^-x) for x >= 0 and
/// e^x / (1 + e^x) below, so neither exp overflows into a 0/inf or inf/inf.
fn sigmoid(x: Prim) -> Prim {
    use Dispatch as D;
    let e = D::float_exp(D::float_neg(D::float_abs(x.clone())));
    let one_plus = D::float_add_scalar(e.clone(), fscalar(1.0));
    let positive = D::float_recip(one_plus.clone());
    let negative = D::float_div(e, one_plus);
    mask(negative, D::float_greater_equal_elem(x, fscalar(0.0), BOOL), positive)
}

fn erf_ratio(x: &Prim) -> Prim {
    use erf_coeffs::*;
    let z = mul(x, x);
    Dispatch::float_div(horner(&z, &PP), horner(&z, &QQ))
}

/// erfc without the cancellation of 1 - erf(x) (which is 0 from x = 6 on and loses a digit per
/// half unit before): fdlibm's method on tensors, every branch evaluated and the right one
/// picked per element. `ratio` is erf_ratio(x).
///  - |x| < 0.84375: 1 - (x + x r), or 0.5 - ((x - 0.5) + x r) from 0.25 on (exact subtractions);
///  - |x| < 1.25: (1 - ERX) - PA/QA at |x| - 1;
///  - |x| < 28: exp(-z^2 - 0.5625) exp((z - a)(z + a) + R/S) / a, where z is a = |x| cut to a
///    few fraction bits, so z^2 and the exponent of the first exp are exact and exp(-a^2) keeps
///    full precision (plain exp(-a * a) would be off by a^2 ulps);
///  - 0 beyond (it underflows), and 2 - erfc(|x|) for negative x.
fn erfc(x: &Prim, ratio: &Prim) -> Prim {
    use erf_coeffs::*;
    use Dispatch as D;
    let a = D::float_abs(x.clone());
    let xr = mul(x, ratio);
    let below_quarter = rsub(1.0, D::float_add(x.clone(), xr.clone()));
    let above_quarter = rsub(0.5, D::float_add(D::float_sub_scalar(x.clone(), fscalar(0.5)), xr));
    let small = mask(above_quarter, below(x, 0.25), below_quarter);

    let s = D::float_sub_scalar(a.clone(), fscalar(1.0));
    let mid = rsub(1.0 - ERX, D::float_div(horner(&s, &PA), horner(&s, &QA)));

    let s = D::float_recip(mul(&a, &a));
    let rs_a = D::float_div(horner(&s, &RA), horner(&s, &SA));
    let rs_b = D::float_div(horner(&s, &RB), horner(&s, &SB));
    let rs = mask(rs_b, below(&a, 1.0 / 0.35), rs_a);
    // z has at most 5 + `cut` significant bits on a < 28, so z^2 is exact in the working type
    let cut = match dispatch::dtype(x) {
        burn::backend::DType::F64 => 20.0,
        burn::backend::DType::F32 => 7.0,
        _ => 0.0,
    };
    let scale = 2f64.powf(cut);
    let z = D::float_div_scalar(D::float_floor(D::float_mul_scalar(a.clone(), fscalar(scale))), fscalar(scale));
    let e1 = D::float_exp(D::float_sub_scalar(D::float_neg(mul(&z, &z)), fscalar(0.5625)));
    let lo = D::float_mul(D::float_sub(z.clone(), a.clone()), D::float_add(z, a.clone()));
    let e2 = D::float_exp(D::float_add(lo, rs));
    let far = D::float_div(D::float_mul(e1, e2), a.clone());

    let far = D::float_mask_fill(far, D::float_greater_equal_elem(a.clone(), fscalar(28.0), BOOL), fscalar(0.0));
    let big = mask(far, below(&a, 1.25), mid);
    let big = mask(big.clone(), below(x, 0.0), rsub(2.0, big));
    mask(big, below(&a, 0.84375), small)
}

/// Burn has no erf⁻¹. Start from Giles' single-precision polynomials in w = -ln(1 - y^2)
/// ("Approximating the erfinv function", 2010; relative error 1.3e-7 for w < 16) and, for
/// 16 <= w <= 37 (|y| from 1 - 5.6e-8 to 1 - 2^-53, beyond Giles' fit), a degree-6 Chebyshev
/// fit in sqrt(w) made with mpmath (relative error 8.6e-9); then one Halley step on
/// erf(x) = |y|, which cubes the error. The residual is erf(x) - |y| for |y| <= 0.5 and
/// (1 - |y|) - erfc(x) above (1 - |y| is exact there), both from the fdlibm forms above, so it
/// keeps its relative precision up to |y| = 1 - 2^-53: the result is within a few ulps in f64
/// (measured max relative error 2.2e-16 on (-1, 1)). |y| = 1 gives +-inf, |y| > 1 NaN.
fn erf_inv(y: Prim) -> Prim {
    use Dispatch as D;
    let a = D::float_abs(y.clone());
    let q = rsub(1.0, a.clone());
    let w = D::float_neg(D::float_log(D::float_mul(q.clone(), D::float_add_scalar(a.clone(), fscalar(1.0)))));
    let central = horner(
        &D::float_sub_scalar(w.clone(), fscalar(2.5)),
        &[2.810_226_36e-08, 3.432_739_39e-07, -3.523_387_7e-06, -4.391_506_54e-06, 0.000_218_580_87, -0.001_253_725_03, -0.004_177_681_64, 0.246_640_727, 1.501_409_41],
    );
    let root = D::float_sqrt(w.clone());
    let tail = horner(
        &D::float_sub_scalar(root.clone(), fscalar(3.0)),
        &[-0.000_200_214_257, 0.000_100_950_558, 0.001_349_343_22, -0.003_673_428_44, 0.005_739_507_73, -0.007_622_461_3, 0.009_438_870_47, 1.001_674_06, 2.832_976_82],
    );
    let far = horner(
        &D::float_sub_scalar(root, fscalar(5.0)),
        &[4.663_697_014_348_731e-06, -2.171_706_772_022_097e-05, 7.622_050_612_533_89e-05, -2.139_176_792_530_003_5e-04, -1.388_485_243_411_780_4e-04, 1.010_300_315_101_057, 4.849_906_409_079_944],
    );
    let p = mask(mask(far, below(&w, 16.0), tail), below(&w, 5.0), central);
    let x = D::float_mul(p, a.clone());

    let ratio = erf_ratio(&x);
    let erf_x = D::float_add(x.clone(), mul(&x, &ratio));
    let residual = mask(
        D::float_sub(q, erfc(&x, &ratio)),
        D::float_lower_equal_elem(a.clone(), fscalar(0.5), BOOL),
        D::float_sub(erf_x, a.clone()),
    );
    let slope = D::float_mul_scalar(D::float_exp(D::float_neg(mul(&x, &x))), fscalar(2.0 / std::f64::consts::PI.sqrt()));
    let u = D::float_div(residual, slope);
    let x = D::float_sub(x.clone(), D::float_div(u.clone(), D::float_add_scalar(mul(&x, &u), fscalar(1.0))));

    let x = D::float_mask_fill(x, D::float_equal_elem(a, fscalar(1.0), BOOL), fscalar(f64::INFINITY));
    // negative y, -0 included (1/-0 = -inf)
    let negative = below(&D::float_recip(y), 0.0);
    mask(x.clone(), negative, D::float_neg(x))
}

fn bits(ty: NxType) -> i64 {
    ty.bytes() as i64 * 8
}

/// Binary search on the top bits: shift left while the top `s` bits are zero.
fn count_leading_zeros(t: Prim, ty: NxType) -> Prim {
    use Dispatch as D;
    let w = bits(ty);
    let int = |v: i64| ty.scalar(v);
    let is_zero = D::int_equal_elem(t.clone(), int(0), BOOL);
    let (mut x, mut n) = (t.clone(), D::int_mul_scalar(t, int(0)));
    let mut s = w / 2;
    while s >= 1 {
        // Arithmetic shifts of negatives are never zero, which is right: their top bit is set.
        let top_clear = D::int_equal_elem(D::bitwise_right_shift_scalar(x.clone(), int(w - s)), int(0), BOOL);
        n = D::int_mask_where(n.clone(), top_clear.clone(), D::int_add_scalar(n, int(s)));
        x = D::int_mask_where(x.clone(), top_clear, D::bitwise_left_shift_scalar(x, int(s)));
        s /= 2;
    }
    D::int_mask_fill(n, is_zero, int(w))
}

fn population_count(t: Prim, ty: NxType) -> Prim {
    use Dispatch as D;
    let int = |v: i64| ty.scalar(v);
    let bit = |i: i64| D::bitwise_and_scalar(D::bitwise_right_shift_scalar(t.clone(), int(i)), int(1));
    (1..bits(ty)).fold(bit(0), |acc, i| D::int_add(acc, bit(i)))
}

fn int_unary(op: UnaryOp, t: Prim, ty: NxType) -> ExResult<Prim> {
    Ok(match op {
        UnaryOp::Abs if ty.is_unsigned() => t,
        UnaryOp::Abs => Dispatch::int_abs(t),
        // Burn's int_neg multiplies by the scalar -1, which the GPU backends cannot convert to an
        // unsigned type; !x + 1 is Nx's result modulo 2^bits on every backend.
        UnaryOp::Negate if ty.is_unsigned() => Dispatch::int_add_scalar(Dispatch::bitwise_not(t), Scalar::UInt(1)),
        UnaryOp::Negate => Dispatch::int_neg(t),
        UnaryOp::Sign if ty.is_unsigned() => dispatch::cast(dispatch::pred(dispatch::to_bool(t)), ty.dtype()),
        UnaryOp::Sign => Dispatch::int_sign(t),
        UnaryOp::Square => Dispatch::int_mul(t.clone(), t),
        UnaryOp::BitwiseNot => Dispatch::bitwise_not(t),
        UnaryOp::CountLeadingZeros => count_leading_zeros(t, ty),
        UnaryOp::PopulationCount => population_count(t, ty),
        // Rounding an integer is the identity in Nx.
        UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round => t,
        UnaryOp::IsNan | UnaryOp::IsInfinity => dispatch::pred(Dispatch::int_not_equal(t.clone(), t, BOOL)),
        _ => return Err(unknown(op.name(), "unary")),
    })
}

fn unknown(op: &str, family: &str) -> ExError {
    ExError::invalid_with(
        format!("unknown or unsupported {family} op for this type"),
        vec![("op", crate::error::Detail::Text(op.to_string()))],
    )
}

/// `op` applied to `h` cast to `out` (Elixir computes Nx's result type). The predicates
/// (`logical_not`, `is_nan`, `is_infinity`) look at the input as it is and return u8.
pub fn unary(op: UnaryOp, h: &Handle, out: NxType) -> ExResult<Handle> {
    let predicate = op.is_predicate();
    let out = if predicate { PRED } else { out };
    h.device.check_type(out)?;
    check_f64_math(op.name(), op.f64_exact(), if predicate { h.ty } else { out }, h.device)?;
    if h.numel() == 0 {
        return empty(h.shape.clone(), out, h.device);
    }
    let prim = match op {
        UnaryOp::LogicalNot => dispatch::pred(by_kind!(h.prim.clone(), float_equal_elem, int_equal_elem, dispatch::zero_of(h.ty.dtype()), BOOL)),
        UnaryOp::IsNan | UnaryOp::IsInfinity if h.ty.is_float() => float_unary(op, h.prim.clone())?,
        UnaryOp::IsNan | UnaryOp::IsInfinity => int_unary(op, h.prim.clone(), h.ty)?,
        // Composites of several kernels (Halley steps, erfc's branches, the tanh form of expm1)
        // round at every step; narrow floats are computed in f64 and rounded once, as
        // BinaryBackend does (in f32 where the device has no f64 math).
        _ if COMPOSITES.contains(&op) && out.is_float() && composite_type(out, h.device)?.is_some() => {
            float_unary(op, cast_to(h, composite_type(out, h.device)?.unwrap_or(out)))?
        }
        _ => {
            let x = cast_to(h, out);
            if out.is_float() { float_unary(op, x)? } else { int_unary(op, x, out)? }
        }
    };
    Ok(Handle::new(dispatch::cast(prim, out.dtype()), out, h.shape.clone(), h.device))
}

/// The wider type a composite runs in for float result type `out`: f64 where the device does f64
/// math, else f32 for f16/bf16; None where `out` is already the widest available.
fn composite_type(out: NxType, device: crate::device::DeviceRef) -> ExResult<Option<NxType>> {
    let f64 = NxType::F(64);
    Ok(if out == f64 {
        None
    } else if device.f64_math() && device.supports(f64)? {
        Some(f64)
    } else if out != NxType::F(32) && device.supports(NxType::F(32))? {
        Some(NxType::F(32))
    } else {
        None
    })
}

/// Fails when an integer divisor holds a zero (Nx raises there; GPU kernels would return junk).
fn check_nonzero_divisor(b: &Prim) -> ExResult<()> {
    let zeros = Dispatch::int_equal_elem(b.clone(), dispatch::zero_of(dispatch::dtype(b)), BOOL);
    let any = dispatch::into_data(Dispatch::bool_any(zeros))?;
    if any.as_bytes().iter().any(|x| *x != 0) {
        return Err(ExError::invalid("integer division by zero"));
    }
    Ok(())
}

fn compare(op: BinaryOp, a: Prim, b: Prim) -> Prim {
    let bool_prim = match op {
        BinaryOp::Equal => by_kind2!(a, b, float_equal, int_equal, BOOL),
        BinaryOp::NotEqual => by_kind2!(a, b, float_not_equal, int_not_equal, BOOL),
        BinaryOp::Greater => by_kind2!(a, b, float_greater, int_greater, BOOL),
        BinaryOp::Less => by_kind2!(a, b, float_lower, int_lower, BOOL),
        BinaryOp::GreaterEqual => by_kind2!(a, b, float_greater_equal, int_greater_equal, BOOL),
        _ => by_kind2!(a, b, float_lower_equal, int_lower_equal, BOOL),
    };
    dispatch::pred(bool_prim)
}

fn logical(op: BinaryOp, a: Prim, b: Prim) -> Prim {
    let (a, b) = (dispatch::to_bool(a), dispatch::to_bool(b));
    let bool_prim = match op {
        BinaryOp::LogicalAnd => Dispatch::bool_and(a, b),
        BinaryOp::LogicalOr => Dispatch::bool_or(a, b),
        _ => Dispatch::bool_xor(a, b),
    };
    dispatch::pred(bool_prim)
}

/// Nx's remainder takes the dividend's sign (C fmod); Burn's takes the divisor's (Python). They
/// differ by exactly one divisor where the signs disagree and the result is non-zero.
fn remainder(a: Prim, b: Prim) -> Prim {
    let float = dispatch::is_float(&a);
    // f32 and f64, the types its test holds it to on the card; halves keep the composition
    #[cfg(feature = "cuda")]
    if matches!(dispatch::dtype(&a), burn::backend::DType::F32 | burn::backend::DType::F64) && crate::gpu::dispatch_on_cuda(&a) && crate::gpu::dispatch_on_cuda(&b) {
        return crate::gpu::cuda::fmod::fmod(a, b);
    }
    let dividend = a.clone();
    let zero = dispatch::zero_of(dispatch::dtype(&a));
    let r = by_kind2!(a.clone(), b.clone(), float_remainder, int_remainder);
    let r_neg = by_kind!(r.clone(), float_lower_elem, int_lower_elem, zero, BOOL);
    let a_neg = by_kind!(a, float_lower_elem, int_lower_elem, zero, BOOL);
    let nonzero = by_kind!(r.clone(), float_not_equal_elem, int_not_equal_elem, zero, BOOL);
    let fix = Dispatch::bool_and(Dispatch::bool_xor(r_neg, a_neg), nonzero);
    let adjusted = if float { Dispatch::float_sub(r.clone(), b.clone()) } else { Dispatch::int_sub(r.clone(), b.clone()) };
    let out = dispatch::select(fix, adjusted, r);
    if !float {
        return out;
    }
    // fmod(x, y) = x exactly wherever |x| < |y|, where the floored remainder and its fix-up
    // round twice (remainder(3.86, -1e30) came out 0: 3.86 - 1e30 + 1e30). That also covers
    // fmod(x, +-inf) = x for finite x, where Burn's remainder gives +-inf or NaN. NaN compares
    // false, so NaN operands keep the NaN result.
    let keep = Dispatch::float_lower(Dispatch::float_abs(dividend.clone()), Dispatch::float_abs(b), BOOL);
    let out = Dispatch::float_mask_where(out, keep, dividend.clone());
    // A zero remainder has the dividend's sign (C fmod(-4, 2) = -0). Burn's floored remainder
    // a - b floor(a / b) gives +0 on cube devices; x * 0 is the dividend's signed zero for every
    // finite x, and an infinite or NaN dividend never leaves a zero remainder.
    let zero = Dispatch::float_equal_elem(out.clone(), fscalar(0.0), BOOL);
    Dispatch::float_mask_where(out, zero, Dispatch::float_mul_scalar(dividend, fscalar(0.0)))
}

fn arith(op: BinaryOp, a: Prim, b: Prim, ty: NxType) -> ExResult<Prim> {
    let float = ty.is_float();
    let int_only = |what: &str| -> ExResult<()> {
        if float {
            Err(ExError::invalid(format!("{what} needs integer operands, got {ty}")))
        } else {
            Ok(())
        }
    };
    Ok(match op {
        BinaryOp::Add => by_kind2!(a, b, float_add, int_add),
        BinaryOp::Subtract => by_kind2!(a, b, float_sub, int_sub),
        BinaryOp::Multiply => by_kind2!(a, b, float_mul, int_mul),
        BinaryOp::Divide if float => Dispatch::float_div(a, b),
        BinaryOp::Divide | BinaryOp::Quotient => {
            int_only(op.name())?;
            check_nonzero_divisor(&b)?;
            Dispatch::int_div(a, b)
        }
        BinaryOp::Remainder => {
            if !float {
                check_nonzero_divisor(&b)?;
            }
            remainder(a, b)
        }
        BinaryOp::Pow if float => Dispatch::float_powf(a, b),
        BinaryOp::Pow => Dispatch::int_powi(a, b),
        BinaryOp::Max | BinaryOp::Min if float => {
            // b where it wins or is NaN, else a (also NaN when a is): Nx propagates NaN, and a
            // comparison with NaN is false. Four passes; ties keep a. The CPU's f32/f64 kernel
            // (`kernels::cpu::vector::Arith::Max`) follows the same rule in one.
            let b_wins = if op == BinaryOp::Max {
                Dispatch::float_lower(a.clone(), b.clone(), BOOL)
            } else {
                Dispatch::float_greater(a.clone(), b.clone(), BOOL)
            };
            let take_b = Dispatch::bool_or(b_wins, Dispatch::float_is_nan(b.clone(), BOOL));
            dispatch::select(take_b, b, a)
        }
        BinaryOp::Max | BinaryOp::Min => {
            let a_wins = if op == BinaryOp::Max {
                by_kind2!(a.clone(), b.clone(), float_greater_equal, int_greater_equal, BOOL)
            } else {
                by_kind2!(a.clone(), b.clone(), float_lower_equal, int_lower_equal, BOOL)
            };
            dispatch::select(a_wins, a, b)
        }
        BinaryOp::Atan2 if float => Dispatch::float_atan2(a, b),
        BinaryOp::BitwiseAnd | BinaryOp::BitwiseOr | BinaryOp::BitwiseXor | BinaryOp::LeftShift | BinaryOp::RightShift => {
            int_only(op.name())?;
            match op {
                BinaryOp::BitwiseAnd => Dispatch::bitwise_and(a, b),
                BinaryOp::BitwiseOr => Dispatch::bitwise_or(a, b),
                BinaryOp::BitwiseXor => Dispatch::bitwise_xor(a, b),
                BinaryOp::LeftShift => Dispatch::bitwise_left_shift(a, b),
                _ if ty.is_unsigned() => Dispatch::bitwise_right_shift(a, b),
                _ => arithmetic_right_shift(a, b),
            }
        }
        _ => return Err(unknown(op.name(), "binary")),
    })
}

/// Nx shifts signed integers arithmetically (the sign fills in). CubeCL's CUDA kernel shifts
/// logically (-16 >> 2 came out 1073741820), so negatives go through !x, which is non-negative
/// and shifts the same either way: x >> n = !(!x >> n) for x < 0.
fn arithmetic_right_shift(a: Prim, b: Prim) -> Prim {
    use Dispatch as D;
    let negative = D::int_lower_elem(a.clone(), Scalar::Int(0), BOOL);
    let magnitude = D::int_mask_where(a.clone(), negative.clone(), D::bitwise_not(a));
    let shifted = D::bitwise_right_shift(magnitude, b);
    D::int_mask_where(shifted.clone(), negative, D::bitwise_not(shifted))
}

pub fn binary(op: BinaryOp, a: &Handle, b: &Handle, ty: NxType) -> ExResult<Handle> {
    if matches!(op, BinaryOp::LeftShift | BinaryOp::RightShift) {
        check_shift(op, b)?;
    }
    let (device, [a, b]) = colocate([a, b])?;
    let (a, b) = (a.as_ref(), b.as_ref());
    device.check_type(ty)?;
    check_f64_math(op.name(), op.f64_exact(), ty, device)?;
    let shape = broadcast_shape(&a.shape, &b.shape)?;
    let is_pred = op.is_comparison() || op.is_logical();
    let out_ty = if is_pred { PRED } else { ty };
    check_alloc(&shape, out_ty)?;
    if numel(&shape) == 0 {
        return empty(shape, out_ty, device);
    }
    // f32/f64 arithmetic on the CPU: parallel, broadcasting rows without expanding them
    if device.kind == crate::device::DeviceKind::Cpu && matches!(ty, NxType::F(32) | NxType::F(64)) {
        use crate::kernels::cpu::vector::{arith, Arith};
        let kernel_op = match op {
            BinaryOp::Add => Some(Arith::Add),
            BinaryOp::Subtract => Some(Arith::Sub),
            BinaryOp::Multiply => Some(Arith::Mul),
            BinaryOp::Divide => Some(Arith::Div),
            BinaryOp::Max => Some(Arith::Max),
            BinaryOp::Min => Some(Arith::Min),
            _ => None,
        };
        if let Some(prim) = kernel_op.and_then(|k| arith(k, &a.prim, &a.shape, &b.prim, &b.shape, &shape)) {
            return Ok(Handle::new(prim, ty, shape, device));
        }
        if op == BinaryOp::Pow && a.ty == ty {
            let exponent = dispatch::cast(b.prim.clone(), ty.dtype());
            if let Some(prim) = crate::kernels::cpu::vector::pow(&a.prim, &a.shape, &exponent, &shape) {
                return Ok(Handle::new(prim, ty, shape, device));
            }
        }
    }
    let pa = dispatch::cast(broadcast_prim(a, &shape), ty.dtype());
    let pb = dispatch::cast(broadcast_prim(b, &shape), ty.dtype());
    let prim = if op.is_comparison() {
        compare(op, pa, pb)
    } else if op.is_logical() {
        logical(op, pa, pb)
    } else {
        arith(op, pa, pb, ty)?
    };
    Ok(Handle::new(prim, out_ty, shape, device))
}

/// Nx: a negative shift amount is an ArgumentError (BinaryBackend's message), not a
/// device-defined result.
fn check_shift(op: BinaryOp, amount: &Handle) -> ExResult<()> {
    if let NxType::S(_) = amount.ty {
        if let Some(min) = read_ints(amount)?.into_iter().min() {
            if min < 0 {
                let verb = if op == BinaryOp::LeftShift { "left" } else { "right" };
                return Err(ExError::NxArgument(format!("cannot {verb} shift by {min}")));
            }
        }
    }
    Ok(())
}

pub fn select(p: &Handle, t: &Handle, f: &Handle, ty: NxType) -> ExResult<Handle> {
    let (device, [p, t, f]) = colocate([p, t, f])?;
    let (p, t, f) = (p.as_ref(), t.as_ref(), f.as_ref());
    device.check_type(ty)?;
    let shape = broadcast_shape(&broadcast_shape(&p.shape, &t.shape)?, &f.shape)?;
    check_alloc(&shape, ty)?;
    if numel(&shape) == 0 {
        return empty(shape, ty, device);
    }
    let mask = broadcast_prim(p, &shape);
    let pt = dispatch::cast(broadcast_prim(t, &shape), ty.dtype());
    let pf = dispatch::cast(broadcast_prim(f, &shape), ty.dtype());
    Ok(Handle::new(dispatch::select(mask, pt, pf), ty, shape, device))
}

/// Nx.clip: bounds broadcast to the tensor's shape, result in the tensor's type.
/// Nx.clip: the tensor and both bounds are taken in `ty`, the result type.
pub fn clip(h: &Handle, lo: &Handle, hi: &Handle, ty: NxType) -> ExResult<Handle> {
    let (h, lo, hi) = (&as_type(h, ty)?, &as_type(lo, ty)?, &as_type(hi, ty)?);
    for bound in [lo, hi] {
        if broadcast_shape(&h.shape, &bound.shape)? != h.shape {
            return Err(ExError::Broadcast { lhs: h.shape.clone(), rhs: bound.shape.clone() });
        }
    }
    let low = binary(BinaryOp::Max, h, lo, h.ty)?;
    binary(BinaryOp::Min, &low, hi, h.ty)
}

/// Nx's max/min of a float tensor and a non-NaN constant, in one pass. flex's clamps test
/// `is_nan` first, so NaN stays NaN as in Nx; GPU clamps make no such promise, so the program
/// only uses this on the CPU.
pub fn clamp_scalar(h: &Handle, max: bool, bound: f64) -> ExResult<Handle> {
    if !h.ty.is_float() || bound.is_nan() {
        return Err(ExError::invalid("clamp_scalar needs a float tensor and a non-NaN bound"));
    }
    let prim = if max {
        Dispatch::float_clamp_min(h.prim.clone(), Scalar::Float(bound))
    } else {
        Dispatch::float_clamp_max(h.prim.clone(), Scalar::Float(bound))
    };
    Ok(Handle::new(prim, h.ty, h.shape.clone(), h.device))
}

/// Nx.as_type: float to int truncates toward zero, int to narrower int wraps.
pub fn as_type(h: &Handle, ty: NxType) -> ExResult<Handle> {
    h.device.check_type(ty)?;
    if h.numel() == 0 {
        return empty(h.shape.clone(), ty, h.device);
    }
    Ok(Handle::new(cast_to(h, ty), ty, h.shape.clone(), h.device))
}

/// The values of an integer tensor, read back to the host.
pub fn read_ints(h: &Handle) -> ExResult<Vec<i64>> {
    if h.numel() == 0 {
        return Ok(Vec::new());
    }
    let bytes = as_type(h, NxType::S(64))?.to_bytes()?;
    Ok(bytes.chunks_exact(8).map(|c| i64::from_ne_bytes(c.try_into().expect("8 bytes"))).collect())
}


#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;

    #[test]
    fn float_min_max_propagate_nan() {
        let a = f32s(&[f32::NAN, 1.0, 2.0], &[3]);
        let b = f32s(&[f32::INFINITY, f32::NAN, 0.5], &[3]);
        for op in [BinaryOp::Min, BinaryOp::Max] {
            let r = floats(&binary(op, &a, &b, NxType::F(32)).unwrap());
            assert!(r[0].is_nan() && r[1].is_nan(), "{op}: {r:?}");
            assert_eq!(r[2], if op == BinaryOp::Min { 0.5 } else { 2.0 });
        }
    }

    /// Past the CPU kernel's size threshold, max and min of f32 and f64 give the composition's
    /// bits (the rule every other device runs) over NaN, ±0, ±inf, ties and ordinary values,
    /// full, scalar, row and column operands alike; ties keep the first operand's zero.
    #[test]
    fn float_min_max_kernel_equals_the_composition() {
        let specials = [f64::NAN, 0.0, -0.0, f64::INFINITY, f64::NEG_INFINITY, 1.5, -2.25, 1.5];
        let value = |i: usize, salt: usize| if (i * 7 + salt) % 5 == 0 { specials[(i + salt) % specials.len()] } else { (((i * 31 + salt) % 97) as f64 - 48.0) * 0.25 };
        let (rows, cols) = (96, 64);
        let full: Vec<f64> = (0..rows * cols).map(|i| value(i, 0)).collect();
        let operands: [(Vec<f64>, Vec<usize>); 4] = [
            ((0..rows * cols).map(|i| value(i, 3)).collect(), vec![rows, cols]),
            (vec![0.0], vec![]),
            ((0..cols).map(|i| value(i, 1)).collect(), vec![cols]),
            ((0..rows).map(|i| value(i, 2)).collect(), vec![rows, 1]),
        ];
        for ty in [NxType::F(32), NxType::F(64)] {
            let make = |v: &[f64], shape: &[usize]| as_type(&f64s(v, shape), ty).unwrap();
            let x = make(&full, &[rows, cols]);
            for (v, shape) in &operands {
                let y = make(v, shape);
                for op in [BinaryOp::Max, BinaryOp::Min] {
                    for (a, b) in [(&x, &y), (&y, &x)] {
                        let got = floats(&binary(op, a, b, ty).unwrap());
                        let out = broadcast_shape(&a.shape, &b.shape).unwrap();
                        let composed = arith(op, broadcast_prim(a, &out), broadcast_prim(b, &out), ty).unwrap();
                        let want = floats(&Handle::new(composed, ty, out, a.device));
                        assert_eq!(got.len(), rows * cols);
                        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                            assert!(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()), "{op} {ty} {shape:?} at {k}: {g} vs {w}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn binary_broadcasts_like_nx() {
        let a = f32s(&[1.0, 2.0, 3.0], &[3, 1]);
        let b = f32s(&[10.0, 20.0], &[2]);
        let c = binary(BinaryOp::Add, &a, &b, NxType::F(32)).unwrap();
        assert_eq!(c.shape, vec![3, 2]);
        assert_eq!(floats(&c), vec![11.0, 21.0, 12.0, 22.0, 13.0, 23.0]);
        let err = binary(BinaryOp::Add, &f32s(&[1.0, 2.0], &[2]), &f32s(&[1.0, 2.0, 3.0], &[3]), NxType::F(32)).unwrap_err();
        assert!(matches!(err, ExError::Broadcast { .. }));
    }

    #[test]
    fn remainder_takes_the_sign_of_the_dividend() {
        let a = i64s(&[7, -7, 7, -7], &[4]);
        let b = i64s(&[3, 3, -3, -3], &[4]);
        assert_eq!(ints(&binary(BinaryOp::Remainder, &a, &b, NxType::S(64)).unwrap()), vec![1, -1, 1, -1]);
        let fa = f32s(&[5.5, -5.5], &[2]);
        let fb = f32s(&[2.0, 2.0], &[2]);
        assert_eq!(floats(&binary(BinaryOp::Remainder, &fa, &fb, NxType::F(32)).unwrap()), vec![1.5, -1.5]);
        // |x| < |y|: x itself, however far apart the magnitudes (C fmod)
        let small = f32s(&[3.863_054, -3.863_054, 0.5], &[3]);
        let huge = f32s(&[-1.0e30, 1.0e30, -2.0], &[3]);
        let want: Vec<f64> = [3.863_054_f32, -3.863_054, 0.5].iter().map(|&v| v as f64).collect();
        assert_eq!(floats(&binary(BinaryOp::Remainder, &small, &huge, NxType::F(32)).unwrap()), want);
        assert_eq!(ints(&binary(BinaryOp::Quotient, &a, &b, NxType::S(64)).unwrap()), vec![2, -2, -2, 2]);
    }

    #[test]
    fn integer_division_by_zero_is_an_error() {
        let err = binary(BinaryOp::Quotient, &i64s(&[1], &[1]), &i64s(&[0], &[1]), NxType::S(64)).unwrap_err();
        assert!(err.to_string().contains("division by zero"), "{err}");
    }

    #[test]
    fn comparisons_and_logic_return_u8() {
        let a = f32s(&[1.0, 2.0, 3.0], &[3]);
        let b = f32s(&[2.0], &[]);
        let c = binary(BinaryOp::Greater, &a, &b, NxType::F(32)).unwrap();
        assert_eq!((c.ty, c.to_bytes().unwrap()), (PRED, vec![0, 0, 1]));
        let d = binary(BinaryOp::LogicalXor, &a, &f32s(&[0.0, 1.0, 0.0], &[3]), NxType::F(32)).unwrap();
        assert_eq!(d.to_bytes().unwrap(), vec![1, 0, 1]);
    }

    #[test]
    fn round_is_half_away_from_zero_and_expm1_is_precise() {
        let x = f32s(&[0.5, 1.5, 2.5, -0.5, -2.5, 0.49999997], &[6]);
        assert_eq!(floats(&unary(UnaryOp::Round, &x, NxType::F(32)).unwrap()), vec![1.0, 2.0, 3.0, -1.0, -3.0, 0.0]);
        let small = unary(UnaryOp::Expm1, &f32s(&[1e-7, 2.0], &[2]), NxType::F(32)).unwrap();
        assert_close(&floats(&small), &[1e-7, 2.0f64.exp_m1()], 1e-6);
    }

    #[test]
    fn unary_on_ints_casts_to_the_out_type() {
        let x = i64s(&[-2, 0, 3], &[3]);
        assert_eq!(ints(&unary(UnaryOp::Abs, &x, NxType::S(64)).unwrap()), vec![2, 0, 3]);
        let e = unary(UnaryOp::Exp, &x, NxType::F(32)).unwrap();
        assert_eq!(e.ty, NxType::F(32));
        assert_close(&floats(&e), &[(-2f64).exp(), 1.0, 3f64.exp()], 1e-6);
    }

    fn f64_op(op: UnaryOp, x: &[f64]) -> Vec<f64> {
        floats(&unary(op, &f64s(x, &[x.len()]), NxType::F(64)).unwrap())
    }

    /// Asserts bit-identical values (NaN matches any NaN; the sign of zero counts).
    fn assert_same(got: &[f64], want: &[f64]) {
        for (g, w) in got.iter().zip(want) {
            assert!(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()), "got {got:?}, want {want:?}");
        }
    }

    fn assert_rel(got: &[f64], want: &[f64], tol: f64) {
        for (g, w) in got.iter().zip(want) {
            assert!(((g - w) / w).abs() <= tol, "got {g:e}, want {w:e} (relative error {:e})", ((g - w) / w).abs());
        }
    }

    #[test]
    fn erf_inv_is_f64_accurate_up_to_one() {
        if !device().f64_math() {
            let err = unary(UnaryOp::ErfInv, &f64s(&[0.5], &[1]), NxType::F(64)).unwrap_err();
            assert!(err.to_string().contains("no f64 transcendental"), "{err}");
            return;
        }
        // references: mpmath.erfinv at 300 bits, rounded to f64
        let y = [0.5, -0.25, 0.999, 1.0 - f64::EPSILON / 2.0, 0.999_999_999_999, 1e-300, 0.1];
        let want = [0.476_936_276_204_469_9, -0.225_312_055_012_178_1, 2.326_753_765_513_524_6, 5.863_584_748_755_167_6, 5.042_031_898_572_696, 8.862_269_254_527_58e-301, 0.088_855_990_494_257_69];
        assert_rel(&f64_op(UnaryOp::ErfInv, &y), &want, 1e-15);
        let edges = [1.0, -1.0, 0.0, -0.0, 2.0, -1.5, f64::INFINITY, f64::NAN];
        let want = [f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0, f64::NAN, f64::NAN, f64::NAN, f64::NAN];
        assert_same(&f64_op(UnaryOp::ErfInv, &edges), &want);
    }

    #[test]
    fn erfc_is_f64_accurate_where_one_minus_erf_underflows() {
        if !device().f64_math() {
            return; // f64 exp is refused there, as erf_inv_is_f64_accurate_up_to_one checks
        }
        // references: mpmath.erfc at 300 bits, rounded to f64
        let x = [0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 26.5, -1.0, -5.0, 1e-20];
        let want = [0.479_500_122_186_953_5, 0.157_299_207_050_285_13, 0.004_677_734_981_047_266, 2.209_049_699_858_544e-05, 1.537_459_794_428_035e-12, 2.088_487_583_762_545e-45, 2.210_907_664_263_734_3e-307, 1.842_700_792_949_714_8, 1.999_999_999_998_462_6, 1.0];
        assert_rel(&f64_op(UnaryOp::Erfc, &x), &want, 1e-15);
        // erfc(27) = 5.2370489e-319 is subnormal: within an ulp (4.9e-324)
        let sub = f64_op(UnaryOp::Erfc, &[27.0])[0];
        assert!((sub - 5.237_05e-319).abs() <= 5e-324, "{sub:e}");
        let edges = [f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 0.0, -0.0, 28.0, -30.0];
        assert_same(&f64_op(UnaryOp::Erfc, &edges), &[0.0, 2.0, f64::NAN, 1.0, 1.0, 0.0, 2.0]);
    }

    #[test]
    fn log1p_is_accurate_near_zero_and_exact_at_its_edges() {
        if !device().f64_math() {
            return; // f64 log is refused there, as erf_inv_is_f64_accurate_up_to_one checks
        }
        let got = f64_op(UnaryOp::Log1p, &[2.0, 1e-10, -0.5, -1.0 + f64::EPSILON]);
        assert_eq!(got[0], 3f64.ln());
        // naive log(1 + 1e-10) is off by 8e-7 relative; the corrected form by at most an ulp
        // (references: mpmath.log1p)
        assert_rel(&got[1..], &[9.999_999_999_500_001e-11, -std::f64::consts::LN_2, -36.043_653_389_117_15], 2.3e-16);
        let edges = [0.0, -0.0, -1.0, f64::INFINITY, -2.0, f64::NEG_INFINITY, f64::NAN, 1e-300, -1e-300];
        let want = [0.0, -0.0, f64::NEG_INFINITY, f64::INFINITY, f64::NAN, f64::NAN, f64::NAN, 1e-300, -1e-300];
        assert_same(&f64_op(UnaryOp::Log1p, &edges), &want);
    }

    #[test]
    fn inverse_hyperbolics_hold_at_their_edges() {
        if !device().f64_math() {
            return;
        }
        // references: mpmath at 300 bits. Rust's formulas give atanh(-(1 - 2^-53)) = -18.368 (1 - x
        // rounds), acosh(1 + 2^-52) 4e-9 off (log near 1), and asinh/acosh(f64::MAX) = inf.
        let big = f64::MAX;
        assert_rel(&f64_op(UnaryOp::Atanh, &[-(1.0 - f64::EPSILON / 2.0), 0.5, 1e-10]), &[-18.714_973_875_118_524, 0.549_306_144_334_054_9, 1e-10], 2.3e-16);
        assert_rel(&f64_op(UnaryOp::Acosh, &[1.0 + f64::EPSILON, big, 2.0]), &[2.107_342_425_544_701_4e-08, 710.475_860_073_944, 1.316_957_896_924_816_8], 2.3e-16);
        assert_rel(&f64_op(UnaryOp::Asinh, &[big, -big, 1e-10, 3.0]), &[710.475_860_073_944, -710.475_860_073_944, 1e-10, 1.818_446_459_232_066_8], 2.3e-16);
        let (inf, nan) = (f64::INFINITY, f64::NAN);
        assert_same(&f64_op(UnaryOp::Atanh, &[1.0, -1.0, -0.0, 1.5, nan, 3.4e38, -1e300]), &[inf, -inf, -0.0, nan, nan, nan, nan]);
        assert_same(&f64_op(UnaryOp::Acosh, &[1.0, 0.5, -big, inf, -inf, nan]), &[0.0, nan, nan, inf, nan, nan]);
        assert_same(&f64_op(UnaryOp::Asinh, &[-0.0, inf, -inf, nan]), &[-0.0, inf, -inf, nan]);
    }

    #[test]
    fn cbrt_and_sign_keep_zeros_and_nan() {
        if !device().f64_math() {
            return;
        }
        let (inf, nan) = (f64::INFINITY, f64::NAN);
        // powf(x, 1/3) alone is 58 ulps off at 1e-300; the Newton step leaves at most one
        assert_rel(&f64_op(UnaryOp::Cbrt, &[1e300, 1e-300, -8.0, 5e-324]), &[1e100, 1e-100, -2.0, 1.703_183_936_003_260_3e-108], 2.3e-16);
        assert_same(&f64_op(UnaryOp::Cbrt, &[-0.0, 0.0, inf, -inf, nan, 27.0]), &[-0.0, 0.0, inf, -inf, nan, 3.0]);
        assert_same(&f64_op(UnaryOp::Sign, &[-0.0, 0.0, nan, -3.0, inf]), &[-0.0, 0.0, nan, -1.0, 1.0]);
    }

    #[test]
    fn float_remainder_by_an_infinity_is_the_dividend() {
        let (inf, nan) = (f32::INFINITY, f32::NAN);
        let a = f32s(&[-1.5, 2.0, 0.0, inf, nan, -4.0], &[6]);
        let b = f32s(&[inf, -inf, inf, inf, inf, 2.0], &[6]);
        let got: Vec<f64> = floats(&binary(BinaryOp::Remainder, &a, &b, NxType::F(32)).unwrap());
        assert_same(&got, &[-1.5, 2.0, 0.0, f64::NAN, f64::NAN, -0.0]);
    }

    /// Remainders whose quotients run far past the mantissa, signed zeros, infinities, NaN and
    /// subnormals, bit for bit against Rust's `%` (IEEE fmod, exact), in f64 and f32.
    #[test]
    fn float_remainder_is_exact_for_any_quotient() {
        use crate::device::DeviceKind;
        if matches!(device().kind, DeviceKind::Vulkan | DeviceKind::Metal | DeviceKind::Rocm) {
            return; // composed there from a - b floor(a / b), which rounds past 2^53 (guides/devices.md)
        }
        let (inf, nan) = (f64::INFINITY, f64::NAN);
        let edges = [0.0, -0.0, 1.0, -1.0, 3.25, -3.25, 7.0, 0.1, 1e-310, -5e-324, 1e30, -1e30, 1e300, 2f64.powi(53) + 2.0, inf, -inf, nan];
        let (mut xs, mut ys) = (vec![], vec![]);
        for &x in &edges {
            for &y in &edges {
                xs.push(x);
                ys.push(y);
            }
        }
        // dividends up to 1e300 over divisors down to 1e-3: quotients of up to 2^1000
        for i in 0..200 {
            xs.push((-1f64).powi(i) * 1.37f64.powi(i * 11 % 2200) * 0.731 * (1.0 + i as f64 / 97.0));
            ys.push((-1f64).powi(i / 3) * (0.001 + (i % 17) as f64 * 0.613));
        }
        // random bit patterns (every exponent, subnormals, NaN payloads), and pairs of nearby
        // magnitudes, where a rounded quotient lands on either side of an integer
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut bits = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for i in 0..4000 {
            let (x, b) = (f64::from_bits(bits()), bits());
            xs.push(x);
            ys.push(if i % 2 == 0 { f64::from_bits(b) } else { x / (1.0 + (b % 1000) as f64 * 0.37) });
        }
        let got = floats(&binary(BinaryOp::Remainder, &f64s(&xs, &[xs.len()]), &f64s(&ys, &[ys.len()]), NxType::F(64)).unwrap());
        let want: Vec<f64> = xs.iter().zip(&ys).map(|(x, y)| x % y).collect();
        assert_same(&got, &want);
        let (xs, ys): (Vec<f32>, Vec<f32>) = xs.iter().zip(&ys).map(|(&x, &y)| (x as f32, y as f32)).unzip();
        let got = floats(&binary(BinaryOp::Remainder, &f32s(&xs, &[xs.len()]), &f32s(&ys, &[ys.len()]), NxType::F(32)).unwrap());
        let want: Vec<f64> = xs.iter().zip(&ys).map(|(x, y)| (x % y) as f64).collect();
        assert_same(&got, &want);
    }

    /// The composites that replace CubeCL's kernels off the CPU (`std_math`), run here on flex
    /// against Rust's std/libm: erf, asinh, atanh within a few ulps, edges exact.
    #[test]
    fn gpu_composites_match_std_math() {
        if !device().f64_math() {
            return; // f64 references; Vulkan has no f64 transcendentals
        }
        let xs: Vec<f64> = (-400..=400).map(|i| i as f64 * 0.0137).chain([1e-10, -1e-10, 1e-300, 5.0, -27.0, 0.84375, 0.8437]).collect();
        let run = |f: fn(&Prim) -> Prim, x: &[f64]| -> Vec<f64> {
            let h = f64s(x, &[x.len()]);
            floats(&Handle::new(f(&h.prim), NxType::F(64), h.shape.clone(), h.device))
        };
        let close = |got: &[f64], want: &[f64], ulps: f64, what: &str| {
            for ((g, w), x) in got.iter().zip(want).zip(&xs) {
                assert!((g - w).abs() <= ulps * f64::EPSILON * w.abs() + 1e-300, "{what}({x}) = {g:e}, want {w:e}");
            }
        };
        close(&run(erf, &xs), &xs.iter().map(|&x| libm::erf(x)).collect::<Vec<_>>(), 4.0, "erf");
        let wide: Vec<f64> = xs.iter().map(|x| x * 60.0).collect();
        let got = run(|p| sigmoid(p.clone()), &wide);
        for (g, x) in got.iter().zip(&wide) {
            // other formulas than the composite's: tanh near 0, 1 / (1 + e^-x) in the tail
            let w = if *x >= -2.0 { 0.5 + 0.5 * (x / 2.0).tanh() } else { 1.0 / (1.0 + (-x).exp()) };
            assert!((g - w).abs() <= 4.0 * f64::EPSILON * w.abs(), "sigmoid({x}) = {g:e}, want {w:e}");
        }
        close(&run(|p| asinh(p.clone(), false), &xs), &xs.iter().map(|x| x.asinh()).collect::<Vec<_>>(), 4.0, "asinh");
        let inside: Vec<f64> = xs.iter().map(|x| x / 6.0).filter(|x| x.abs() < 1.0).collect();
        let h = f64s(&inside, &[inside.len()]);
        let got = floats(&Handle::new(atanh(h.prim.clone(), false), NxType::F(64), h.shape.clone(), h.device));
        for (g, x) in got.iter().zip(&inside) {
            let w = x.atanh();
            assert!((g - w).abs() <= 4.0 * f64::EPSILON * w.abs() + 1e-300, "atanh({x}) = {g:e}, want {w:e}");
        }
        let (inf, nan) = (f64::INFINITY, f64::NAN);
        assert_same(&run(erf, &[0.0, -0.0, inf, -inf, nan]), &[0.0, -0.0, 1.0, -1.0, nan]);
        let h = f64s(&[1.0, -1.0, -0.0, 1.5, nan], &[5]);
        let edges = floats(&Handle::new(atanh(h.prim.clone(), false), NxType::F(64), h.shape.clone(), h.device));
        assert_same(&edges, &[inf, -inf, -0.0, nan, nan]);
    }

    /// Signed right shifts fill in the sign whatever the backend's kernel does with negatives.
    #[test]
    fn arithmetic_right_shift_of_negatives() {
        let a = i64s(&[-16, -1, 16, i64::MIN, 7], &[5]);
        let n = i64s(&[2, 5, 2, 63, 1], &[5]);
        let got = Handle::new(arithmetic_right_shift(a.prim.clone(), n.prim.clone()), NxType::S(64), vec![5], a.device);
        assert_eq!(ints(&got), vec![-4, -1, 4, -1, 3]);
    }

    /// A composite run in f32 itself, as on a device without f64 math (Vulkan).
    fn f32_native(op: UnaryOp, x: &[f32]) -> Vec<f32> {
        let h = f32s(x, &[x.len()]);
        let out = Handle::new(float_unary(op, h.prim.clone()).unwrap(), NxType::F(32), h.shape.clone(), h.device);
        out.to_bytes().unwrap().chunks(4).map(|c| f32::from_ne_bytes(c.try_into().unwrap())).collect()
    }

    #[test]
    fn composites_hold_in_f32_arithmetic() {
        // Where a device has no f64 math the composites run in f32: still within a few f32 ulps
        // of the truth (references: mpmath), with the same edges.
        let ulps = |got: f32, want: f64| ((got as f64 - want) / (want as f32 as f64 * f32::EPSILON as f64 / 2.0)).abs();
        let cases: &[(UnaryOp, f32, f64)] = &[
            (UnaryOp::Erfc, 0.5, 0.479_500_122_186_953_5),
            (UnaryOp::Erfc, 2.0, 0.004_677_734_981_047_266),
            (UnaryOp::Erfc, 5.0, 1.537_459_794_428_035e-12),
            (UnaryOp::Erfc, 9.0, 4.137_031_746_513_81e-37),
            (UnaryOp::Erfc, -1.0, 1.842_700_792_949_714_8),
            (UnaryOp::ErfInv, 0.5, 0.476_936_276_204_469_9),
            (UnaryOp::ErfInv, 0.1, 0.088_855_990_494_257_69),
            (UnaryOp::ErfInv, 0.999_999_9, 3.743_921_162_776_799_4),
            (UnaryOp::Log1p, 1e-7, 9.999_999_616_860_996e-8),
            (UnaryOp::Atanh, -0.999_999_94, -8.664_339_742_098_155),
            (UnaryOp::Acosh, 1.000_000_1, 4.882_812_451_493_617e-4),
            (UnaryOp::Asinh, f32::MAX, 89.415_986_232_628_3),
        ];
        // Vulkan's exp need only be within 3 + 2|y| ulps at y (the Vulkan specification's precision
        // table), and erfc beyond 1.25 is exp(-x² - 0.5625) times a factor near 1: its error is the
        // device's exp's (11 ulps at 5 on NVIDIA's driver, 27.6 on lavapipe).
        let vulkan = crate::testing::device().kind == crate::device::DeviceKind::Vulkan;
        let exp_ulps = |op: UnaryOp, x: f32| match op {
            UnaryOp::Erfc if vulkan && x.abs() >= 1.25 => 3.0 + 2.0 * (x as f64 * x as f64 + 0.5625),
            _ => 0.0,
        };
        for (op, x, want) in cases {
            let got = f32_native(*op, &[*x])[0];
            let bound = 4.0 + exp_ulps(*op, *x);
            assert!(ulps(got, *want) <= bound, "{op}({x}) = {got}, want {want} ({} ulps)", ulps(got, *want));
        }
        let (inf, nan) = (f32::INFINITY, f32::NAN);
        let same = |op: UnaryOp, x: &[f32], want: &[f32]| {
            let got = f32_native(op, x);
            for (g, w) in got.iter().zip(want) {
                assert!(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()), "{op}: got {got:?}, want {want:?}");
            }
        };
        same(UnaryOp::Erfc, &[inf, -inf, nan, 0.0, 30.0], &[0.0, 2.0, nan, 1.0, 0.0]);
        same(UnaryOp::ErfInv, &[1.0, -1.0, -0.0, 2.0, nan], &[inf, -inf, -0.0, nan, nan]);
        same(UnaryOp::Log1p, &[-1.0, inf, -0.0, -2.0], &[-inf, inf, -0.0, nan]);
    }

    #[test]
    fn narrow_float_composites_are_correctly_rounded() {
        // erf_inv(0.1) = 0.08885599049425769; the nearest f32 is 0.08885599 (bits 0x3db5fa0f).
        let x = unary(UnaryOp::ErfInv, &f32s(&[0.1], &[1]), NxType::F(32)).unwrap();
        assert_eq!(x.ty, NxType::F(32));
        let got = f32::from_ne_bytes(x.to_bytes().unwrap()[..4].try_into().unwrap());
        let exact = 0.088_855_990_494_257_69_f64 as f32;
        if device().f64_math() {
            assert_eq!(got, exact);
        } else {
            // Without f64 math (Vulkan) the steps run in f32 on the driver's exp/log, which the
            // Vulkan spec lets be off by a few ulps each, hence a bound of several.
            let ulps = (got.to_bits() as i64 - exact.to_bits() as i64).abs();
            assert!(ulps <= 8, "{got} is {ulps} ulps from {exact}");
        }
    }

    #[test]
    fn bit_counting_ops() {
        let x = as_type(&i64s(&[1, 0, -1, 255], &[4]), NxType::S(32)).unwrap();
        assert_eq!(ints(&unary(UnaryOp::CountLeadingZeros, &x, NxType::S(32)).unwrap()), vec![31, 32, 0, 24]);
        assert_eq!(ints(&unary(UnaryOp::PopulationCount, &x, NxType::S(32)).unwrap()), vec![1, 0, 32, 8]);
        let u = as_type(&i64s(&[1, 128, 255, 16], &[4]), NxType::U(8)).unwrap();
        assert_eq!(ints(&unary(UnaryOp::CountLeadingZeros, &u, NxType::U(8)).unwrap()), vec![7, 0, 0, 3]);
        assert_eq!(ints(&unary(UnaryOp::PopulationCount, &u, NxType::U(8)).unwrap()), vec![1, 1, 8, 1]);
    }

    #[test]
    fn unsigned_negate_wraps_around() {
        for (ty, max) in [(NxType::U(8), 255i64), (NxType::U(16), 65_535), (NxType::U(32), 4_294_967_295)] {
            let u = as_type(&i64s(&[0, 1, 2, max], &[4]), ty).unwrap();
            let got = unary(UnaryOp::Negate, &u, ty).unwrap();
            assert_eq!(got.ty, ty);
            assert_eq!(ints(&got), vec![0, max, max - 1, 1], "{ty:?}");
        }
        let u = as_type(&i64s(&[0, 1, 7], &[3]), NxType::U(64)).unwrap();
        let bytes = unary(UnaryOp::Negate, &u, NxType::U(64)).unwrap().to_bytes().unwrap();
        let got: Vec<u64> = bytes.chunks(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap())).collect();
        assert_eq!(got, vec![0, u64::MAX, u64::MAX - 6]);
        let s = as_type(&i64s(&[0, 1, -7, 127], &[4]), NxType::S(8)).unwrap();
        assert_eq!(ints(&unary(UnaryOp::Negate, &s, NxType::S(8)).unwrap()), vec![0, -1, 7, -127]);
    }

    #[test]
    fn as_type_truncates_floats_toward_zero() {
        let x = f32s(&[1.9, -1.9, 300.5], &[3]);
        assert_eq!(ints(&as_type(&x, NxType::S(32)).unwrap()), vec![1, -1, 300]);
    }

    #[test]
    fn select_and_clip() {
        let p = as_type(&i64s(&[1, 0, 1], &[3]), PRED).unwrap();
        let s = select(&p, &f32s(&[1.0, 2.0, 3.0], &[3]), &f32s(&[-1.0], &[]), NxType::F(32)).unwrap();
        assert_eq!(floats(&s), vec![1.0, -1.0, 3.0]);
        let c = clip(&f32s(&[-5.0, 0.5, 5.0], &[3]), &f32s(&[0.0], &[]), &f32s(&[1.0], &[]), NxType::F(32)).unwrap();
        assert_eq!(floats(&c), vec![0.0, 0.5, 1.0]);
    }
}
