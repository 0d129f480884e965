//! The encoder families that load (config.json `model_type`) and the rules that set each apart
//! from BERT, written once for both engines: tensor names, position ids, usable length, MPNet's
//! relative attention buckets.

use std::path::Path;

use super::errors::{self, kind};
use crate::error::{Detail, ExResult};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Bert,
    /// XLM-RoBERTa (multilingual-e5, bge-m3, bge-reranker): BERT's layers; positions count real
    /// tokens from `pad_token_id + 1`.
    XlmRoberta,
    /// MPNet (all-mpnet-base-v2): no token types, positions as XLM-R's from padding index 1, and
    /// a relative position bias shared by every layer's attention.
    MpNet,
    /// NomicBERT (nomic-embed-text): no position table but rotary positions on Q and K (halves
    /// rotate), a SwiGLU MLP, no biases but the layer norms', and its checkpoints' own tensor
    /// names (`emb_ln`, `encoder.layers.N.attn.Wqkv`, `mlp.fc11`/`fc12`/`fc2`, `norm1`/`norm2`).
    NomicBert,
}

/// The `model_type` values that load, in the order error messages list them.
pub const MODEL_TYPES: &[&str] = &["bert", "xlm-roberta", "mpnet", "nomic_bert"];

impl Family {
    pub fn from_model_type(t: &str) -> Option<Family> {
        match t {
            "bert" => Some(Family::Bert),
            "xlm-roberta" => Some(Family::XlmRoberta),
            "mpnet" => Some(Family::MpNet),
            "nomic_bert" => Some(Family::NomicBert),
            _ => None,
        }
    }

    /// The family of the model in `dir`, from config.json's `model_type` alone (BERT when absent),
    /// so an unknown one is refused before any weight is read.
    pub fn of_config(config: &serde_json::Value, path: &Path) -> ExResult<Family> {
        let t = config.get("model_type").and_then(|v| v.as_str()).unwrap_or("bert");
        Family::from_model_type(t).ok_or_else(|| {
            errors::err(
                kind::UNKNOWN_ARCHITECTURE,
                format!("unsupported encoder architecture {t:?} (supported: {})", MODEL_TYPES.join(", ")),
                vec![("arch", Detail::Text(t.to_string())), errors::path_detail(path)],
            )
        })
    }

    /// NomicBERT's hub uploads (nomic-embed-text v1 and v1.5) describe the model in GPT-2's
    /// config keys (`n_embd`, `n_head`, `n_layer`, `n_inner`, ...) with switches for variants of
    /// the block, where transformers' `NomicBertConfig` has BERT's. Rewrites such a config in
    /// place into the latter's keys, and refuses a switch set to a variant the forward passes do
    /// not compute (an absent switch takes the upload code's default). Other configs are left.
    pub fn hub_config(config: &mut serde_json::Value, path: &Path, engine: &'static str) -> ExResult<()> {
        use serde_json::{json, Value};
        let Some(c) = config.as_object_mut() else { return Ok(()) };
        if c.get("model_type").and_then(Value::as_str) != Some("nomic_bert") || !c.contains_key("n_embd") || c.contains_key("hidden_size") {
            return Ok(());
        }
        let given = |key: &str| c.get(key).filter(|v| !v.is_null()).cloned();
        // (switch, its default in the upload code, the value the forward passes compute)
        let switches: [(&str, Value, Value); 10] = [
            ("activation_function", json!("gelu_new"), json!("swiglu")),
            ("qkv_proj_bias", json!(true), json!(false)),
            ("mlp_fc1_bias", json!(true), json!(false)),
            ("mlp_fc2_bias", json!(true), json!(false)),
            ("prenorm", json!(false), json!(false)),
            ("parallel_block", json!(false), json!(false)),
            ("use_rms_norm", json!(false), json!(false)),
            ("causal", json!(false), json!(false)),
            ("rotary_emb_interleaved", json!(false), json!(false)),
            ("rotary_emb_fraction", json!(0.0), json!(1.0)),
        ];
        for (key, default, computed) in switches {
            let v = given(key).unwrap_or(default);
            let same = match (v.as_f64(), computed.as_f64()) {
                (Some(a), Some(b)) => a == b,
                _ => v == computed,
            };
            if !same {
                return Err(errors::unsupported(engine, format!("NomicBERT with {key} = {v} in {} (only {computed})", path.display())));
            }
        }
        // rope scaling: none, or a factor of 1
        let scaled = [("rotary_scaling_factor", given("rotary_scaling_factor").filter(|v| v.as_f64() != Some(1.0))), ("rotary_emb_scale_base", given("rotary_emb_scale_base"))];
        if let Some((key, Some(v))) = scaled.into_iter().find(|(_, v)| v.is_some()) {
            return Err(errors::unsupported(engine, format!("unsupported rope scaling ({key} = {v} in {}; the encoders rotate with the default rope)", path.display())));
        }
        let count = |key: &str| given(key).and_then(|v| v.as_u64());
        let need = |key: &str| count(key).ok_or_else(|| errors::bad_config(path, format!("`{key}` is missing or not a count")));
        let width = need("n_embd")?;
        let native = [
            ("hidden_size", json!(width)),
            ("num_attention_heads", json!(need("n_head")?)),
            ("num_hidden_layers", json!(need("n_layer")?)),
            // GPT-2's rule for an absent n_inner, which the upload code's MLP follows
            ("intermediate_size", json!(count("n_inner").unwrap_or(4 * width))),
            ("max_position_embeddings", json!(count("n_positions").unwrap_or(1024))),
            ("layer_norm_eps", given("layer_norm_epsilon").unwrap_or(json!(1e-5))),
            ("hidden_act", json!("silu")),
            ("rope_parameters", json!({"rope_type": "default", "rope_theta": given("rotary_emb_base").unwrap_or(json!(1000.0))})),
        ];
        for (k, v) in native {
            c.insert(k.to_string(), v);
        }
        Ok(())
    }

