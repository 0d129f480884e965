//! Layer norm over the last axis in one pass per row, the kernel of `Op::LayerNorm`
//! (`compiler::fuse`), with the bits of the Nx composition it replaces.

use std::mem::MaybeUninit;

use super::vector::{flex_f32, map_last_rows, row_sum_as_sum, simd, wide, Isa, Simd};
#[cfg(target_arch = "x86_64")]
use super::vector::{IsaAvx2, IsaAvx512};
use super::vector::IsaBase;
use crate::dispatch::{self, Prim};

/// `out = row - mean` and `sq = out * out`, each rounded to f32 (a layer norm row's centring).
#[inline(always)]
fn center_row<S: Isa>(row: &[f32], mean: f32, out: &mut [MaybeUninit<f32>], sq: &mut [f32]) {
    for ((o, s), &v) in out.iter_mut().zip(sq.iter_mut()).zip(row) {
        let c = v - mean;
        o.write(c);
        *s = c * c;
    }
}

/// `c = c * r`, or with `affine` `(gamma * r) * c + beta` (Axon's order), in place.
#[inline(always)]
fn scale_row<S: Isa>(c: &mut [f32], r: f32, affine: Option<(&[f32], &[f32])>) {
    match affine {
        None => c.iter_mut().for_each(|v| *v *= r),
        Some((g, b)) => {
            for ((v, &g), &b) in c.iter_mut().zip(g).zip(b) {
                *v = (g * r) * *v + b;
            }
        }
    }
}

wide!(fn center_row_wide(row: &[f32], mean: f32, out: &mut [MaybeUninit<f32>], sq: &mut [f32]) = center_row;);
wide!(fn scale_row_wide(c: &mut [f32], r: f32, affine: Option<(&[f32], &[f32])>) = scale_row;);

/// Layer norm over the last axis of a contiguous f32 flex tensor, row by row on rayon's pool, with
/// the bits of the composition `Program` fuses into it (`compiler::fuse`): `mean = s / mean_den`
/// with `s` `sum`'s f64 row sum rounded to f32, `c = x - mean`, `var` likewise from `c * c`
/// rounded to f32, `r = 1 / sqrt(var + eps)`, then `c * r` or `(gamma * r) * c + beta`. Four
/// passes over memory, two allocations and a dozen dispatches become one pass. `None` off
/// f32/flex, for an empty tensor, or gamma and beta not one value per column.
pub fn layer_norm_last(x: &Prim, affine: Option<(&[f32], &[f32])>, eps: f32, mean_den: f32, var_den: f32) -> Option<Prim> {
    let cols = *dispatch::dims(x).last()?;
    if affine.is_some_and(|(g, b)| g.len() != cols || b.len() != cols) {
        return None;
    }
    let (level, total) = (simd(), flex_f32(x)?.len());
    map_last_rows(x, |row, o, sq| {
        let mean = row_sum_as_sum(level, row, total) as f32 / mean_den;
        center_row_wide(level, row, mean, o, sq);
        let var = row_sum_as_sum(level, sq, total) as f32 / var_den;
        let r = 1.0 / (var + eps).sqrt();
        // SAFETY: center_row_wide wrote every element of `o`.
        let c: &mut [f32] = unsafe { &mut *(o as *mut [MaybeUninit<f32>] as *mut [f32]) };
        scale_row_wide(level, c, r, affine);
    })
}
