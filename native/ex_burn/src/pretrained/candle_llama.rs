//! Llama-family decoder (Llama, Qwen2, Qwen3, Phi-3, Gemma 2 and 3: `decoder_family::Family`) on the Candle engine (CPU or CUDA),
//! written here on `candle-core` and
//! `candle-nn` ops: every projection a `QMatMul` over the GGUF's own quantised blocks, and the
//! token embedding kept quantised too (rows dequantised on lookup by `qmatmul::dequantise_row`;
//! a tied output projection multiplies the same blocks).
//! `candle-transformers`' quantised Llama dequantises the embedding to f32, which for a small
//! model is more memory than the whole file (guides/pretrained.md). Hyperparameters and
//! rotary tables are the Burn engine's (`llama_config::LlamaConfig`), and tensors come through the
//! same `DecoderSource`, so both engines read a GGUF file or a Hugging Face directory the same
//! way.

use std::path::Path;
use std::sync::Arc;

use candle_core::quantized::{QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor};

use super::llama_config::LlamaConfig;
use super::decoder_family::{HeadExtras, RopeStyle};
use super::candle_device;
use super::candle_kv::{self, KvBuf};
use super::errors;
use super::gguf::{self, Header};
use super::qmatmul::{dequantise_row, QFormat};
use super::decoder_source::DecoderSource;
use super::files::is_hf_dir;
use super::{own_chunks, CausalLm, Chunk, LmSession};
use crate::device::DeviceRef;
use crate::error::{ExError, ExResult};

/// GGUF `general.architecture` values this engine runs: the Burn engine's.
pub const ARCHITECTURES: &[&str] = super::decoder_family::ARCHITECTURES;

/// GGML tensor types Candle reads: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 and the
/// K-quants Q2_K…Q8_K.
pub const TENSOR_TYPES: &[u32] = &[0, 1, 30, 2, 3, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];

fn engine_err(e: candle_core::Error) -> ExError {
    errors::engine("candle", e)
}

/// The token embedding: quantised rows where `qmatmul` decodes the format (in host memory on
/// every device: a step's rows are decoded there and copied over), else f32 on the device.
enum Embedding {
    Quant { blocks: Arc<QTensor>, format: QFormat, row_bytes: usize },
    Dense(Tensor),
}

struct Block {
    attn_norm: Tensor,
    /// The family's Q, K and V biases (`[1, 1, width]`) and per-head Q and K norms
    /// (`[head_dim]`), where it has them.
    bias: Option<[Tensor; 3]>,
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
    /// Q, K and V; gate and up (`Family::projections`).
    qkv: Stacked,
    out: QMatMul,
    ffn_norm: Tensor,
    gate_up: Stacked,
    down: QMatMul,
    /// Gemma's norms of the attention and MLP outputs.
    post_norms: Option<(Tensor, Tensor)>,
}

/// A projection whose outputs are several matrices' stacked: one `QMatMul` per tensor the file
/// stores, and when it stores them as one, that output split into the parts' widths.
struct Stacked {
    mats: Vec<QMatMul>,
    widths: Vec<usize>,
}

impl Stacked {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Vec<Tensor>> {
        let outs = self.mats.iter().map(|m| m.forward(x)).collect::<candle_core::Result<Vec<_>>>()?;
        if outs.len() == self.widths.len() {
            return Ok(outs);
        }
        let mut at = 0;
        self.widths
            .iter()
            .map(|&w| {
                at += w;
                outs[0].narrow(candle_core::D::Minus1, at - w, w)
            })
            .collect()
    }
}

struct Weights {
    cfg: LlamaConfig,
    dev: Device,
    embed: Embedding,
    blocks: Vec<Block>,
    out_norm: Tensor,
    output: QMatMul,
    /// `[context, rope_dim / 2]`
    cos: Tensor,
    sin: Tensor,
    /// The sliding layers' tables, where their rope differs (`LlamaConfig::rope_swa`).
    swa: Option<(Tensor, Tensor)>,
}

struct CandleLlama {
    w: Arc<Weights>,
}

struct CandleSession {
    w: Arc<Weights>,
    /// Per block: K and V.
    cache: Vec<Option<KvBuf>>,
    /// Positions a cache buffer is made with (`LmSession::reserve`).
    room: usize,
    /// A step failed part-way, leaving the blocks' caches inconsistent.
    failed: bool,
}

