//! `x @ Wᵀ` in f32 for `W` in PyTorch's `[out, in]` layout, each output summed in one order
//! whatever the number of rows of `x`: accumulator lane `l` adds, with FMA, the products of the
//! columns `c ≡ l (mod 8)` in increasing `c`; the eight lanes are then added in a fixed tree, and
//! the columns past the last full eight last. A row of `x` thus gives the same bits alone and
//! among any other rows (an embedding does not depend on the texts sharing its batch), which a
//! switch between kernels by row count (a dot-product pass for few rows, gemm for many) breaks.
//! Rows of `x` and of `W` are tiled in registers, and each task's block of `W` stays in L2 while
//! every tile of `x` passes over it, so one kernel serves one row and hundreds.

use super::vector::{par_tasks, simd, SharedMut, Simd};

/// Bytes of `W` one task owns: a block that stays in L2 while the tiles of `x` pass over it.
const BLOCK_BYTES: usize = 192 << 10;

/// Multiply-adds below which one thread does it all.
const PAR_WORK: usize = 1 << 16;

/// Accumulator lanes every level ends with (AVX-512 sums in sixteen, then folds them to eight).
const LANES: usize = 8;

/// `x @ Wᵀ` for `w` of `n` rows of `k` values and `x` of `m` rows of `k`: `m` rows of `n`.
pub(crate) fn linear_f32(w: &[f32], n: usize, k: usize, x: &[f32], m: usize) -> Vec<f32> {
    assert!(w.len() == n * k && x.len() == m * k, "linear_f32: [{n}, {k}] weights and [{m}, {k}] rows hold {} and {} values", w.len(), x.len());
    let mut out = vec![0f32; m * n];
    if m == 0 || n == 0 {
        return out;
    }
    let level = simd();
    let threads = rayon::current_num_threads().max(1);
    // blocks that fit in L2, and at least eight a thread where `n` allows, so threads end together
    let fit = BLOCK_BYTES / (4 * k.min(KC)).max(1);
    let block = fit.min(n.div_ceil(8 * threads)).max(12).next_multiple_of(12).min(n);
    let tasks = n.div_ceil(block);
    let base = SharedMut(out.as_mut_ptr());
    let task = |t: usize| {
        let (j0, j1) = (t * block, ((t + 1) * block).min(n));
        // SAFETY: task `t` writes only columns j0..j1 of the `m` rows of `out`, which outlives
        // every task; `w` and `x` hold the values the assert above checked.
        unsafe { block_rows(level, w, x, k, m, n, j0, j1, base.get()) }
    };
    if m * n * k < PAR_WORK {
        (0..tasks).for_each(task);
    } else {
        par_tasks(tasks, &task);
    }
    out
}

/// Columns `j0..j1` of every output row.
#[allow(clippy::too_many_arguments)]
unsafe fn block_rows(level: Simd, w: &[f32], x: &[f32], k: usize, m: usize, n: usize, j0: usize, j1: usize, out: *mut f32) {
    #[cfg(target_arch = "x86_64")]
    if level >= Simd::Avx512 {
        return avx512::block(w.as_ptr(), x.as_ptr(), k, m, n, j0, j1, out);
    }
    #[cfg(target_arch = "x86_64")]
    if level >= Simd::Avx2 {
        return avx2::block(w.as_ptr(), x.as_ptr(), k, m, n, j0, j1, out);
    }
    let _ = level;
    scalar_block(w, x, k, m, n, j0, j1, out)
}

/// The lanes' sum in the tree every level uses: `l` and `l + 4`, then `l` and `l + 2`, then the
/// two left; then the tail columns in order.
#[inline(always)]
fn finish(lanes: [f32; LANES], x: &[f32], w: &[f32]) -> f32 {
    let a = [lanes[0] + lanes[4], lanes[1] + lanes[5], lanes[2] + lanes[6], lanes[3] + lanes[7]];
    let b = [a[0] + a[2], a[1] + a[3]];
    let mut s = b[0] + b[1];
    for (xv, wv) in x.iter().zip(w) {
        s = xv.mul_add(*wv, s);
    }
    s
}

