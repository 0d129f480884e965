//! Kernels of our own for the CPU (Burn's flex backend), where flex's generic path costs several
//! times what the work needs. Each reads a contiguous flex tensor's storage directly, splits the
//! work over rayon's pool (the one flex uses) and returns `None` for anything it does not cover
//! (another device, a strided view, another dtype), so callers keep Burn's path as the fallback.
//! Written against Burn's public API so each could move upstream into burn-flex.

use burn::backend::{BackendTensor, DType, DispatchTensorKind, TensorData};
use rayon::prelude::*;

use crate::dispatch::{self, Prim};
use crate::ops::vocab::UnaryOp;

/// Below this many elements one thread does the work: splitting costs more than it saves.
const PAR_MIN: usize = 1 << 15;

/// The contiguous f32 storage of a flex float tensor.
fn flex_f32(p: &Prim) -> Option<&[f32]> {
    match &p.kind {
        DispatchTensorKind::Flex(BackendTensor::Float(t)) if t.dtype() == DType::F32 => t.as_slice::<f32>(),
        _ => None,
    }
}

/// The contiguous f64 storage of a flex float tensor.
fn flex_f64(p: &Prim) -> Option<&[f64]> {
    match &p.kind {
        DispatchTensorKind::Flex(BackendTensor::Float(t)) if t.dtype() == DType::F64 => t.as_slice::<f64>(),
        _ => None,
    }
}

/// The contiguous i64 storage of a flex int tensor.
fn flex_i64(p: &Prim) -> Option<&[i64]> {
    match &p.kind {
        DispatchTensorKind::Flex(BackendTensor::Int(t)) if t.dtype() == DType::I64 => t.as_slice::<i64>(),
        _ => None,
    }
}

/// Whether every entry of a contiguous s64 flex tensor is in `0..bound`, in one pass over
/// memory (as an unsigned compare, which also catches negatives) on rayon's pool. Burn's path
/// builds two comparison masks, ors them and reduces: about 2.8 ms for 1M indices against
/// 0.1 ms here.
pub fn indices_in_bounds(p: &Prim, bound: usize) -> Option<bool> {
    let xs = flex_i64(p)?;
    let out = |c: &[i64]| c.iter().any(|&v| v as u64 >= bound as u64);
    Some(if xs.len() < PAR_MIN { !out(xs) } else { !xs.par_chunks(PAR_MIN).any(out) })
}

/// Sum of a slice in f64, with eight independent accumulators (so the loop vectorises: one
/// running sum would serialise every add on its latency).
fn sum_f64<T: Copy + Into<f64>>(xs: &[T]) -> f64 {
    let mut acc = [0.0f64; 8];
    let chunks = xs.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..8 {
            acc[i] += c[i].into();
        }
    }
    let mut s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for &x in rest {
        s += x.into();
    }
    s
}

fn par_sum<T: Copy + Into<f64> + Sync>(xs: &[T]) -> f64 {
    if xs.len() < PAR_MIN {
        return sum_f64(xs);
    }
    xs.par_chunks(PAR_MIN).map(sum_f64).sum()
}

/// `rows` sums of `cols` consecutive values (a reduction over trailing axes).
fn row_sums<T: Copy + Into<f64> + Sync>(xs: &[T], cols: usize) -> Vec<f64> {
    if xs.len() < PAR_MIN || cols >= xs.len() / 2 {
        return xs.chunks(cols).map(par_sum).collect();
    }
    xs.par_chunks(cols).map(sum_f64).collect()
}

/// `cols` sums down `rows` rows (a reduction over leading axes): each task owns a band of columns
/// and adds the rows into it, so the inner loop runs along memory and vectorises.
fn col_sums<T: Copy + Into<f64> + Sync>(xs: &[T], cols: usize) -> Vec<f64> {
    let rows = xs.len() / cols;
    let band = if xs.len() < PAR_MIN { cols } else { (cols / rayon::current_num_threads().max(1)).max(256).min(cols) };
    let mut out = vec![0.0f64; cols];
    out.par_chunks_mut(band).enumerate().for_each(|(b, acc)| {
        let start = b * band;
        for r in 0..rows {
            let row = &xs[r * cols + start..r * cols + start + acc.len()];
            for (a, &x) in acc.iter_mut().zip(row) {
                *a += x.into();
            }
        }
    });
    out
}