impl CausalLm for CandleLlama {
    fn vocab_size(&self) -> usize {
        self.w.cfg.vocab_size
    }

    fn context_length(&self) -> usize {
        self.w.cfg.context_length
    }

    fn kv_bytes_per_token(&self) -> usize {
        self.w.cfg.kv_bytes_per_token()
    }

    fn session(&self) -> ExResult<Box<dyn LmSession>> {
        Ok(Box::new(CandleSession { w: Arc::clone(&self.w), cache: (0..self.w.blocks.len()).map(|_| None).collect(), room: 0, failed: false }))
    }

    /// The chunks of this model's sessions run through the layers in one pass, every projection
    /// taking all their rows; a chunk a session refuses is answered alone. Candle's quantised
    /// CPU product still works row by row, so on the CPU this saves the per-call overheads only.
    fn forward_batch(&self, batch: &mut [Chunk]) -> Vec<ExResult<Vec<f32>>> {
        own_chunks(batch, |s: &CandleSession| Arc::ptr_eq(&s.w, &self.w), CandleSession::check, |mut ours, _| CandleSession::forward_many(&self.w, &mut ours))
    }
}

impl Weights {
    fn embed(&self, tokens: &[u32]) -> candle_core::Result<Tensor> {
        let h = self.cfg.embedding_length;
        match &self.embed {
            Embedding::Quant { blocks, format, row_bytes } => {
                // borrowed: the CPU storage's own bytes
                let data = blocks.data()?;
                let mut rows = vec![0f32; tokens.len() * h];
                for (&t, row) in tokens.iter().zip(rows.chunks_exact_mut(h)) {
                    let at = t as usize * row_bytes;
                    dequantise_row(*format, &data[at..at + row_bytes], row);
                }
                Tensor::from_vec(rows, (1, tokens.len(), h), &self.dev)
            }
            Embedding::Dense(e) => e.index_select(&Tensor::new(tokens, &self.dev)?, 0)?.unsqueeze(0),
        }
    }

