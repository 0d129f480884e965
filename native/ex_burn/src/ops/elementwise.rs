//! Elementwise NIFs: unary math, binary arithmetic/comparison/logic with Nx broadcasting, select,
//! clip and type conversion. Elixir computes the Nx result type; here operands are cast to it and
//! the Burn op of the matching family is applied.

use burn::backend::ops::{ActivationOps, BoolTensorOps, FloatTensorOps, IntTensorOps};
use burn::backend::{Dispatch, Scalar};

use crate::dispatch::{self, by_kind, by_kind2, Prim, BOOL};
use crate::dtype::{NxType, PRED};
use crate::error::{ExError, ExResult};
use crate::ops::{broadcast_prim, broadcast_shape, cast_to, check_alloc, empty, same_device};
use crate::tensor::{numel, Handle};

type UnaryFn = fn(Prim) -> Prim;

/// Float-only unary ops that map one-to-one onto a Burn kernel.
const FLOAT_UNARY: &[(&str, UnaryFn)] = &[
    ("exp", Dispatch::float_exp),
    ("log", Dispatch::float_log),
    ("sqrt", Dispatch::float_sqrt),
    ("sin", Dispatch::float_sin),
    ("cos", Dispatch::float_cos),
    ("tan", Dispatch::float_tan),
    ("asin", Dispatch::float_asin),
    ("acos", Dispatch::float_acos),
    ("atan", Dispatch::float_atan),
    ("sinh", Dispatch::float_sinh),
    ("cosh", Dispatch::float_cosh),
    ("tanh", Dispatch::float_tanh),
    ("asinh", Dispatch::float_asinh),
    ("acosh", Dispatch::float_acosh),
    ("atanh", Dispatch::float_atanh),
    ("erf", Dispatch::float_erf),
    ("sigmoid", Dispatch::sigmoid),
    ("floor", Dispatch::float_floor),
    ("ceil", Dispatch::float_ceil),
];

/// Float ops that need no transcendental function, so they run in f64 wherever f64 is stored.
const F64_EXACT: &[&str] = &[
    "abs", "negate", "sign", "floor", "ceil", "round", "square", "sqrt", "rsqrt", "is_nan", "is_infinity", "logical_not",
    "add", "subtract", "multiply", "divide", "remainder", "max", "min",
    "equal", "not_equal", "greater", "less", "greater_equal", "less_equal", "logical_and", "logical_or", "logical_xor",
];

/// Refuses f64 transcendentals where the device cannot compile them (see `DeviceRef::f64_math`):
/// an error now instead of a poisoned device later.
fn check_f64_math(op: &str, ty: NxType, device: crate::device::DeviceRef) -> ExResult<()> {
    if ty == NxType::F(64) && !device.f64_math() && !F64_EXACT.contains(&op) {
        return Err(ExError::invalid_with(
            format!("f64 {op} is not supported on {device}: Vulkan (SPIR-V) has no f64 transcendental functions"),
            vec![("op", crate::error::Detail::Text(op.into())), ("device", crate::error::Detail::Text(device.to_string()))],
        ));
    }
    Ok(())
}

/// Float ops built from several Burn kernels.
const COMPOSITES: &[&str] = &["expm1", "log1p", "cbrt", "erfc", "erf_inv"];

fn fscalar(v: f64) -> Scalar {
    Scalar::Float(v)
}