    pub fn model_type(self) -> &'static str {
        match self {
            Family::Bert => "bert",
            Family::XlmRoberta => "xlm-roberta",
            Family::MpNet => "mpnet",
            Family::NomicBert => "nomic_bert",
        }
    }

    /// The prefix of the encoder's tensors in a `*ForSequenceClassification` checkpoint.
    pub fn head_prefix(self) -> &'static str {
        match self {
            Family::Bert => "bert.",
            Family::XlmRoberta => "roberta.",
            Family::MpNet => "mpnet.",
            Family::NomicBert => "nomic_bert.",
        }
    }

    pub fn has_token_types(self) -> bool {
        self != Family::MpNet
    }

    /// Whether positions rotate Q and K (`rope_tables`) rather than index a position table.
    pub fn rotary(self) -> bool {
        self == Family::NomicBert
    }

    /// The padding index positions are counted from, if they are (`None`: BERT's 0, 1, 2, …).
    /// MPNet's embeddings fix it at 1 whatever config.json says.
    pub fn position_padding(self, pad_token_id: u32) -> Option<u32> {
        match self {
            Family::Bert | Family::NomicBert => None,
            Family::XlmRoberta => Some(pad_token_id),
            Family::MpNet => Some(1),
        }
    }

    /// The longest input the position table holds: positions past a padding index start after it.
    pub fn max_tokens(self, max_position_embeddings: usize, pad_token_id: u32) -> usize {
        match self.position_padding(pad_token_id) {
            None => max_position_embeddings,
            Some(p) => max_position_embeddings.saturating_sub(p as usize + 1),
        }
    }

    /// Position ids of a padded `[rows, seq]` batch of token ids, row-major. With a padding index
    /// `p`, transformers' `create_position_ids_from_input_ids`: a token that is not `p` gets `p`
    /// plus the count of non-`p` tokens up to and including it, and `p` itself gets `p`.
    pub fn position_ids(self, ids: &[u32], seq: usize, pad_token_id: u32) -> Vec<u32> {
        match self.position_padding(pad_token_id) {
            None => (0..ids.len()).map(|i| (i % seq) as u32).collect(),
            Some(p) => ids
                .chunks(seq)
                .flat_map(|row| {
                    let mut n = 0;
                    row.iter()
                        .map(move |&id| {
                            if id == p {
                                p
                            } else {
                                n += 1;
                                p + n
                            }
                        })
                        .collect::<Vec<_>>()
                })
                .collect(),
        }
    }
}