    /// Several sequences at once, each extending its cache: their rows go through every
    /// projection together. Attention runs once for the sequences that decode one token (two or
    /// more of them), their caches stacked to the longest, and for each other sequence over its
    /// own cache. The logits of each one's last token.
    fn forward_many(&self, seqs: &mut [Seq]) -> candle_core::Result<Vec<Vec<f32>>> {
        let cfg = &self.cfg;
        let (dh, nh, nkv) = (cfg.head_dim(), cfg.head_count, cfg.head_count_kv);
        let eps = cfg.rms_eps as f32;
        let tokens: Vec<u32> = seqs.iter().flat_map(|s| s.tokens.iter().copied()).collect();
        let starts: Vec<usize> = seqs.iter().scan(0, |acc, s| Some(std::mem::replace(acc, *acc + s.tokens.len()))).collect();
        let decoding: Vec<usize> = (0..seqs.len()).filter(|&i| seqs[i].tokens.len() == 1).collect();
        let group = match decoding.len() >= 2 {
            true => Some(DecodeGroup::new(self, seqs, &starts, decoding)?),
            false => None,
        };
        let mut views = Vec::with_capacity(seqs.len());
        for s in seqs.iter() {
            let (n, pos) = (s.tokens.len(), s.pos);
            // causal mask over the cache plus this chunk: query i sees keys up to pos + i, and
            // in a window's layers none before pos + i - window + 1 (none needed where nothing
            // is hidden); its rows once for each query head of a K/V head (`attend`)
            let total = pos + n;
            let mask = |window: Option<usize>| -> candle_core::Result<Option<Tensor>> {
                let hidden = |i: usize, j: usize| candle_kv::hidden(pos + i, j, window);
                if !(0..n).any(|i| (0..total).any(|j| hidden(i, j))) {
                    return Ok(None);
                }
                let rows = (0..nh / nkv).flat_map(|_| 0..n);
                let m: Vec<f32> = rows.flat_map(|i| (0..total).map(move |j| if hidden(i, j) { f32::NEG_INFINITY } else { 0.0 })).collect();
                Tensor::from_vec(m, (1, 1, nh / nkv * n, total), &self.dev).map(Some)
            };
            let tables = |(cos, sin): (&Tensor, &Tensor)| -> candle_core::Result<(Tensor, Tensor)> { Ok((cos.narrow(0, pos, n)?, sin.narrow(0, pos, n)?)) };
            let swa = self.swa.as_ref().map(|(c, sn)| tables((c, sn))).transpose()?;
            views.push((tables((&self.cos, &self.sin))?, swa, mask(None)?, cfg.window.map(|w| mask(Some(w))).transpose()?.flatten()));
        }
        let rope = |t: Tensor, norm: &Option<Tensor>, cos: &Tensor, sin: &Tensor| -> candle_core::Result<Tensor> {
            let t = match norm {
                Some(w) => candle_nn::ops::rms_norm(&t, w, eps)?,
                None => t,
            };
            match cfg.family.rope {
                RopeStyle::Interleaved => candle_nn::rotary_emb::rope_i(&t, cos, sin),
                RopeStyle::Halves => candle_nn::rotary_emb::rope(&t, cos, sin),
            }
        };
        // softmax(q·kᵀ) v for `q` `[b, heads, s, head_dim]` over `k`, `v` `[b, kv_heads, t,
        // head_dim]`: the query heads that share a K/V head (adjacent) become rows of one
        // product with it, so K and V are never repeated; the mask's rows follow that order
        let attend = |q: &Tensor, k: Tensor, v: Tensor, mask: Option<&Tensor>| -> candle_core::Result<Tensor> {
            let (b, _, s, _) = q.dims4()?;
            let q = q.reshape((b, nkv, nh / nkv * s, dh))?;
            let scores = (q.matmul(&k.t()?)? * cfg.attn_scale)?;
            let scores = match cfg.attn_softcap {
                Some(cap) => ((scores / cap)?.tanh()? * cap)?,
                None => scores,
            };
            let scores = match mask {
                Some(m) => scores.broadcast_add(m)?,
                None => scores,
            };
            candle_nn::ops::softmax_last_dim(&scores)?.matmul(&v)?.reshape((b, nh, s, dh))
        };
        let mut x = self.embed(&tokens)?;
        if cfg.family.gemma {
            x = (x * (cfg.embedding_length as f64).sqrt())?;
        }
        for (l, b) in self.blocks.iter().enumerate() {
            let window = cfg.window_of(l).is_some();
            let swa_rope = cfg.swa_rope(l);
            let normed = candle_nn::ops::rms_norm(&x, &b.attn_norm, eps)?;
            let [mut q, mut k, mut v]: [Tensor; 3] = b.qkv.forward(&normed)?.try_into().expect("three projections");
            if let Some([bq, bk, bv]) = &b.bias {
                (q, k, v) = (q.broadcast_add(bq)?, k.broadcast_add(bk)?, v.broadcast_add(bv)?);
            }
            let mut ctxs: Vec<Option<Tensor>> = (0..seqs.len()).map(|_| None).collect();
            let mut group_ctx = None;
            if let Some(g) = &group {
                let n = g.members.len();
                let heads = |t: &Tensor, h: usize| t.index_select(&g.rows, 1)?.reshape((n, 1, h, dh))?.transpose(1, 2)?.contiguous();
                let (cos, sin) = g.tables(swa_rope);
                let qg = rope(heads(&q, nh)?, &b.q_norm, cos, sin)?;
                let kg = rope(heads(&k, nkv)?, &b.k_norm, cos, sin)?;
                let vg = heads(&v, nkv)?;
                let mut slots: Vec<&mut Option<KvBuf>> = seqs.iter_mut().enumerate().filter(|(i, _)| g.members.binary_search(i).is_ok()).map(|(_, s)| &mut s.cache[l]).collect();
                let (ks, vs) = candle_kv::append_stacked(&mut slots, &kg, &vg, &g.at, &g.write_at, &g.rooms)?;
                let ctx = attend(&qg, ks, vs, g.mask(window))?;
                let ctx = ctx.transpose(1, 2)?.reshape((1, n, nh * dh))?;
                for (j, &i) in g.members.iter().enumerate() {
                    ctxs[i] = Some(ctx.narrow(1, j, 1)?);
                }
                group_ctx = Some(ctx);
            }
            for (i, (s, (global, swa, full_mask, window_mask))) in seqs.iter_mut().zip(&views).enumerate() {
                if ctxs[i].is_some() {
                    continue;
                }
                let (at, n) = (starts[i], s.tokens.len());
                let (cos, sin) = match swa {
                    Some((c, sn)) if swa_rope => (c, sn),
                    _ => (&global.0, &global.1),
                };
                let mask = if window { window_mask } else { full_mask };
                let heads = |t: &Tensor, h: usize| t.narrow(1, at, n)?.reshape((1, n, h, dh))?.transpose(1, 2)?.contiguous();
                let qi = rope(heads(&q, nh)?, &b.q_norm, cos, sin)?;
                let ki = rope(heads(&k, nkv)?, &b.k_norm, cos, sin)?;
                let vi = heads(&v, nkv)?;
                let slot = &mut s.cache[l];
                KvBuf::append(slot, &ki, &vi, s.room)?;
                let (kc, vc) = slot.as_ref().expect("appended above").cached()?;
                let ctx = attend(&qi, kc, vc, mask.as_ref())?;
                ctxs[i] = Some(ctx.transpose(1, 2)?.reshape((1, n, nh * dh))?);
            }
            let ctx = match group_ctx {
                // every sequence decodes: the group's rows are the step's, in order
                Some(ctx) if group.as_ref().is_some_and(|g| g.members.len() == seqs.len()) => ctx,
                _ => Tensor::cat(&ctxs.into_iter().map(|c| c.expect("every sequence attended")).collect::<Vec<_>>(), 1)?,
            };
            // Gemma normalises each output before it joins the residual
            let post = |y: Tensor, i: usize| -> candle_core::Result<Tensor> {
                match &b.post_norms {
                    Some(norms) => candle_nn::ops::rms_norm(&y, if i == 0 { &norms.0 } else { &norms.1 }, eps),
                    None => Ok(y),
                }
            };
            x = (x + post(b.out.forward(&ctx)?, 0)?)?;
            let normed = candle_nn::ops::rms_norm(&x, &b.ffn_norm, eps)?;
            let [gate, up]: [Tensor; 2] = b.gate_up.forward(&normed)?.try_into().expect("two projections");
            // candle's `gelu` is the tanh form
            let act = if cfg.family.gemma { gate.gelu()? } else { candle_nn::ops::silu(&gate)? };
            x = (x + post(b.down.forward(&(act * up)?)?, 1)?)?;
        }
        let last = seqs.iter().zip(&starts).map(|(s, &at)| x.narrow(1, at + s.tokens.len() - 1, 1)).collect::<candle_core::Result<Vec<_>>>()?;
        let last = Tensor::cat(&last, 1)?;
        let logits = self.output.forward(&candle_nn::ops::rms_norm(&last, &self.out_norm, eps)?)?;
        let logits = match cfg.final_softcap {
            Some(cap) => ((logits / cap)?.tanh()? * cap)?,
            None => logits,
        };
        let values = logits.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
        Ok(values.chunks_exact(cfg.vocab_size).map(<[f32]>::to_vec).collect())
    }
}