fn float_unary(op: &str, t: Prim) -> ExResult<Prim> {
    if let Some((_, f)) = FLOAT_UNARY.iter().find(|(name, _)| *name == op) {
        return Ok(f(t));
    }
    Ok(match op {
        // expm1 = 2t / (1 - t) with t = tanh(x/2) keeps full precision near 0, where exp(x) - 1
        // cancels; far from 0 the direct form is exact enough and does not overflow early.
        "expm1" => {
            let half = Dispatch::float_tanh(Dispatch::float_mul_scalar(t.clone(), fscalar(0.5)));
            let near = Dispatch::float_div(
                Dispatch::float_mul_scalar(half.clone(), fscalar(2.0)),
                Dispatch::float_add_scalar(Dispatch::float_neg(half), fscalar(1.0)),
            );
            let far = Dispatch::float_sub_scalar(Dispatch::float_exp(t.clone()), fscalar(1.0));
            let small = Dispatch::float_lower_elem(Dispatch::float_abs(t), fscalar(0.5), BOOL);
            Dispatch::float_mask_where(far, small, near)
        }
        // log(w) - ((w - 1) - x) / w with w = 1 + x: the correction term restores what rounding
        // 1 + x lost, so this is accurate near 0 and exact where 1 + x is (Burn's f64 log1p is
        // one ulp off at log1p(2)).
        "log1p" => {
            let w = Dispatch::float_add_scalar(t.clone(), fscalar(1.0));
            let lost = Dispatch::float_sub(Dispatch::float_sub_scalar(w.clone(), fscalar(1.0)), t);
            Dispatch::float_sub(Dispatch::float_log(w.clone()), Dispatch::float_div(lost, w))
        }
        "rsqrt" => Dispatch::float_recip(Dispatch::float_sqrt(t)),
        "cbrt" => {
            let mag = Dispatch::float_powf_scalar(Dispatch::float_abs(t.clone()), fscalar(1.0 / 3.0));
            Dispatch::float_mul(mag, Dispatch::float_sign(t))
        }
        "erfc" => Dispatch::float_add_scalar(Dispatch::float_neg(Dispatch::float_erf(t)), fscalar(1.0)),
        // Nx rounds half away from zero; Burn rounds half to even.
        "round" => {
            let tr = Dispatch::float_trunc(t.clone());
            let frac = Dispatch::float_abs(Dispatch::float_sub(t.clone(), tr.clone()));
            let bump = Dispatch::float_greater_equal_elem(frac, fscalar(0.5), BOOL);
            let away = Dispatch::float_add(tr.clone(), Dispatch::float_sign(t));
            Dispatch::float_mask_where(tr, bump, away)
        }
        "erf_inv" => erf_inv(t),
        "abs" => Dispatch::float_abs(t),
        "negate" => Dispatch::float_neg(t),
        "sign" => Dispatch::float_sign(t),
        "square" => Dispatch::float_mul(t.clone(), t),
        "is_nan" => dispatch::pred(Dispatch::float_is_nan(t, BOOL)),
        "is_infinity" => dispatch::pred(Dispatch::float_is_inf(t, BOOL)),
        _ => return Err(unknown(op, "unary")),
    })
}

/// Burn has no erf⁻¹: Giles' single-precision polynomial, then two Newton steps on
/// erf(x) = y, which bring it to the input type's precision (f64 included).
fn erf_inv(y: Prim) -> Prim {
    use Dispatch as D;
    let poly = |w: Prim, coeffs: &[f64]| {
        use burn::backend::TensorMetadata;
        let c0 = D::float_full(w.shape(), fscalar(coeffs[0]), &w.device(), w.dtype().into());
        coeffs[1..].iter().fold(c0, |acc, c| {
            D::float_add_scalar(D::float_mul(acc, w.clone()), fscalar(*c))
        })
    };
    // w = -ln((1 - y)(1 + y))
    let one_minus = D::float_add_scalar(D::float_neg(y.clone()), fscalar(1.0));
    let one_plus = D::float_add_scalar(y.clone(), fscalar(1.0));
    let w = D::float_neg(D::float_log(D::float_mul(one_minus, one_plus)));
    let central = poly(
        D::float_sub_scalar(w.clone(), fscalar(2.5)),
        &[2.810_226_36e-08, 3.432_739_39e-07, -3.523_387_7e-06, -4.391_506_54e-06, 0.000_218_580_87, -0.001_253_725_03, -0.004_177_681_64, 0.246_640_727, 1.501_409_41],
    );
    let tail = poly(
        D::float_sub_scalar(D::float_sqrt(w.clone()), fscalar(3.0)),
        &[-0.000_200_214_257, 0.000_100_950_558, 0.001_349_343_22, -0.003_673_428_44, 0.005_739_507_73, -0.007_622_461_3, 0.009_438_870_47, 1.001_674_06, 2.832_976_82],
    );
    let is_central = D::float_lower_elem(w, fscalar(5.0), BOOL);
    let mut x = D::float_mul(D::float_mask_where(tail, is_central, central), y.clone());
    let two_over_sqrt_pi = 2.0 / std::f64::consts::PI.sqrt();
    for _ in 0..2 {
        let err = D::float_sub(D::float_erf(x.clone()), y.clone());
        let slope = D::float_mul_scalar(D::float_exp(D::float_neg(D::float_mul(x.clone(), x.clone()))), fscalar(two_over_sqrt_pi));
        x = D::float_sub(x, D::float_div(err, slope));
    }
    // |y| = 1 gives ±inf through the polynomial; Newton would turn that into NaN.
    let edge = D::float_greater_equal_elem(D::float_abs(y.clone()), fscalar(1.0), BOOL);
    let at_edge = D::float_div_scalar(y, fscalar(0.0));
    D::float_mask_where(x, edge, at_edge)
}

