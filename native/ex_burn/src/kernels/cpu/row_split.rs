//! Mid-size f32/f64 products on the CPU, cut into row blocks that the `gemm` crate multiplies
//! on one thread each, straight into one output buffer, the blocks spread by `par_tasks`.
//!
//! Why: from 192^3 multiply-adds flex hands a product to gemm with rayon parallelism, and gemm
//! forks from the calling thread. Our callers are the BEAM's dirty schedulers, outside rayon's
//! pool, so every such product parks the caller and wakes a worker, twice, and those context
//! switches weigh on a mid-size product (perf: `finish_task_switch`). Below 192^3 flex keeps a
//! product on one thread. Through `par_tasks` the caller starts on the first block at once and a
//! worker takes blocks as soon as it wakes. Each block packs its own copy of B, which costs more
//! than it saves on large products, so products above 2^25 stay with gemm's own split (one
//! packed B); guides/backend.md has the timings.

use burn::backend::DType;
use burn::tensor::TensorData;

use super::strided::View;
use super::vector::{par_tasks, SharedMut};
use crate::dispatch::{self, Prim};

/// Products from this many multiply-adds up are split (below, the fork costs what it saves).
const SPLIT_MIN: usize = 1 << 18;
/// Products above this many multiply-adds stay whole.
const SPLIT_MAX: usize = 1 << 25;
/// Blocks thinner than this would run gemm at a poor shape.
const MIN_ROWS: usize = 16;

/// `pa · pb` for flex f32/f64 operands `[1, m, k]` and `[1, k, n]` of one dtype (any strides) in
/// the size range above, as row blocks; `None` otherwise.
pub fn matmul(pa: &Prim, pb: &Prim, [bsz, m, k, n]: [usize; 4]) -> Option<Prim> {
    let macs = m.checked_mul(k)?.checked_mul(n)?;
    let threads = rayon::current_num_threads();
    if bsz != 1 || !(SPLIT_MIN..=SPLIT_MAX).contains(&macs) || threads < 2 || m < 2 * MIN_ROWS {
        return None;
    }
    // two blocks a thread where they stay thick enough, so a thread another process holds up
    // leaves its second block to the other
    let blocks = (2 * threads).min(m / MIN_ROWS);
    let dims = [m, k, n];
    if let (Some(a), Some(b)) = (View::<f32>::of::<f32>(pa, DType::F32), View::<f32>::of::<f32>(pb, DType::F32)) {
        return split(a, b, dims, blocks, [0.0, 1.0]);
    }
    split(View::<f64>::of::<f64>(pa, DType::F64)?, View::<f64>::of::<f64>(pb, DType::F64)?, dims, blocks, [0.0, 1.0])
}

