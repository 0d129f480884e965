//! Mid-size f32/f64 products on the CPU, cut into row blocks that flex multiplies on one
//! thread each, the blocks spread by `par_tasks`.
//!
//! Why: above 192^3 multiply-adds flex hands a product to gemm with rayon parallelism, and
//! gemm forks from the calling thread. Our callers are the BEAM's dirty schedulers, outside
//! rayon's pool, so every such product parks the caller and wakes a worker, twice, and those
//! context switches weigh on a mid-size product (perf: `finish_task_switch`).
//! Through `par_tasks` the caller starts on the first block at once and a worker takes blocks
//! as soon as it wakes. The gain shrinks with the product's size and turns negative around
//! 2^26, so products above 2^25 stay whole, where gemm's own split (one packed B) does as well
//! (guides/backend.md has the timings).
//! Written against Burn's public API, so it could move upstream into flex's matmul.

use std::sync::Mutex;

use burn::backend::ops::FloatTensorOps;
use burn::backend::{BackendTensor, DType, Dispatch, DispatchTensorKind};
use burn::tensor::Slice;

use super::vector::par_tasks;
use crate::dispatch::{self, Prim};

/// burn-flex's PARALLEL_THRESHOLD (ops/matmul.rs): products from here up are threaded by gemm.
const FLEX_PARALLEL: usize = 192 * 192 * 192;
/// Products above this many multiply-adds stay whole.
const SPLIT_MAX: usize = 1 << 25;
/// Blocks thinner than this would run gemm at a poor shape.
const MIN_ROWS: usize = 16;

/// `pa · pb` for flex f32/f64 operands `[1, m, k]` and `[1, k, n]` in the size range above, as
/// row blocks of fewer than `FLEX_PARALLEL` multiply-adds each; `None` otherwise.
pub fn matmul(pa: &Prim, pb: &Prim, [bsz, m, k, n]: [usize; 4]) -> Option<Prim> {
    let flex_float = |p: &Prim| matches!(&p.kind, DispatchTensorKind::Flex(BackendTensor::Float(t)) if matches!(t.dtype(), DType::F32 | DType::F64));
    let macs = m.checked_mul(k)?.checked_mul(n)?;
    if bsz != 1 || !(FLEX_PARALLEL..=SPLIT_MAX).contains(&macs) || rayon::current_num_threads() < 2 || !flex_float(pa) || !flex_float(pb) {
        return None;
    }
    let rows = (FLEX_PARALLEL - 1) / (k * n);
    if rows < MIN_ROWS || m <= rows {
        return None;
    }
    let blocks = m.div_ceil(rows);
    let parts: Vec<Mutex<Option<Prim>>> = (0..blocks).map(|_| Mutex::new(None)).collect();
    par_tasks(blocks, &|i| {
        let (r0, r1) = (i * rows, m.min((i + 1) * rows));
        let a = dispatch::slice(pa.clone(), &[Slice::new(0, Some(1), 1), Slice::new(r0 as isize, Some(r1 as isize), 1), Slice::new(0, Some(k as isize), 1)]);
        let p = Dispatch::float_matmul(a, pb.clone());
        *parts[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
    });
    // par_tasks returned, so every task ran (a panic would have been re-raised)
    let parts: Vec<Prim> = parts.into_iter().map(|p| p.into_inner().unwrap_or_else(|e| e.into_inner()).expect("every block ran")).collect();
    Some(dispatch::cat(parts, 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{assert_f32_product, flex_f32s, prim_f32s};

    /// Split products equal the whole product computed in f64 within f32 rounding, at row
    /// counts that leave a partial last block, and the sizes outside the range are declined.
    #[test]
    fn split_products_match_the_f64_product() {
        for (m, k, n) in [(256, 256, 256), (301, 200, 150), (1000, 300, 40)] {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 104729) % 997) as f32 / 498.5 - 1.0).collect();
            let got = matmul(&flex_f32s(a.clone(), &[1, m, k]), &flex_f32s(b.clone(), &[1, k, n]), [1, m, k, n]).expect("in range");
            assert_eq!(dispatch::dims(&got), vec![1, m, n]);
            let got: Vec<f64> = prim_f32s(got).into_iter().map(f64::from).collect();
            assert_f32_product(&got, |i, l| a[i * k + l] as f64, &b, (m, k, n), "row split");
        }
        // a NaN in a row of A makes that row NaN, an infinity in a column of B that column
        let (m, k, n) = (256, 256, 256);
        let mut a = vec![0.5f32; m * k];
        let mut b = vec![0.25f32; k * n];
        a[200 * k + 3] = f32::NAN;
        b[10 * n + 77] = f32::INFINITY;
        let got = prim_f32s(matmul(&flex_f32s(a, &[1, m, k]), &flex_f32s(b, &[1, k, n]), [1, m, k, n]).expect("in range"));
        for i in 0..m {
            for j in 0..n {
                let v = got[i * n + j];
                match (i, j) {
                    (200, _) => assert!(v.is_nan(), "({i},{j}) = {v}"),
                    (_, 77) => assert_eq!(v, f32::INFINITY, "({i},{j})"),
                    _ => assert_eq!(v, 32.0, "({i},{j})"),
                }
            }
        }
        let small = flex_f32s(vec![1.0; 64 * 64], &[1, 64, 64]);
        assert!(matmul(&small, &small, [1, 64, 64, 64]).is_none());
    }
}
