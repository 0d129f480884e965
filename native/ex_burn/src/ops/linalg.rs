//! `dot` with contraction and batch axes, lowered onto one batched matmul.

use burn::backend::ops::{FloatTensorOps, IntTensorOps};
use burn::backend::Dispatch;

use crate::dispatch::{self, by_kind2, Prim};
use crate::dtype::NxType;
use crate::error::{ExError, ExResult};
use crate::kernels::cpu::{bf16_gemm, row_split};
use crate::ops::{cast_to, check_alloc, check_axes, colocate, dims_detail, empty};
use crate::tensor::{numel, Handle};

pub struct DotSpec {
    pub contract: Vec<usize>,
    pub batch: Vec<usize>,
}

fn free_axes(rank: usize, spec: &DotSpec) -> Vec<usize> {
    (0..rank).filter(|a| !spec.contract.contains(a) && !spec.batch.contains(a)).collect()
}

/// Nx.dot/6: the result is batch dims ++ free dims of `a` ++ free dims of `b`.
pub fn dot(a: &Handle, sa: &DotSpec, b: &Handle, sb: &DotSpec, out: NxType) -> ExResult<Handle> {
    dot_with(a, sa, b, sb, out, None)
}

/// `dot` at a chosen f32 matmul precision (`None`: the global level, `crate::ops::precision`).
pub fn dot_with(
    a: &Handle,
    sa: &DotSpec,
    b: &Handle,
    sb: &DotSpec,
    out: NxType,
    precision: Option<crate::ops::precision::MatmulPrecision>,
) -> ExResult<Handle> {
    let _precision = crate::ops::precision::MatmulPrecision::resolve(precision);
    let (device, [a, b]) = colocate([a, b])?;
    let (a, b) = (a.as_ref(), b.as_ref());
    device.check_type(out)?;
    let mismatch = || {
        ExError::invalid_with(
            "dot axes do not match",
            vec![
                dims_detail("lhs", &a.shape),
                dims_detail("lhs_contract", &sa.contract),
                dims_detail("lhs_batch", &sa.batch),
                dims_detail("rhs", &b.shape),
                dims_detail("rhs_contract", &sb.contract),
                dims_detail("rhs_batch", &sb.batch),
            ],
        )
    };
    let mut all_a = sa.contract.clone();
    all_a.extend(&sa.batch);
    let mut all_b = sb.contract.clone();
    all_b.extend(&sb.batch);
    check_axes(&all_a, a.rank()).map_err(|_| mismatch())?;
    check_axes(&all_b, b.rank()).map_err(|_| mismatch())?;
    let same_sizes = |xs: &[usize], ys: &[usize]| {
        xs.len() == ys.len() && xs.iter().zip(ys).all(|(x, y)| a.shape[*x] == b.shape[*y])
    };
    if !same_sizes(&sa.contract, &sb.contract) || !same_sizes(&sa.batch, &sb.batch) {
        return Err(mismatch());
    }
    let (fa, fb) = (free_axes(a.rank(), sa), free_axes(b.rank(), sb));
    let size = |h: &Handle, axes: &[usize]| axes.iter().map(|&x| h.shape[x]).product::<usize>();
    let (bsz, m, k, n) = (size(a, &sa.batch), size(a, &fa), size(a, &sa.contract), size(b, &fb));
    let shape: Vec<usize> = sa
        .batch
        .iter()
        .map(|&x| a.shape[x])
        .chain(fa.iter().map(|&x| a.shape[x]))
        .chain(fb.iter().map(|&x| b.shape[x]))
        .collect();
    check_alloc(&shape, out)?;
    if numel(&shape) == 0 {
        return empty(shape, out, device);
    }
    if k == 0 {
        let zero = dispatch::zero_of(out.dtype());
        let prim = dispatch::full(&shape, zero, out.dtype(), &device.burn()?);
        return Ok(Handle::new(prim, out, shape, device));
    }
    let order = |first: &[usize], second: &[usize], third: &[usize]| -> Vec<usize> {
        first.iter().chain(second).chain(third).copied().collect()
    };
    let compute = if wide_accumulation(out, bsz * m * k * n, device) { NxType::F(64) } else { out };
    let pa = dispatch::permute(cast_to(a, compute), &order(&sa.batch, &fa, &sa.contract));
    let pa = dispatch::reshape(pa, &[bsz, m, k]);
    let pb = dispatch::permute(cast_to(b, compute), &order(&sb.batch, &sb.contract, &fb));
    let pb = dispatch::reshape(pb, &[bsz, k, n]);
    // CUDA float products go to cuBLAS at the requested precision (Burn's kernel would round f32
    // to TF32 regardless); bf16 products on a CPU with AVX512-BF16 to our kernel (flex widens
    // them to f32); everything else stays on Burn's matmul.
    #[cfg(feature = "cuda")]
    let prod = if crate::gpu::cuda::cublas::applies(&pa, &pb, compute.dtype()) {
        crate::gpu::cuda::cublas::matmul(pa, pb, _precision)
    } else {
        cpu_product(pa, pb, [bsz, m, k, n])
    };
    #[cfg(not(feature = "cuda"))]
    let prod = cpu_product(pa, pb, [bsz, m, k, n]);
    let prim = dispatch::reshape(prod, &shape);
    let r = Handle::new(prim, compute, shape.clone(), device);
    Ok(if compute == out { r } else { Handle::new(cast_to(&r, out), out, shape, device) })
}

