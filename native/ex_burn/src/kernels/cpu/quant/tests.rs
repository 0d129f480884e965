//! The block kernels against independent references: candle's dequantisation of the same bytes,
//! products summed in f64, and the scalar kernel for every ISA path. Also the helpers the
//! quantised layers' tests share.

use burn::tensor::f16;
use candle_core::quantized::{ggml_file, GgmlDType};

use super::isa::IntIsa;
use super::grouped::group_dots;
use super::packed::{self, group_dots_scalar, LANES};
use super::{q8::Q8Rows, QFormat, BLOCK};
use crate::kernels::cpu::vector::{simd, Simd};

/// Every quantised format.
pub(crate) const QUANTISED: [QFormat; 8] = [QFormat::Q4_0, QFormat::Q4_1, QFormat::Q5_0, QFormat::Q5_1, QFormat::Q8_0, QFormat::Q4_K, QFormat::Q5_K, QFormat::Q6_K];

/// Random blocks of a format, scales of both signs included.
pub(crate) fn random_blocks(f: QFormat, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut s = seed;
    let mut next = || {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (s >> 33) as u32
    };
    let mut out = Vec::new();
    for _ in 0..rows * cols / f.block_values() {
        if f == QFormat::F32 {
            for _ in 0..BLOCK {
                out.extend(((next() % 2000) as f32 / 1000.0 - 1.0).to_le_bytes());
            }
            continue;
        }
        if f == QFormat::F16 {
            for _ in 0..BLOCK {
                out.extend(f16::from_f32((next() % 2000) as f32 / 1000.0 - 1.0).to_bits().to_le_bytes());
            }
            continue;
        }
        let half = |out: &mut Vec<u8>, r: u32| {
            let v = (r % 2000) as f32 / 1000.0 - 1.0;
            out.extend(f16::from_f32(v * 0.05).to_bits().to_le_bytes());
        };
        // Q6_K's scale comes last
        if f != QFormat::Q6_K {
            half(&mut out, next());
        }
        if matches!(f, QFormat::Q4_1 | QFormat::Q5_1 | QFormat::Q4_K | QFormat::Q5_K) {
            half(&mut out, next());
        }
        let n = f.block_bytes() - out.len() % f.block_bytes() - 2 * (f == QFormat::Q6_K) as usize;
        for _ in 0..n {
            out.push(next() as u8);
        }
        if f == QFormat::Q6_K {
            half(&mut out, next());
        }
    }
    out
}

/// The weights as candle dequantises them, `[rows, cols]` row-major.
pub(crate) fn candle_dequantised(f: QFormat, data: &[u8], rows: usize, cols: usize) -> Vec<f32> {
    let dtype = match f {
        QFormat::Q4_0 => GgmlDType::Q4_0,
        QFormat::Q4_1 => GgmlDType::Q4_1,
        QFormat::Q8_0 => GgmlDType::Q8_0,
        QFormat::F32 => GgmlDType::F32,
        QFormat::F16 => GgmlDType::F16,
        QFormat::Q5_0 => GgmlDType::Q5_0,
        QFormat::Q5_1 => GgmlDType::Q5_1,
        QFormat::Q4_K => GgmlDType::Q4K,
        QFormat::Q6_K => GgmlDType::Q6K,
        QFormat::Q5_K => GgmlDType::Q5K,
    };
    let dev = candle_core::Device::Cpu;
    let w = ggml_file::qtensor_from_ggml(dtype, data, vec![rows, cols], &dev).unwrap().dequantize(&dev).unwrap();
    w.flatten_all().unwrap().to_vec1().unwrap()
}

/// `x @ Wᵀ` in f64 for dequantised `w` (`[rows, cols]`) and `x` of `m` rows.
pub(crate) fn f64_product(w: &[f32], rows: usize, cols: usize, x: &[f32], m: usize) -> Vec<f64> {
    let mut out = vec![0f64; m * rows];
    for i in 0..m {
        for j in 0..rows {
            out[i * rows + j] = (0..cols).map(|c| w[j * cols + c] as f64 * x[i * cols + c] as f64).sum();
        }
    }
    out
}

