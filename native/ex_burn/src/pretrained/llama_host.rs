//! The Llama decoder's layers on host f32 rows, for the CPU with every linear layer quantised:
//! the products run on the block kernels (`qmatmul`), and the rest of a layer (RMSNorm, RoPE,
//! attention over a KV cache appended in place, SiLU·up, residuals) is a pass over plain
//! slices. A decoding step is a few dozen small operations a layer; as tensor operations each
//! would allocate and dispatch, which costs as much as the layer's products.
//!
//! The same arithmetic as the tensor path (`burn_llama`), which the tests hold it to, for every
//! family there (`decoder_family::Family`: biases, Q/K norms and rope style read from `HostBlock`,
//! Gemma's activation, soft cap, output norms and sliding windows from `Shape` and the caller).

use super::decoder_family::{gelu_tanh, HeadExtras, RopeStyle};
use super::qmatmul::QStack;
use crate::kernels::cpu::attention::{self, weighted_sum};
use crate::kernels::cpu::vector::{exp_slice, par_chunks_for, simd};

/// The sizes a layer needs (from the model's `LlamaConfig`).
pub(super) struct Shape {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub rope_dim: usize,
    pub rope: RopeStyle,
    pub rms_eps: f64,
    /// GELU (tanh) gating instead of SiLU (`Family::gemma`); the output norms come with
    /// `HeadExtras::post_norms`.
    pub gemma: bool,
    pub attn_scale: f32,
    pub attn_softcap: Option<f32>,
}

/// One layer's weights as the host path reads them.
pub(super) struct HostBlock<'a> {
    pub attn_norm: &'a [f32],
    pub qkv: &'a QStack,
    /// The family's Q/K/V biases and per-head Q/K norms, where it has them.
    pub extras: &'a HeadExtras,
    pub out: &'a QStack,
    pub ffn_norm: &'a [f32],
    pub gate_up: &'a QStack,
    pub down: &'a QStack,
}

/// One layer's keys and values, `[kv_heads][position][head_dim]`, appended as tokens arrive.
#[derive(Clone, Default)]
pub struct HostKv {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl HostKv {
    /// Room for `len` positions of `heads` heads of `dh` values, allocated exactly.
    pub(super) fn reserve(&mut self, heads: usize, len: usize, dh: usize) {
        for side in [&mut self.k, &mut self.v] {
            side.resize_with(heads, Vec::new);
            for h in side.iter_mut() {
                h.reserve_exact((len * dh).saturating_sub(h.len()));
            }
        }
    }

    /// A copy of the first `len` positions (`dh` values a head each); `None` if it holds fewer.
    pub(super) fn prefix(&self, len: usize, dh: usize) -> Option<HostKv> {
        let cut = |heads: &[Vec<f32>]| heads.iter().map(|h| h.get(..len * dh).map(<[f32]>::to_vec)).collect::<Option<Vec<_>>>();
        Some(HostKv { k: cut(&self.k)?, v: cut(&self.v)? })
    }
}

/// `x ⊙ w / sqrt(mean(x²) + eps)` for each row of `x`, as the tensor path computes it.
pub(super) fn rms_norm(x: &[f32], w: &[f32], eps: f64) -> Vec<f32> {
    let mut out = x.to_vec();
    out.chunks_exact_mut(w.len()).for_each(|row| rms_norm_in_place(row, w, eps));
    out
}

/// One row (or one head's values: Qwen3's Q/K norms) RMS-normalised in place.
pub(super) fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f64) {
    let mean = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let scale = 1.0 / (mean + eps as f32).sqrt();
    for (v, w) in x.iter_mut().zip(w) {
        *v = *v * scale * w;
    }
}

/// Every value of `x` times `by`.
pub(super) fn scale(x: &mut [f32], by: f32) {
    x.iter_mut().for_each(|v| *v *= by);
}

/// `cap · tanh(v / cap)` for every value (Gemma 2's soft cap).
pub(super) fn softcap(x: &mut [f32], cap: f32) {
    x.iter_mut().for_each(|v| *v = cap * (*v / cap).tanh());
}

/// Adds `bias` to every row of `x` (rows of `bias.len()` values); nothing without one.
pub(super) fn add_bias(x: &mut [f32], bias: Option<&[f32]>) {
    let Some(b) = bias else { return };
    for row in x.chunks_exact_mut(b.len()) {
        for (v, b) in row.iter_mut().zip(b) {
            *v += b;
        }
    }
}

