//! The grouped layout's kernels (`packed`) picked by instruction set: 256-bit AVX2, or
//! `dpbusd` with AVX-512 VNNI, else the scalar reference.

use super::isa::IntIsa;
use super::packed::{self, LANES};
#[cfg(target_arch = "x86_64")]
use super::packed_avx2;
use super::{q8::Q8Rows, QFormat};

/// `out[i][lane] = row lane · a[first + i]` for the group's eight rows and `out.len()` (1 to
/// `ROWS`) activation rows.
pub(super) fn group_dots(isa: IntIsa, f: QFormat, group: &[u8], a: &Q8Rows, first: usize, out: &mut [[f32; LANES]]) {
    debug_assert!(packed::packs(f) && (1..=packed::ROWS).contains(&out.len()) && first + out.len() <= a.rows());
    debug_assert_eq!(group.len() * f.block_values(), a.k * packed::block_bytes(f));
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! rows {
            ($fun:ident, $F:tt) => {
                match out.len() {
                    1 => packed_avx2::$fun::<$F, 1>(group, a, first, out),
                    2 => packed_avx2::$fun::<$F, 2>(group, a, first, out),
                    3 => packed_avx2::$fun::<$F, 3>(group, a, first, out),
                    _ => packed_avx2::$fun::<$F, 4>(group, a, first, out),
                }
            };
        }
        macro_rules! formats {
            ($fun:ident) => {
                match f {
                    QFormat::Q4_0 => rows!($fun, { QFormat::Q4_0 as u8 }),
                    QFormat::Q4_1 => rows!($fun, { QFormat::Q4_1 as u8 }),
                    QFormat::Q5_0 => rows!($fun, { QFormat::Q5_0 as u8 }),
                    QFormat::Q5_1 => rows!($fun, { QFormat::Q5_1 as u8 }),
                    QFormat::Q4_K => rows!($fun, { QFormat::Q4_K as u8 }),
                    QFormat::Q5_K => rows!($fun, { QFormat::Q5_K as u8 }),
                    QFormat::Q6_K => rows!($fun, { QFormat::Q6_K as u8 }),
                    _ => rows!($fun, { QFormat::Q8_0 as u8 }),
                }
            };
        }
        // SAFETY: each path runs only where `IntIsa::available` found its instructions: AVX2,
        // FMA and F16C; AVX-512 VNNI with VL for `dpbusd` on 256 bits.
        unsafe {
            match isa {
                IntIsa::Scalar => {}
                IntIsa::Avx2 => return formats!(group_dots),
                IntIsa::Avx2Vnni => return formats!(group_dots_vnni),
            }
        }
    }
    let _ = isa;
    packed::group_dots_scalar(f, group, a, first, out)
}

