//! Activation rows quantised to 8 bits per block of 32, as llama.cpp's Q8_0: `x ≈ d·q` with
//! `d = amax/127` and `q = round(x/d)` in `-127..=127` (never -128, so a sign flip stays in i8).

use super::BLOCK;
use crate::kernels::cpu::vector::{par_chunks_for, simd, SharedMut, Simd};

/// `rows` rows of `k` values (`k` a multiple of 32), quantised per block.
pub struct Q8Rows {
    pub(super) k: usize,
    /// The quants, row-major like the input.
    pub(super) qs: Vec<i8>,
    /// Each block's scale `d`: NaN where the block holds a NaN, infinite where it holds an
    /// infinity (its quants are then 0, so the products become NaN rather than finite).
    pub(super) d: Vec<f32>,
    /// Each block's `d·Σq`: the term that a weight block's offset `m` multiplies.
    pub(super) ds: Vec<f32>,
}

impl Q8Rows {
    pub fn quantise(x: &[f32], k: usize) -> Q8Rows {
        assert!(k % BLOCK == 0 && x.len() % k.max(1) == 0, "q8: {} values are not rows of {k}, a multiple of {BLOCK}", x.len());
        let blocks = x.len() / BLOCK;
        let (mut qs, mut scales) = (vec![0i8; x.len()], vec![(0f32, 0f32); blocks]);
        let avx2 = simd() >= Simd::Avx2;
        let base = SharedMut(qs.as_mut_ptr());
        // tasks of 1024 blocks
        let per = 1024;
        par_chunks_for(&mut scales, per, x.len(), |t, scales| {
            let first = t * per;
            // SAFETY: task `t` alone takes the quants of blocks `first..first + scales.len()`,
            // inside `qs`, which outlives `par_chunks_for`.
            let qs = unsafe { std::slice::from_raw_parts_mut(base.get().add(first * BLOCK), scales.len() * BLOCK) };
            for (i, (q, s)) in qs.chunks_exact_mut(BLOCK).zip(scales.iter_mut()).enumerate() {
                *s = quantise_block(&x[(first + i) * BLOCK..(first + i + 1) * BLOCK], q, avx2);
            }
        });
        let (d, ds) = scales.into_iter().unzip();
        Q8Rows { k, qs, d, ds }
    }

    pub fn rows(&self) -> usize {
        self.qs.len() / self.k.max(1)
    }

    /// Row `r`'s block `b`: its quants, `d` and `d·Σq`.
    #[inline(always)]
    pub(super) fn block(&self, r: usize, b: usize) -> (&[i8], f32, f32) {
        let i = r * (self.k / BLOCK) + b;
        (&self.qs[i * BLOCK..(i + 1) * BLOCK], self.d[i], self.ds[i])
    }
}

/// One block's quants into `q`; its `d` and `d·Σq`.
#[inline(always)]
pub(super) fn quantise_block(xs: &[f32], q: &mut [i8], avx2: bool) -> (f32, f32) {
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: AVX2 was detected (`simd`); a block is 32 values and 32 quants.
        if let Some(r) = unsafe { avx2_block(xs.try_into().unwrap(), q.try_into().unwrap()) } {
            return r;
        }
    }
    let _ = avx2;
    let (mut amax, mut nan) = (0f32, false);
    for v in xs {
        amax = amax.max(v.abs());
        nan |= v.is_nan();
    }
    let scale = if nan { f32::NAN } else { amax / 127.0 };
    let inv = if scale > 0.0 && scale.is_finite() { 1.0 / scale } else { 0.0 };
    let mut sum = 0i32;
    for (v, q) in xs.iter().zip(q.iter_mut()) {
        let r = ((v * inv).round_ties_even() as i32).clamp(-127, 127);
        *q = r as i8;
        sum += r;
    }
    (scale, scale * sum as f32)
}

/// The scalar path's block in registers, for blocks of finite values whose scale and its
/// inverse are finite and non-zero; `None` leaves the others (NaN, infinities, zeros, scales
/// that underflow) to the scalar path. The largest magnitude is a maximum, exact in any order,
/// so the scale, the quants and their sum are the scalar path's.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn avx2_block(xs: &[f32; BLOCK], q: &mut [i8; BLOCK]) -> Option<(f32, f32)> {
    use std::arch::x86_64::*;
    let v: [__m256; 4] = std::array::from_fn(|j| _mm256_loadu_ps(xs.as_ptr().add(8 * j)));
    let abs = v.map(|v| _mm256_andnot_ps(_mm256_set1_ps(-0.0), v));
    // NaN and infinities compare unordered or above the largest finite value
    let big = _mm256_set1_ps(f32::MAX);
    let odd = abs.map(|a| _mm256_cmp_ps::<_CMP_NLE_UQ>(a, big));
    if _mm256_movemask_ps(_mm256_or_ps(_mm256_or_ps(odd[0], odd[1]), _mm256_or_ps(odd[2], odd[3]))) != 0 {
        return None;
    }
    let m = _mm256_max_ps(_mm256_max_ps(abs[0], abs[1]), _mm256_max_ps(abs[2], abs[3]));
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
    let scale = amax / 127.0;
    let inv = 1.0 / scale;
    if !(scale > 0.0 && inv.is_finite()) {
        return None;
    }
    let r = v.map(|v| {
        let r = _mm256_cvtps_epi32(_mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(v, _mm256_set1_ps(inv))));
        _mm256_max_epi32(_mm256_min_epi32(r, _mm256_set1_epi32(127)), _mm256_set1_epi32(-127))
    });
    // packing interleaves the four registers' halves by 32-bit groups; the permutation puts
    // each register's eight quants back in order
    let bytes = _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3]));
    let bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(q.as_mut_ptr() as *mut __m256i, bytes);
    let s = _mm256_add_epi32(_mm256_add_epi32(r[0], r[1]), _mm256_add_epi32(r[2], r[3]));
    let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let sum = _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s)));
    Some((scale, scale * sum as f32))
}