/// How far a quantised row's product may be from the exact one: rounding each activation to
/// its block's 8-bit grid moves it by at most `amax/254`, which weight `w` multiplies; plus f32
/// rounding of the sums.
pub(crate) fn q8_bound(w_row: &[f32], x_row: &[f32]) -> f64 {
    let mut bound = 0f64;
    for (w, x) in w_row.chunks_exact(BLOCK).zip(x_row.chunks_exact(BLOCK)) {
        let amax = x.iter().fold(0f64, |a, v| a.max(v.abs() as f64));
        bound += amax / 254.0 * w.iter().map(|v| v.abs() as f64).sum::<f64>();
    }
    let magnitude: f64 = w_row.iter().zip(x_row).map(|(w, x)| (w * x).abs() as f64).sum();
    bound * (1.0 + 1e-6) + 1e-5 * magnitude + 1e-30
}

pub(crate) fn inputs(m: usize, k: usize) -> Vec<f32> {
    (0..m * k).map(|i| ((i as f32) * 0.37).sin() * 2.0).collect()
}

fn levels() -> Vec<Simd> {
    let mut l = vec![Simd::Base, Simd::Avx2.min(simd()), simd()];
    l.dedup();
    l
}

#[test]
fn rows_dequantise_to_candles_values() {
    for f in QUANTISED {
        let (rows, k) = (3, 768);
        let data = random_blocks(f, rows, k, 77);
        let want = candle_dequantised(f, &data, rows, k);
        let row_bytes = k / f.block_values() * f.block_bytes();
        let mut got = vec![0f32; k];
        for j in 0..rows {
            super::dequantise_row(f, &data[j * row_bytes..(j + 1) * row_bytes], &mut got);
            // the same bits (0.0 and -0.0 aside)
            assert_eq!(got, want[j * k..(j + 1) * k], "{f:?} row {j}");
        }
    }
}

#[test]
fn activations_round_to_their_block_grid_and_specials_poison_their_block() {
    let k = 64;
    let x = inputs(1, k);
    let a = Q8Rows::quantise(&x, k);
    for b in 0..2 {
        let (q, d, ds) = a.block(0, b);
        let amax = x[b * BLOCK..(b + 1) * BLOCK].iter().fold(0f32, |m, v| m.max(v.abs()));
        assert_eq!(d, amax / 127.0);
        for (v, q) in x[b * BLOCK..].iter().zip(q) {
            assert!((v - d * *q as f32).abs() <= d / 2.0 * 1.0001, "{v} vs {d}·{q}");
        }
        assert_eq!(ds, d * q.iter().map(|q| *q as i32).sum::<i32>() as f32);
    }
    let zeros = Q8Rows::quantise(&[0.0; 32], 32);
    assert_eq!((zeros.d[0], zeros.ds[0]), (0.0, 0.0));
    assert!(zeros.qs.iter().all(|q| *q == 0));
    // a NaN or an infinity makes every product of its row non-finite, as the f32 product does
    let k = 256;
    let mut x = inputs(1, k);
    for f in QUANTISED {
        let data = random_blocks(f, 1, k, 9);
        for special in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            x[40] = special;
            let a = Q8Rows::quantise(&x, k);
            let group = grouped(f, 1, k, &data);
            for isa in IntIsa::available() {
                let mut out = [[0f32; LANES]];
                group_dots(isa, f, &group, &a, 0, &mut out);
                assert!(!out[0][0].is_finite(), "{f:?} {special} {isa:?}: {}", out[0][0]);
            }
        }
    }
}

