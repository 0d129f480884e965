//! AVX-512 block × Q8 dot products, two blocks per 512-bit vector: `maddubs` + `madd` with
//! AVX-512BW, one `dpbusd` with VNNI (four byte products summed into each i32 lane, without
//! the i16 step). Q8_0's signed weights take their magnitude, and their sign moves onto the
//! activations; an odd last block takes the AVX2 step. The k-quants take the AVX2 kernels.

use std::arch::x86_64::*;

use super::int_avx2;
use super::{q8::Q8Rows, QFormat, BLOCK};

/// The quants of the blocks at `p0` and `p1`: lanes 0..32 and 32..64, each in GGML order.
#[inline(always)]
unsafe fn weights2<const F: u8>(p0: *const u8, p1: *const u8) -> __m512i {
    let at = 2 + 2 * (QFormat::of(F) == QFormat::Q4_1) as usize;
    let (p0, p1) = (p0.add(at), p1.add(at));
    match QFormat::of(F) {
        QFormat::Q5_0 | QFormat::Q5_1 => {
            let (p0, p1) = (p0.sub(at), p1.sub(at));
            _mm512_inserti64x4(_mm512_castsi256_si512(int_avx2::weights::<F>(p0, 0)), int_avx2::weights::<F>(p1, 0), 1)
        }
        QFormat::Q8_0 => {
            _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(p0 as *const __m256i)), _mm256_loadu_si256(p1 as *const __m256i), 1)
        }
        _ => {
            let (b0, b1) = (_mm_loadu_si128(p0 as *const __m128i), _mm_loadu_si128(p1 as *const __m128i));
            let y0 = _mm256_set_m128i(_mm_srli_epi16(b0, 4), b0);
            let y1 = _mm256_set_m128i(_mm_srli_epi16(b1, 4), b1);
            _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(y0), y1, 1), _mm512_set1_epi8(0x0f))
        }
    }
}

/// Unsigned weight bytes, and the activations signed to match (Q8_0's sign trick).
#[inline(always)]
unsafe fn operands<const F: u8>(w: __m512i, x: __m512i) -> (__m512i, __m512i) {
    match QFormat::of(F) {
        QFormat::Q8_0 => (_mm512_abs_epi8(w), _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x)),
        _ => (w, x),
    }
}

#[inline(always)]
unsafe fn block_dot2<const F: u8, const VNNI: bool>(w: __m512i, x: __m512i) -> __m512 {
    let (u, s) = operands::<F>(w, x);
    let sums = if VNNI { _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s) } else { _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)) };
    _mm512_cvtepi32_ps(sums)
}

/// Blocks `b` and `b + 1` of the weight row into each row's accumulator.
#[inline(always)]
unsafe fn step2<const F: u8, const R: usize, const VNNI: bool>(w: &[u8], a: &Q8Rows, first: usize, b: usize, acc: &mut [__m512; R], offsets: &mut [f32; R]) {
    let f = QFormat::of(F);
    debug_assert!(f.sub_blocks() == 1, "the k-quants take the AVX2 kernels");
    let bb = f.block_bytes();
    let (blk0, blk1) = (w.get_unchecked(b * bb..(b + 1) * bb), w.get_unchecked((b + 1) * bb..(b + 2) * bb));
    let ((d0, m0, _), (d1, m1, _)) = (f.header(blk0), f.header(blk1));
    let wv = weights2::<F>(blk0.as_ptr(), blk1.as_ptr());
    let nb = a.k / BLOCK;
    for r in 0..R {
        let i = (first + r) * nb + b;
        let x = _mm512_loadu_si512(a.qs.as_ptr().add(i * BLOCK) as *const _);
        let (dx0, dx1) = (*a.d.get_unchecked(i), *a.d.get_unchecked(i + 1));
        let scale = _mm512_insertf32x8(_mm512_set1_ps(d0 * dx0), _mm256_set1_ps(d1 * dx1), 1);
        acc[r] = _mm512_fmadd_ps(scale, block_dot2::<F, VNNI>(wv, x), acc[r]);
        if f.has_offset() {
            offsets[r] += m0 * *a.ds.get_unchecked(i) + m1 * *a.ds.get_unchecked(i + 1);
        }
    }
}