fn bits(ty: NxType) -> i64 {
    ty.bytes() as i64 * 8
}

/// Binary search on the top bits: shift left while the top `s` bits are zero.
fn count_leading_zeros(t: Prim, ty: NxType) -> Prim {
    use Dispatch as D;
    let w = bits(ty);
    let int = |v: i64| if ty.is_unsigned() { Scalar::UInt(v as u64) } else { Scalar::Int(v) };
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
    let int = |v: i64| if ty.is_unsigned() { Scalar::UInt(v as u64) } else { Scalar::Int(v) };
    let bit = |i: i64| D::bitwise_and_scalar(D::bitwise_right_shift_scalar(t.clone(), int(i)), int(1));
    (1..bits(ty)).fold(bit(0), |acc, i| D::int_add(acc, bit(i)))
}

fn int_unary(op: &str, t: Prim, ty: NxType) -> ExResult<Prim> {
    Ok(match op {
        "abs" if ty.is_unsigned() => t,
        "abs" => Dispatch::int_abs(t),
        "negate" => Dispatch::int_neg(t),
        "sign" if ty.is_unsigned() => dispatch::cast(dispatch::pred(dispatch::to_bool(t)), ty.dtype()),
        "sign" => Dispatch::int_sign(t),
        "square" => Dispatch::int_mul(t.clone(), t),
        "bitwise_not" => Dispatch::bitwise_not(t),
        "count_leading_zeros" => count_leading_zeros(t, ty),
        "population_count" => population_count(t, ty),
        // Rounding an integer is the identity in Nx.
        "floor" | "ceil" | "round" => t,
        "is_nan" | "is_infinity" => dispatch::pred(Dispatch::int_not_equal(t.clone(), t, BOOL)),
        _ => return Err(unknown(op, "unary")),
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
pub fn unary(op: &str, h: &Handle, out: NxType) -> ExResult<Handle> {
    let predicate = matches!(op, "logical_not" | "is_nan" | "is_infinity");
    let out = if predicate { PRED } else { out };
    h.device.check_type(out)?;
    check_f64_math(op, if predicate { h.ty } else { out }, h.device)?;
    if h.numel() == 0 {
        return empty(h.shape.clone(), out, h.device);
    }
    let prim = match op {
        "logical_not" => dispatch::pred(by_kind!(h.prim.clone(), float_equal_elem, int_equal_elem, dispatch::zero_of(h.ty.dtype()), BOOL)),
        "is_nan" | "is_infinity" if h.ty.is_float() => float_unary(op, h.prim.clone())?,
        "is_nan" | "is_infinity" => int_unary(op, h.prim.clone(), h.ty)?,
        // Composites of several kernels (Newton steps, 1 - erf, the tanh form of expm1) round at
        // every step; narrow floats are computed in f64 and rounded once, as BinaryBackend does.
        _ if COMPOSITES.contains(&op) && out.is_float() && out != NxType::F(64) && h.device.f64_math() && h.device.supports(NxType::F(64))? => {
            float_unary(op, cast_to(h, NxType::F(64)))?
        }
        _ => {
            let x = cast_to(h, out);
            if out.is_float() { float_unary(op, x)? } else { int_unary(op, x, out)? }
        }
    };
    Ok(Handle::new(dispatch::cast(prim, out.dtype()), out, h.shape.clone(), h.device))
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

const COMPARISONS: &[&str] = &["equal", "not_equal", "greater", "less", "greater_equal", "less_equal"];
const LOGICAL: &[&str] = &["logical_and", "logical_or", "logical_xor"];

fn compare(op: &str, a: Prim, b: Prim) -> Prim {
    let bool_prim = match op {
        "equal" => by_kind2!(a, b, float_equal, int_equal, BOOL),
        "not_equal" => by_kind2!(a, b, float_not_equal, int_not_equal, BOOL),
        "greater" => by_kind2!(a, b, float_greater, int_greater, BOOL),
        "less" => by_kind2!(a, b, float_lower, int_lower, BOOL),
        "greater_equal" => by_kind2!(a, b, float_greater_equal, int_greater_equal, BOOL),
        _ => by_kind2!(a, b, float_lower_equal, int_lower_equal, BOOL),
    };
    dispatch::pred(bool_prim)
}

fn logical(op: &str, a: Prim, b: Prim) -> Prim {
    let (a, b) = (dispatch::to_bool(a), dispatch::to_bool(b));
    let bool_prim = match op {
        "logical_and" => Dispatch::bool_and(a, b),
        "logical_or" => Dispatch::bool_or(a, b),
        _ => Dispatch::bool_xor(a, b),
    };
    dispatch::pred(bool_prim)
}

/// Nx's remainder takes the dividend's sign (C fmod); Burn's takes the divisor's (Python). They
/// differ by exactly one divisor where the signs disagree and the result is non-zero.
fn remainder(a: Prim, b: Prim) -> Prim {
    let float = dispatch::is_float(&a);
    let zero = dispatch::zero_of(dispatch::dtype(&a));
    let r = by_kind2!(a.clone(), b.clone(), float_remainder, int_remainder);
    let r_neg = by_kind!(r.clone(), float_lower_elem, int_lower_elem, zero, BOOL);
    let a_neg = by_kind!(a, float_lower_elem, int_lower_elem, zero, BOOL);
    let nonzero = by_kind!(r.clone(), float_not_equal_elem, int_not_equal_elem, zero, BOOL);
    let fix = Dispatch::bool_and(Dispatch::bool_xor(r_neg, a_neg), nonzero);
    let adjusted = if float { Dispatch::float_sub(r.clone(), b) } else { Dispatch::int_sub(r.clone(), b) };
    dispatch::select(fix, adjusted, r)
}

fn arith(op: &str, a: Prim, b: Prim, ty: NxType) -> ExResult<Prim> {
    let float = ty.is_float();
    let int_only = |what: &str| -> ExResult<()> {
        if float {
            Err(ExError::invalid(format!("{what} needs integer operands, got {ty}")))
        } else {
            Ok(())
        }
    };
    Ok(match op {
        "add" => by_kind2!(a, b, float_add, int_add),
        "subtract" => by_kind2!(a, b, float_sub, int_sub),
        "multiply" => by_kind2!(a, b, float_mul, int_mul),
        "divide" if float => Dispatch::float_div(a, b),
        "divide" | "quotient" => {
            int_only(op)?;
            check_nonzero_divisor(&b)?;
            Dispatch::int_div(a, b)
        }
        "remainder" => {
            if !float {
                check_nonzero_divisor(&b)?;
            }
            remainder(a, b)
        }
        "pow" if float => Dispatch::float_powf(a, b),
        "pow" => Dispatch::int_powi(a, b),
        "max" | "min" if float => {
            // b where it wins or is NaN, else a (also NaN when a is): Nx propagates NaN, and a
            // comparison with NaN is false. Four passes; ties keep a.
            let b_wins = if op == "max" {
                Dispatch::float_lower(a.clone(), b.clone(), BOOL)
            } else {
                Dispatch::float_greater(a.clone(), b.clone(), BOOL)
            };
            let take_b = Dispatch::bool_or(b_wins, Dispatch::float_is_nan(b.clone(), BOOL));
            dispatch::select(take_b, b, a)
        }
        "max" | "min" => {
            let a_wins = if op == "max" {
                by_kind2!(a.clone(), b.clone(), float_greater_equal, int_greater_equal, BOOL)
            } else {
                by_kind2!(a.clone(), b.clone(), float_lower_equal, int_lower_equal, BOOL)
            };
            dispatch::select(a_wins, a, b)
        }
        "atan2" if float => Dispatch::float_atan2(a, b),
        "bitwise_and" | "bitwise_or" | "bitwise_xor" | "left_shift" | "right_shift" => {
            int_only(op)?;
            match op {
                "bitwise_and" => Dispatch::bitwise_and(a, b),
                "bitwise_or" => Dispatch::bitwise_or(a, b),
                "bitwise_xor" => Dispatch::bitwise_xor(a, b),
                "left_shift" => Dispatch::bitwise_left_shift(a, b),
                _ => Dispatch::bitwise_right_shift(a, b),
            }
        }
        _ => return Err(unknown(op, "binary")),
    })
}

pub fn binary(op: &str, a: &Handle, b: &Handle, ty: NxType) -> ExResult<Handle> {
    if op == "left_shift" || op == "right_shift" {
        check_shift(op, b)?;
    }
    let device = same_device(&[a, b])?;
    device.check_type(ty)?;
    check_f64_math(op, ty, device)?;
    let shape = broadcast_shape(&a.shape, &b.shape)?;
    let is_pred = COMPARISONS.contains(&op) || LOGICAL.contains(&op);
    let out_ty = if is_pred { PRED } else { ty };
    check_alloc(&shape, out_ty)?;
    if numel(&shape) == 0 {
        return empty(shape, out_ty, device);
    }
    let pa = dispatch::cast(broadcast_prim(a, &shape), ty.dtype());
    let pb = dispatch::cast(broadcast_prim(b, &shape), ty.dtype());
    let prim = if COMPARISONS.contains(&op) {
        compare(op, pa, pb)
    } else if LOGICAL.contains(&op) {
        logical(op, pa, pb)
    } else {
        arith(op, pa, pb, ty)?
    };
    Ok(Handle::new(prim, out_ty, shape, device))
}

/// Nx: a negative shift amount is an ArgumentError (BinaryBackend's message), not a
/// device-defined result.
fn check_shift(op: &str, amount: &Handle) -> ExResult<()> {
    if let NxType::S(_) = amount.ty {
        if let Some(min) = crate::ops::indexing::read_ints(amount)?.into_iter().min() {
            if min < 0 {
                let verb = if op == "left_shift" { "left" } else { "right" };
                return Err(ExError::NxArgument(format!("cannot {verb} shift by {min}")));
            }
        }
    }
    Ok(())
}

pub fn select(p: &Handle, t: &Handle, f: &Handle, ty: NxType) -> ExResult<Handle> {
    let device = same_device(&[p, t, f])?;
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
pub fn clip(h: &Handle, lo: &Handle, hi: &Handle) -> ExResult<Handle> {
    for bound in [lo, hi] {
        if broadcast_shape(&h.shape, &bound.shape)? != h.shape {
            return Err(ExError::Broadcast { lhs: h.shape.clone(), rhs: bound.shape.clone() });
        }
    }
    let low = binary("max", h, lo, h.ty)?;
    binary("min", &low, hi, h.ty)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;

    #[test]
    fn float_min_max_propagate_nan() {
        let a = f32s(&[f32::NAN, 1.0, 2.0], &[3]);
        let b = f32s(&[f32::INFINITY, f32::NAN, 0.5], &[3]);
        for op in ["min", "max"] {
            let r = floats(&binary(op, &a, &b, NxType::F(32)).unwrap());
            assert!(r[0].is_nan() && r[1].is_nan(), "{op}: {r:?}");
            assert_eq!(r[2], if op == "min" { 0.5 } else { 2.0 });
        }
    }

    #[test]
    fn binary_broadcasts_like_nx() {
        let a = f32s(&[1.0, 2.0, 3.0], &[3, 1]);
        let b = f32s(&[10.0, 20.0], &[2]);
        let c = binary("add", &a, &b, NxType::F(32)).unwrap();
        assert_eq!(c.shape, vec![3, 2]);
        assert_eq!(floats(&c), vec![11.0, 21.0, 12.0, 22.0, 13.0, 23.0]);
        let err = binary("add", &f32s(&[1.0, 2.0], &[2]), &f32s(&[1.0, 2.0, 3.0], &[3]), NxType::F(32)).unwrap_err();
        assert!(matches!(err, ExError::Broadcast { .. }));
    }

    #[test]
    fn remainder_takes_the_sign_of_the_dividend() {
        let a = i64s(&[7, -7, 7, -7], &[4]);
        let b = i64s(&[3, 3, -3, -3], &[4]);
        assert_eq!(ints(&binary("remainder", &a, &b, NxType::S(64)).unwrap()), vec![1, -1, 1, -1]);
        let fa = f32s(&[5.5, -5.5], &[2]);
        let fb = f32s(&[2.0, 2.0], &[2]);
        assert_eq!(floats(&binary("remainder", &fa, &fb, NxType::F(32)).unwrap()), vec![1.5, -1.5]);
        assert_eq!(ints(&binary("quotient", &a, &b, NxType::S(64)).unwrap()), vec![2, -2, -2, 2]);
    }

    #[test]
    fn integer_division_by_zero_is_an_error() {
        let err = binary("quotient", &i64s(&[1], &[1]), &i64s(&[0], &[1]), NxType::S(64)).unwrap_err();
        assert!(err.to_string().contains("division by zero"), "{err}");
    }

    #[test]
    fn comparisons_and_logic_return_u8() {
        let a = f32s(&[1.0, 2.0, 3.0], &[3]);
        let b = f32s(&[2.0], &[]);
        let c = binary("greater", &a, &b, NxType::F(32)).unwrap();
        assert_eq!((c.ty, c.to_bytes().unwrap()), (PRED, vec![0, 0, 1]));
        let d = binary("logical_xor", &a, &f32s(&[0.0, 1.0, 0.0], &[3]), NxType::F(32)).unwrap();
        assert_eq!(d.to_bytes().unwrap(), vec![1, 0, 1]);
    }

    #[test]
    fn round_is_half_away_from_zero_and_expm1_is_precise() {
        let x = f32s(&[0.5, 1.5, 2.5, -0.5, -2.5, 0.49999997], &[6]);
        assert_eq!(floats(&unary("round", &x, NxType::F(32)).unwrap()), vec![1.0, 2.0, 3.0, -1.0, -3.0, 0.0]);
        let small = unary("expm1", &f32s(&[1e-7, 2.0], &[2]), NxType::F(32)).unwrap();
        assert_close(&floats(&small), &[1e-7, 2.0f64.exp_m1()], 1e-6);
    }

    #[test]
    fn unary_on_ints_casts_to_the_out_type() {
        let x = i64s(&[-2, 0, 3], &[3]);
        assert_eq!(ints(&unary("abs", &x, NxType::S(64)).unwrap()), vec![2, 0, 3]);
        let e = unary("exp", &x, NxType::F(32)).unwrap();
        assert_eq!(e.ty, NxType::F(32));
        assert_close(&floats(&e), &[(-2f64).exp(), 1.0, 3f64.exp()], 1e-6);
    }

    #[test]
    fn erf_inv_inverts_erf() {
        if !device().f64_math() {
            let err = unary("erf_inv", &f64s(&[0.5], &[1]), NxType::F(64)).unwrap_err();
            assert!(err.to_string().contains("no f64 transcendental"), "{err}");
            return;
        }
        let y = f64s(&[0.5, -0.25, 0.0, 0.999], &[4]);
        let x = unary("erf_inv", &y, NxType::F(64)).unwrap();
        assert_close(&floats(&x), &[0.476_936_276_204_469_9, -0.225_312_055_012_178_1, 0.0, 2.326_753_765_513_524], 1e-9);
    }

    #[test]
    fn log1p_is_accurate_near_zero_and_exact_where_one_plus_x_is() {
        if !device().f64_math() {
            return; // f64 log is refused there, as erf_inv_inverts_erf checks
        }
        let x = f64s(&[2.0, 1e-10, -0.5, 0.0], &[4]);
        let got = floats(&unary("log1p", &x, NxType::F(64)).unwrap());
        assert_eq!(got[0], 3f64.ln());
        assert_eq!(got[3], 0.0);
        // naive log(1 + 1e-10) is off by 8e-7 relative; the corrected form by at most an ulp
        assert!(((got[1] - 1e-10_f64.ln_1p()) / 1e-10).abs() < 1e-15, "{}", got[1]);
        assert_close(&got[2..3], &[(-0.5f64).ln_1p()], 1e-15);
    }

    #[test]
    fn narrow_float_composites_are_correctly_rounded() {
        // erf_inv(0.1) = 0.08885599049425769; the nearest f32 is 0.08885599 (bits 0x3db5fa0f).
        let x = unary("erf_inv", &f32s(&[0.1], &[1]), NxType::F(32)).unwrap();
        assert_eq!(x.ty, NxType::F(32));
        let got = f32::from_ne_bytes(x.to_bytes().unwrap()[..4].try_into().unwrap());
        let exact = 0.088_855_990_494_257_69_f64 as f32;
        if device().f64_math() {
            assert_eq!(got, exact);
        } else {
            // Without f64 math (Vulkan) the steps run in f32 on the driver's exp/erf, which the
            // Vulkan spec lets be off by a few ulps each; measured: 6 ulps on lavapipe.
            let ulps = (got.to_bits() as i64 - exact.to_bits() as i64).abs();
            assert!(ulps <= 8, "{got} is {ulps} ulps from {exact}");
        }
    }

    #[test]
    fn bit_counting_ops() {
        let x = as_type(&i64s(&[1, 0, -1, 255], &[4]), NxType::S(32)).unwrap();
        assert_eq!(ints(&unary("count_leading_zeros", &x, NxType::S(32)).unwrap()), vec![31, 32, 0, 24]);
        assert_eq!(ints(&unary("population_count", &x, NxType::S(32)).unwrap()), vec![1, 0, 32, 8]);
        let u = as_type(&i64s(&[1, 128, 255, 16], &[4]), NxType::U(8)).unwrap();
        assert_eq!(ints(&unary("count_leading_zeros", &u, NxType::U(8)).unwrap()), vec![7, 0, 0, 3]);
        assert_eq!(ints(&unary("population_count", &u, NxType::U(8)).unwrap()), vec![1, 1, 8, 1]);
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
        let c = clip(&f32s(&[-5.0, 0.5, 5.0], &[3]), &f32s(&[0.0], &[]), &f32s(&[1.0], &[])).unwrap();
        assert_eq!(floats(&c), vec![0.0, 0.5, 1.0]);
    }
}
