//! `x @ Wᵀ` in f32 for a constant `W` (a model's dense layer), repacked once at load into panels
//! of `NR` output columns, each three strips of 16 columns (`[k][16]` each), for CPUs with AVX2
//! and FMA. Each output is one accumulator lane that adds `x[r][c]·W[j][c]` with FMA in
//! increasing `c`, so a row of `x` gives the same bits alone and among any other rows, as
//! `linear` guarantees, and AVX-512 and AVX2 give the same bits.
//!
//! Why: `linear` reads `W` in its stored `[out, in]` layout and sums each output across vector
//! lanes, which ends every output with a horizontal reduction: at BERT's 384-wide inputs a sixth of
//! the work. Here a tile of `MR` rows by `NR` columns broadcasts one `x` value a row against
//! `NR / 16` weight vectors per column `c`, and nothing is reduced across lanes.

use super::vector::{par_tasks, simd, SharedMut, Simd};

/// Output columns a panel holds: three AVX-512 vectors.
const NR: usize = 48;

/// Output columns a strip holds: one AVX-512 vector, two AVX2 ones. A strip's weights are
/// contiguous, so an AVX2 tile (one strip) reads only whole cache lines of it, and the strip
/// (`k · 64` bytes: 24 KiB at 384 inputs) stays in L1 across the row tiles that reuse it; in
/// `[k][NR]` rows a tile's 16 columns took a third of each line, and the lines it touched
/// (three times that) streamed from L2 for every tile.
const STRIP: usize = 16;

/// Rows of `x` an AVX-512 tile holds: 8 x 3 accumulators, 3 weight vectors and a broadcast in
/// the 32 registers. AVX2's tiles are 6 rows by 16 columns (`avx2`).
const MR: usize = 8;

/// Multiply-adds below which one thread does it all.
const PAR_WORK: usize = 1 << 16;

/// `W` (`n` rows of `k` values) in panels of strips: strip `s` of panel `p`, column `c` holds
/// `W[p·NR + s·STRIP + j][c]` at `((p·3 + s)·k + c)·STRIP + j`, zeros past `n`; and the bias,
/// zeros past `n` too.
pub struct PackedLinear {
    n: usize,
    k: usize,
    panels: Vec<f32>,
    bias: Option<Vec<f32>>,
    level: Simd,
}

impl PackedLinear {
    /// `w` (`[n, k]`, PyTorch's `[out, in]`) and the bias `b` (`n` values) in panels, where the
    /// CPU has AVX2 and FMA; `None` elsewhere (`linear::linear_f32` serves those).
    pub fn new(w: &[f32], b: Option<&[f32]>, n: usize, k: usize) -> Option<PackedLinear> {
        assert_eq!(w.len(), n * k, "PackedLinear: {} values for [{n}, {k}]", w.len());
        let level = simd();
        if !cfg!(target_arch = "x86_64") || level < Simd::Avx2 {
            return None;
        }
        let mut panels = vec![0f32; n.div_ceil(NR) * k * NR];
        for (j, row) in w.chunks_exact(k.max(1)).enumerate().take(n) {
            let (strip, lane) = (j / STRIP, j % STRIP);
            for (c, &v) in row.iter().enumerate() {
                panels[(strip * k + c) * STRIP + lane] = v;
            }
        }
        if let Some(b) = b {
            assert_eq!(b.len(), n, "PackedLinear: {} bias values for {n} outputs", b.len());
        }
        let bias = b.map(|b| {
            let mut v = b.to_vec();
            v.resize(n.div_ceil(NR) * NR, 0.0);
            v
        });
        Some(PackedLinear { n, k, panels, bias, level })
    }

    pub fn out_features(&self) -> usize {
        self.n
    }

