//! Weight rows against f32 activation rows: each block decoded to f32 in registers,
//! `w = fma(q, d, m)`, and multiplied into up to `ROWS` rows (a prompt's tokens share one
//! decoding). Serves plain f32 rows; the layers' quantised rows take the integer kernels, and of
//! them only Q4_0, Q4_1 and Q8_0 are decoded here.

use super::{QFormat, BLOCK};
use crate::kernels::cpu::vector::Simd;

/// Activation rows sharing one decoding of a weight row (a prompt's tokens): each block is
/// decoded once per this many rows.
pub(super) const ROWS: usize = 8;

/// `out[i] = Σ_j w[j]·x_i[j]` for one weight row and `out.len()` (1 to `ROWS`) rows `x_i` of `k`
/// values. Each block is dequantised in registers, `w = fma(q, d, m)`, then multiplied in.
pub(super) fn row_dots(level: Simd, f: QFormat, w: &[u8], xs: &[f32], k: usize, out: &mut [f32]) {
    macro_rules! by_rows {
        ($isa:ident) => {
            match out.len() {
                1 => $isa::row_dots::<1>(f, w, xs, k, out),
                2 => $isa::row_dots::<2>(f, w, xs, k, out),
                3 => $isa::row_dots::<3>(f, w, xs, k, out),
                4 => $isa::row_dots::<4>(f, w, xs, k, out),
                5 => $isa::row_dots::<5>(f, w, xs, k, out),
                6 => $isa::row_dots::<6>(f, w, xs, k, out),
                7 => $isa::row_dots::<7>(f, w, xs, k, out),
                _ => $isa::row_dots::<8>(f, w, xs, k, out),
            }
        };
    }
    #[cfg(target_arch = "x86_64")]
    if level >= Simd::Avx512 {
        // SAFETY: AVX-512 (F, BW) with AVX2, FMA and F16C were detected on this CPU (`simd`).
        unsafe { by_rows!(avx512) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if level >= Simd::Avx2 {
        // SAFETY: AVX2 and FMA were detected on this CPU (`simd`).
        unsafe { by_rows!(avx2) };
        return;
    }
    let _ = level;
    row_dots_scalar(f, w, xs, k, out)
}

fn row_dots_scalar(f: QFormat, w: &[u8], xs: &[f32], k: usize, out: &mut [f32]) {
    let bb = f.block_bytes();
    let mut q = [0f32; BLOCK];
    out.fill(0.0);
    for (b, block) in w.chunks_exact(bb).enumerate() {
        let (d, m, at) = f.header(block);
        f.quants(block, at, &mut q);
        if f != QFormat::F32 {
            q.iter_mut().for_each(|q| *q = q.mul_add(d, m));
        }
        for (i, o) in out.iter_mut().enumerate() {
            let x = &xs[i * k + b * BLOCK..i * k + (b + 1) * BLOCK];
            *o += q.iter().zip(x).map(|(w, x)| w * x).sum::<f32>();
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{QFormat, BLOCK};
    use std::arch::x86_64::*;

    /// A block's 32 quants as four vectors of 8 f32. Each byte is widened once and both of its
    /// nibbles taken in the 32-bit lanes: two byte shuffles per block instead of six, since
    /// shuffles issue on fewer ports than shifts and conversions and would set the pace.
    #[inline(always)]
    unsafe fn quants(f: QFormat, p: *const u8) -> [__m256; 4] {
        match f {
            QFormat::Q4_0 | QFormat::Q4_1 => {
                let v0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i));
                let v1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(8) as *const __m128i));
                let mask = _mm256_set1_epi32(0x0f);
                let f = _mm256_cvtepi32_ps;
                [f(_mm256_and_si256(v0, mask)), f(_mm256_and_si256(v1, mask)), f(_mm256_srli_epi32(v0, 4)), f(_mm256_srli_epi32(v1, 4))]
            }
            QFormat::Q8_0 => {
                let f = |o: usize| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p.add(o) as *const __m128i)));
                [f(0), f(8), f(16), f(24)]
            }
            QFormat::F32 => {
                let p = p as *const f32;
                [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)), _mm256_loadu_ps(p.add(16)), _mm256_loadu_ps(p.add(24))]
            }
            _ => unreachable!("f32 activations meet Q4_0, Q4_1, Q8_0 and f32 rows only"),
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn row_dots<const R: usize>(f: QFormat, w: &[u8], xs: &[f32], k: usize, out: &mut [f32]) {
        let (bb, nb) = (f.block_bytes(), k / BLOCK);
        debug_assert!(w.len() == nb * bb && xs.len() == R * k && out.len() == R);
        let mut acc = [_mm256_setzero_ps(); R];
        let xp = xs.as_ptr();
        for b in 0..nb {
            let block = w.get_unchecked(b * bb..(b + 1) * bb);
            let (d, m, at) = f.header(block);
            let (dv, mv) = (_mm256_set1_ps(d), _mm256_set1_ps(m));
            let q = quants(f, block.as_ptr().add(at));
            // no closure here (`map`): closures do not inherit `target_feature`
            let w = if f == QFormat::F32 {
                q
            } else {
                [_mm256_fmadd_ps(q[0], dv, mv), _mm256_fmadd_ps(q[1], dv, mv), _mm256_fmadd_ps(q[2], dv, mv), _mm256_fmadd_ps(q[3], dv, mv)]
            };
            for r in 0..R {
                let x = xp.add(r * k + b * BLOCK);
                let mut a = acc[r];
                for (i, w) in w.iter().enumerate() {
                    a = _mm256_fmadd_ps(*w, _mm256_loadu_ps(x.add(8 * i)), a);
                }
                acc[r] = a;
            }
        }
        for r in 0..R {
            let v = acc[r];
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
            out[r] = _mm_cvtss_f32(s);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{QFormat, BLOCK};
    use std::arch::x86_64::*;

    /// A block's 32 quants as two vectors of 16 f32: one byte shuffle per block.
    #[inline(always)]
    unsafe fn quants(f: QFormat, p: *const u8) -> [__m512; 2] {
        match f {
            QFormat::Q4_0 | QFormat::Q4_1 => {
                let v = _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i));
                let lo = _mm512_and_si512(v, _mm512_set1_epi32(0x0f));
                [_mm512_cvtepi32_ps(lo), _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4))]
            }
            QFormat::Q8_0 => {
                let f = |o: usize| _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p.add(o) as *const __m128i)));
                [f(0), f(16)]
            }
            QFormat::F32 => [_mm512_loadu_ps(p as *const f32), _mm512_loadu_ps((p as *const f32).add(16))],
            _ => unreachable!("f32 activations meet Q4_0, Q4_1, Q8_0 and f32 rows only"),
        }
    }

    /// One block into `acc` (a function, not a closure: closures do not inherit
    /// `target_feature`, and the intrinsics would become calls).
    #[inline(always)]
    unsafe fn step<const R: usize>(f: QFormat, w: &[u8], xp: *const f32, k: usize, b: usize, acc: &mut [__m512; R]) {
        let bb = f.block_bytes();
        let block = w.get_unchecked(b * bb..(b + 1) * bb);
        let (d, m, at) = f.header(block);
        let (dv, mv) = (_mm512_set1_ps(d), _mm512_set1_ps(m));
        let [q0, q1] = quants(f, block.as_ptr().add(at));
        let (w0, w1) = if f == QFormat::F32 { (q0, q1) } else { (_mm512_fmadd_ps(q0, dv, mv), _mm512_fmadd_ps(q1, dv, mv)) };
        for r in 0..R {
            let x = xp.add(r * k + b * BLOCK);
            acc[r] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x.add(16)), _mm512_fmadd_ps(w0, _mm512_loadu_ps(x), acc[r]));
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
    pub(super) unsafe fn row_dots<const R: usize>(f: QFormat, w: &[u8], xs: &[f32], k: usize, out: &mut [f32]) {
        let nb = k / BLOCK;
        debug_assert!(w.len() == nb * f.block_bytes() && xs.len() == R * k && out.len() == R);
        // two accumulators per row (even and odd blocks): one row alone is otherwise a chain of
        // dependent FMAs, two per block
        let (mut even, mut odd) = ([_mm512_setzero_ps(); R], [_mm512_setzero_ps(); R]);
        let xp = xs.as_ptr();
        let mut b = 0;
        while b + 1 < nb {
            step(f, w, xp, k, b, &mut even);
            step(f, w, xp, k, b + 1, &mut odd);
            b += 2;
        }
        if b < nb {
            step(f, w, xp, k, b, &mut even);
        }
        for r in 0..R {
            out[r] = _mm512_reduce_add_ps(_mm512_add_ps(even[r], odd[r]));
        }
    }
}