/// The same sums without SIMD intrinsics (other CPUs): eight lanes per output, `mul_add` each.
#[allow(clippy::too_many_arguments)]
unsafe fn scalar_block(w: &[f32], x: &[f32], k: usize, m: usize, n: usize, j0: usize, j1: usize, out: *mut f32) {
    let full = k - k % LANES;
    for i in 0..m {
        let xr = &x[i * k..(i + 1) * k];
        for j in j0..j1 {
            let wr = &w[j * k..(j + 1) * k];
            let mut lanes = [0f32; LANES];
            for (xc, wc) in xr[..full].chunks_exact(LANES).zip(wr[..full].chunks_exact(LANES)) {
                for l in 0..LANES {
                    lanes[l] = xc[l].mul_add(wc[l], lanes[l]);
                }
            }
            *out.add(i * n + j) = finish(lanes, &xr[full..], &wr[full..]);
        }
    }
}

/// Columns of `x` and `W` a tile's pass covers before the next tile's: the two tiles' rows of
/// that many columns stay in L1 (rows of thousands of values would not). The accumulators are
/// kept between passes, so the sums' order does not change.
const KC: usize = 512;

/// The tile driver both x86 levels share: `MR` rows of `x` by `NR` rows of `W` a tile, `x`'s tile
/// outside (it stays in L1), `W`'s inside (the block stays in L2), `KC` columns a pass. The last
/// rows of `x` take a tile of their own count; a short tile of `W` at a block's end reuses its
/// last row, computed again and not stored. Every output runs through the same sums.
macro_rules! tiled {
    ($features:literal) => {
        #[target_feature(enable = $features)]
        #[allow(clippy::too_many_arguments)]
        pub(super) unsafe fn block(w: *const f32, x: *const f32, k: usize, m: usize, n: usize, j0: usize, j1: usize, out: *mut f32) {
            let mut i = 0;
            while i + MR <= m {
                rows::<MR>(w, x, k, i, n, j0, j1, out);
                i += MR;
            }
            match m - i {
                0 => {}
                1 => rows::<1>(w, x, k, i, n, j0, j1, out),
                2 => rows::<2>(w, x, k, i, n, j0, j1, out),
                3 => rows::<3>(w, x, k, i, n, j0, j1, out),
                4 => rows::<4>(w, x, k, i, n, j0, j1, out),
                5 => rows::<5>(w, x, k, i, n, j0, j1, out),
                r => unreachable!("{r} rows left of a tile of {MR}"),
            }
        }

        /// Rows `i..i + M` of `x` against the block.
        #[target_feature(enable = $features)]
        #[allow(clippy::too_many_arguments)]
        unsafe fn rows<const M: usize>(w: *const f32, x: *const f32, k: usize, i: usize, n: usize, j0: usize, j1: usize, out: *mut f32) {
            let tiles = (j1 - j0).div_ceil(NR);
            let mut accs: Vec<[[V; NR]; M]> = vec![zero::<M>(); tiles];
            let xs: [*const f32; M] = std::array::from_fn(|r| x.add((i + r) * k));
            let ws = |t: usize| -> [*const f32; NR] {
                let (j, nr) = (j0 + t * NR, (j1 - j0 - t * NR).min(NR));
                std::array::from_fn(|c| w.add((j + c.min(nr - 1)) * k))
            };
            let mut c0 = 0;
            loop {
                let c1 = (c0 + KC).min(k);
                for (t, acc) in accs.iter_mut().enumerate() {
                    step::<M>(xs, ws(t), c0, c1, acc);
                }
                if c1 == k {
                    break;
                }
                c0 = c1;
            }
            for (t, acc) in accs.iter().enumerate() {
                let (j, nr) = (j0 + t * NR, (j1 - j0 - t * NR).min(NR));
                let sums = finish_tile::<M>(xs, ws(t), k, acc);
                for r in 0..M {
                    for c in 0..nr {
                        *out.add((i + r) * n + j + c) = sums[r][c];
                    }
                }
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{finish, KC, LANES};
    use std::arch::x86_64::*;

    const MR: usize = 6;
    const NR: usize = 2;
    type V = __m256;

    #[inline(always)]
    unsafe fn zero<const M: usize>() -> [[V; NR]; M] {
        [[_mm256_setzero_ps(); NR]; M]
    }

    /// The products of columns `c0..c1` (a multiple of eight, or `k`) into an `MR × NR` tile:
    /// twelve accumulators, two `W` vectors, one `x` vector (fifteen of the sixteen registers).
    #[inline(always)]
    unsafe fn step<const M: usize>(xs: [*const f32; M], ws: [*const f32; NR], c0: usize, c1: usize, acc: &mut [[V; NR]; M]) {
        let full = c1 - (c1 - c0) % LANES;
        let mut a = *acc;
        let mut c = c0;
        while c < full {
            let wv = [_mm256_loadu_ps(ws[0].add(c)), _mm256_loadu_ps(ws[1].add(c))];
            for r in 0..M {
                let xv = _mm256_loadu_ps(xs[r].add(c));
                for j in 0..NR {
                    a[r][j] = _mm256_fmadd_ps(xv, wv[j], a[r][j]);
                }
            }
            c += LANES;
        }
        *acc = a;
    }

    /// Each accumulator's lanes in `finish`'s tree (the same adds in vector registers), then
    /// the columns past the last eight.
    #[inline(always)]
    unsafe fn finish_tile<const M: usize>(xs: [*const f32; M], ws: [*const f32; NR], k: usize, acc: &[[V; NR]; M]) -> [[f32; NR]; M] {
        let full = k - k % LANES;
        let mut sums = [[0f32; NR]; M];
        for r in 0..M {
            for j in 0..NR {
                let v = acc[r][j];
                let s = if full == k {
                    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
                    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
                } else {
                    let mut lanes = [0f32; LANES];
                    _mm256_storeu_ps(lanes.as_mut_ptr(), v);
                    finish(lanes, std::slice::from_raw_parts(xs[r].add(full), k - full), std::slice::from_raw_parts(ws[j].add(full), k - full))
                };
                sums[r][j] = s;
            }
        }
        sums
    }

    tiled!("avx2,fma");
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{finish, KC, LANES};
    use std::arch::x86_64::*;

    const MR: usize = 6;
    const NR: usize = 4;
    type V = __m512;

    #[inline(always)]
    unsafe fn zero<const M: usize>() -> [[V; NR]; M] {
        [[_mm512_setzero_ps(); NR]; M]
    }

    /// AVX2's step at twice the width: sixteen lanes over the columns `c ≡ l (mod 16)` (`KC` is
    /// a multiple of sixteen, so every pass keeps the lanes' columns).
    #[inline(always)]
    unsafe fn step<const M: usize>(xs: [*const f32; M], ws: [*const f32; NR], c0: usize, c1: usize, acc: &mut [[V; NR]; M]) {
        let wide = c1 - (c1 - c0) % (2 * LANES);
        let mut a = *acc;
        let mut c = c0;
        while c < wide {
            let wv = [_mm512_loadu_ps(ws[0].add(c)), _mm512_loadu_ps(ws[1].add(c)), _mm512_loadu_ps(ws[2].add(c)), _mm512_loadu_ps(ws[3].add(c))];
            for r in 0..M {
                let xv = _mm512_loadu_ps(xs[r].add(c));
                for j in 0..NR {
                    a[r][j] = _mm512_fmadd_ps(xv, wv[j], a[r][j]);
                }
            }
            c += 2 * LANES;
        }
        *acc = a;
    }

    /// The sixteen lanes folded to eight (`l` and `l + 8`), a last eight columns when `k` leaves
    /// them, then `finish`'s tree and the columns past those.
    #[inline(always)]
    unsafe fn finish_tile<const M: usize>(xs: [*const f32; M], ws: [*const f32; NR], k: usize, acc: &[[V; NR]; M]) -> [[f32; NR]; M] {
        let full = k - k % LANES;
        let wide = full - full % (2 * LANES);
        let mut sums = [[0f32; NR]; M];
        for r in 0..M {
            let xt = std::slice::from_raw_parts(xs[r].add(full), k - full);
            for j in 0..NR {
                let mut v = _mm256_add_ps(_mm512_castps512_ps256(acc[r][j]), _mm512_extractf32x8_ps(acc[r][j], 1));
                if wide < full {
                    v = _mm256_fmadd_ps(_mm256_loadu_ps(xs[r].add(wide)), _mm256_loadu_ps(ws[j].add(wide)), v);
                }
                let mut lanes = [0f32; LANES];
                _mm256_storeu_ps(lanes.as_mut_ptr(), v);
                sums[r][j] = finish(lanes, xt, std::slice::from_raw_parts(ws[j].add(full), k - full));
            }
        }
        sums
    }

    tiled!("avx512f,avx512dq,avx2,fma");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(len: usize, seed: usize) -> Vec<f32> {
        (0..len).map(|i| (((i * 7919 + seed * 104_729) % 2001) as f32 / 1000.0 - 1.0) * 0.37).collect()
    }

    fn run(level: Simd, w: &[f32], n: usize, k: usize, x: &[f32], m: usize) -> Vec<f32> {
        let mut out = vec![f32::NAN; m * n];
        // SAFETY: one block of all the columns, into an `out` of m rows of n
        unsafe { block_rows(level, w, x, k, m, n, 0, n, out.as_mut_ptr()) };
        out
    }

    #[test]
    fn linear_equals_an_f64_product() {
        // k: multiples of 16 and 8, a remainder below 8, below one vector; n and m off the tiles
        for (n, k, m) in [(1, 32, 1), (7, 384, 5), (384, 384, 16), (1536, 384, 7), (5, 1536, 33), (13, 45, 9), (3, 5, 2), (64, 24, 40), (10, 0, 3)] {
            let (w, x) = (values(n * k, 1), values(m * k, 2));
            let got = linear_f32(&w, n, k, &x, m);
            assert_eq!(got.len(), m * n);
            for i in 0..m {
                for j in 0..n {
                    let want: f64 = (0..k).map(|c| w[j * k + c] as f64 * x[i * k + c] as f64).sum();
                    let g = got[i * n + j] as f64;
                    assert!((g - want).abs() <= 1e-6 * (1.0 + want.abs()) * (k as f64).sqrt(), "{n}x{k} m={m} [{i},{j}]: {g} vs {want}");
                }
            }
        }
        assert!(linear_f32(&[], 0, 4, &values(8, 1), 2).is_empty());
        assert!(linear_f32(&values(8, 1), 2, 4, &[], 0).is_empty());
    }

    #[test]
    fn a_row_gives_the_same_bits_alone_and_among_any_rows() {
        // row counts across the tiles, the thread split and the single-thread threshold
        for (n, k) in [(1152, 384), (384, 1536), (37, 100), (64, 32)] {
            let w = values(n * k, 3);
            let x = values(200 * k, 4);
            let alone: Vec<Vec<f32>> = (0..200).map(|i| linear_f32(&w, n, k, &x[i * k..(i + 1) * k], 1)).collect();
            for m in [2, 3, 5, 6, 7, 13, 24, 25, 64, 200] {
                let all = linear_f32(&w, n, k, &x[..m * k], m);
                for i in 0..m {
                    assert_eq!(all[i * n..(i + 1) * n], alone[i][..], "{n}x{k}: row {i} of {m}");
                }
            }
        }
    }

    #[test]
    fn specials_propagate_per_row() {
        let (n, k, m) = (5, 40, 3);
        let w = values(n * k, 5);
        let mut x = values(m * k, 6);
        x[k + 3] = f32::NAN;
        x[2 * k + 39] = f32::INFINITY;
        let y = linear_f32(&w, n, k, &x, m);
        assert!(y[..n].iter().all(|v| v.is_finite()));
        assert!(y[n..2 * n].iter().all(|v| v.is_nan()));
        assert!(y[2 * n..].iter().all(|v| !v.is_finite()));
    }

    /// Every level sums in one order: the scalar code gives AVX2's bits.
    #[test]
    fn scalar_sums_equal_avx2s() {
        if simd() < Simd::Avx2 {
            return;
        }
        for (n, k, m) in [(7, 384, 5), (13, 45, 9), (64, 24, 40)] {
            let (w, x) = (values(n * k, 7), values(m * k, 8));
            assert_eq!(run(Simd::Base, &w, n, k, &x, m), run(Simd::Avx2, &w, n, k, &x, m), "{n}x{k} m={m}");
        }
    }
}
