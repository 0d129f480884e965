//! F16 weight rows in `packed`'s groups of eight against f32 activation rows: per value, the
//! eight rows' halves converted to f32 in one register, multiplied by the activation and added
//! into the even or odd values' accumulator with a fused multiply-add; the two are added at the
//! end. Every path takes that order, so a row's result has the same bits on each and whatever
//! activation rows come with it.

use super::packed::LANES;
use crate::kernels::cpu::vector::Simd;

/// `out[i][lane] = row lane · x[first + i]` for the group's eight rows (`group`: `k` values of
/// eight f16 each) and `out.len()` (1 to `packed::ROWS`) rows of `x` (`k` values each).
pub(super) fn group_dots(level: Simd, group: &[u8], x: &[f32], k: usize, first: usize, out: &mut [[f32; LANES]]) {
    assert!(group.len() == 2 * LANES * k && k % 2 == 0 && (first + out.len()) * k <= x.len(), "f16 group: {} bytes for {k} values", group.len());
    #[cfg(target_arch = "x86_64")]
    if level >= Simd::Avx2 {
        // SAFETY: AVX2, FMA and F16C were detected on this CPU (`simd`).
        unsafe {
            match out.len() {
                1 => avx2::dots::<1>(group, x, k, first, out),
                2 => avx2::dots::<2>(group, x, k, first, out),
                3 => avx2::dots::<3>(group, x, k, first, out),
                _ => avx2::dots::<4>(group, x, k, first, out),
            }
        }
        return;
    }
    let _ = level;
    group_dots_scalar(group, x, k, first, out)
}

/// The reference every path gives the same bits as.
pub(super) fn group_dots_scalar(group: &[u8], x: &[f32], k: usize, first: usize, out: &mut [[f32; LANES]]) {
    for (i, o) in out.iter_mut().enumerate() {
        let xs = &x[(first + i) * k..(first + i + 1) * k];
        for (lane, o) in o.iter_mut().enumerate() {
            let mut acc = [0f32; 2];
            for (v, xv) in xs.iter().enumerate() {
                let at = 2 * (LANES * v + lane);
                let w = burn::tensor::f16::from_bits(u16::from_le_bytes([group[at], group[at + 1]])).to_f32();
                acc[v % 2] = w.mul_add(*xv, acc[v % 2]);
            }
            *o = acc[0] + acc[1];
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::LANES;

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dots<const R: usize>(group: &[u8], x: &[f32], k: usize, first: usize, out: &mut [[f32; LANES]]) {
        // even and odd values apart, in two named sets: indexed by `v % 2`, LLVM kept them in
        // memory
        let (mut even, mut odd) = ([_mm256_setzero_ps(); R], [_mm256_setzero_ps(); R]);
        let p = group.as_ptr() as *const __m128i;
        for v in (0..k).step_by(2) {
            let (w0, w1) = (_mm256_cvtph_ps(_mm_loadu_si128(p.add(v))), _mm256_cvtph_ps(_mm_loadu_si128(p.add(v + 1))));
            for r in 0..R {
                let xr = x.as_ptr().add((first + r) * k + v);
                even[r] = _mm256_fmadd_ps(w0, _mm256_set1_ps(*xr), even[r]);
                odd[r] = _mm256_fmadd_ps(w1, _mm256_set1_ps(*xr.add(1)), odd[r]);
            }
        }
        for r in 0..R {
            _mm256_storeu_ps(out[r].as_mut_ptr(), _mm256_add_ps(even[r], odd[r]));
        }
    }
}