/// Rotation of one head's first `2 · cos.len()` values by a table row (`rope_tables`), pairs
/// taken in the family's style: the rotation both Llama paths apply on the host.
pub(super) fn rotate(x: &mut [f32], cos: &[f32], sin: &[f32], style: RopeStyle) {
    let half = cos.len();
    for i in 0..half {
        let (a, b) = match style {
            RopeStyle::Interleaved => (2 * i, 2 * i + 1),
            RopeStyle::Halves => (i, i + half),
        };
        let (x0, x1) = (x[a], x[b]);
        x[a] = x0 * cos[i] - x1 * sin[i];
        x[b] = x0 * sin[i] + x1 * cos[i];
    }
}

/// One sequence's rows in a layer call: `len` rows at positions `pos..pos + len`, and its cache.
pub(super) struct HostSeq<'a> {
    pub pos: usize,
    pub len: usize,
    pub kv: &'a mut HostKv,
}

/// Causal attention of the rows' queries `q` (`[rows, heads, head_dim]`, rotated) over their
/// sequences' caches: the row of `at[t] = (sequence, position p)` sees that sequence's positions
/// p − window < j ≤ p, and query heads share K/V heads in groups. Rows are independent: they run
/// in parallel, each the same sums as alone. Returns `[rows, heads, head_dim]`.
pub(super) fn attend(cfg: &Shape, q: &[f32], at: &[(usize, usize)], kvs: &[&HostKv], window: Option<usize>) -> Vec<f32> {
    let (dh, nh) = (cfg.head_dim, cfg.heads);
    let (group, scale) = (nh / cfg.kv_heads, cfg.attn_scale);
    let mut ctx = vec![0f32; at.len() * nh * dh];
    let work = at.iter().map(|&(_, p)| p + 1).sum::<usize>() * nh * dh;
    let level = simd();
    par_chunks_for(&mut ctx, nh * dh, work, |t, ctx_t| {
        let (i, p) = at[t];
        let (kv, first) = (kvs[i], window.map_or(0, |w| (p + 1).saturating_sub(w)));
        let seen = p + 1 - first;
        let (mut scores, mut weights) = (vec![0f32; seen], vec![0f32; seen]);
        for head in 0..nh {
            let (keys, values) = (&kv.k[head / group][first * dh..], &kv.v[head / group][first * dh..]);
            let qh = &q[(t * nh + head) * dh..(t * nh + head + 1) * dh];
            attention::scores(level, qh, keys, scale, &mut scores);
            if let Some(cap) = cfg.attn_softcap {
                softcap(&mut scores, cap);
            }
            let max = scores.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
            scores.iter_mut().for_each(|v| *v -= max);
            exp_slice(&scores, &mut weights);
            let total = weights.iter().fold(0f32, |t, v| t + v);
            weights.iter_mut().for_each(|p| *p /= total);
            weighted_sum(level, &mut ctx_t[head * dh..(head + 1) * dh], &weights, values, dh);
        }
    });
    ctx
}