/// Nx's sum (`mean`: divided by the count) of an f32 or f64 tensor on the CPU over a leading or
/// trailing block of its axes (all axes included), accumulated in f64 as Nx.BinaryBackend does
/// and rounded once to the input's type. The result is flat (`kept` elements).
pub fn sum(x: &Prim, shape: &[usize], axes: &[usize], mean: bool) -> Option<Prim> {
    let rank = shape.len();
    let mut sorted = axes.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let k = sorted.len();
    if rank == 0 || k == 0 {
        return None;
    }
    let leading = sorted.iter().enumerate().all(|(i, &a)| a == i);
    let trailing = sorted.iter().enumerate().all(|(i, &a)| a == rank - k + i);
    if !(leading || trailing) {
        return None;
    }
    let reduced: usize = sorted.iter().map(|&a| shape[a]).product();
    let n: usize = shape.iter().product();
    if reduced == 0 || n == 0 {
        return None;
    }
    let kept = n / reduced;
    let run = |sums: Vec<f64>| -> Vec<f64> {
        sums.into_iter()
            .map(|s| {
                let s = if mean { s / reduced as f64 } else { s };
                // x86's inf + -inf is a negative NaN; Nx gives the positive one
                if s.is_nan() { f64::NAN } else { s }
            })
            .collect()
    };
    let sums = if let Some(xs) = flex_f32(x) {
        let s = if kept == 1 { vec![par_sum(xs)] } else if trailing { row_sums(xs, reduced) } else { col_sums(xs, kept) };
        let out: Vec<f32> = run(s).into_iter().map(|v| v as f32).collect();
        TensorData::new(out, [kept])
    } else if let Some(xs) = flex_f64(x) {
        let s = if kept == 1 { vec![par_sum(xs)] } else if trailing { row_sums(xs, reduced) } else { col_sums(xs, kept) };
        TensorData::new(run(s), [kept])
    } else {
        return None;
    };
    Some(dispatch::from_data(sums, &burn::tensor::Device::flex()))
}

/// The std function flex applies per element for `op`, for f32 and f64: the parallel map below
/// computes exactly what flex computes, on all cores instead of one.
fn std_unary(op: UnaryOp) -> Option<(fn(f32) -> f32, fn(f64) -> f64)> {
    Some(match op {
        UnaryOp::Exp => (f32::exp, f64::exp),
        UnaryOp::Log => (f32::ln, f64::ln),
        UnaryOp::Sqrt => (f32::sqrt, f64::sqrt),
        UnaryOp::Sin => (f32::sin, f64::sin),
        UnaryOp::Cos => (f32::cos, f64::cos),
        UnaryOp::Tan => (f32::tan, f64::tan),
        UnaryOp::Asin => (f32::asin, f64::asin),
        UnaryOp::Acos => (f32::acos, f64::acos),
        UnaryOp::Atan => (f32::atan, f64::atan),
        UnaryOp::Sinh => (f32::sinh, f64::sinh),
        UnaryOp::Cosh => (f32::cosh, f64::cosh),
        UnaryOp::Tanh => (f32::tanh, f64::tanh),
        _ => return None,
    })
}

fn par_map<T: Copy + Send + Sync + burn::tensor::Element>(xs: &[T], shape: Vec<usize>, f: fn(T) -> T) -> Prim {
    let mut out = Vec::with_capacity(xs.len());
    out.par_extend(xs.par_iter().with_min_len(PAR_MIN).map(|&x| f(x)));
    dispatch::from_data(TensorData::new(out, shape), &burn::tensor::Device::flex())
}

/// A float unary op of `std_unary`'s list over a large contiguous f32/f64 flex tensor, split
/// over rayon's pool. Small tensors stay on flex's own (single-threaded) loop, except f32 `exp`,
/// which takes the vectorised kernel at every size.
pub fn unary(op: UnaryOp, x: &Prim) -> Option<Prim> {
    let shape = dispatch::dims(x);
    // f32 exp at any size: the vectorised kernel (cpu_exp), whose results equal glibc's expf
    if let (UnaryOp::Exp, Some(xs)) = (op, flex_f32(x)) {
        let mut out = vec![0.0f32; xs.len()];
        if xs.len() < 2 * PAR_MIN {
            super::cpu_exp::exp_f32(xs, &mut out);
        } else {
            out.par_chunks_mut(PAR_MIN).zip(xs.par_chunks(PAR_MIN)).for_each(|(o, c)| super::cpu_exp::exp_f32(c, o));
        }
        return Some(dispatch::from_data(TensorData::new(out, shape), &burn::tensor::Device::flex()));
    }
    let (f32_op, f64_op) = std_unary(op)?;
    if let Some(xs) = flex_f32(x).filter(|xs| xs.len() >= 2 * PAR_MIN) {
        Some(par_map(xs, shape, f32_op))
    } else {
        flex_f64(x).filter(|xs| xs.len() >= 2 * PAR_MIN).map(|xs| par_map(xs, shape, f64_op))
    }
}

