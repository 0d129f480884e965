//! The hyperparameters of a Llama-family decoder (`LlamaConfig`), read from GGUF metadata here and
//! from a Hugging Face config.json by `hf_decoder`, and what they decide: the attention and
//! rotary shapes the engines run, the rotary tables, the sliding-window layers, which chunks a
//! session may run next.

use std::path::Path;

use super::decoder_family::{Family, ARCHITECTURES};
use super::weights::Gguf;
use crate::error::{ExError, ExResult};

#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// `general.architecture`, the prefix of the hyperparameters' metadata keys.
    pub arch: String,
    pub family: Family,
    pub block_count: usize,
    pub embedding_length: usize,
    pub feed_forward_length: usize,
    pub head_count: usize,
    pub head_count_kv: usize,
    /// `{arch}.attention.key_length`, else `embedding_length / head_count` (Qwen3 heads may be
    /// wider than that).
    pub head_dim: usize,
    pub rope_freq_base: f64,
    /// Positions are multiplied by this before rotating (`1 / {arch}.rope.scaling.factor` for
    /// linear scaling, else 1).
    pub rope_position_scale: f64,
    pub rms_eps: f64,
    pub context_length: usize,
    pub rope_dim: usize,
    pub vocab_size: usize,
    /// What multiplies query·key: 1/√head_dim, or 1/√`query_pre_attn_scalar` (Gemma).
    pub attn_scale: f64,
    /// Gemma 2's soft caps: attention scores, and the output logits, become cap·tanh(x / cap).
    pub attn_softcap: Option<f64>,
    pub final_softcap: Option<f64>,
    /// The attention window of the layers `sliding` marks: a query at position p sees keys at
    /// p − window < j ≤ p (Gemma; other families' windows hold `context_length` instead).
    pub window: Option<usize>,
    pub sliding: Vec<bool>,
    /// The sliding layers' rope base and position scale, where they differ from the others'
    /// (Gemma 3: base 10 000 and no scaling there).
    pub rope_swa: Option<(f64, f64)>,
}