/// A sequence of a step: its chunk at `pos`, its cache, and the positions to make its cache with.
struct Seq<'a> {
    tokens: &'a [u32],
    pos: usize,
    room: usize,
    cache: &'a mut [Option<KvBuf>],
}

/// The sequences of a step that decode one token each, attended together: their rows among the
/// step's, their rotary rows, and masks over their caches stacked to the longest.
struct DecodeGroup {
    /// indices among the step's sequences, ascending
    members: Vec<usize>,
    /// members' cache lengths before this step, as `candle_kv::append_stacked` writes at them,
    /// and the positions their sessions reserved
    at: Vec<usize>,
    write_at: Tensor,
    rooms: Vec<usize>,
    /// `members`' rows among the step's (u32, on the device)
    rows: Tensor,
    /// `[members, 1, rope_dim / 2]` cos and sin at each member's position, and the sliding
    /// layers' where they differ
    global: (Tensor, Tensor),
    swa: Option<(Tensor, Tensor)>,
    full_mask: Option<Tensor>,
    window_mask: Option<Tensor>,
}

impl DecodeGroup {
    fn new(w: &Weights, seqs: &[Seq], starts: &[usize], members: Vec<usize>) -> candle_core::Result<DecodeGroup> {
        let dev = &w.dev;
        let n = members.len();
        let rows = Tensor::new(members.iter().map(|&i| starts[i] as u32).collect::<Vec<_>>(), dev)?;
        let rotary_at = Tensor::new(members.iter().map(|&i| seqs[i].pos as u32).collect::<Vec<_>>(), dev)?;
        let at: Vec<usize> = members.iter().map(|&i| seqs[i].pos).collect();
        let lens: Vec<usize> = at.iter().map(|p| p + 1).collect();
        let positions = lens.iter().copied().max().unwrap_or(1);
        let half = w.cos.dim(1)?;
        let pick = |(c, s): (&Tensor, &Tensor)| -> candle_core::Result<(Tensor, Tensor)> {
            Ok((c.index_select(&rotary_at, 0)?.reshape((n, 1, half))?, s.index_select(&rotary_at, 0)?.reshape((n, 1, half))?))
        };
        Ok(DecodeGroup {
            write_at: candle_kv::write_indices(&at, w.cfg.head_count_kv, w.cfg.head_dim(), dev)?,
            rooms: members.iter().map(|&i| seqs[i].room).collect(),
            at,
            rows,
            global: pick((&w.cos, &w.sin))?,
            swa: w.swa.as_ref().map(|(c, s)| pick((c, s))).transpose()?,
            full_mask: candle_kv::stacked_mask(&lens, positions, None, dev)?,
            window_mask: w.cfg.window.map(|win| candle_kv::stacked_mask(&lens, positions, Some(win), dev)).transpose()?.flatten(),
            members,
        })
    }