/// The exact (erf) GELU, `x/2 (1 + erf(x/√2))`, of a contiguous f32 flex tensor in one pass on
/// rayon's pool: Burn composes it from five tensor ops, each a single-threaded pass over memory
/// (a quarter of a BERT forward on the CPU). Written as `x/2 erfc(-x/√2)` (libm, as flex's erf),
/// which keeps full precision for negative x where `1 + erf` cancels.
pub fn gelu(x: &Prim) -> Option<Prim> {
    fn f(x: f32) -> f32 {
        0.5 * x * libm::erfcf(-x * std::f32::consts::FRAC_1_SQRT_2)
    }
    let xs = flex_f32(x)?;
    Some(par_map(xs, dispatch::dims(x), f))
}

/// `gelu` on a Burn tensor, falling back to Burn's composition off the CPU or for other dtypes.
pub fn gelu_tensor<const D: usize>(t: burn::tensor::Tensor<D>) -> burn::tensor::Tensor<D> {
    let p = t.into_dispatch();
    match gelu(&p) {
        Some(out) => burn::tensor::Tensor::from_dispatch(out),
        None => burn::tensor::activation::gelu(burn::tensor::Tensor::from_dispatch(p)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::ops::FloatTensorOps;
    use burn::backend::Dispatch;

    fn flex(values: Vec<f32>, shape: &[usize]) -> Prim {
        dispatch::from_data(TensorData::new(values, shape.to_vec()), &burn::tensor::Device::flex())
    }

    fn values(p: Prim) -> Vec<f32> {
        dispatch::into_data(p).unwrap().try_to_vec::<f32>().unwrap()
    }

    /// Inputs with every special value, long enough for the parallel paths.
    fn specials(n: usize) -> Vec<f32> {
        let special = [0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, f32::MIN_POSITIVE, 1e-45, 88.7, -103.0, 1e30];
        (0..n).map(|i| if i % 97 == 0 { special[(i / 97) % special.len()] } else { ((i as f32) * 1.7e-3).sin() * 20.0 }).collect()
    }

    #[test]
    fn parallel_unary_maps_equal_flex_bit_for_bit() {
        let xs = specials(3 * PAR_MIN + 5);
        let x = flex(xs, &[3 * PAR_MIN + 5]);
        // (f32 exp is cpu_exp's, tested there against exp in f64; here: the split changes nothing)
        let exp_whole = {
            let xs = flex_f32(&x).unwrap();
            let mut out = vec![0.0; xs.len()];
            crate::ops::cpu_exp::exp_f32(xs, &mut out);
            out
        };
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert!(bits(&values(unary(UnaryOp::Exp, &x).unwrap())) == bits(&exp_whole));
        for (op, flex_op) in [
            (UnaryOp::Tanh, Dispatch::float_tanh as fn(Prim) -> Prim),
            (UnaryOp::Log, Dispatch::float_log),
            (UnaryOp::Sin, Dispatch::float_sin),
        ] {
            let ours = values(unary(op, &x).expect("large contiguous f32 takes the kernel"));
            let theirs = values(flex_op(x.clone()));
            assert_eq!(bits(&ours), bits(&theirs), "{op:?}");
        }
        // small tensors and unlisted ops stay on flex (f32 exp excepted: cpu_exp at any size)
        assert!(unary(UnaryOp::Tanh, &flex(vec![1.0; 10], &[10])).is_none());
        assert_eq!(values(unary(UnaryOp::Exp, &flex(vec![1.0; 10], &[10])).unwrap()), vec![1.0f32.exp(); 10]);
        assert!(unary(UnaryOp::Erf, &x).is_none());
    }

    #[test]
    fn sums_over_leading_and_trailing_blocks_accumulate_in_f64() {
        let (r, c) = (300, 257);
        let xs: Vec<f32> = (0..r * c).map(|i| ((i as f32) * 0.37).sin() * 1000.0 + 0.1).collect();
        let x = flex(xs.clone(), &[r, c]);
        let want_rows: Vec<f32> = xs.chunks(c).map(|row| row.iter().map(|&v| v as f64).sum::<f64>() as f32).collect();
        let want_cols: Vec<f32> = (0..c).map(|j| (0..r).map(|i| xs[i * c + j] as f64).sum::<f64>() as f32).collect();
        let want_all = xs.iter().map(|&v| v as f64).sum::<f64>();
        assert_eq!(values(sum(&x, &[r, c], &[1], false).unwrap()), want_rows);
        assert_eq!(values(sum(&x, &[r, c], &[0], false).unwrap()), want_cols);
        assert_eq!(values(sum(&x, &[r, c], &[0, 1], false).unwrap()), vec![want_all as f32]);
        assert_eq!(values(sum(&x, &[r, c], &[1, 0], true).unwrap()), vec![(want_all / (r * c) as f64) as f32]);
        // a middle axis is not a block: Burn's path takes it
        assert!(sum(&flex(vec![0.0; 8], &[2, 2, 2]), &[2, 2, 2], &[1], false).is_none());
    }

    #[test]
    fn fused_gelu_is_accurate_to_an_f64_reference_and_agrees_with_burns_composition() {
        let n = 3 * PAR_MIN + 11;
        let xs: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.013).sin() * 8.0).chain([0.0, -0.0, 40.0, -40.0, f32::INFINITY, f32::NEG_INFINITY]).collect();
        let shape = [xs.len()];
        let t = burn::tensor::Tensor::<1>::from_dispatch(flex(xs.clone(), &shape));
        let ours = values(gelu_tensor(t.clone()).into_dispatch());
        let burns = values(burn::tensor::activation::gelu(t).into_dispatch());
        for (i, &x) in xs[..n].iter().enumerate() {
            let want = 0.5 * x as f64 * libm::erfc(-(x as f64) / std::f64::consts::SQRT_2);
            // erfc(z)'s condition number is ~2z², so rounding z = -x/√2 to f32 alone costs ~z² ulps:
            // allow that plus 8 ulps for erfcf itself. Burn's 1 + erf loses far more for negative x.
            let z2 = (x as f64) * (x as f64) / 2.0;
            let tol = (8.0 + 2.0 * z2) * f32::EPSILON as f64;
            assert!((ours[i] as f64 - want).abs() <= tol * want.abs() + 1e-30, "x = {x}: {} vs {want}", ours[i]);
            assert!((ours[i] - burns[i]).abs() <= 1e-4 * burns[i].abs().max(1e-3), "x = {x}");
        }
        assert_eq!(&ours[n..n + 4], &[0.0, -0.0, 40.0, -0.0]);
        assert_eq!(ours[n + 4], f32::INFINITY);
    }

    #[test]
    fn index_bounds_are_checked_in_one_pass_with_negatives_out() {
        let ints = |v: Vec<i64>| dispatch::from_data(TensorData::new(v.clone(), [v.len()]), &burn::tensor::Device::flex());
        let n = 3 * PAR_MIN + 7;
        let mut xs: Vec<i64> = (0..n as i64).map(|i| i % 10).collect();
        assert_eq!(indices_in_bounds(&ints(xs.clone()), 10), Some(true));
        assert_eq!(indices_in_bounds(&ints(xs.clone()), 9), Some(false));
        xs[n - 1] = -1; // in the tail chunk
        assert_eq!(indices_in_bounds(&ints(xs.clone()), 10), Some(false));
        xs[n - 1] = i64::MIN;
        assert_eq!(indices_in_bounds(&ints(xs), 10), Some(false));
        assert_eq!(indices_in_bounds(&ints(vec![0, 1, 2]), 3), Some(true));
        assert_eq!(indices_in_bounds(&ints(vec![0, 3]), 3), Some(false));
        assert_eq!(indices_in_bounds(&ints(vec![]), 0), Some(true));
        assert_eq!(indices_in_bounds(&ints(vec![0]), 0), Some(false));
        // not an s64 flex tensor: the caller keeps Burn's path
        assert_eq!(indices_in_bounds(&flex(vec![0.0], &[1]), 1), None);
    }

    #[test]
    fn sums_keep_nx_special_values() {
        let x = flex(vec![1.0, f32::INFINITY, f32::NEG_INFINITY, 2.0, f32::NAN, 3.0, f32::INFINITY, 1.0, -0.0, -0.0, 0.0, 0.0], &[4, 3]);
        let got = values(sum(&x, &[4, 3], &[1], false).unwrap());
        // inf + -inf is the positive NaN Nx gives, not x86's negative one
        assert!(got[0].is_nan() && got[0].is_sign_positive());
        assert!(got[1].is_nan());
        assert_eq!(got[2], f32::INFINITY);
        assert_eq!(got[3], 0.0);
    }
}