#[test]
fn activations_round_alike_on_every_path_and_in_parallel() {
    // ties at every half step of the grid, both signs, zeros, and ordinary values
    let mut x: Vec<f32> = (0..64 * BLOCK).map(|i| ((i as f32) * 0.731).sin() * 3.0).collect();
    for b in 0..8 {
        let block = &mut x[b * BLOCK..(b + 1) * BLOCK];
        block[0] = 127.0;
        for (j, v) in block.iter_mut().enumerate().skip(1) {
            *v = (j as f32 - 16.0) + 0.5 * (b % 2) as f32;
        }
    }
    x[9 * BLOCK..10 * BLOCK].fill(0.0);
    // the blocks the scalar path keeps: a NaN, infinities, scales that underflow; and the
    // largest finite values
    x[10 * BLOCK + 3] = f32::NAN;
    x[11 * BLOCK + 31] = f32::INFINITY;
    x[12 * BLOCK] = f32::NEG_INFINITY;
    x[13 * BLOCK..14 * BLOCK].iter_mut().enumerate().for_each(|(j, v)| *v = f32::from_bits(j as u32) * if j % 2 == 0 { 1.0 } else { -1.0 });
    x[14 * BLOCK..15 * BLOCK].iter_mut().enumerate().for_each(|(j, v)| *v = f32::MIN_POSITIVE * (j as f32 - 9.0));
    x[15 * BLOCK..16 * BLOCK].iter_mut().enumerate().for_each(|(j, v)| *v = f32::MAX / (1.0 + j as f32) * if j % 3 == 0 { -1.0 } else { 1.0 });
    x[16 * BLOCK..17 * BLOCK].fill(-0.0);
    for b in 0..64 {
        let xs = &x[b * BLOCK..(b + 1) * BLOCK];
        let (mut scalar, mut simd_q) = ([0i8; BLOCK], [0i8; BLOCK]);
        let want = super::q8::quantise_block(xs, &mut scalar, false);
        let got = super::q8::quantise_block(xs, &mut simd_q, simd() >= Simd::Avx2);
        assert_eq!((scalar, want.0.to_bits(), want.1.to_bits()), (simd_q, got.0.to_bits(), got.1.to_bits()), "block {b}");
        if b == 15 {
            assert!(want.0.is_finite() && scalar.iter().any(|q| q.abs() == 127), "block {b}: {want:?} {scalar:?}");
        }
    }
    // many rows (the parallel split) give each block's own quants
    let many: Vec<f32> = (0..300 * 576).map(|i| ((i as f32) * 0.123).cos() * 5.0).collect();
    let a = Q8Rows::quantise(&many, 576);
    for b in (0..many.len() / BLOCK).step_by(97) {
        let mut q = [0i8; BLOCK];
        let (d, ds) = super::q8::quantise_block(&many[b * BLOCK..(b + 1) * BLOCK], &mut q, false);
        assert_eq!((&a.qs[b * BLOCK..(b + 1) * BLOCK], a.d[b], a.ds[b]), (&q[..], d, ds), "block {b}");
    }
}

#[test]
fn f32_activation_kernels_equal_an_f64_product_on_every_isa_path() {
    for f in [QFormat::Q4_0, QFormat::Q4_1, QFormat::Q8_0, QFormat::F32] {
        for (rows, k, m) in [(3, 32, 1), (5, 64, 2), (4, 96, 5), (2, 576, 8)] {
            let data = random_blocks(f, rows, k, (rows * 17 + k + m) as u64);
            let w = candle_dequantised(f, &data, rows, k);
            let x = inputs(m, k);
            let want = f64_product(&w, rows, k, &x, m);
            let row_bytes = k / BLOCK * f.block_bytes();
            for level in levels() {
                for j in 0..rows {
                    let mut got = vec![0f32; m];
                    super::f32_dots::row_dots(level, f, &data[j * row_bytes..(j + 1) * row_bytes], &x, k, &mut got);
                    for i in 0..m {
                        let e = want[i * rows + j];
                        let tol = 1e-5 * (1.0 + e.abs()) * (k as f64).sqrt();
                        assert!((got[i] as f64 - e).abs() <= tol, "{f:?} {level:?} {rows}x{k} [{i},{j}]: {} vs {e}", got[i]);
                    }
                }
            }
        }
    }
}