/// `pa · pb` (`[bsz, m, k]`, `[bsz, k, n]`) off cuBLAS: bf16 on our AVX512-BF16/AMX kernel,
/// mid-size f32/f64 products in row blocks (`kernels::cpu::row_split`), the rest on Burn's matmul; each
/// kernel declines what it does not cover.
fn cpu_product(pa: Prim, pb: Prim, sizes: [usize; 4]) -> Prim {
    bf16_gemm::matmul(&pa, &pb)
        .or_else(|| row_split::matmul(&pa, &pb, sizes))
        .unwrap_or_else(|| by_kind2!(pa, pb, float_matmul, int_matmul))
}

/// Products of at most this many multiply-adds accumulate narrow floats in f64.
pub const WIDE_DOT_LIMIT: usize = 1 << 18;

/// Small float products accumulate in f64 and round once, as Nx.BinaryBackend does. LinAlg's
/// decompositions (QR, SVD, LU, eigh, pinv, least squares, covariance) iterate on small
/// matrices, where f32 accumulation moves the last digits of the results Nx documents; there
/// the wider product costs microseconds. Larger products keep the f32 kernel's speed.
fn wide_accumulation(out: NxType, macs: usize, device: crate::device::DeviceRef) -> bool {
    out.is_float() && out != NxType::F(64) && macs <= WIDE_DOT_LIMIT && device.check_type(NxType::F(64)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;

    fn spec(contract: &[usize], batch: &[usize]) -> DotSpec {
        DotSpec { contract: contract.to_vec(), batch: batch.to_vec() }
    }

    #[test]
    fn matrix_product() {
        let a = f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
        let b = f32s(&[1.0, 0.0, 0.0, 1.0, 1.0, 1.0], &[3, 2]);
        let c = dot(&a, &spec(&[1], &[]), &b, &spec(&[0], &[]), NxType::F(32)).unwrap();
        assert_eq!((c.shape.clone(), floats(&c)), (vec![2, 2], vec![4.0, 5.0, 10.0, 11.0]));
    }

    #[test]
    fn batched_dot_and_contraction_over_the_first_axis() {
        // batch 2 of [1x2]·[2x1]
        let a = f32s(&[1.0, 2.0, 3.0, 4.0], &[2, 1, 2]);
        let b = f32s(&[5.0, 6.0, 7.0, 8.0], &[2, 2, 1]);
        let c = dot(&a, &spec(&[2], &[0]), &b, &spec(&[1], &[0]), NxType::F(32)).unwrap();
        assert_eq!((c.shape.clone(), floats(&c)), (vec![2, 1, 1], vec![17.0, 53.0]));
        // aᵀ·a for a 2x2 written as contraction of axis 0 with axis 0
        let m = f32s(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
        let g = dot(&m, &spec(&[0], &[]), &m, &spec(&[0], &[]), NxType::F(32)).unwrap();
        assert_eq!(floats(&g), vec![10.0, 14.0, 14.0, 20.0]);
    }

    #[test]
    fn integer_dot_and_outer_product() {
        let a = i64s(&[1, 2, 3], &[3]);
        let outer = dot(&a, &spec(&[], &[]), &a, &spec(&[], &[]), NxType::S(64)).unwrap();
        assert_eq!((outer.shape.clone(), ints(&outer)), (vec![3, 3], vec![1, 2, 3, 2, 4, 6, 3, 6, 9]));
        let inner = dot(&a, &spec(&[0], &[]), &a, &spec(&[0], &[]), NxType::S(64)).unwrap();
        assert_eq!((inner.shape.clone(), ints(&inner)), (vec![], vec![14]));
    }

    /// A small f32 product rounds once, like the f64 product rounded to f32: here the f32
    /// accumulation would give 0.0 (1e8 + 1 rounds back to 1e8 before the -1e8 cancels it).
    #[test]
    fn small_f32_products_accumulate_in_f64() {
        let a = f32s(&[1.0e8, 1.0, -1.0e8], &[1, 3]);
        let b = f32s(&[1.0, 1.0, 1.0], &[3, 1]);
        let c = dot(&a, &spec(&[1], &[]), &b, &spec(&[0], &[]), NxType::F(32)).unwrap();
        assert_eq!((c.ty, floats(&c)), (NxType::F(32), vec![1.0]));
    }

    /// Deterministic values in [-1, 1).
    fn noise(n: usize, seed: u64) -> Vec<f32> {
        let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((x >> 40) as f64 / (1u64 << 23) as f64 - 1.0) as f32
            })
            .collect()
    }

    /// Max |got - want| / max |want| against an f64 product of the same f32 inputs.
    fn rel_error(a: &[f32], b: &[f32], got: &[f64], (bsz, m, k, n): (usize, usize, usize, usize), a_t: bool) -> f64 {
        let (mut err, mut scale) = (0.0f64, 0.0f64);
        for p in 0..bsz {
            for i in 0..m {
                for j in 0..n {
                    let mut acc = 0.0f64;
                    for l in 0..k {
                        let av = if a_t { a[p * m * k + l * m + i] } else { a[p * m * k + i * k + l] };
                        acc += av as f64 * b[p * k * n + l * n + j] as f64;
                    }
                    err = err.max((got[p * m * n + i * n + j] - acc).abs());
                    scale = scale.max(acc.abs());
                }
            }
        }
        err / scale
    }

    /// f32 means f32 by default: on every device (on CUDA through cuBLAS, where Burn's own kernel
    /// would round the inputs to TF32, ~1e-3) a product of f32 inputs at `:highest` stays within
    /// f32 accumulation error of the f64 product; plain, transposed-operand and batched layouts.
    #[test]
    fn f32_products_are_true_f32_at_highest_precision() {
        use crate::ops::precision::MatmulPrecision;
        let (m, k, n) = (96, 512, 80);
        let a = noise(2 * m * k, 1);
        let b = noise(2 * k * n, 2);
        for precision in [None, Some(MatmulPrecision::Highest)] {
            let (ha, hb) = (f32s(&a[..m * k], &[m, k]), f32s(&b[..k * n], &[k, n]));
            let c = dot_with(&ha, &spec(&[1], &[]), &hb, &spec(&[0], &[]), NxType::F(32), precision).unwrap();
            assert_eq!((c.ty, c.shape.clone()), (NxType::F(32), vec![m, n]));
            let e = rel_error(&a, &b, &floats(&c), (1, m, k, n), false);
            assert!(e < 2e-6, "plain: relative error {e:e} is not f32's");
            // a stored [k, m], contracted over its first axis: aᵀ·b
            let hat = f32s(&a[..m * k], &[k, m]);
            let c = dot_with(&hat, &spec(&[0], &[]), &hb, &spec(&[0], &[]), NxType::F(32), precision).unwrap();
            let e = rel_error(&a, &b, &floats(&c), (1, m, k, n), true);
            assert!(e < 2e-6, "transposed lhs: relative error {e:e} is not f32's");
            let (ba, bb) = (f32s(&a, &[2, m, k]), f32s(&b, &[2, k, n]));
            let c = dot_with(&ba, &spec(&[2], &[0]), &bb, &spec(&[1], &[0]), NxType::F(32), precision).unwrap();
            assert_eq!(c.shape, vec![2, m, n]);
            let e = rel_error(&a, &b, &floats(&c), (2, m, k, n), false);
            assert!(e < 2e-6, "batched: relative error {e:e} is not f32's");
        }
    }

    /// A product's inputs are read after their producers wrote them, and its result before its
    /// consumers read it, also where the product runs outside Burn's queue (cuBLAS on CUDA, on its
    /// own stream) and several threads (several of the device's queues) chain products and
    /// element-wise ops with no read in between. Each step is exact in f32 (a product with 0.5·I,
    /// then + c), so the host computes the same bits; a step that read stale or unwritten memory
    /// would not.
    #[test]
    fn chained_products_and_element_wise_ops_see_each_others_results() {
        use crate::ops::elementwise::binary;
        use crate::ops::vocab::BinaryOp;
        // on a GPU the product must outlast the host's gap between queueing it and queueing its
        // consumer, or an ordering bug would go unseen: a 2048² f32 product takes much longer
        let n = if device().kind == crate::device::DeviceKind::Cpu { 192 } else { 2048 };
        let steps = 30;
        let half: Vec<f32> = (0..n * n).map(|i| if i / n == i % n { 0.5 } else { 0.0 }).collect();
        let run = |t: usize| {
            let start: Vec<f32> = (0..n * n).map(|i| ((i * 7 + t * 13) % 101) as f32).collect();
            let c = (t + 1) as f32;
            let (b, cs) = (f32s(&half, &[n, n]), f32s(&vec![c; n * n], &[n, n]));
            let mut a = f32s(&start, &[n, n]);
            for _ in 0..steps {
                let p = dot(&a, &spec(&[1], &[]), &b, &spec(&[0], &[]), NxType::F(32)).unwrap();
                a = binary(BinaryOp::Add, &p, &cs, NxType::F(32)).unwrap();
            }
            let want: Vec<f64> = start
                .iter()
                .map(|&x| (0..steps).fold(x, |v, _| 0.5 * v + c) as f64)
                .collect();
            (floats(&a), want)
        };
        let results: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..3).map(|t| s.spawn(move || run(t))).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (t, (got, want)) in results.iter().enumerate() {
            let bad = got.iter().zip(want).filter(|(g, w)| g != w).count();
            assert_eq!(bad, 0, "thread {t}: {bad} of {} values differ (first {:?} vs {:?})", got.len(), &got[..4], &want[..4]);
        }
    }

    /// `:high` may use TF32 (about 1e-3 relative error on tensor-core GPUs), never worse.
    #[test]
    fn f32_products_at_high_precision_stay_within_tf32_error() {
        use crate::ops::precision::MatmulPrecision;
        let (m, k, n) = (96, 512, 80);
        let (a, b) = (noise(m * k, 3), noise(k * n, 4));
        let (ha, hb) = (f32s(&a, &[m, k]), f32s(&b, &[k, n]));
        let c = dot_with(&ha, &spec(&[1], &[]), &hb, &spec(&[0], &[]), NxType::F(32), Some(MatmulPrecision::High)).unwrap();
        let e = rel_error(&a, &b, &floats(&c), (1, m, k, n), false);
        assert!(e < 1e-2, "relative error {e:e}");
    }

    /// The f32 gemm (on x86 the `gemm` crate's AVX-512 microkernels where the CPU has them,
    /// else AVX2) at sizes that are not multiples of its register tiles (16/48 rows, 4-6
    /// columns) or cache blocks, so every edge kernel and partial panel runs, with plain and
    /// transposed operands, above the f64-accumulation limit. Each entry is held to
    /// 8·√k·2⁻²⁴ of Σ|aₗ·bₗ|, the reach of f32 rounding; a term dropped or taken twice moves an
    /// entry by about one term, |aₗ·bₗ| ≈ Σ|aₗ·bₗ|/k, far above that bound for these k.
    #[test]
    fn f32_products_at_odd_sizes_match_the_f64_product() {
        for (case, &(m, k, n)) in [(37, 301, 53), (1, 1000, 300), (300, 1000, 1), (129, 257, 65), (17, 4099, 5), (49, 96, 97)]
            .iter()
            .enumerate()
        {
            assert!(m * k * n > WIDE_DOT_LIMIT, "{m}x{k}x{n} would take the f64 path");
            let (a, b) = (noise(m * k, 10 + case as u64), noise(k * n, 20 + case as u64));
            for a_t in [false, true] {
                let ha = if a_t { f32s(&a, &[k, m]) } else { f32s(&a, &[m, k]) };
                let axis = if a_t { 0 } else { 1 };
                let c = dot(&ha, &spec(&[axis], &[]), &f32s(&b, &[k, n]), &spec(&[0], &[]), NxType::F(32)).unwrap();
                assert_eq!((c.ty, c.shape.clone()), (NxType::F(32), vec![m, n]));
                let a_at = |i: usize, l: usize| if a_t { a[l * m + i] } else { a[i * k + l] } as f64;
                assert_f32_product(&floats(&c), a_at, &b, (m, k, n), &format!("lhs transposed: {a_t}"));
            }
        }
    }

    #[test]
    fn mismatched_contraction_is_an_error() {
        let a = f32s(&[1.0, 2.0], &[2]);
        let b = f32s(&[1.0, 2.0, 3.0], &[3]);
        assert!(dot(&a, &spec(&[0], &[]), &b, &spec(&[0], &[]), NxType::F(32)).is_err());
    }
}