impl LlamaConfig {
    /// Keys and values of every layer, f32, as both engines cache them.
    pub fn kv_bytes_per_token(&self) -> usize {
        self.block_count * 2 * self.head_count_kv * self.head_dim() * std::mem::size_of::<f32>()
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// The rotary tables, cos and sin as `[context, rope_dim / 2]` row-major: θ_i =
    /// base^(-2i / rope_dim), divided by `factors` (`rope_freqs.weight`'s, Llama 3.1-style
    /// scaling as llama.cpp applies them: `DecoderSource::rope_factors`); angle = position ·
    /// scale · θ_i, in f64. Both engines and both rope styles rotate with these.
    pub(crate) fn rope_tables(&self, factors: &[f32]) -> (Vec<f32>, Vec<f32>) {
        self.angles(self.rope_freq_base, self.rope_position_scale, factors)
    }

    /// The sliding layers' tables where their rope differs (`rope_swa`), in `rope_tables`' form.
    pub(crate) fn swa_rope_tables(&self) -> Option<(Vec<f32>, Vec<f32>)> {
        let (base, scale) = self.rope_swa?;
        Some(self.angles(base, scale, &vec![1.0; self.rope_dim / 2]))
    }

    fn angles(&self, base: f64, scale: f64, factors: &[f32]) -> (Vec<f32>, Vec<f32>) {
        let (half, ctx) = (self.rope_dim / 2, self.context_length.max(1));
        let inv: Vec<f64> = (0..half).map(|i| base.powf(-((2 * i) as f64) / self.rope_dim as f64) / factors[i] as f64).collect();
        let angles = |f: fn(f64) -> f64| -> Vec<f32> { (0..ctx).flat_map(|p| inv.iter().map(move |t| f(p as f64 * scale * t) as f32)).collect() };
        (angles(f64::cos), angles(f64::sin))
    }

    /// Whether `tokens` at `pos` may run next on a sequence of this model holding `len`
    /// tokens: not after a failed step, in order, within the context, each token in the vocabulary.
    pub(crate) fn check_chunk(&self, failed: bool, len: usize, tokens: &[u32], pos: usize) -> ExResult<()> {
        if failed {
            return Err(ExError::invalid("this session failed in an earlier step; start a new session"));
        }
        if tokens.is_empty() {
            return Err(ExError::invalid("forward needs at least one token"));
        }
        if pos != len {
            return Err(super::errors::out_of_order(len, pos));
        }
        if pos + tokens.len() > self.context_length {
            return Err(ExError::invalid(format!(
                "sequence of {} tokens exceeds the model's context length {}",
                pos + tokens.len(),
                self.context_length
            )));
        }
        if let Some(t) = tokens.iter().find(|&&t| t as usize >= self.vocab_size) {
            return Err(super::errors::err(
                super::errors::kind::TOKEN_OUT_OF_RANGE,
                format!("token id {t} is outside the vocabulary of {}", self.vocab_size),
                vec![],
            ));
        }
        Ok(())
    }

    /// Layer `l`'s attention window, if it slides.
    pub(crate) fn window_of(&self, l: usize) -> Option<usize> {
        self.window.filter(|_| self.sliding.get(l).copied().unwrap_or(false))
    }

    /// Whether layer `l` rotates with the sliding layers' tables.
    pub(crate) fn swa_rope(&self, l: usize) -> bool {
        self.rope_swa.is_some() && self.window_of(l).is_some()
    }

    pub(crate) fn read(g: &Gguf) -> ExResult<Self> {
        let arch = g.string("general.architecture")?.to_string();
        let Some(family) = Family::of(&arch) else {
            return Err(super::errors::unsupported(
                "burn",
                format!("unknown architecture `{arch}` in {}: the Burn engine runs {} GGUF models", g.path().display(), ARCHITECTURES.join(", ")),
            ));
        };
        // hyperparameters are keyed by the architecture: `llama.block_count`, `qwen2.block_count`
        let key = |name: &str| format!("{arch}.{name}");
        let embedding_length = g.usize(&key("embedding_length"))?;
        let head_count = g.usize(&key("attention.head_count"))?;
        let head_count_kv = g.opt_usize(&key("attention.head_count_kv"))?.unwrap_or(head_count);
        let key_length = g.opt_usize(&key("attention.key_length"))?;
        if head_count == 0 || (key_length.is_none() && embedding_length % head_count != 0) {
            return Err(ExError::invalid(format!(
                "inconsistent attention shape in {}: embedding_length {embedding_length}, head_count {head_count}, head_count_kv {head_count_kv}",
                g.path().display()
            )));
        }
        let head_dim = key_length.unwrap_or(embedding_length / head_count);
        if let Some(n) = g.opt_usize(&key("attention.value_length"))? {
            if n != head_dim {
                return Err(super::errors::unsupported(
                    "burn",
                    format!("{arch}.attention.value_length {n} differs from the key length {head_dim}, which the engines do not support"),
                ));
            }
        }
        let rope_dim = g.opt_usize(&key("rope.dimension_count"))?.unwrap_or(head_dim);
        let rope_position_scale = match g.metadata().get(&key("rope.scaling.type")) {
            None => 1.0,
            Some(_) => match g.string(&key("rope.scaling.type"))? {
                "none" => 1.0,
                "linear" => 1.0 / g.opt_f64(&key("rope.scaling.factor"))?.unwrap_or(1.0),
                other => {
                    return Err(super::errors::unsupported("burn", format!("unsupported rope scaling `{other}` (the Burn engine supports none and linear)")))
                }
            },
        };
        let vocab_size = match g.shape("token_embd.weight") {
            Some(s) if s.len() == 2 && s[1] == embedding_length => s[0],
            Some(s) => {
                return Err(ExError::invalid(format!(
                    "tensor `token_embd.weight` in {} has shape {s:?}, expected [vocab, {embedding_length}]",
                    g.path().display()
                )))
            }
            None => {
                return Err(super::errors::err(
                    super::errors::kind::MISSING_TENSOR,
                    format!("tensor `token_embd.weight` is missing from {}", g.path().display()),
                    vec![super::errors::path_detail(g.path())],
                ))
            }
        };
        if g.contains("rope_factors_long.weight") || g.contains("rope_factors_short.weight") {
            return Err(super::errors::unsupported("burn", format!("long-context rope factors (Phi-3's `longrope`) in {}: the engines do not apply them", g.path().display())));
        }
        // Attention over a sliding window (Phi-3 mini-4k: 2047 positions) equals full attention
        // while a sequence fits in the window: sequences are held to it. Gemma's windows are
        // applied, layer by layer.
        let declared = g.usize(&key("context_length"))?;
        let block_count = g.usize(&key("block_count"))?;
        let window = g.opt_usize(&key("attention.sliding_window"))?.filter(|&w| w > 0);
        let (context_length, window) = match (window, family.gemma) {
            (Some(w), false) => (declared.min(w), None),
            (w, _) => (declared, w),
        };
        let sliding = match (window, g.metadata().get(&key("attention.sliding_window_pattern"))) {
            (None, _) => vec![false; block_count],
            (Some(_), Some(candle_core::quantized::gguf_file::Value::Array(a))) => a.iter().map(|v| v.to_bool().unwrap_or(false)).collect(),
            (Some(_), Some(_)) => super::decoder_family::sliding_layers(block_count, g.usize(&key("attention.sliding_window_pattern"))?),
            (Some(_), None) => super::decoder_family::sliding_layers(block_count, Family::swa_pattern(&arch).unwrap_or(0)),
        };
        // llama.cpp's rule for Gemma: 1/√(hidden / heads) at 27B, where query_pre_attn_scalar
        // is that, else 1/√head_dim
        let big_gemma = (arch == "gemma2" && block_count == 46) || (arch == "gemma3" && block_count == 62);
        let attn_scale = if big_gemma { (embedding_length as f64 / head_count as f64).powf(-0.5) } else { (head_dim as f64).powf(-0.5) };
        let cap = |name: &str| -> ExResult<Option<f64>> { Ok(g.opt_f64(&key(name))?.filter(|&c| c > 0.0)) };
        let rope_swa = match window {
            Some(_) if arch == "gemma3" => Some((g.opt_f64(&key("rope.freq_base_swa"))?.unwrap_or(10000.0), 1.0)),
            _ => None,
        };
        if let Some(v) = g.opt_usize(&key("vocab_size"))? {
            if v != vocab_size {
                return Err(ExError::invalid(format!("{arch}.vocab_size {v} disagrees with token_embd.weight's {vocab_size} rows")));
            }
        }
        LlamaConfig {
            attn_scale,
            attn_softcap: cap("attn_logit_softcapping")?,
            final_softcap: cap("final_logit_softcapping")?,
            window,
            sliding,
            rope_swa,
            block_count,
            embedding_length,
            feed_forward_length: g.usize(&key("feed_forward_length"))?,
            head_count,
            head_count_kv,
            head_dim,
            rope_freq_base: g.opt_f64(&key("rope.freq_base"))?.unwrap_or(10000.0),
            rope_position_scale,
            rms_eps: g.opt_f64(&key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5),
            context_length,
            rope_dim,
            vocab_size,
            arch,
            family,
        }
        .checked(g.path())
    }

    /// The config, where its attention and rotary shapes are ones the engines run (`path`
    /// names the file it came from).
    pub(crate) fn checked(self, path: &Path) -> ExResult<Self> {
        let (h, kv) = (self.head_count, self.head_count_kv);
        if h == 0 || kv == 0 || h % kv != 0 || self.head_dim == 0 {
            return Err(ExError::invalid(format!(
                "inconsistent attention shape in {}: embedding_length {}, head_count {h}, head_count_kv {kv}, head_dim {}",
                path.display(),
                self.embedding_length,
                self.head_dim
            )));
        }
        if self.rope_dim > self.head_dim || self.rope_dim % 2 != 0 {
            return Err(ExError::invalid(format!("rope dimension {} does not fit heads of {} in {}", self.rope_dim, self.head_dim, path.display())));
        }
        if self.sliding.len() != self.block_count {
            return Err(ExError::invalid(format!("{} sliding-window flags for {} layers in {}", self.sliding.len(), self.block_count, path.display())));
        }
        Ok(self)
    }
}
