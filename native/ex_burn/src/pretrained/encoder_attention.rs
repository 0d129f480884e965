//! An encoder layer's self-attention on the host, straight from the packed rows of its Q/K/V
//! projection (only the texts' real tokens, text after text): each text's tokens attend over
//! that text's tokens, so nothing is padded, masked or copied between layouts.
//!
//! Why: in Burn ops a layer gathers the packed rows into a padded `[texts, heads, seq,
//! head_dim]` layout, runs the attention there and gathers the rows back; those copies and the
//! attention's small ops took a quarter of MiniLM's time on a batch of 32 texts, for arithmetic
//! that is a few percent of the dense layers'.

use crate::kernels::cpu::attention::{scores as key_scores, weighted_sum};
use crate::kernels::cpu::vector::{exp_slice, par_tasks, simd, SharedMut};

/// The packed rows' texts and the extras some families add to the scores or the rows.
pub struct Layout<'a> {
    /// Rows each text has, in order.
    pub lens: &'a [usize],
    /// Each row's position in its text's padded row (what the position tables index).
    pub positions: &'a [usize],
    pub heads: usize,
    /// MPNet's bias `[heads, seq, seq]` by the two tokens' positions (`mpnet_position_bias`).
    pub bias: Option<(&'a [f32], usize)>,
    /// NomicBERT's rotary tables `[positions, head_dim]` (`encoder_family::rope_tables`: cos, and
    /// sin as (-sin, sin)), applied to Q and K as each head's halves swap.
    pub rope: Option<(&'a [f32], &'a [f32])>,
}