    fn tables(&self, swa_rope: bool) -> (&Tensor, &Tensor) {
        match &self.swa {
            Some((c, s)) if swa_rope => (c, s),
            _ => (&self.global.0, &self.global.1),
        }
    }

    fn mask(&self, window: bool) -> Option<&Tensor> {
        if window { self.window_mask.as_ref() } else { self.full_mask.as_ref() }
    }
}

impl LmSession for CandleSession {
    fn forward(&mut self, tokens: &[u32], pos: usize) -> ExResult<Vec<f32>> {
        self.check(tokens, pos)?;
        let w = Arc::clone(&self.w);
        Self::forward_many(&w, &mut [(self, tokens, pos)]).remove(0)
    }

    fn reserve(&mut self, tokens: usize) {
        self.room = tokens;
    }
}

impl CandleSession {
    /// Whether `tokens` at `pos` may run next.
    fn check(&self, tokens: &[u32], pos: usize) -> ExResult<()> {
        if self.failed {
            return Err(ExError::invalid("this session failed in an earlier step; start a new session"));
        }
        if tokens.is_empty() {
            return Err(ExError::invalid("forward needs at least one token"));
        }
        // position 0 starts the session over; any other continues its cache
        let cached = self.cache.first().and_then(|c| c.as_ref()).map_or(0, KvBuf::len);
        if pos != 0 && pos != cached {
            return Err(errors::out_of_order(cached, pos));
        }
        let context = self.w.cfg.context_length;
        if pos + tokens.len() > context {
            return Err(errors::engine("candle", format!("position {} is beyond the model's {context} positions", pos + tokens.len())));
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= self.w.cfg.vocab_size) {
            return Err(errors::err(
                errors::kind::TOKEN_OUT_OF_RANGE,
                format!("token id {t} is outside the vocabulary of {}", self.w.cfg.vocab_size),
                vec![],
            ));
        }
        Ok(())
    }

