//! A weight row in quantised blocks against `Q8Rows` activation rows: per block pair the
//! integer sum `Σ q_w·q_x`, then `d_w·d_x·Σ + m_w·(d_x·Σq_x)` in f32. `m_w` is the block's
//! offset: Q4_1's `m`, `-8·d` for Q4_0 (its quants are stored with +8), 0 for Q8_0. The
//! k-quants' super-blocks go sub-block by sub-block, each against its 32-block of activations.

use super::{q8::Q8Rows, QFormat, BLOCK};
use crate::kernels::cpu::vector::{simd, Simd};

/// Activation rows sharing one decoding of a weight row.
pub(super) const ROWS: usize = 4;

/// The instruction sets the integer kernels are written for, narrowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum IntIsa {
    Scalar,
    /// `maddubs` + `madd` on 256 bits.
    Avx2,
    /// `dpbusd` on 256 bits (AVX-512 VNNI with VL): one instruction for a block's byte
    /// products and their sum, where AVX2 needs two.
    Avx2Vnni,
    /// `maddubs` + `madd` on 512 bits, two blocks a vector.
    Avx512,
    /// `dpbusd` on 512 bits.
    Avx512Vnni,
}

impl IntIsa {
    /// Every path this CPU runs, narrowest first (the tests run them all).
    pub(super) fn available() -> Vec<IntIsa> {
        let mut out = vec![IntIsa::Scalar];
        let level = simd();
        if level >= Simd::Avx2 {
            out.push(IntIsa::Avx2);
        }
        #[cfg(target_arch = "x86_64")]
        if level >= Simd::Avx512 {
            let vnni = is_x86_feature_detected!("avx512vnni");
            if vnni {
                out.push(IntIsa::Avx2Vnni);
            }
            out.push(IntIsa::Avx512);
            if vnni {
                out.push(IntIsa::Avx512Vnni);
            }
        }
        out
    }

    /// The path the layers take: the widest this CPU has. Each path's four-row kernel
    /// (`rows4_dots`) sums a row as its one-row kernel does, so the two may be mixed.
    pub(super) fn best() -> IntIsa {
        static BEST: std::sync::OnceLock<IntIsa> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| *IntIsa::available().last().expect("the scalar path is always there"))
    }
}

/// `$call!(F)` with `F` the const argument (`QFormat as u8`) of the format `$f`.
macro_rules! by_format {
    ($f:expr, $call:ident) => {
        match $f {
            QFormat::Q4_0 => $call!({ QFormat::Q4_0 as u8 }),
            QFormat::Q4_1 => $call!({ QFormat::Q4_1 as u8 }),
            QFormat::Q5_0 => $call!({ QFormat::Q5_0 as u8 }),
            QFormat::Q5_1 => $call!({ QFormat::Q5_1 as u8 }),
            QFormat::Q4_K => $call!({ QFormat::Q4_K as u8 }),
            QFormat::Q6_K => $call!({ QFormat::Q6_K as u8 }),
            _ => $call!({ QFormat::Q8_0 as u8 }),
        }
    };
}

/// `out[i] = row · a[first + i]` for `out.len()` (1 to `ROWS`) activation rows.
pub(super) fn row_dots(isa: IntIsa, f: QFormat, w: &[u8], a: &Q8Rows, first: usize, out: &mut [f32]) {
    debug_assert!(f != QFormat::F32 && out.len() <= ROWS && first + out.len() <= a.rows());
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! shapes {
            ($m:ident, $fun:ident) => {{
                macro_rules! rows {
                    ($F:tt) => {
                        match out.len() {
                            1 => super::$m::$fun::<$F, 1>(w, a, first, out),
                            2 => super::$m::$fun::<$F, 2>(w, a, first, out),
                            3 => super::$m::$fun::<$F, 3>(w, a, first, out),
                            _ => super::$m::$fun::<$F, 4>(w, a, first, out),
                        }
                    };
                }
                by_format!(f, rows)
            }};
        }
        // SAFETY: each path runs only where `available` found its instructions on this CPU:
        // AVX2, FMA and F16C for all; AVX-512 F, DQ, VL and BW for the 512-bit and VNNI ones;
        // AVX-512 VNNI for the `dpbusd` ones. The k-quants take the 256-bit kernels on the
        // AVX-512 paths (a subset of their instructions).
        unsafe {
            match (isa, f.sub_blocks() > 1) {
                (IntIsa::Scalar, _) => {}
                (IntIsa::Avx2, _) | (IntIsa::Avx512, true) => return shapes!(int_avx2, row_dots),
                (IntIsa::Avx2Vnni, _) | (IntIsa::Avx512Vnni, true) => return shapes!(int_avx2, row_dots_vnni),
                (IntIsa::Avx512, false) => return shapes!(int_avx512, row_dots),
                (IntIsa::Avx512Vnni, false) => return shapes!(int_avx512, row_dots_vnni),
            }
        }
    }
    let _ = isa;
    row_dots_scalar(f, w, a, first, out)
}

/// `out[j] = ws[j] · a[row]` for four weight rows of one format (decoding a token).
pub(super) fn rows4_dots(isa: IntIsa, f: QFormat, ws: [&[u8]; 4], a: &Q8Rows, row: usize, out: &mut [f32]) {
    debug_assert!(f != QFormat::F32 && out.len() == 4 && row < a.rows());
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! formats {
            ($m:ident, $fun:ident) => {{
                macro_rules! call {
                    ($F:tt) => {
                        super::$m::$fun::<$F>(ws, a, row, out)
                    };
                }
                by_format!(f, call)
            }};
        }
        // SAFETY: as in `row_dots`.
        unsafe {
            match (isa, f.sub_blocks() > 1) {
                (IntIsa::Scalar, _) => {}
                (IntIsa::Avx2, _) | (IntIsa::Avx512, true) => return formats!(int_avx2, rows4_dots),
                (IntIsa::Avx2Vnni, _) | (IntIsa::Avx512Vnni, true) => return formats!(int_avx2, rows4_dots_vnni),
                (IntIsa::Avx512, false) => return formats!(int_avx512, rows4_dots),
                (IntIsa::Avx512Vnni, false) => return formats!(int_avx512, rows4_dots_vnni),
            }
        }
    }
    for (w, o) in ws.iter().zip(out.chunks_exact_mut(1)) {
        row_dots(isa, f, w, a, row, o);
    }
}

/// The reference every ISA path is tested against.
pub(super) fn row_dots_scalar(f: QFormat, w: &[u8], a: &Q8Rows, first: usize, out: &mut [f32]) {
    let (bb, subs) = (f.block_bytes(), f.sub_blocks());
    let mut q = [0i32; BLOCK];
    for (i, o) in out.iter_mut().enumerate() {
        let (mut acc, mut offsets) = (0f32, 0f32);
        for (b, block) in w.chunks_exact(bb).enumerate() {
            for s in 0..subs {
                let (dw, mw) = f.sub_header(block, s);
                f.int_quants(block, s, &mut q);
                let (xq, dx, dsx) = a.block(first + i, b * subs + s);
                let sum: i32 = q.iter().zip(xq).map(|(w, x)| w * *x as i32).sum();
                acc += dw * dx * sum as f32;
                offsets += mw * dsx;
            }
        }
        *o = acc + offsets;
    }
}