/// `softmax(q kᵀ / √head_dim + bias) v` of every text and head, for `qkv` rows of `[q | k | v]`
/// (`3 width` values each): rows of `width` values, head `h` at `h · head_dim`.
pub fn attend(qkv: &[f32], width: usize, l: &Layout) -> Vec<f32> {
    let rows: usize = l.lens.iter().sum();
    assert_eq!(qkv.len(), rows * 3 * width, "attend: {} values for {rows} rows of 3 × {width}", qkv.len());
    assert_eq!(l.positions.len(), rows);
    let dh = width / l.heads;
    let starts: Vec<usize> = l.lens.iter().scan(0, |at, n| Some(std::mem::replace(at, *at + n))).collect();
    let mut out = vec![0f32; rows * width];
    let base = SharedMut(out.as_mut_ptr());
    let scale = 1.0 / (dh as f32).sqrt();
    let level = simd();
    let task = |t: usize| {
        let (text, head) = (t / l.heads, t % l.heads);
        let (start, n) = (starts[text], l.lens[text]);
        if n == 0 {
            return;
        }
        // where row `row`'s Q (0), K (1) or V (2) of this head starts in `qkv`
        let offset = |which: usize, row: usize| (start + row) * 3 * width + which * width + head * dh;
        // this head's Q (scaled) and K, rotated where the family rotates them
        let part = |which: usize, row: usize| &qkv[offset(which, row)..][..dh];
        let rotated = |which: usize| -> Vec<f32> {
            let mut v = Vec::with_capacity(n * dh);
            for r in 0..n {
                let x = part(which, r);
                match l.rope {
                    Some((cos, sin)) => {
                        let p = l.positions[start + r];
                        let (c, s) = (&cos[p * dh..][..dh], &sin[p * dh..][..dh]);
                        let half = dh / 2;
                        v.extend((0..dh).map(|d| x[d] * c[d] + x[(d + half) % dh] * s[d]));
                    }
                    None => v.extend_from_slice(x),
                }
            }
            v
        };
        let (q, k) = (rotated(0), rotated(1));
        let (mut scores, mut weights) = (vec![0f32; n], vec![0f32; n]);
        let mut ctx = vec![0f32; dh];
        for i in 0..n {
            let qi = &q[i * dh..][..dh];
            key_scores(level, qi, &k, scale, &mut scores);
            if let Some((bias, seq)) = l.bias {
                for (j, s) in scores.iter_mut().enumerate() {
                    *s += bias[(head * seq + l.positions[start + i]) * seq + l.positions[start + j]];
                }
            }
            let top = scores.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            scores.iter_mut().for_each(|s| *s -= top);
            exp_slice(&scores, &mut weights);
            let total = weights.iter().fold(0f32, |t, w| t + w);
            ctx.iter_mut().for_each(|c| *c = 0.0);
            weighted_sum(level, &mut ctx, &weights, &qkv[offset(2, 0)..], 3 * width);
            let at = (start + i) * width + head * dh;
            for (d, c) in ctx.iter().enumerate() {
                // SAFETY: task (text, head) alone writes its rows' `head` columns of `out`, which
                // outlives every task; `at + d` is inside the `rows * width` values.
                unsafe { *base.get().add(at + d) = c / total };
            }
        }
    };
    par_tasks(l.lens.len() * l.heads, &task);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against an f64 attention over each text alone, written out here: two texts of 3 and 5
    /// rows (and an empty one), with MPNet's bias by position and with rotary tables, at the
    /// positions a padded batch gives them.
    #[test]
    fn attends_each_text_over_its_own_rows() {
        let (heads, dh, seq) = (2, 4, 6);
        let width = heads * dh;
        let lens = [3, 0, 5];
        let positions = [0, 1, 2, 0, 1, 2, 3, 4];
        let rows = 8;
        let qkv: Vec<f32> = (0..rows * 3 * width).map(|i| (i * 37 % 101) as f32 / 50.0 - 1.0).collect();
        let bias: Vec<f32> = (0..heads * seq * seq).map(|i| (i % 7) as f32 / 5.0 - 0.6).collect();
        let (cos, sin) = super::super::encoder_family::rope_tables(seq, dh, 1000.0);
        for (with_bias, with_rope) in [(false, false), (true, false), (false, true)] {
            let layout = Layout {
                lens: &lens,
                positions: &positions,
                heads,
                bias: with_bias.then_some((&bias[..], seq)),
                rope: with_rope.then_some((&cos[..], &sin[..])),
            };
            let got = attend(&qkv, width, &layout);
            let mut start = 0;
            for &n in &lens {
                for h in 0..heads {
                    let vec_of = |which: usize, r: usize| -> Vec<f64> {
                        let x: Vec<f64> = (0..dh).map(|d| qkv[(start + r) * 3 * width + which * width + h * dh + d] as f64).collect();
                        if !with_rope || which == 2 {
                            return x;
                        }
                        // rotate halves: (x0, x1) -> (x0 cos - x1 sin, x1 cos + x0 sin)
                        let (p, half) = (positions[start + r], dh / 2);
                        (0..dh).map(|d| x[d] * cos[p * dh + d] as f64 + x[(d + half) % dh] * sin[p * dh + d] as f64).collect()
                    };
                    for i in 0..n {
                        let q = vec_of(0, i);
                        let s: Vec<f64> = (0..n)
                            .map(|j| {
                                let k = vec_of(1, j);
                                let b = if with_bias { bias[(h * seq + positions[start + i]) * seq + positions[start + j]] as f64 } else { 0.0 };
                                q.iter().zip(&k).map(|(a, b)| a * b).sum::<f64>() / (dh as f64).sqrt() + b
                            })
                            .collect();
                        let top = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        let e: Vec<f64> = s.iter().map(|v| (v - top).exp()).collect();
                        let total: f64 = e.iter().sum();
                        for d in 0..dh {
                            let want: f64 = (0..n).map(|j| e[j] / total * vec_of(2, j)[d]).sum();
                            let v = got[(start + i) * width + h * dh + d] as f64;
                            assert!((v - want).abs() < 1e-5, "bias {with_bias} rope {with_rope}: row {} head {h} dim {d}: {v} vs {want}", start + i);
                        }
                    }
                }
                start += n;
            }
        }
    }
}