/// CPU time of this thread: steadier than the wall clock on a shared machine.
fn thread_cpu_ns() -> u128 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid timespec for clock_gettime to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as u128 * 1_000_000_000 + t.tv_nsec as u128
}

/// One thread's nanoseconds per weight block (32 weights × `m` activation rows), integer dots
/// against f32 activations, for a SmolLM2-sized `[1536, 576]` projection that stays in the
/// caches, and for 64K rows of 576 that do not (a decoding step reads every weight from memory).
#[test]
#[ignore]
fn quant_kernel_timing() {
    for (f, rows) in QUANTISED.into_iter().flat_map(|f| [(f, 1536), (f, 65536)]) {
        // SmolLM2's widths: 576, and 1536 (its down projection) for the k-quants
        let k = if f.block_values() > BLOCK { 1536 } else { 576 };
        let data = random_blocks(f, rows, k, 5);
        let (g, gb) = (grouped(f, rows, k, &data), packed::group_bytes(f, k));
        let row_bytes = k / f.block_values() * f.block_bytes();
        for m in [1, 4, 8] {
            let x = inputs(m, k);
            let a = Q8Rows::quantise(&x, k);
            let reps = (40 * 1536 / rows).max(2);
            let per_block = |t0: u128| (thread_cpu_ns() - t0) as f64 / (reps * rows * k / BLOCK) as f64;
            // f32 activations decode the 32-value formats of old only
            let fl = if matches!(f, QFormat::Q4_0 | QFormat::Q4_1 | QFormat::Q8_0) {
                let mut out = vec![0f32; m];
                let t0 = thread_cpu_ns();
                for _ in 0..reps {
                    for w in data.chunks_exact(row_bytes) {
                        super::f32_dots::row_dots(simd(), f, w, &x, k, &mut out);
                    }
                }
                std::hint::black_box(&out);
                per_block(t0)
            } else {
                f64::NAN
            };
            let ints: Vec<String> = IntIsa::available()
                .into_iter()
                .map(|isa| {
                    let mut sums = [[0f32; LANES]; 8];
                    let t0 = thread_cpu_ns();
                    for _ in 0..reps {
                        for group in g.chunks_exact(gb) {
                            for r in (0..m).step_by(packed::ROWS) {
                                let n = (m - r).min(packed::ROWS);
                                group_dots(isa, f, group, &a, r, &mut sums[..n]);
                            }
                        }
                    }
                    std::hint::black_box(&sums);
                    format!("{isa:?} {:.2}", per_block(t0))
                })
                .collect();
            println!("{f:?} [{rows}, {k}] m={m}: ns per weight block: f32 activations ({:?}) {fl:.2}; grouped q8 integer {}; layers use {:?}", simd(), ints.join(", "), IntIsa::best());
        }
    }
}

/// `rows` GGML rows in groups of eight.
pub(crate) fn grouped(f: QFormat, rows: usize, cols: usize, data: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; rows.div_ceil(LANES) * packed::group_bytes(f, cols)];
    packed::pack(f, rows, cols, data, &mut out);
    out
}

/// The formats kept in groups.
fn grouped_formats() -> Vec<QFormat> {
    QUANTISED.into_iter().filter(|f| packed::packs(*f)).collect()
}