/// One layer on rows `x` (`[rows, hidden]`, in place): the rows of `seqs` one after another. The
/// products take all rows at once (each weight read once for all of them); attention keeps to
/// each row's own sequence, so a row's values are the same whatever else is in the call. A row
/// at position p attends to positions p − window < j ≤ p where the layer has a `window`.
pub(super) fn layer(cfg: &Shape, b: &HostBlock, cos: &[f32], sin: &[f32], window: Option<usize>, x: &mut [f32], seqs: &mut [HostSeq]) {
    let (h, dh, nh, nkv) = (cfg.hidden, cfg.head_dim, cfg.heads, cfg.kv_heads);
    let s = x.len() / h;
    let (half, width) = (cfg.rope_dim / 2, b.qkv.rows());
    let mut qkv = b.qkv.matmul(&rms_norm(x, b.attn_norm, cfg.rms_eps), s);
    add_bias(&mut qkv, b.extras.qkv_bias.as_deref());
    // each row's sequence and position
    let at: Vec<(usize, usize)> = seqs.iter().enumerate().flat_map(|(i, q)| (q.pos..q.pos + q.len).map(move |p| (i, p))).collect();
    assert_eq!(at.len(), s, "llama_host: the sequences hold {} rows, x {s}", at.len());
    // queries rotated into `[s, heads, dh]`; keys rotated and values appended to the caches
    let mut q = vec![0f32; s * nh * dh];
    for (t, &(i, p)) in at.iter().enumerate() {
        let kv = &mut *seqs[i].kv;
        if kv.k.is_empty() {
            kv.k = vec![Vec::new(); nkv];
            kv.v = vec![Vec::new(); nkv];
        }
        let row = &qkv[t * width..(t + 1) * width];
        let (c, sn) = (&cos[p * half..(p + 1) * half], &sin[p * half..(p + 1) * half]);
        for head in 0..nh {
            let dst = &mut q[(t * nh + head) * dh..(t * nh + head + 1) * dh];
            dst.copy_from_slice(&row[head * dh..(head + 1) * dh]);
            if let Some(w) = &b.extras.q_norm {
                rms_norm_in_place(dst, w, cfg.rms_eps);
            }
            rotate(&mut dst[..2 * half], c, sn, cfg.rope);
        }
        for head in 0..nkv {
            let k = &row[(nh + head) * dh..(nh + head + 1) * dh];
            let at = kv.k[head].len();
            kv.k[head].extend_from_slice(k);
            if let Some(w) = &b.extras.k_norm {
                rms_norm_in_place(&mut kv.k[head][at..at + dh], w, cfg.rms_eps);
            }
            rotate(&mut kv.k[head][at..at + 2 * half], c, sn, cfg.rope);
            kv.v[head].extend_from_slice(&row[(nh + nkv + head) * dh..(nh + nkv + head + 1) * dh]);
        }
    }
    let kvs: Vec<&HostKv> = seqs.iter().map(|q| &*q.kv).collect();
    let ctx = attend(cfg, &q, &at, &kvs, window);
    // Gemma normalises each output before it joins the residual
    let post = |y: Vec<f32>, w: Option<&Vec<f32>>| match w {
        Some(w) => rms_norm(&y, w, cfg.rms_eps),
        None => y,
    };
    let post_norms = b.extras.post_norms.as_ref();
    for (x, o) in x.iter_mut().zip(post(b.out.matmul(&ctx, s), post_norms.map(|p| &p.0))) {
        *x += o;
    }
    let f = cfg.ffn;
    let gu = b.gate_up.matmul(&rms_norm(x, b.ffn_norm, cfg.rms_eps), s);
    let mut act = vec![0f32; s * f];
    par_chunks_for(&mut act, f, 8 * s * f, |t, a| {
        let (gate, up) = gu[2 * f * t..2 * f * (t + 1)].split_at(f);
        if cfg.gemma {
            for ((a, g), u) in a.iter_mut().zip(gate).zip(up) {
                *a = gelu_tanh(*g) * u;
            }
            return;
        }
        let minus: Vec<f32> = gate.iter().map(|g| -g).collect();
        exp_slice(&minus, a);
        for ((a, g), u) in a.iter_mut().zip(gate).zip(up) {
            *a = g / (1.0 + *a) * u;
        }
    });
    for (x, d) in x.iter_mut().zip(post(b.down.matmul(&act, s), post_norms.map(|p| &p.1))) {
        *x += d;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::attention::dot;

    /// SmolLM2's attention sizes (9 query heads over 3 K/V heads of 64 values).
    fn smol_shape() -> Shape {
        Shape {
            hidden: 576,
            heads: 9,
            kv_heads: 3,
            head_dim: 64,
            ffn: 1536,
            rope_dim: 64,
            rope: RopeStyle::Halves,
            rms_eps: 1e-5,
            gemma: false,
            attn_scale: 0.125,
            attn_softcap: None,
        }
    }

    /// Caches of the given lengths and one query row per sequence at its last position.
    fn filled(cfg: &Shape, lens: &[usize], seed: &mut u32) -> (Vec<HostKv>, Vec<f32>, Vec<(usize, usize)>) {
        let mut rand = || {
            *seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
            (*seed >> 8) as f32 / (1u32 << 24) as f32 * 4.0 - 2.0
        };
        let dh = cfg.head_dim;
        let kvs = lens
            .iter()
            .map(|&n| {
                let mut side = || (0..cfg.kv_heads).map(|_| (0..n * dh).map(|_| rand()).collect()).collect();
                HostKv { k: side(), v: side() }
            })
            .collect();
        let q = (0..lens.len() * cfg.heads * dh).map(|_| rand()).collect();
        (kvs, q, lens.iter().enumerate().map(|(i, &n)| (i, n - 1)).collect())
    }

    /// Attention as a row at a time of values, the plain reading of the sums `attend` makes.
    fn attend_plainly(cfg: &Shape, q: &[f32], at: &[(usize, usize)], kvs: &[&HostKv], window: Option<usize>) -> Vec<f32> {
        let (dh, nh) = (cfg.head_dim, cfg.heads);
        let mut ctx = vec![0f32; at.len() * nh * dh];
        for (t, &(i, p)) in at.iter().enumerate() {
            let first = window.map_or(0, |w| (p + 1).saturating_sub(w));
            for head in 0..nh {
                let g = head / (nh / cfg.kv_heads);
                let qh = &q[(t * nh + head) * dh..][..dh];
                let mut scores: Vec<f32> = (first..=p).map(|j| dot(qh, &kvs[i].k[g][j * dh..][..dh]) * cfg.attn_scale).collect();
                if let Some(cap) = cfg.attn_softcap {
                    softcap(&mut scores, cap);
                }
                let max = scores.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
                scores.iter_mut().for_each(|v| *v -= max);
                let mut weights = vec![0f32; scores.len()];
                exp_slice(&scores, &mut weights);
                let total = weights.iter().fold(0f32, |t, v| t + v);
                for (j, w) in (first..=p).zip(&weights) {
                    let w = w / total;
                    for (o, v) in ctx[(t * nh + head) * dh..][..dh].iter_mut().zip(&kvs[i].v[g][j * dh..][..dh]) {
                        *o += w * v;
                    }
                }
            }
        }
        ctx
    }

    /// `attend` gives the plain sums' bits, with and without a window and a soft cap.
    #[test]
    fn attend_sums_as_the_plain_reading() {
        let mut seed = 3;
        for (window, softcap) in [(None, None), (Some(5), None), (None, Some(30.0))] {
            let cfg = Shape { attn_softcap: softcap, ..smol_shape() };
            let (kvs, q, at) = filled(&cfg, &[1, 7, 40], &mut seed);
            let kvs: Vec<&HostKv> = kvs.iter().collect();
            let got = attend(&cfg, &q, &at, &kvs, window);
            let want = attend_plainly(&cfg, &q, &at, &kvs, window);
            assert_eq!(got.len(), 3 * 9 * 64);
            assert!(got.iter().all(|v| v.is_finite()) && got.iter().any(|v| *v != 0.0));
            assert_eq!(got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "window {window:?}, soft cap {softcap:?}");
        }
    }

    /// One decoding step's attention for eight sequences at serving-length prompts, against the
    /// plain reading in the same run (`--ignored --nocapture`).
    #[test]
    #[ignore]
    fn host_attention_timing() {
        let cfg = smol_shape();
        let lens: Vec<usize> = (0..8).map(|i| 100 + 40 * i).collect();
        let (kvs, q, at) = filled(&cfg, &lens, &mut 11);
        let kvs: Vec<&HostKv> = kvs.iter().collect();
        let time = |f: &dyn Fn() -> Vec<f32>| {
            let mut best = f64::INFINITY;
            for _ in 0..5 {
                let t = std::time::Instant::now();
                for _ in 0..30 {
                    std::hint::black_box(f());
                }
                best = best.min(t.elapsed().as_secs_f64() / 30.0);
            }
            best * 1e6
        };
        // a row a call, so both run on one thread
        let row = |t: usize| &q[t * cfg.heads * cfg.head_dim..][..cfg.heads * cfg.head_dim];
        let plain = time(&|| (0..8).flat_map(|t| attend_plainly(&cfg, row(t), &at[t..t + 1], &kvs, None)).collect());
        let ours = time(&|| (0..8).flat_map(|t| attend(&cfg, row(t), &at[t..t + 1], &kvs, None)).collect());
        println!("host attention, one thread, 8 rows at positions {lens:?}, one layer: {ours:.0} us, the plain reading {plain:.0} us ({:.2}x)", plain / ours);
    }
}
