//! The grouped layout's kernel on 256 bits: lane `j` of every register is weight row `j`.
//! Per block and activation row, eight broadcast words of activations meet eight quant words:
//! `maddubs` adds byte pairs into i16, several quant words are summed there before `madd` takes
//! them to i32 (at most 2·15·127 a pair for 4-bit quants, so eight fit; 2·31·127 for 5-bit ones,
//! so four), and Q8_0 takes the sign trick, one quant word at a time. With AVX-512 VNNI,
//! `dpbusd` does each word's products and sum into i32 at once. Q6_K's quants go signed
//! (`q − 32`, the sign trick again, four words in i16), and its `madd` multiplies by each row's
//! scale of the 16 values instead of ones.

use std::arch::x86_64::*;

use super::packed::{block_bytes, fifth_bits_at, quants_at, LANES};
use super::{q8::Q8Rows, QFormat, BLOCK};

/// Sub-block `s`'s eight scales and offsets, as `packed::sub_header` gives them.
#[inline(always)]
unsafe fn headers<const F: u8>(blk: *const u8, s: usize) -> (__m256, __m256) {
    let f = QFormat::of(F);
    let d = halves(blk, 0);
    match f {
        QFormat::Q4_0 => (d, _mm256_mul_ps(_mm256_set1_ps(-8.0), d)),
        QFormat::Q5_0 => (d, _mm256_mul_ps(_mm256_set1_ps(-16.0), d)),
        QFormat::Q8_0 | QFormat::Q6_K => (d, _mm256_setzero_ps()),
        QFormat::Q4_K | QFormat::Q5_K => {
            let min = _mm256_mul_ps(halves(blk, 16), bytes(blk, 32 + LANES * (f.sub_blocks() + s)));
            (_mm256_mul_ps(d, bytes(blk, 32 + LANES * s)), _mm256_xor_ps(min, _mm256_set1_ps(-0.0)))
        }
        _ => (d, halves(blk, 16)),
    }
}

/// Eight f16 at `blk + at` as f32.
#[inline(always)]
unsafe fn halves(blk: *const u8, at: usize) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(blk.add(at) as *const __m128i))
}

/// Eight bytes at `blk + at` as f32.
#[inline(always)]
unsafe fn bytes(blk: *const u8, at: usize) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(blk.add(at) as *const __m128i)))
}

/// Activation word `g` of block `b` of row `row`, in every lane.
#[inline(always)]
unsafe fn word(a: &Q8Rows, row: usize, b: usize, g: usize) -> __m256i {
    let at = a.qs.as_ptr().add((row * (a.k / BLOCK) + b) * BLOCK + 4 * g) as *const i32;
    _mm256_set1_epi32(at.read_unaligned())
}

/// Quant word `g` of sub-block `s` for the eight rows: the bytes that activations `4g..4g + 4`
/// meet (unsigned, but Q8_0's signed ones).
#[inline(always)]
unsafe fn quant_word<const F: u8>(blk: *const u8, s: usize, g: usize) -> __m256i {
    let f = QFormat::of(F);
    let at = blk.add(quants_at(f, s));
    if f == QFormat::Q8_0 {
        return _mm256_loadu_si256(at.add(32 * g) as *const __m256i);
    }
    let p = _mm256_loadu_si256(at.add(32 * (g % 4)) as *const __m256i);
    let w = _mm256_and_si256(if g < 4 { p } else { _mm256_srli_epi16::<4>(p) }, _mm256_set1_epi8(0x0f));
    if f == QFormat::Q6_K {
        // bits `2c..2c + 2` of each byte to bits 4 and 5, then `q − 32`
        let (h, c) = (_mm256_loadu_si256(at.add(128 + 32 * (g / 4)) as *const __m256i), g % 4);
        let bits = if c < 3 { _mm256_sll_epi16(h, _mm_cvtsi32_si128(4 - 2 * c as i32)) } else { _mm256_srli_epi16::<2>(h) };
        return _mm256_sub_epi8(_mm256_or_si256(w, _mm256_and_si256(bits, _mm256_set1_epi8(0x30))), _mm256_set1_epi8(32));
    }
    if !matches!(f, QFormat::Q5_0 | QFormat::Q5_1 | QFormat::Q5_K) {
        return w;
    }
    // bit `g` of each byte of fifth bits to bit 4 (16-bit shifts: what crosses from the
    // neighbouring byte lands outside bit 4)
    let h = _mm256_loadu_si256(blk.add(fifth_bits_at(f, s)) as *const __m256i);
    let bit = if g <= 4 { _mm256_sll_epi16(h, _mm_cvtsi32_si128(4 - g as i32)) } else { _mm256_srl_epi16(h, _mm_cvtsi32_si128(g as i32 - 4)) };
    _mm256_or_si256(w, _mm256_and_si256(bit, _mm256_set1_epi8(0x10)))
}

/// Bytes between the block being summed and the one being prefetched (a few KiB of a weight
/// stream; measured by `quant_matmul_step_timing`).
const AHEAD: usize = 4096;

