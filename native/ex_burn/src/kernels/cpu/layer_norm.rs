//! Layer norm over the last axis in one pass per row, the kernel of `Op::LayerNorm`
//! (`compiler::fuse`), with the bits of the Nx composition it replaces.

use burn::backend::TensorData;
use std::mem::MaybeUninit;

use super::vector::{flex_f32, par_chunks_for, row_sum_as_sum, simd, wide, Isa, Simd, PAR_MIN};
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
    let xs = flex_f32(x)?;
    let shape = dispatch::dims(x);
    let cols = *shape.last()?;
    if xs.is_empty() || cols == 0 || affine.is_some_and(|(g, b)| g.len() != cols || b.len() != cols) {
        return None;
    }
    let level = simd();
    let per_task = (PAR_MIN / cols).max(1);
    let mut out: Vec<f32> = Vec::with_capacity(xs.len());
    par_chunks_for(&mut out.spare_capacity_mut()[..xs.len()], per_task * cols, xs.len(), |t, o| {
        let mut sq = vec![0f32; cols];
        for (row, o) in xs[t * per_task * cols..].chunks(cols).zip(o.chunks_mut(cols)) {
            let mean = row_sum_as_sum(level, row, xs.len()) as f32 / mean_den;
            center_row_wide(level, row, mean, o, &mut sq);
            let var = row_sum_as_sum(level, &sq, xs.len()) as f32 / var_den;
            let r = 1.0 / (var + eps).sqrt();
            // SAFETY: center_row_wide wrote every element of `o`.
            let c: &mut [f32] = unsafe { &mut *(o as *mut [MaybeUninit<f32>] as *mut [f32]) };
            scale_row_wide(level, c, r, affine);
        }
    });
    // SAFETY: the tasks wrote all xs.len() elements (each row of each chunk).
    unsafe { out.set_len(xs.len()) };
    Some(dispatch::from_data(TensorData::new(out, shape), &burn::tensor::Device::flex()))
}
