//! AVX2 block × Q8 dot products: `maddubs` multiplies unsigned weight bytes by signed
//! activation bytes and adds pairs into i16 (at most 2·15·127 for Q4, 2·128·127 for Q8_0 after
//! the sign trick: no saturation), `madd` adds those pairs into i32 lanes.

use std::arch::x86_64::*;

use super::{q8::Q8Rows, QFormat, BLOCK};

/// A block's 32 weight quants as bytes in GGML order (low nibbles are values 0..16): Q4's
/// nibbles unsigned, Q8_0's bytes signed.
#[inline(always)]
unsafe fn weights<const F: u8>(p: *const u8) -> __m256i {
    match QFormat::of(F) {
        QFormat::Q8_0 => _mm256_loadu_si256(p as *const __m256i),
        _ => {
            let b = _mm_loadu_si128(p as *const __m128i);
            _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), _mm256_set1_epi8(0x0f))
        }
    }
}

/// `Σ w·x` of one block pair in eight i32 lanes, as f32 (exact: below 2^24).
#[inline(always)]
pub(super) unsafe fn block_dot<const F: u8>(w: __m256i, x: __m256i) -> __m256 {
    let pairs = match QFormat::of(F) {
        // signed × signed: |w| against x with w's sign moved onto it
        QFormat::Q8_0 => _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)),
        _ => _mm256_maddubs_epi16(w, x),
    };
    _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
}

/// Block `b` of the weight row into each row's accumulator.
#[inline(always)]
pub(super) unsafe fn step<const F: u8, const R: usize>(w: &[u8], a: &Q8Rows, first: usize, b: usize, acc: &mut [__m256; R], offsets: &mut [f32; R]) {
    let f = QFormat::of(F);
    let bb = f.block_bytes();
    let block = w.get_unchecked(b * bb..(b + 1) * bb);
    let (dw, mw, at) = f.header(block);
    let wv = weights::<F>(block.as_ptr().add(at));
    let nb = a.k / BLOCK;
    for r in 0..R {
        let i = (first + r) * nb + b;
        let x = _mm256_loadu_si256(a.qs.as_ptr().add(i * BLOCK) as *const __m256i);
        let scale = _mm256_set1_ps(dw * *a.d.get_unchecked(i));
        acc[r] = _mm256_fmadd_ps(scale, block_dot::<F>(wv, x), acc[r]);
        if f != QFormat::Q8_0 {
            offsets[r] += mw * *a.ds.get_unchecked(i);
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn row_dots<const F: u8, const R: usize>(w: &[u8], a: &Q8Rows, first: usize, out: &mut [f32]) {
    let nb = a.k / BLOCK;
    debug_assert!(w.len() == nb * QFormat::of(F).block_bytes() && first + R <= a.rows() && out.len() == R);
    // two accumulators per row and per sum (even and odd blocks): one alone is a chain of
    // dependent additions, which would set the pace for a single row
    let (mut even, mut odd) = ([_mm256_setzero_ps(); R], [_mm256_setzero_ps(); R]);
    let (mut even_offsets, mut odd_offsets) = ([0f32; R], [0f32; R]);
    let mut b = 0;
    while b + 1 < nb {
        step::<F, R>(w, a, first, b, &mut even, &mut even_offsets);
        step::<F, R>(w, a, first, b + 1, &mut odd, &mut odd_offsets);
        b += 2;
    }
    if b < nb {
        step::<F, R>(w, a, first, b, &mut even, &mut even_offsets);
    }
    for r in 0..R {
        out[r] = hsum(_mm256_add_ps(even[r], odd[r])) + (even_offsets[r] + odd_offsets[r]);
    }
}

#[inline(always)]
pub(super) unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
}