#[test]
fn grouped_rows_hold_the_ggml_rows() {
    for f in grouped_formats() {
        // 13 rows: a second group with three rows and five zero lanes
        let (rows, k) = (13, 512);
        let data = random_blocks(f, rows, k, 41);
        let g = grouped(f, rows, k, &data);
        let (gb, row_bytes, subs) = (packed::group_bytes(f, k), k / f.block_values() * f.block_bytes(), f.sub_blocks());
        let want = candle_dequantised(f, &data, rows, k);
        let (mut q, mut pq) = ([0i32; BLOCK], [0i32; BLOCK]);
        let mut row = vec![0f32; k];
        for r in 0..2 * LANES {
            let group = &g[r / LANES * gb..(r / LANES + 1) * gb];
            packed::dequantise_lane(f, group, r % LANES, &mut row);
            if r >= rows {
                assert!(row.iter().all(|v| *v == 0.0), "{f:?} padding lane {r}");
                continue;
            }
            assert_eq!(row, want[r * k..(r + 1) * k], "{f:?} row {r}");
            for (b, (blk, src)) in group.chunks_exact(packed::block_bytes(f)).zip(data[r * row_bytes..].chunks_exact(f.block_bytes())).enumerate() {
                for s in 0..subs {
                    assert_eq!(packed::sub_header(f, blk, r % LANES, s), f.sub_header(src, s), "{f:?} row {r} block {b}.{s}");
                    packed::int_quants(f, blk, r % LANES, s, &mut pq);
                    f.int_quants(src, s, &mut q);
                    assert_eq!(pq, q, "{f:?} row {r} block {b}.{s}");
                }
            }
        }
    }
}