    /// One step for sessions of one model that passed `check`, each with its chunk. A session
    /// fed from position 0 starts over, so it can be reused; a failed step fails them all
    /// (their caches may be extended in some blocks and not others).
    fn forward_many(w: &Weights, sessions: &mut [(&mut CandleSession, &[u32], usize)]) -> Vec<ExResult<Vec<f32>>> {
        for (s, _, pos) in sessions.iter_mut() {
            if *pos == 0 {
                s.cache.iter_mut().for_each(|c| *c = None);
            }
        }
        let mut seqs: Vec<Seq> = sessions.iter_mut().map(|(s, t, p)| Seq { tokens: t, pos: *p, room: s.room, cache: &mut s.cache[..] }).collect();
        let result = w.forward_many(&mut seqs);
        drop(seqs);
        match result {
            Ok(logits) => logits.into_iter().map(Ok).collect(),
            Err(e) => {
                let e = engine_err(e);
                sessions
                    .iter_mut()
                    .map(|(s, _, _)| {
                        s.cache.iter_mut().for_each(|c| *c = None);
                        s.failed = true;
                        Err(ExError::Execution(format!("step: {e}")))
                    })
                    .collect()
            }
        }
    }
}

/// The checks both engines share before reading tensors: a Llama architecture, tensor types this
/// engine reads, and a complete file.
pub fn check_header(h: &Header, architectures: &[&str], tensor_types: &[u32]) -> ExResult<()> {
    let arch = h.architecture().unwrap_or("");
    if !architectures.contains(&arch) {
        return Err(errors::err(
            errors::kind::UNKNOWN_ARCHITECTURE,
            format!("unsupported GGUF architecture {arch:?} in {} (supported: {})", h.path.display(), architectures.join(", ")),
            vec![("arch", crate::error::Detail::Text(arch.to_string())), errors::path_detail(&h.path)],
        ));
    }
    let bad: Vec<String> = h.tensor_types().into_iter().filter(|(t, _)| !tensor_types.contains(&t.id)).map(|(t, n)| format!("{} ({n} tensors)", t.label())).collect();
    if !bad.is_empty() {
        return Err(errors::err(
            errors::kind::UNSUPPORTED_QUANTIZATION,
            format!("unsupported tensor types in {}: {}", h.path.display(), bad.join(", ")),
            vec![("types", crate::error::Detail::Text(bad.join(", "))), errors::path_detail(&h.path)],
        ));
    }
    h.check_complete()
}

/// The context length a GGUF model declares (`{arch}.context_length`), if any.
pub fn declared_context(h: &Header) -> Option<usize> {
    h.arch_int("context_length").and_then(|v| usize::try_from(v).ok()).filter(|v| *v > 0)
}