#[inline(always)]
unsafe fn dots<const F: u8, const R: usize, const VNNI: bool>(w: &[u8], a: &Q8Rows, first: usize, out: &mut [f32]) {
    let nb = a.k / BLOCK;
    debug_assert!(w.len() == nb * QFormat::of(F).block_bytes() && first + R <= a.rows() && out.len() == R);
    let (mut even, mut odd) = ([_mm512_setzero_ps(); R], [_mm512_setzero_ps(); R]);
    // per sum two accumulators (alternate pairs of blocks), so no single chain of additions
    let (mut even_offsets, mut odd_offsets) = ([0f32; R], [0f32; R]);
    let mut b = 0;
    while b + 3 < nb {
        step2::<F, R, VNNI>(w, a, first, b, &mut even, &mut even_offsets);
        step2::<F, R, VNNI>(w, a, first, b + 2, &mut odd, &mut odd_offsets);
        b += 4;
    }
    if b + 1 < nb {
        step2::<F, R, VNNI>(w, a, first, b, &mut even, &mut even_offsets);
        b += 2;
    }
    let mut tail = [_mm256_setzero_ps(); R];
    if b < nb {
        int_avx2::step::<F, R, VNNI>(w, a, first, b, &mut tail, &mut odd_offsets);
    }
    for r in 0..R {
        out[r] = _mm512_reduce_add_ps(_mm512_add_ps(even[r], odd[r])) + int_avx2::hsum(tail[r]) + (even_offsets[r] + odd_offsets[r]);
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn row_dots<const F: u8, const R: usize>(w: &[u8], a: &Q8Rows, first: usize, out: &mut [f32]) {
    dots::<F, R, false>(w, a, first, out)
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn row_dots_vnni<const F: u8, const R: usize>(w: &[u8], a: &Q8Rows, first: usize, out: &mut [f32]) {
    dots::<F, R, true>(w, a, first, out)
}

/// Four weight rows against one activation row (decoding a token), each row summed exactly as
/// `dots` sums it, so a row's result does not depend on the kernel that took it.
#[inline(always)]
unsafe fn dots4<const F: u8, const VNNI: bool>(ws: [&[u8]; 4], a: &Q8Rows, row: usize, out: &mut [f32]) {
    let nb = a.k / BLOCK;
    debug_assert!(ws.iter().all(|w| w.len() == nb * QFormat::of(F).block_bytes()) && row < a.rows() && out.len() == 4);
    let (mut even, mut odd) = ([[_mm512_setzero_ps(); 1]; 4], [[_mm512_setzero_ps(); 1]; 4]);
    let (mut even_offsets, mut odd_offsets) = ([[0f32; 1]; 4], [[0f32; 1]; 4]);
    let mut b = 0;
    while b + 3 < nb {
        for j in 0..4 {
            step2::<F, 1, VNNI>(ws[j], a, row, b, &mut even[j], &mut even_offsets[j]);
            step2::<F, 1, VNNI>(ws[j], a, row, b + 2, &mut odd[j], &mut odd_offsets[j]);
        }
        b += 4;
    }
    if b + 1 < nb {
        for j in 0..4 {
            step2::<F, 1, VNNI>(ws[j], a, row, b, &mut even[j], &mut even_offsets[j]);
        }
        b += 2;
    }
    let mut tail = [[_mm256_setzero_ps(); 1]; 4];
    if b < nb {
        for j in 0..4 {
            int_avx2::step::<F, 1, VNNI>(ws[j], a, row, b, &mut tail[j], &mut odd_offsets[j]);
        }
    }
    for j in 0..4 {
        out[j] = _mm512_reduce_add_ps(_mm512_add_ps(even[j][0], odd[j][0])) + int_avx2::hsum(tail[j][0]) + (even_offsets[j][0] + odd_offsets[j][0]);
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn rows4_dots<const F: u8>(ws: [&[u8]; 4], a: &Q8Rows, row: usize, out: &mut [f32]) {
    dots4::<F, false>(ws, a, row, out)
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn rows4_dots_vnni<const F: u8>(ws: [&[u8]; 4], a: &Q8Rows, row: usize, out: &mut [f32]) {
    dots4::<F, true>(ws, a, row, out)
}