#[test]
fn grouped_kernels_give_the_scalar_bits_on_every_path_and_the_bound_holds() {
    for f in grouped_formats() {
        let cases = [(8, 32, 1), (13, 64, 2), (5, 96, 3), (16, 128, 4), (8, 576, 4), (3, 1536, 1), (9, 256, 2), (8, 768, 3), (11, 512, 4)];
        for (rows, k, m) in cases.into_iter().filter(|c| c.1 % f.block_values() == 0) {
            let data = random_blocks(f, rows, k, (rows * 7 + k + m) as u64);
            let g = grouped(f, rows, k, &data);
            let gb = packed::group_bytes(f, k);
            let w = candle_dequantised(f, &data, rows, k);
            let x = inputs(m, k);
            let exact = f64_product(&w, rows, k, &x, m);
            let a = Q8Rows::quantise(&x, k);
            for (gi, group) in g.chunks_exact(gb).enumerate() {
                let mut want = vec![[0f32; LANES]; m];
                group_dots_scalar(f, group, &a, 0, &mut want);
                for (i, lanes) in want.iter().enumerate() {
                    for (lane, v) in lanes.iter().enumerate().take(rows - gi * LANES) {
                        let j = gi * LANES + lane;
                        let e = exact[i * rows + j];
                        let bound = q8_bound(&w[j * k..(j + 1) * k], &x[i * k..(i + 1) * k]);
                        assert!((*v as f64 - e).abs() <= bound, "{f:?} {rows}x{k} row {j} x{i}: {v} vs {e} (bound {bound})");
                    }
                }
                for isa in IntIsa::available() {
                    // every count of activation rows from every first row: the same bits
                    for first in 0..m {
                        for n in 1..=(m - first).min(packed::ROWS) {
                            let mut got = vec![[0f32; LANES]; n];
                            group_dots(isa, f, group, &a, first, &mut got);
                            for (i, lanes) in got.iter().enumerate() {
                                assert_eq!(lanes.map(f32::to_bits), want[first + i].map(f32::to_bits), "{f:?} {isa:?} {rows}x{k} group {gi} x{}", first + i);
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn grouped_extremes_do_not_saturate() {
    // every byte of the blocks at 0x00, 0x80, 0x7f or 0xff (scales aside), against activations
    // of ±127: the largest i16 sums `maddubs` and the word sums meet
    let k = 512;
    for x in [vec![1.0f32; k], (0..k).map(|i| if i % 3 == 0 { -1.0 } else { 1.0 }).collect()] {
        let a = Q8Rows::quantise(&x, k);
        for f in grouped_formats() {
            for (fill, scale) in [(0xffu8, 1.0f32), (0x80, -1.0), (0x7f, 0.5), (0x00, 1.0)] {
                let mut data = Vec::new();
                for _ in 0..LANES * k / f.block_values() {
                    let mut block = vec![fill; f.block_bytes()];
                    if f == QFormat::Q6_K {
                        block[192..208].fill(if scale < 0.0 { 0x80 } else { 0x7f });
                        block[208..].copy_from_slice(&f16::from_f32(scale).to_bits().to_le_bytes());
                        data.extend(block);
                        continue;
                    }
                    block[..2].copy_from_slice(&f16::from_f32(scale).to_bits().to_le_bytes());
                    if matches!(f, QFormat::Q4_1 | QFormat::Q5_1 | QFormat::Q4_K | QFormat::Q5_K) {
                        block[2..4].copy_from_slice(&f16::from_f32(-scale).to_bits().to_le_bytes());
                    }
                    data.extend(block);
                }
                let g = grouped(f, LANES, k, &data);
                let w = candle_dequantised(f, &data, LANES, k);
                let exact = f64_product(&w, LANES, k, &x, 1);
                for isa in IntIsa::available() {
                    let mut got = [[0f32; LANES]];
                    group_dots(isa, f, &g, &a, 0, &mut got);
                    for j in 0..LANES {
                        let magnitude: f64 = w[j * k..(j + 1) * k].iter().map(|v| v.abs() as f64).sum();
                        assert!((got[0][j] as f64 - exact[j]).abs() <= 1e-5 * magnitude.max(1.0), "{f:?} {fill:#x} {scale} {isa:?} row {j}: {} vs {}", got[0][j], exact[j]);
                    }
                }
            }
        }
    }
}

#[test]
fn grouped_f16_rows_give_the_scalar_bits_and_an_f64_products_value() {
    let f = QFormat::F16;
    for (rows, k, m) in [(8, 32, 1), (13, 64, 4), (5, 576, 3), (9, 1536, 2)] {
        let data = random_blocks(f, rows, k, (rows + k) as u64);
        let g = grouped(f, rows, k, &data);
        let gb = packed::group_bytes(f, k);
        let w = candle_dequantised(f, &data, rows, k);
        let mut row = vec![0f32; k];
        for r in 0..rows {
            packed::dequantise_lane(f, &g[r / LANES * gb..], r % LANES, &mut row);
            assert_eq!(row, w[r * k..(r + 1) * k], "row {r}");
        }
        let mut x = inputs(m, k);
        x[k / 2] = f32::NAN;
        let exact = f64_product(&w, rows, k, &x, m);
        for (gi, group) in g.chunks_exact(gb).enumerate() {
            let mut want = vec![[0f32; LANES]; m];
            super::packed_f16::group_dots_scalar(group, &x, k, 0, &mut want);
            for (i, lanes) in want.iter().enumerate() {
                for (lane, v) in lanes.iter().enumerate().take(rows - gi * LANES) {
                    let (j, e) = (gi * LANES + lane, exact[i * rows + gi * LANES + lane]);
                    let magnitude: f64 = (0..k).map(|c| (w[j * k + c] * x[i * k + c]).abs() as f64).sum();
                    assert!((*v as f64 - e).abs() <= 1e-6 * magnitude || (e.is_nan() && v.is_nan()), "{rows}x{k} row {j} x{i}: {v} vs {e}");
                }
            }
            for level in levels() {
                for first in 0..m {
                    let mut got = vec![[0f32; LANES]; m - first];
                    super::packed_f16::group_dots(level, group, &x, k, first, &mut got);
                    for (i, lanes) in got.iter().enumerate() {
                        assert_eq!(lanes.map(f32::to_bits), want[first + i].map(f32::to_bits), "{level:?} {rows}x{k} group {gi} x{}", first + i);
                    }
                }
            }
        }
    }
}