/// Loads a Llama-family GGUF file or Hugging Face directory. A GGUF file's metadata (the
/// tokenizer's vocabulary and merges among it) is parsed by two readers in turn, the first
/// dropped before the second, so a load's peak is the weights plus one parse.
pub fn load(path: &Path, device: &DeviceRef) -> ExResult<Box<dyn CausalLm>> {
    let dev = candle_device::device(device)?;
    if !is_hf_dir(path) {
        check_header(&gguf::read_header(path)?, ARCHITECTURES, TENSOR_TYPES)?;
    }
    let mut g = DecoderSource::open(path)?;
    let cfg = g.config()?;
    if cfg.rope_dim != cfg.head_dim() {
        return Err(errors::unsupported(
            "candle",
            format!("partial rotary embedding ({} of {} dimensions) in {}: the Candle engine rotates whole heads", cfg.rope_dim, cfg.head_dim(), path.display()),
        ));
    }
    let (h, ctx, half) = (cfg.embedding_length, cfg.context_length.max(1), cfg.rope_dim / 2);
    let table = |v: Vec<f32>| Tensor::from_vec(v, (ctx, half), &dev).map_err(engine_err);
    let (cos, sin) = cfg.rope_tables(&g.rope_factors(&cfg)?);
    let (cos, sin) = (table(cos)?, table(sin)?);
    let swa = cfg.swa_rope_tables().map(|(c, s)| Ok::<_, ExError>((table(c)?, table(s)?))).transpose()?;
    let mut norm = |name: &str| -> ExResult<Tensor> { Tensor::from_vec(g.values(name, &[h])?, h, &dev).map_err(engine_err) };
    let norms = (0..cfg.block_count)
        .map(|l| Ok((norm(&format!("blk.{l}.attn_norm.weight"))?, norm(&format!("blk.{l}.ffn_norm.weight"))?)))
        .collect::<ExResult<Vec<_>>>()?;
    let out_norm = norm("output_norm.weight")?;
    let extras = (0..cfg.block_count).map(|l| HeadExtras::read(&mut g, &cfg, l)).collect::<ExResult<Vec<_>>>()?;
    let tied = !g.contains("output.weight");
    let mut qtensor = |name: &str| -> ExResult<QTensor> { g.qtensor(name) };
    // the largest tensor first, while little else is resident: candle's reader holds a tensor
    // twice on the way in (its raw bytes, then the blocks), and that peak would otherwise come on
    // top of every layer already loaded
    let token_embd = Arc::new(qtensor("token_embd.weight")?);
    // a projection's matrix: the file's blocks, on the model's device
    let mut projection = |name: &str| -> ExResult<QMatMul> { candle_device::quantised_matmul(Arc::new(qtensor(name)?), &dev).map_err(engine_err) };
    if token_embd.shape().dims() != [cfg.vocab_size, h] {
        return Err(ExError::invalid(format!("token_embd.weight in {} is {:?}, not [{}, {h}]", path.display(), token_embd.shape().dims(), cfg.vocab_size)));
    }
    crate::process::alloc::trim();
    let mut blocks = Vec::with_capacity(cfg.block_count);
    let (dh, q_rows, kv_rows) = (cfg.head_dim(), cfg.head_count * cfg.head_dim(), cfg.head_count_kv * cfg.head_dim());
    let host = |v: &[f32], shape: &[usize]| Tensor::from_slice(v, shape, &dev).map_err(engine_err);
    for (l, ((attn_norm, ffn_norm), x)) in norms.into_iter().zip(extras).enumerate() {
        let n = |name: &str| format!("blk.{l}.{name}.weight");
        let [qkv_parts, gate_up_parts] = cfg.family.projections(l, q_rows, kv_rows, cfg.feed_forward_length);
        let mut stacked = |parts: Vec<(String, usize)>, widths: Vec<usize>| -> ExResult<Stacked> {
            Ok(Stacked { mats: parts.iter().map(|(name, _)| projection(name)).collect::<ExResult<_>>()?, widths })
        };
        let qkv = stacked(qkv_parts, vec![q_rows, kv_rows, kv_rows])?;
        let gate_up = stacked(gate_up_parts, vec![cfg.feed_forward_length; 2])?;
        let bias = match &x.qkv_bias {
            Some(b) => Some([
                host(&b[..q_rows], &[1, 1, q_rows])?,
                host(&b[q_rows..q_rows + kv_rows], &[1, 1, kv_rows])?,
                host(&b[q_rows + kv_rows..], &[1, 1, kv_rows])?,
            ]),
            None => None,
        };
        let q_norm = x.q_norm.as_deref().map(|w| host(w, &[dh])).transpose()?;
        let k_norm = x.k_norm.as_deref().map(|w| host(w, &[dh])).transpose()?;
        let post_norms = x.post_norms.as_ref().map(|(a, m)| Ok::<_, ExError>((host(a, &[h])?, host(m, &[h])?))).transpose()?;
        blocks.push(Block {
            attn_norm,
            bias,
            q_norm,
            k_norm,
            qkv,
            out: projection(&n("attn_output"))?,
            ffn_norm,
            gate_up,
            down: projection(&n("ffn_down"))?,
            post_norms,
        });
        // candle's reader copies each tensor once on the way in: hand the freed copies back
        // per block rather than letting them pile up in the heap
        crate::process::alloc::trim();
    }
    // tied: the output projection multiplies the embedding's own blocks (on the CPU the same
    // memory; on a GPU a copy, the lookup's rows staying in host memory)
    let output = match tied {
        true => candle_device::quantised_matmul(Arc::clone(&token_embd), &dev).map_err(engine_err)?,
        false => projection("output.weight")?,
    };
    let embed = match QFormat::from_ggml(token_embd.dtype()).filter(|f| h % f.block_values() == 0) {
        Some(format) => Embedding::Quant { row_bytes: h / format.block_values() * format.block_bytes(), format, blocks: token_embd },
        None => Embedding::Dense(token_embd.dequantize(&dev).map_err(engine_err)?),
    };
    Ok(Box::new(CandleLlama { w: Arc::new(Weights { cfg, dev, embed, blocks, out_norm, output, cos, sin, swa }) }))
}
