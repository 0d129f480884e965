//! 256-bit block × Q8 dot products. AVX2: `maddubs` multiplies unsigned weight bytes by signed
//! activation bytes and adds pairs into i16 (at most 2·15·127 for Q4, 2·128·127 for Q8_0 after
//! the sign trick: no saturation), `madd` adds those pairs into i32 lanes. With AVX-512 VNNI,
//! `dpbusd` does both, into i32 directly.

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
pub(super) unsafe fn block_dot<const F: u8, const VNNI: bool>(w: __m256i, x: __m256i) -> __m256 {
    // signed × signed (Q8_0): |w| against x with w's sign moved onto it
    let (u, s) = match QFormat::of(F) {
        QFormat::Q8_0 => (_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)),
        _ => (w, x),
    };
    let sums = if VNNI { _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s) } else { _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)) };
    _mm256_cvtepi32_ps(sums)
}

/// Block `b` of the weight row into each row's accumulator.
#[inline(always)]
pub(super) unsafe fn step<const F: u8, const R: usize, const VNNI: bool>(w: &[u8], a: &Q8Rows, first: usize, b: usize, acc: &mut [__m256; R], offsets: &mut [f32; R]) {
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
        acc[r] = _mm256_fmadd_ps(scale, block_dot::<F, VNNI>(wv, x), acc[r]);
        if f != QFormat::Q8_0 {
            offsets[r] += mw * *a.ds.get_unchecked(i);
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn row_dots<const F: u8, const R: usize>(w: &[u8], a: &Q8Rows, first: usize, out: &mut [f32]) {
    dots::<F, R, false>(w, a, first, out)
}

#[target_feature(enable = "avx512f,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn row_dots_vnni<const F: u8, const R: usize>(w: &[u8], a: &Q8Rows, first: usize, out: &mut [f32]) {
    dots::<F, R, true>(w, a, first, out)
}

#[inline(always)]
unsafe fn dots<const F: u8, const R: usize, const VNNI: bool>(w: &[u8], a: &Q8Rows, first: usize, out: &mut [f32]) {
    let nb = a.k / BLOCK;
    debug_assert!(w.len() == nb * QFormat::of(F).block_bytes() && first + R <= a.rows() && out.len() == R);
    // two accumulators per row and per sum (even and odd blocks): one alone is a chain of
    // dependent additions, which would set the pace for a single row
    let (mut even, mut odd) = ([_mm256_setzero_ps(); R], [_mm256_setzero_ps(); R]);
    let (mut even_offsets, mut odd_offsets) = ([0f32; R], [0f32; R]);
    let mut b = 0;
    while b + 1 < nb {
        step::<F, R, VNNI>(w, a, first, b, &mut even, &mut even_offsets);
        step::<F, R, VNNI>(w, a, first, b + 1, &mut odd, &mut odd_offsets);
        b += 2;
    }
    if b < nb {
        step::<F, R, VNNI>(w, a, first, b, &mut even, &mut even_offsets);
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

/// Four weight rows against one activation row (decoding a token): the activation block is
/// loaded once for the four, and the per-call set-up and sums are shared. Each row sums its
/// blocks exactly as `dots` does (even and odd blocks apart), so a row's result does not depend
/// on which kernel took it, nor on how many activation rows came with it.
#[inline(always)]
unsafe fn dots4<const F: u8, const VNNI: bool>(ws: [&[u8]; 4], a: &Q8Rows, row: usize, out: &mut [f32]) {
    let f = QFormat::of(F);
    let (bb, nb) = (f.block_bytes(), a.k / BLOCK);
    debug_assert!(ws.iter().all(|w| w.len() == nb * bb) && row < a.rows() && out.len() == 4);
    let mut acc = [[_mm256_setzero_ps(); 4]; 2];
    let mut offsets = [[0f32; 4]; 2];
    for b in 0..nb {
        let i = row * nb + b;
        let x = _mm256_loadu_si256(a.qs.as_ptr().add(i * BLOCK) as *const __m256i);
        let (dx, dsx) = (*a.d.get_unchecked(i), *a.ds.get_unchecked(i));
        let (acc, offsets) = (&mut acc[b & 1], &mut offsets[b & 1]);
        for j in 0..4 {
            let block = ws[j].get_unchecked(b * bb..(b + 1) * bb);
            let (dw, mw, at) = f.header(block);
            let wv = weights::<F>(block.as_ptr().add(at));
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(dw * dx), block_dot::<F, VNNI>(wv, x), acc[j]);
            if f != QFormat::Q8_0 {
                offsets[j] += mw * dsx;
            }
        }
    }
    for j in 0..4 {
        out[j] = hsum(_mm256_add_ps(acc[0][j], acc[1][j])) + (offsets[0][j] + offsets[1][j]);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows4_dots<const F: u8>(ws: [&[u8]; 4], a: &Q8Rows, row: usize, out: &mut [f32]) {
    dots4::<F, false>(ws, a, row, out)
}

#[target_feature(enable = "avx512f,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn rows4_dots_vnni<const F: u8>(ws: [&[u8]; 4], a: &Q8Rows, row: usize, out: &mut [f32]) {
    dots4::<F, true>(ws, a, row, out)
}
