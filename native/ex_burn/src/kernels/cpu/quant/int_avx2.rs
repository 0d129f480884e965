//! 256-bit block × Q8 dot products. AVX2: `maddubs` multiplies unsigned weight bytes by signed
//! activation bytes and adds pairs into i16 (at most 2·15·127 for Q4, 2·31·127 for Q5, 2·63·127
//! for Q6_K, 2·128·127 for Q8_0 after the sign trick: no saturation), `madd` adds those pairs into
//! i32 lanes. With AVX-512 VNNI, `dpbusd` does both, into i32 directly. Q6_K's `madd` multiplies
//! by its per-16 scales instead of ones (and keeps `maddubs` under VNNI). The k-quants' blocks
//! are taken a 32-value sub-block at a time.

use std::arch::x86_64::*;

use super::{q8::Q8Rows, QFormat, BLOCK};

/// Sub-block `s`'s 32 weight quants as bytes in GGML order (low nibbles are values 0..16), from
/// the block at `p`: unsigned, but Q8_0's signed bytes.
#[inline(always)]
pub(super) unsafe fn weights<const F: u8>(p: *const u8, s: usize) -> __m256i {
    let low4 = _mm256_set1_epi8(0x0f);
    match QFormat::of(F) {
        QFormat::Q8_0 => _mm256_loadu_si256(p.add(2) as *const __m256i),
        QFormat::Q5_0 | QFormat::Q5_1 => {
            let at = if QFormat::of(F) == QFormat::Q5_0 { 6 } else { 8 };
            _mm256_or_si256(nibbles(p.add(at)), _mm256_and_si256(bits_as_bytes(p.add(at - 4)), _mm256_set1_epi8(0x10)))
        }
        QFormat::Q4_K => {
            let q = _mm256_loadu_si256(p.add(16 + 32 * (s / 2)) as *const __m256i);
            _mm256_and_si256(if s % 2 == 0 { q } else { _mm256_srli_epi16(q, 4) }, low4)
        }
        QFormat::Q6_K => {
            let (half, c) = (s / 4, s % 4);
            let ql = _mm256_loadu_si256(p.add(64 * half + 32 * (c % 2)) as *const __m256i);
            let qh = _mm256_loadu_si256(p.add(128 + 32 * half) as *const __m256i);
            let low = _mm256_and_si256(if c < 2 { ql } else { _mm256_srli_epi16(ql, 4) }, low4);
            let high = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c as i32)), _mm256_set1_epi8(3));
            _mm256_or_si256(low, _mm256_slli_epi16(high, 4))
        }
        _ => nibbles(p.add(2 + 2 * (QFormat::of(F) == QFormat::Q4_1) as usize)),
    }
}

/// 16 bytes' low nibbles, then their high nibbles.
#[inline(always)]
unsafe fn nibbles(q: *const u8) -> __m256i {
    let b = _mm_loadu_si128(q as *const __m128i);
    _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), _mm256_set1_epi8(0x0f))
}

/// The 32 bits at `p` as bytes, 0xff where bit `i` is set (llama.cpp's `bytes_from_bits_32`).
#[inline(always)]
unsafe fn bits_as_bytes(p: *const u8) -> __m256i {
    let bits = _mm256_set1_epi32((p as *const i32).read_unaligned());
    let spread = _mm256_shuffle_epi8(bits, _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
    let others = _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    _mm256_cmpeq_epi8(others, _mm256_set1_epi64x(-1))
}

/// Q6_K's scales of sub-block `s` as i16, one per half of `madd`'s lanes; ones for the others.
#[inline(always)]
unsafe fn multipliers<const F: u8>(p: *const u8, s: usize) -> __m256i {
    match QFormat::of(F) {
        QFormat::Q6_K => {
            let sc = p.add(192 + 8 * (s / 4) + 2 * (s % 4)) as *const i8;
            _mm256_set_m128i(_mm_set1_epi16(*sc.add(1) as i16), _mm_set1_epi16(*sc as i16))
        }
        _ => _mm256_set1_epi16(1),
    }
}

/// `Σ w·x` of one block pair in eight i32 lanes, as f32 (exact: below 2^24).
#[inline(always)]
pub(super) unsafe fn block_dot<const F: u8, const VNNI: bool>(w: __m256i, x: __m256i, mul: __m256i) -> __m256 {
    let sums = match QFormat::of(F) {
        // `sc·(q − 32)`: the products of 32 taken off in i16 (at most 2·32·127)
        QFormat::Q6_K => _mm256_madd_epi16(_mm256_sub_epi16(_mm256_maddubs_epi16(w, x), _mm256_maddubs_epi16(_mm256_set1_epi8(32), x)), mul),
        f => {
            // signed × signed (Q8_0): |w| against x with w's sign moved onto it
            let (u, s) = if f == QFormat::Q8_0 { (_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)) } else { (w, x) };
            if VNNI {
                _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
            } else {
                _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), mul)
            }
        }
    };
    _mm256_cvtepi32_ps(sums)
}

/// Activation block `b` (a weight block, or a k-quant's sub-block) into each row's accumulator.
#[inline(always)]
pub(super) unsafe fn step<const F: u8, const R: usize, const VNNI: bool>(w: &[u8], a: &Q8Rows, first: usize, b: usize, acc: &mut [__m256; R], offsets: &mut [f32; R]) {
    let f = QFormat::of(F);
    let (bb, subs) = (f.block_bytes(), f.sub_blocks());
    let (block, s) = (w.get_unchecked(b / subs * bb..(b / subs + 1) * bb), b % subs);
    let (dw, mw) = f.sub_header(block, s);
    let (wv, mul) = (weights::<F>(block.as_ptr(), s), multipliers::<F>(block.as_ptr(), s));
    let nb = a.k / BLOCK;
    for r in 0..R {
        let i = (first + r) * nb + b;
        let x = _mm256_loadu_si256(a.qs.as_ptr().add(i * BLOCK) as *const __m256i);
        let scale = _mm256_set1_ps(dw * *a.d.get_unchecked(i));
        acc[r] = _mm256_fmadd_ps(scale, block_dot::<F, VNNI>(wv, x, mul), acc[r]);
        if f.has_offset() {
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
    debug_assert!(w.len() * QFormat::of(F).block_values() == nb * BLOCK * QFormat::of(F).block_bytes() && first + R <= a.rows() && out.len() == R);
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
    let (bb, subs, nb) = (f.block_bytes(), f.sub_blocks(), a.k / BLOCK);
    debug_assert!(ws.iter().all(|w| w.len() * subs == nb * bb) && row < a.rows() && out.len() == 4);
    let mut acc = [[_mm256_setzero_ps(); 4]; 2];
    let mut offsets = [[0f32; 4]; 2];
    for b in 0..nb {
        let i = row * nb + b;
        let x = _mm256_loadu_si256(a.qs.as_ptr().add(i * BLOCK) as *const __m256i);
        let (dx, dsx) = (*a.d.get_unchecked(i), *a.ds.get_unchecked(i));
        let (acc, offsets) = (&mut acc[b & 1], &mut offsets[b & 1]);
        for j in 0..4 {
            let (block, s) = (ws[j].get_unchecked(b / subs * bb..(b / subs + 1) * bb), b % subs);
            let (dw, mw) = f.sub_header(block, s);
            let (wv, mul) = (weights::<F>(block.as_ptr(), s), multipliers::<F>(block.as_ptr(), s));
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(dw * dx), block_dot::<F, VNNI>(wv, x, mul), acc[j]);
            if f.has_offset() {
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