/// The product as `blocks` row blocks, each a one-thread gemm writing its rows of the result
/// (`[zero, one]` of `T` for gemm's `alpha` and `beta`); `None` where the views are not
/// `[1, m, k]` and `[1, k, n]`.
fn split<T: burn::tensor::Element + bytemuck::Pod>(a: View<T>, b: View<T>, [m, k, n]: [usize; 3], blocks: usize, [zero, one]: [T; 2]) -> Option<Prim> {
    if a.shape != [1, m, k] || b.shape != [1, k, n] {
        return None;
    }
    let rows = m.div_ceil(blocks);
    let mut out = vec![zero; m * n];
    // each task writes only its own rows of `out`, which outlives `par_tasks`
    let dst = SharedMut(out.as_mut_ptr());
    par_tasks(blocks, &|i| {
        let (r0, r1) = (i * rows, m.min((i + 1) * rows));
        if r0 >= r1 {
            return;
        }
        // SAFETY: every element the operand views reach is in their storage (`View::of`),
        // rows r0..r1 of `out` are this task's alone, and gemm does not read `dst` (`read_dst`
        // false).
        unsafe {
            gemm::gemm(
                r1 - r0,
                n,
                k,
                dst.get().add(r0 * n),
                1,
                n as isize,
                false,
                a.ptr(0, r0, 0),
                a.strides[2],
                a.strides[1],
                b.ptr(0, 0, 0),
                b.strides[2],
                b.strides[1],
                zero,
                one,
                false,
                false,
                false,
                gemm::Parallelism::None,
            )
        }
    });
    Some(dispatch::from_data(TensorData::new(out, [1, m, n]), &burn::tensor::Device::flex()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{assert_f32_product, flex_f32s, prim_f32s};
    use burn::backend::ops::FloatTensorOps;
    use burn::backend::Dispatch;

    fn values(len: usize, p: usize, q: usize) -> Vec<f32> {
        (0..len).map(|i| ((i * p) % q) as f32 / (q as f32 / 2.0) - 1.0).collect()
    }

    /// Split products equal the whole product computed in f64 within f32 rounding, at row
    /// counts that leave a partial last block and with transposed operands read where they
    /// lie; f64 products to f64 rounding; the sizes outside the range are declined.
    #[test]
    fn split_products_match_the_f64_product() {
        for (m, k, n) in [(64, 64, 64), (256, 256, 256), (301, 200, 150), (1000, 300, 40)] {
            let (a, b) = (values(m * k, 7919, 1000), values(k * n, 104729, 997));
            let got = matmul(&flex_f32s(a.clone(), &[1, m, k]), &flex_f32s(b.clone(), &[1, k, n]), [1, m, k, n]).expect("in range");
            assert_eq!(dispatch::dims(&got), vec![1, m, n]);
            let got: Vec<f64> = prim_f32s(got).into_iter().map(f64::from).collect();
            assert_f32_product(&got, |i, l| a[i * k + l] as f64, &b, (m, k, n), "row split");
        }
        // Aᵀ and Bᵀ stored as [k, m] and [n, k]
        let (m, k, n) = (200, 120, 90);
        let (at, bt) = (values(k * m, 7919, 1000), values(n * k, 104729, 997));
        let pa = dispatch::permute(flex_f32s(at.clone(), &[1, k, m]), &[0, 2, 1]);
        let pb = dispatch::permute(flex_f32s(bt.clone(), &[1, n, k]), &[0, 2, 1]);
        let got: Vec<f64> = prim_f32s(matmul(&pa, &pb, [1, m, k, n]).expect("in range")).into_iter().map(f64::from).collect();
        let b: Vec<f32> = (0..k * n).map(|i| bt[(i % n) * k + i / n]).collect();
        assert_f32_product(&got, |i, l| at[l * m + i] as f64, &b, (m, k, n), "transposed operands");
        // f64: exactly the product, as every partial sum of these dyadic values is exact
        let (m, k, n) = (128, 96, 64);
        let a64: Vec<f64> = values(m * k, 31, 64).into_iter().map(f64::from).collect();
        let b64: Vec<f64> = values(k * n, 17, 32).into_iter().map(f64::from).collect();
        let flex64 = |v: Vec<f64>, d: [usize; 3]| dispatch::from_data(TensorData::new(v, d), &burn::tensor::Device::flex());
        let got = matmul(&flex64(a64.clone(), [1, m, k]), &flex64(b64.clone(), [1, k, n]), [1, m, k, n]).expect("in range");
        let got = dispatch::into_data(got).unwrap().try_to_vec::<f64>().unwrap();
        for i in 0..m {
            for j in 0..n {
                let want: f64 = (0..k).map(|l| a64[i * k + l] * b64[l * n + j]).sum();
                assert_eq!(got[i * n + j], want, "f64 [{i},{j}]: products of these values are exact");
            }
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
        // too small, too few rows, batched, too large (the sizes alone decide)
        let small = flex_f32s(vec![1.0; 48 * 48], &[1, 48, 48]);
        assert!(matmul(&small, &small, [1, 48, 48, 48]).is_none());
        let (thin, wide) = (flex_f32s(vec![1.0; 16 * 4096], &[1, 16, 4096]), flex_f32s(vec![1.0; 4096 * 64], &[1, 4096, 64]));
        assert!(matmul(&thin, &wide, [1, 16, 4096, 64]).is_none());
        assert!(matmul(&small, &small, [2, 64, 64, 64]).is_none());
        assert!(matmul(&small, &small, [1, 1024, 256, 256]).is_none());
    }

    /// Split against flex's whole product, alternating calls from a thread outside rayon's pool
    /// (as a dirty scheduler calls): min / median µs at sizes in and around the range.
    #[test]
    #[ignore]
    fn row_split_timing() {
        println!("load: {}", std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim());
        for (m, k, n) in [(64, 64, 64), (160, 160, 160), (256, 256, 256), (128, 784, 256), (300, 300, 300), (1024, 128, 128)] {
            let (a, b) = (flex_f32s(values(m * k, 7919, 1000), &[1, m, k]), flex_f32s(values(k * n, 104729, 997), &[1, k, n]));
            let mut times = [vec![], vec![]];
            for round in 0..600 {
                let t = std::time::Instant::now();
                let r = if round % 2 == 0 { matmul(&a, &b, [1, m, k, n]).expect("in range") } else { Dispatch::float_matmul(a.clone(), b.clone()) };
                std::hint::black_box(r);
                times[round % 2].push(t.elapsed().as_micros());
            }
            let [split, whole] = times.map(|mut t| {
                t.sort();
                (t[0], t[t.len() / 2])
            });
            println!("{m}x{k}x{n}: split {} / {} µs, whole {} / {} µs", split.0, split.1, whole.0, whole.1);
        }
    }
}