/// The rotary tables for `positions` positions of heads of `dh` values, rotating halves with
/// base `theta` (transformers' default rope, angles in f64): cos as `[c, c]` and sin as `[−s, s]`
/// per position, `[positions, dh]` row-major, so `x·C + swap_halves(x)·S` rotates `x`.
pub fn rope_tables(positions: usize, dh: usize, theta: f64) -> (Vec<f32>, Vec<f32>) {
    let half = dh / 2;
    let inv: Vec<f64> = (0..half).map(|i| theta.powf(-((2 * i) as f64) / dh as f64)).collect();
    let (mut cos, mut sin) = (Vec::with_capacity(positions * dh), Vec::with_capacity(positions * dh));
    for p in 0..positions {
        let (c, s): (Vec<f32>, Vec<f32>) = inv.iter().map(|t| ((p as f64 * t).cos() as f32, (p as f64 * t).sin() as f32)).unzip();
        cos.extend(c.iter().chain(&c));
        sin.extend(s.iter().map(|v| -v).chain(s.iter().copied()));
    }
    (cos, sin)
}

/// transformers' extended attention mask of a padded batch's `mask` (0 at padding): 0 where a
/// token is real, `f32::MIN` where it is padding, added to the attention scores.
pub fn padding_bias(mask: &[u32]) -> Vec<f32> {
    mask.iter().map(|&m| if m != 0 { 0.0 } else { f32::MIN }).collect()
}

/// MPNet's `relative_position_bucket` for `key - query` (32 buckets, max distance 128, as
/// `compute_position_bias` calls it): half the buckets for each direction, exact up to 8 apart,
/// then logarithmic. The log runs in f32, as torch's does, so the boundaries match.
pub fn mpnet_bucket(relative: i64) -> usize {
    const BUCKETS: i64 = 16;
    const MAX_EXACT: i64 = 8;
    const MAX_DISTANCE: f32 = 128.0;
    let n = -relative;
    let mut ret = if n < 0 { BUCKETS } else { 0 };
    let n = n.abs();
    if n < MAX_EXACT {
        ret += n;
    } else {
        let large = ((n as f32 / MAX_EXACT as f32).ln() / (MAX_DISTANCE / MAX_EXACT as f32).ln() * (BUCKETS - MAX_EXACT) as f32) as i64;
        ret += (MAX_EXACT + large).min(BUCKETS - 1);
    }
    ret as usize
}

/// MPNet's attention bias `[heads, seq, seq]` from its `[buckets, heads]` table.
pub fn mpnet_position_bias(table: &[f32], heads: usize, seq: usize) -> Vec<f32> {
    let mut out = vec![0f32; heads * seq * seq];
    for q in 0..seq {
        for k in 0..seq {
            let row = mpnet_bucket(k as i64 - q as i64) * heads;
            for h in 0..heads {
                out[(h * seq + q) * seq + k] = table[row + h];
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_follow_transformers() {
        // XLM-R, pad 1: two rows, the second padded.
        let ids = [0, 5, 6, 2, 0, 7, 2, 1];
        assert_eq!(Family::XlmRoberta.position_ids(&ids, 4, 1), vec![2, 3, 4, 5, 2, 3, 4, 1]);
        assert_eq!(Family::MpNet.position_ids(&ids, 4, 0), vec![2, 3, 4, 5, 2, 3, 4, 1]);
        assert_eq!(Family::Bert.position_ids(&ids, 4, 0), vec![0, 1, 2, 3, 0, 1, 2, 3]);
        assert_eq!(Family::XlmRoberta.max_tokens(514, 1), 512);
        assert_eq!(Family::Bert.max_tokens(512, 0), 512);
    }

    #[test]
    fn mpnet_buckets_match_transformers() {
        // torch: MPNetEncoder.relative_position_bucket(torch.tensor([...]))
        let rel = [-200, -128, -100, -20, -9, -8, -7, -1, 0, 1, 7, 8, 9, 20, 100, 128, 200];
        let want = [15, 15, 15, 10, 8, 8, 7, 1, 0, 17, 23, 24, 24, 26, 31, 31, 31];
        let got: Vec<usize> = rel.iter().map(|&r| mpnet_bucket(r)).collect();
        assert_eq!(got, want);
    }
}
