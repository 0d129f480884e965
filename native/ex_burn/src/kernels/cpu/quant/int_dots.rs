//! A weight row in quantised blocks against `Q8Rows` activation rows: per block pair the
//! integer sum `Σ q_w·q_x`, then `d_w·d_x·Σ + m_w·(d_x·Σq_x)` in f32. `m_w` is the block's
//! offset: Q4_1's `m`, `-8·d` for Q4_0 (its quants are stored with +8), 0 for Q8_0.

use super::{q8::Q8Rows, QFormat, BLOCK};
use crate::kernels::cpu::vector::Simd;

/// Activation rows sharing one decoding of a weight row.
pub(super) const ROWS: usize = 4;

/// Whether this CPU has AVX-512 VNNI (`vpdpbusd`): one instruction for a block's 4-way byte
/// products and their sum, where AVX2 and AVX-512BW need two.
pub(super) fn vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    return is_x86_feature_detected!("avx512vnni");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `out[i] = row · a[first + i]` for `out.len()` (1 to `ROWS`) activation rows.
pub(super) fn row_dots(level: Simd, f: QFormat, w: &[u8], a: &Q8Rows, first: usize, out: &mut [f32]) {
    debug_assert!(f != QFormat::F32 && out.len() <= ROWS && first + out.len() <= a.rows());
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! shapes {
            ($m:ident, $fun:ident) => {
                match (f, out.len()) {
                    (QFormat::Q4_0, 1) => super::$m::$fun::<{ QFormat::Q4_0 as u8 }, 1>(w, a, first, out),
                    (QFormat::Q4_0, 2) => super::$m::$fun::<{ QFormat::Q4_0 as u8 }, 2>(w, a, first, out),
                    (QFormat::Q4_0, 3) => super::$m::$fun::<{ QFormat::Q4_0 as u8 }, 3>(w, a, first, out),
                    (QFormat::Q4_0, _) => super::$m::$fun::<{ QFormat::Q4_0 as u8 }, 4>(w, a, first, out),
                    (QFormat::Q4_1, 1) => super::$m::$fun::<{ QFormat::Q4_1 as u8 }, 1>(w, a, first, out),
                    (QFormat::Q4_1, 2) => super::$m::$fun::<{ QFormat::Q4_1 as u8 }, 2>(w, a, first, out),
                    (QFormat::Q4_1, 3) => super::$m::$fun::<{ QFormat::Q4_1 as u8 }, 3>(w, a, first, out),
                    (QFormat::Q4_1, _) => super::$m::$fun::<{ QFormat::Q4_1 as u8 }, 4>(w, a, first, out),
                    (_, 1) => super::$m::$fun::<{ QFormat::Q8_0 as u8 }, 1>(w, a, first, out),
                    (_, 2) => super::$m::$fun::<{ QFormat::Q8_0 as u8 }, 2>(w, a, first, out),
                    (_, 3) => super::$m::$fun::<{ QFormat::Q8_0 as u8 }, 3>(w, a, first, out),
                    (_, _) => super::$m::$fun::<{ QFormat::Q8_0 as u8 }, 4>(w, a, first, out),
                }
            };
        }
        if level >= Simd::Avx512 {
            // SAFETY: AVX-512 (F, DQ, VL, BW) with AVX2, FMA and F16C were detected (`simd`), and
            // VNNI where `vnni()` says so.
            unsafe {
                if vnni() {
                    shapes!(int_avx512, row_dots_vnni)
                } else {
                    shapes!(int_avx512, row_dots)
                }
            };
            return;
        }
        if level >= Simd::Avx2 {
            // SAFETY: AVX2, FMA and F16C were detected on this CPU (`simd`).
            unsafe { shapes!(int_avx2, row_dots) };
            return;
        }
    }
    let _ = level;
    row_dots_scalar(f, w, a, first, out)
}

/// The reference every ISA path is tested against.
pub(super) fn row_dots_scalar(f: QFormat, w: &[u8], a: &Q8Rows, first: usize, out: &mut [f32]) {
    let bb = f.block_bytes();
    let mut q = [0i32; BLOCK];
    for (i, o) in out.iter_mut().enumerate() {
        let (mut acc, mut offsets) = (0f32, 0f32);
        for (b, block) in w.chunks_exact(bb).enumerate() {
            let (dw, mw, at) = f.header(block);
            integer_quants(f, block, at, &mut q);
            let (xq, dx, dsx) = a.block(first + i, b);
            let sum: i32 = q.iter().zip(xq).map(|(w, x)| w * *x as i32).sum();
            acc += dw * dx * sum as f32;
            offsets += mw * dsx;
        }
        *o = acc + offsets;
    }
}

/// A block's quants as stored (Q4: 0..16, low nibbles first; Q8_0: signed).
fn integer_quants(f: QFormat, b: &[u8], at: usize, out: &mut [i32; BLOCK]) {
    match f {
        QFormat::Q4_0 | QFormat::Q4_1 => {
            for j in 0..16 {
                out[j] = (b[at + j] & 0x0f) as i32;
                out[j + 16] = (b[at + j] >> 4) as i32;
            }
        }
        QFormat::Q8_0 => (0..BLOCK).for_each(|j| out[j] = b[at + j] as i8 as i32),
        QFormat::F32 => unreachable!("f32 rows take f32_dots"),
    }
}
