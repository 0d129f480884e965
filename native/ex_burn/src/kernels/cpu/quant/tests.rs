//! The block kernels against independent references: candle's dequantisation of the same bytes,
//! products summed in f64, and the scalar kernel for every ISA path. Also the helpers the
//! quantised layers' tests share.

use burn::tensor::f16;
use candle_core::quantized::{ggml_file, GgmlDType};

use super::int_dots::{row_dots, row_dots_scalar, rows4_dots, IntIsa, ROWS};
use super::{q8::Q8Rows, QFormat, BLOCK};
use crate::kernels::cpu::vector::{simd, Simd};

/// Every quantised format.
pub(crate) const QUANTISED: [QFormat; 7] = [QFormat::Q4_0, QFormat::Q4_1, QFormat::Q5_0, QFormat::Q5_1, QFormat::Q8_0, QFormat::Q4_K, QFormat::Q6_K];

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
        let half = |out: &mut Vec<u8>, r: u32| {
            let v = (r % 2000) as f32 / 1000.0 - 1.0;
            out.extend(f16::from_f32(v * 0.05).to_bits().to_le_bytes());
        };
        // Q6_K's scale comes last
        if f != QFormat::Q6_K {
            half(&mut out, next());
        }
        if matches!(f, QFormat::Q4_1 | QFormat::Q5_1 | QFormat::Q4_K) {
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
        QFormat::Q5_0 => GgmlDType::Q5_0,
        QFormat::Q5_1 => GgmlDType::Q5_1,
        QFormat::Q4_K => GgmlDType::Q4K,
        QFormat::Q6_K => GgmlDType::Q6K,
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
fn every_isa_path_equals_the_scalar_kernel_and_the_bound_holds() {
    for f in QUANTISED {
        // block counts odd and even (the AVX-512 pairs and the AVX2 tail), 1 to ROWS rows;
        // super-blocks of 256 for the k-quants
        let cases = [(3, 32, 1), (5, 64, 2), (4, 96, 3), (7, 128, 4), (2, 576, 4), (3, 1536, 1), (2, 160, 3), (3, 256, 2), (2, 768, 3), (5, 512, 4)];
        for (rows, k, m) in cases.into_iter().filter(|c| c.1 % f.block_values() == 0) {
            let data = random_blocks(f, rows, k, (rows * 131 + k + m) as u64);
            let w = candle_dequantised(f, &data, rows, k);
            let x = inputs(m, k);
            let exact = f64_product(&w, rows, k, &x, m);
            let a = Q8Rows::quantise(&x, k);
            let row_bytes = k / f.block_values() * f.block_bytes();
            for j in 0..rows {
                let wr = &data[j * row_bytes..(j + 1) * row_bytes];
                let mut want = vec![0f32; m];
                row_dots_scalar(f, wr, &a, 0, &mut want);
                for i in 0..m {
                    let e = exact[i * rows + j];
                    let bound = q8_bound(&w[j * k..(j + 1) * k], &x[i * k..(i + 1) * k]);
                    assert!((want[i] as f64 - e).abs() <= bound, "{f:?} {rows}x{k} row {j} x{i}: {} vs {e} (bound {bound})", want[i]);
                }
                for isa in IntIsa::available() {
                    for first in 0..m {
                        let n = (m - first).min(ROWS);
                        let mut got = vec![0f32; n];
                        row_dots(isa, f, wr, &a, first, &mut got);
                        for (i, g) in got.iter().enumerate() {
                            let s = want[first + i];
                            let scale: f64 = w[j * k..(j + 1) * k].iter().zip(&x[(first + i) * k..]).map(|(w, x)| (w * x).abs() as f64).sum();
                            assert!((*g as f64 - s as f64).abs() <= 1e-5 * (1.0 + scale), "{f:?} {isa:?} {rows}x{k} row {j} x{}: {g} vs {s}", first + i);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn four_weight_rows_at_once_equal_the_scalar_kernel() {
    for f in QUANTISED {
        for k in [32, 64, 96, 576, 256, 768].into_iter().filter(|k| k % f.block_values() == 0) {
            let data = random_blocks(f, 4, k, k as u64 + 1);
            let row_bytes = k / f.block_values() * f.block_bytes();
            let ws: [&[u8]; 4] = std::array::from_fn(|j| &data[j * row_bytes..(j + 1) * row_bytes]);
            let x = inputs(3, k);
            let a = Q8Rows::quantise(&x, k);
            let w = candle_dequantised(f, &data, 4, k);
            for row in 0..3 {
                // the sums' magnitude: f32 rounding scales with it where terms cancel
                let scale: [f32; 4] = std::array::from_fn(|j| (0..k).map(|c| (w[j * k + c] * x[row * k + c]).abs()).sum());
                let mut want = [0f32; 4];
                for j in 0..4 {
                    row_dots_scalar(f, ws[j], &a, row, &mut want[j..j + 1]);
                }
                for isa in IntIsa::available() {
                    let mut got = [0f32; 4];
                    rows4_dots(isa, f, ws, &a, row, &mut got);
                    // the same bits as the one-row kernel of the same path, alone or with others
                    for j in 0..4 {
                        let (mut one, mut among) = ([0f32], [0f32; 3]);
                        row_dots(isa, f, ws[j], &a, row, &mut one);
                        row_dots(isa, f, ws[j], &a, 0, &mut among);
                        assert_eq!(got[j], one[0], "{f:?} {isa:?} k={k} x{row} w{j}: four-row kernel against one row");
                        assert_eq!(got[j], among[row], "{f:?} {isa:?} k={k} x{row} w{j}: four-row kernel against three rows");
                    }
                    for j in 0..4 {
                        assert!((got[j] - want[j]).abs() <= 1e-5 * (1.0 + scale[j]), "{f:?} {isa:?} k={k} x{row} w{j}: {} vs {}", got[j], want[j]);
                    }
                }
            }
        }
    }
}

#[test]
fn extreme_bytes_do_not_saturate() {
    // Q8_0 weights of -128 and 127 against activations of ±127: the largest pair sums the i16
    // step of `maddubs` meets
    let k = 64;
    let x: Vec<f32> = (0..k).map(|i| if i % 3 == 0 { -1.0 } else { 1.0 }).collect();
    let a = Q8Rows::quantise(&x, k);
    assert!(a.qs.iter().all(|q| q.abs() == 127));
    for fill in [0x80u8, 0x7f, 0xff] {
        let mut data = Vec::new();
        for _ in 0..k / BLOCK {
            data.extend(f16::from_f32(0.5).to_bits().to_le_bytes());
            data.extend(std::iter::repeat(fill).take(BLOCK));
        }
        let mut want = [0f32];
        row_dots_scalar(QFormat::Q8_0, &data, &a, 0, &mut want);
        let q = fill as i8 as f64;
        let exact: f64 = x.iter().map(|v| 0.5 * q * (*v as f64) * (127.0 / 127.0)).sum();
        assert!((want[0] as f64 - exact).abs() <= 1e-3 * exact.abs().max(1.0), "fill {fill:#x}: {} vs {exact}", want[0]);
        for isa in IntIsa::available() {
            let mut got = [0f32];
            row_dots(isa, QFormat::Q8_0, &data, &a, 0, &mut got);
            assert_eq!(got[0], want[0], "fill {fill:#x} {isa:?}");
        }
    }
    // Q4 nibbles of 15 against +127 everywhere
    let x = vec![1.0f32; k];
    let a = Q8Rows::quantise(&x, k);
    let mut data = Vec::new();
    for _ in 0..k / BLOCK {
        data.extend(f16::from_f32(1.0).to_bits().to_le_bytes());
        data.extend(f16::from_f32(0.0).to_bits().to_le_bytes());
        data.extend(std::iter::repeat(0xffu8).take(16));
    }
    for isa in IntIsa::available() {
        let mut got = [0f32];
        row_dots(isa, QFormat::Q4_1, &data, &a, 0, &mut got);
        assert_eq!(got[0], 15.0 * k as f32, "{isa:?}");
    }
}

#[test]
fn extreme_quants_and_scales_do_not_saturate() {
    // every quant at its largest, scales at both ends, against activations of ±127
    let k = 512;
    let x: Vec<f32> = (0..k).map(|i| if i % 3 == 0 { -1.0 } else { 1.0 }).collect();
    let a = Q8Rows::quantise(&x, k);
    for f in [QFormat::Q5_0, QFormat::Q5_1, QFormat::Q4_K, QFormat::Q6_K] {
        for (fill, scale) in [(0xffu8, 1.0f32), (0xff, -1.0), (0x00, 1.0), (0x55, -0.5)] {
            let mut data = Vec::new();
            for _ in 0..k / f.block_values() {
                let mut block = vec![fill; f.block_bytes()];
                let d = f16::from_f32(scale).to_bits().to_le_bytes();
                match f {
                    QFormat::Q6_K => {
                        block[192..208].fill(if scale < 0.0 { 0x80 } else { 0x7f });
                        block[208..].copy_from_slice(&d);
                    }
                    QFormat::Q4_K => {
                        block[..2].copy_from_slice(&d);
                        block[2..4].copy_from_slice(&f16::from_f32(-scale).to_bits().to_le_bytes());
                        block[4..16].fill(0xff);
                    }
                    _ => {
                        block[..2].copy_from_slice(&d);
                        if f == QFormat::Q5_1 {
                            block[2..4].copy_from_slice(&f16::from_f32(-scale).to_bits().to_le_bytes());
                        }
                    }
                }
                data.extend(block);
            }
            let w = candle_dequantised(f, &data, 1, k);
            let exact = f64_product(&w, 1, k, &x, 1)[0];
            let magnitude: f64 = w.iter().map(|v| v.abs() as f64).sum();
            for isa in IntIsa::available() {
                let mut got = [0f32];
                row_dots(isa, f, &data, &a, 0, &mut got);
                assert!((got[0] as f64 - exact).abs() <= 1e-5 * magnitude.max(1.0), "{f:?} {fill:#x} {scale} {isa:?}: {} vs {exact}", got[0]);
            }
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
            for isa in IntIsa::available() {
                let mut got = [0f32];
                row_dots(isa, f, &data, &a, 0, &mut got);
                assert!(!got[0].is_finite(), "{f:?} {special} {isa:?}: {}", got[0]);
                let mut four = [0f32; 4];
                rows4_dots(isa, f, [&data[..], &data[..], &data[..], &data[..]], &a, 0, &mut four);
                assert!(four.iter().all(|v| !v.is_finite()), "{f:?} {special} {isa:?}: {four:?}");
            }
        }
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
        println!("{f:?} [{rows}, {k}]:");
        let data = random_blocks(f, rows, k, 5);
        let row_bytes = k / f.block_values() * f.block_bytes();
        for m in [1, 4] {
            let x = inputs(m, k);
            let a = Q8Rows::quantise(&x, k);
            let mut out = vec![0f32; m];
            let mut time = |isa: Option<IntIsa>| {
                let reps = (40 * 1536 / rows).max(2);
                let t0 = thread_cpu_ns();
                for _ in 0..reps {
                    for j in 0..rows {
                        let w = &data[j * row_bytes..(j + 1) * row_bytes];
                        if let Some(isa) = isa {
                            row_dots(isa, f, w, &a, 0, &mut out);
                        } else {
                            super::f32_dots::row_dots(simd(), f, w, &x, k, &mut out);
                        }
                    }
                }
                std::hint::black_box(&out);
                (thread_cpu_ns() - t0) as f64 / (reps * rows * k / BLOCK) as f64
            };
            // f32 activations decode the 32-value formats of old only
            let fl = if matches!(f, QFormat::Q4_0 | QFormat::Q4_1 | QFormat::Q8_0) { time(None) } else { f64::NAN };
            if m == 1 {
                let fours: Vec<String> = IntIsa::available()
                    .into_iter()
                    .skip(1)
                    .map(|isa| {
                        let reps = (40 * 1536 / rows).max(2);
                        let mut out4 = [0f32; 4];
                        let t0 = thread_cpu_ns();
                        for _ in 0..reps {
                            for j in (0..rows).step_by(4) {
                                let ws: [&[u8]; 4] = std::array::from_fn(|i| &data[(j + i) * row_bytes..(j + i + 1) * row_bytes]);
                                rows4_dots(isa, f, ws, &a, 0, &mut out4);
                            }
                        }
                        std::hint::black_box(&out4);
                        format!("{isa:?} {:.2}", (thread_cpu_ns() - t0) as f64 / (reps * rows * k / BLOCK) as f64)
                    })
                    .collect();
                println!("{f:?} m=1, four weight rows a call: {}", fours.join(", "));
            }
            let ints: Vec<String> = IntIsa::available().into_iter().skip(1).map(|isa| format!("{isa:?} {:.2}", time(Some(isa)))).collect();
            println!("{f:?} m={m}: ns per weight block: f32 activations ({:?}) {fl:.2}; q8 integer {}; layers use {:?}", simd(), ints.join(", "), IntIsa::best());
        }
    }
}
