//! Activation rows quantised to 8 bits per block of 32, as llama.cpp's Q8_0: `x ≈ d·q` with
//! `d = amax/127` and `q = round(x/d)` in `-127..=127` (never -128, so a sign flip stays in i8).

use super::BLOCK;

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
        let (mut qs, mut d, mut ds) = (vec![0i8; x.len()], Vec::with_capacity(blocks), Vec::with_capacity(blocks));
        for (xs, q) in x.chunks_exact(BLOCK).zip(qs.chunks_exact_mut(BLOCK)) {
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
            d.push(scale);
            ds.push(scale * sum as f32);
        }
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