    /// `x @ Wᵀ (+ b)` for `x` of `m` rows of `k` values: `m` rows of `n`, the bias added to each
    /// finished sum.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul_at(self.level, x, m)
    }

    /// `matmul` on the kernels of `level` (at most the CPU's).
    fn matmul_at(&self, level: Simd, x: &[f32], m: usize) -> Vec<f32> {
        let (n, k) = (self.n, self.k);
        assert_eq!(x.len(), m * k, "PackedLinear: x holds {} values, not {m} rows of {k}", x.len());
        if m == 0 || n == 0 {
            return vec![0f32; m * n];
        }
        // every element is stored by a tile, so the buffer is not zeroed first
        let mut out: Vec<f32> = Vec::with_capacity(m * n);
        let base = SharedMut(out.as_mut_ptr());
        let task = |p: usize| {
            let cols = (n - p * NR).min(NR);
            // SAFETY: the level was checked at `new` (x86-64 only); task `p` writes only columns
            // p·NR..p·NR + cols of the `m` rows of `out`, which outlives every task; the panel
            // and `x` hold the values the asserts checked.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                let (w, bias) = (self.panels[p * k * NR..].as_ptr(), self.bias.as_ref().map(|b| b[p * NR..].as_ptr()));
                if level >= Simd::Avx512 {
                    avx512::panel(w, bias, x.as_ptr(), k, m, n, p * NR, cols, base.get())
                } else {
                    avx2::panel(w, bias, x.as_ptr(), k, m, n, p * NR, cols, base.get())
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            unreachable!("no panels off x86-64 ({cols} columns, {level:?})")
        };
        let panels = n.div_ceil(NR);
        if m * n * k < PAR_WORK {
            (0..panels).for_each(task);
        } else {
            par_tasks(panels, &task);
        }
        // SAFETY: the panels' tiles stored all m·n values (each panel every row of its
        // columns); a panicking task would have unwound out of `par_tasks` before this
        unsafe { out.set_len(m * n) };
        out
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{MR, STRIP};
    use std::arch::x86_64::*;

    /// Every row of `x` against one panel: tiles of `MR` rows, then one of the rows left.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn panel(w: *const f32, bias: Option<*const f32>, x: *const f32, k: usize, m: usize, n: usize, j0: usize, cols: usize, out: *mut f32) {
        let mut i = 0;
        while i + MR <= m {
            tile::<MR>(w, bias, x, k, i, n, j0, cols, out);
            i += MR;
        }
        match m - i {
            0 => {}
            1 => tile::<1>(w, bias, x, k, i, n, j0, cols, out),
            2 => tile::<2>(w, bias, x, k, i, n, j0, cols, out),
            3 => tile::<3>(w, bias, x, k, i, n, j0, cols, out),
            4 => tile::<4>(w, bias, x, k, i, n, j0, cols, out),
            5 => tile::<5>(w, bias, x, k, i, n, j0, cols, out),
            6 => tile::<6>(w, bias, x, k, i, n, j0, cols, out),
            7 => tile::<7>(w, bias, x, k, i, n, j0, cols, out),
            r => unreachable!("{r} rows left of a tile of {MR}"),
        }
    }

    /// Rows `i..i + M` of `x` by the panel's `cols` columns (the lanes past them are computed on
    /// the panel's zeros and not stored), plus the panel's bias.
    #[target_feature(enable = "avx512f")]
    #[inline]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<const M: usize>(w: *const f32, bias: Option<*const f32>, x: *const f32, k: usize, i: usize, n: usize, j0: usize, cols: usize, out: *mut f32) {
        let mut acc = [[_mm512_setzero_ps(); 3]; M];
        let xs: [*const f32; M] = std::array::from_fn(|r| x.add((i + r) * k));
        for c in 0..k {
            let wc = w.add(c * STRIP);
            let wv = [_mm512_loadu_ps(wc), _mm512_loadu_ps(wc.add(k * STRIP)), _mm512_loadu_ps(wc.add(2 * k * STRIP))];
            for r in 0..M {
                let xb = _mm512_set1_ps(*xs[r].add(c));
                for v in 0..3 {
                    acc[r][v] = _mm512_fmadd_ps(xb, wv[v], acc[r][v]);
                }
            }
        }
        if let Some(b) = bias {
            let bv = [_mm512_loadu_ps(b), _mm512_loadu_ps(b.add(16)), _mm512_loadu_ps(b.add(32))];
            for a in acc.iter_mut() {
                for v in 0..3 {
                    a[v] = _mm512_add_ps(a[v], bv[v]);
                }
            }
        }
        for (r, a) in acc.iter().enumerate() {
            let o = out.add((i + r) * n + j0);
            for (v, lanes) in a.iter().enumerate() {
                let take = cols.saturating_sub(16 * v).min(16);
                if take == 16 {
                    _mm512_storeu_ps(o.add(16 * v), *lanes);
                } else if take > 0 {
                    _mm512_mask_storeu_ps(o.add(16 * v), ((1u32 << take) - 1) as u16, *lanes);
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::STRIP;
    use std::arch::x86_64::*;

    /// Rows of `x` a tile holds: 6 x 2 accumulators, 2 weight vectors and a broadcast in the 16
    /// registers.
    const MR: usize = 6;

    /// Every row of `x` against one panel, a strip at a time (16 columns, two vectors).
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn panel(w: *const f32, bias: Option<*const f32>, x: *const f32, k: usize, m: usize, n: usize, j0: usize, cols: usize, out: *mut f32) {
        for s in (0..cols).step_by(STRIP) {
            let (w, bias, cols) = (w.add(s * k), bias.map(|b| b.add(s)), (cols - s).min(STRIP));
            let mut i = 0;
            while i + MR <= m {
                tile::<MR>(w, bias, x, k, i, n, j0 + s, cols, out);
                i += MR;
            }
            match m - i {
                0 => {}
                1 => tile::<1>(w, bias, x, k, i, n, j0 + s, cols, out),
                2 => tile::<2>(w, bias, x, k, i, n, j0 + s, cols, out),
                3 => tile::<3>(w, bias, x, k, i, n, j0 + s, cols, out),
                4 => tile::<4>(w, bias, x, k, i, n, j0 + s, cols, out),
                5 => tile::<5>(w, bias, x, k, i, n, j0 + s, cols, out),
                r => unreachable!("{r} rows left of a tile of {MR}"),
            }
        }
    }

    /// Rows `i..i + M` of `x` by one strip's 16 columns (`w` at its first), `cols` of them
    /// stored, plus their bias: the AVX-512 tile's sums, lane for lane.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<const M: usize>(w: *const f32, bias: Option<*const f32>, x: *const f32, k: usize, i: usize, n: usize, j0: usize, cols: usize, out: *mut f32) {
        let mut acc = [[_mm256_setzero_ps(); 2]; M];
        let xs: [*const f32; M] = std::array::from_fn(|r| x.add((i + r) * k));
        for c in 0..k {
            let wc = w.add(c * STRIP);
            let wv = [_mm256_loadu_ps(wc), _mm256_loadu_ps(wc.add(8))];
            for r in 0..M {
                let xb = _mm256_set1_ps(*xs[r].add(c));
                for v in 0..2 {
                    acc[r][v] = _mm256_fmadd_ps(xb, wv[v], acc[r][v]);
                }
            }
        }
        if let Some(b) = bias {
            let bv = [_mm256_loadu_ps(b), _mm256_loadu_ps(b.add(8))];
            for a in acc.iter_mut() {
                for v in 0..2 {
                    a[v] = _mm256_add_ps(a[v], bv[v]);
                }
            }
        }
        for (r, a) in acc.iter().enumerate() {
            let o = out.add((i + r) * n + j0);
            if cols == 16 {
                _mm256_storeu_ps(o, a[0]);
                _mm256_storeu_ps(o.add(8), a[1]);
            } else {
                let mut lanes = [0f32; 16];
                _mm256_storeu_ps(lanes.as_mut_ptr(), a[0]);
                _mm256_storeu_ps(lanes.as_mut_ptr().add(8), a[1]);
                std::ptr::copy_nonoverlapping(lanes.as_ptr(), o, cols);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(len: usize, seed: usize) -> Vec<f32> {
        (0..len).map(|i| (((i * 7919 + seed * 104_729) % 2001) as f32 / 1000.0 - 1.0) * 0.37).collect()
    }

    /// Each output is the FMA chain over the columns in order (computed here one output at a
    /// time), then the bias, bit for bit, at every level the CPU runs, for shapes across panels, tiles and the single-thread threshold; and a
    /// row's bits do not depend on the rows beside it.
    #[test]
    fn packed_linear_sums_each_output_in_column_order() {
        for (n, k, m) in [(1, 32, 1), (7, 384, 5), (1152, 384, 19), (384, 1536, 9), (50, 3, 17), (96, 45, 8), (10, 0, 3)] {
            let (w, x, b) = (values(n * k, 1), values(m * k, 2), values(n, 3));
            for bias in [None, Some(&b[..])] {
                let Some(p) = PackedLinear::new(&w, bias, n, k) else { return };
                let got = p.matmul(&x, m);
                // the narrower level's kernels give the same bits
                assert_eq!(p.matmul_at(Simd::Avx2, &x, m), got, "{n}x{k} m={m}: AVX2 against {:?}", p.level);
                for i in 0..m {
                    for j in 0..n {
                        let sum = (0..k).fold(0f32, |s, c| x[i * k + c].mul_add(w[j * k + c], s));
                        let want = bias.map_or(sum, |b| sum + b[j]);
                        assert_eq!(got[i * n + j].to_bits(), want.to_bits(), "{n}x{k} m={m} bias {} [{i},{j}]", bias.is_some());
                    }
                    assert_eq!(p.matmul(&x[i * k..(i + 1) * k], 1), got[i * n..(i + 1) * n], "{n}x{k}: row {i} of {m} alone");
                }
            }
        }
    }

    #[test]
    fn packed_linear_propagates_specials_per_row() {
        let (n, k, m) = (5, 40, 3);
        let Some(p) = PackedLinear::new(&values(n * k, 5), None, n, k) else { return };
        let mut x = values(m * k, 6);
        x[k + 3] = f32::NAN;
        x[2 * k + 39] = f32::INFINITY;
        let y = p.matmul(&x, m);
        assert!(y[..n].iter().all(|v| v.is_finite()));
        assert!(y[n..2 * n].iter().all(|v| v.is_nan()));
        assert!(y[2 * n..].iter().all(|v| !v.is_finite()));
    }

    /// GFLOP/s of independent AVX2 FMA chains on `threads` threads at once, no memory touched:
    /// what the cores deliver together, which on a VM whose vCPUs share a physical core is one
    /// core's rate however many threads run.
    #[cfg(target_arch = "x86_64")]
    fn fma_peak(threads: usize) -> f64 {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn chains(iters: usize) -> f32 {
            use std::arch::x86_64::*;
            let (m, c) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
            let mut acc = [_mm256_set1_ps(1.0); 12];
            for _ in 0..iters {
                for a in acc.iter_mut() {
                    *a = _mm256_fmadd_ps(*a, m, c);
                }
            }
            let mut out = [0f32; 8];
            _mm256_storeu_ps(out.as_mut_ptr(), acc.iter().fold(_mm256_setzero_ps(), |s, a| _mm256_add_ps(s, *a)));
            out[0]
        }
        let iters = 50_000_000;
        let t0 = std::time::Instant::now();
        // SAFETY: the caller checked AVX2 and FMA (`simd()`).
        std::thread::scope(|s| (0..threads).map(|_| s.spawn(|| unsafe { chains(iters) })).collect::<Vec<_>>().into_iter().for_each(|h| {
            std::hint::black_box(h.join().unwrap());
        }));
        (threads * iters * 12 * 16) as f64 / t0.elapsed().as_secs_f64() / 1e9
    }

    /// all-MiniLM-L6-v2's four dense shapes at the benchmark's 527 token rows, two threads: best
    /// and median of 20 calls each (`--ignored --nocapture`), after the machine's FMA rate on one
    /// thread and on the pool's threads at once (`fma_peak`).
    #[test]
    #[ignore]
    fn packed_linear_timing() {
        println!("load: {}", std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim());
        #[cfg(target_arch = "x86_64")]
        if simd() >= Simd::Avx2 {
            let threads = rayon::current_num_threads();
            println!("AVX2 FMA chains: 1 thread {:.0} GFLOP/s, {threads} threads {:.0} GFLOP/s together", fma_peak(1), fma_peak(threads));
        }
        let m = 527;
        for (n, k) in [(1152, 384), (384, 384), (1536, 384), (384, 1536)] {
            let Some(p) = PackedLinear::new(&values(n * k, 1), None, n, k) else { return };
            let x = values(m * k, 2);
            let mut t: Vec<f64> = (0..20)
                .map(|_| {
                    let t0 = std::time::Instant::now();
                    std::hint::black_box(p.matmul(&x, m));
                    t0.elapsed().as_secs_f64()
                })
                .collect();
            t.sort_by(f64::total_cmp);
            let flop = 2.0 * (m * n * k) as f64;
            println!("{m}x{k} @ {k}x{n}: best {:.3} ms ({:.0} GFLOP/s), median {:.3} ms", t[0] * 1e3, flop / t[0] / 1e9, t[10] * 1e3);
        }
    }
}