#[inline(always)]
unsafe fn dots<const F: u8, const R: usize, const VNNI: bool>(group: &[u8], a: &Q8Rows, first: usize, out: &mut [[f32; LANES]]) {
    let f = QFormat::of(F);
    let (pb, subs, nb) = (block_bytes(f), f.sub_blocks(), a.k / BLOCK);
    debug_assert!(group.len() == nb / subs * pb && first + R <= a.rows() && out.len() == R);
    let ones = _mm256_set1_epi16(1);
    // quant words summed in i16 before `madd`
    let per = if matches!(f, QFormat::Q5_0 | QFormat::Q5_1 | QFormat::Q5_K) { 4 } else { 8 };
    let (mut acc, mut acc_m) = ([_mm256_setzero_ps(); R], [_mm256_setzero_ps(); R]);
    for b in 0..nb {
        let (blk, s) = (group.as_ptr().add(b / subs * pb), b % subs);
        if R > 1 && s == 0 {
            // the bytes `AHEAD` on, as many as this block holds: with several activation rows a
            // block is enough work that the hardware's prefetch falls behind the stream (with
            // one it keeps up, and the extra loads cost)
            let ahead = blk.wrapping_add(AHEAD);
            for line in (0..pb).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line) as *const i8);
            }
        }
        let (dw, mw) = headers::<F>(blk, s);
        let mut sums = [_mm256_setzero_si256(); R];
        if f == QFormat::Q6_K {
            for half in 0..2 {
                // the half's scale as two i16 in each lane, for `madd`
                let sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64(blk.add(16 + LANES * (2 * s + half)) as *const __m128i));
                let sc = _mm256_or_si256(_mm256_and_si256(sc, _mm256_set1_epi32(0xffff)), _mm256_slli_epi32::<16>(sc));
                let mut pairs = [_mm256_setzero_si256(); R];
                for g in 4 * half..4 * half + 4 {
                    let w = quant_word::<F>(blk, s, g);
                    let u = _mm256_sign_epi8(w, w);
                    for r in 0..R {
                        pairs[r] = _mm256_add_epi16(pairs[r], _mm256_maddubs_epi16(u, _mm256_sign_epi8(word(a, first + r, b, g), w)));
                    }
                }
                for r in 0..R {
                    sums[r] = _mm256_add_epi32(sums[r], _mm256_madd_epi16(pairs[r], sc));
                }
            }
        } else if f == QFormat::Q8_0 {
            for g in 0..8 {
                let w = quant_word::<F>(blk, s, g);
                let u = _mm256_sign_epi8(w, w);
                for r in 0..R {
                    let sx = _mm256_sign_epi8(word(a, first + r, b, g), w);
                    sums[r] = if VNNI {
                        _mm256_dpbusd_epi32(sums[r], u, sx)
                    } else {
                        _mm256_add_epi32(sums[r], _mm256_madd_epi16(_mm256_maddubs_epi16(u, sx), ones))
                    };
                }
            }
        } else if VNNI {
            for g in 0..8 {
                let w = quant_word::<F>(blk, s, g);
                for r in 0..R {
                    sums[r] = _mm256_dpbusd_epi32(sums[r], w, word(a, first + r, b, g));
                }
            }
        } else {
            let mut pairs = [_mm256_setzero_si256(); R];
            for g in 0..8 {
                let w = quant_word::<F>(blk, s, g);
                for r in 0..R {
                    pairs[r] = _mm256_add_epi16(pairs[r], _mm256_maddubs_epi16(w, word(a, first + r, b, g)));
                }
                if (g + 1) % per == 0 {
                    for r in 0..R {
                        sums[r] = _mm256_add_epi32(sums[r], _mm256_madd_epi16(pairs[r], ones));
                        pairs[r] = _mm256_setzero_si256();
                    }
                }
            }
        }
        for r in 0..R {
            let i = (first + r) * nb + b;
            let scale = _mm256_mul_ps(dw, _mm256_set1_ps(*a.d.get_unchecked(i)));
            acc[r] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(sums[r]), acc[r]);
            if f.has_offset() {
                acc_m[r] = _mm256_fmadd_ps(mw, _mm256_set1_ps(*a.ds.get_unchecked(i)), acc_m[r]);
            }
        }
    }
    for r in 0..R {
        _mm256_storeu_ps(out[r].as_mut_ptr(), _mm256_add_ps(acc[r], acc_m[r]));
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn group_dots<const F: u8, const R: usize>(group: &[u8], a: &Q8Rows, first: usize, out: &mut [[f32; LANES]]) {
    dots::<F, R, false>(group, a, first, out)
}

#[target_feature(enable = "avx512f,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn group_dots_vnni<const F: u8, const R: usize>(group: &[u8], a: &Q8Rows, first: usize, out: &mut [[f32; LANES]]) {
    dots::<F, R, true>(group, a, first, out)
}
