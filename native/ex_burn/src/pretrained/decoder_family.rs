//! The decoder families the Llama-family engines run (`general.architecture`): how each one's
//! layer departs from Llama's, read by the Burn tensor path, the host layer path and Candle.

/// GGUF `general.architecture` values this decoder runs (Mistral-style GGUFs say "llama" too).
pub const ARCHITECTURES: &[&str] = &["llama", "qwen2", "qwen3"];

/// Which pairs of a head's values rotate together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// `(2i, 2i+1)`: llama.cpp's converter permutes Llama's Q and K rows into this layout
    /// (`LLAMA_ROPE_TYPE_NORM`), as candle's `rope_i` rotates.
    Interleaved,
    /// `(i, i + rope_dim / 2)`: Hugging Face's layout, which the converter keeps for Qwen
    /// (`LLAMA_ROPE_TYPE_NEOX`), as candle's `rope` rotates.
    Halves,
}

/// How a decoder family's layer departs from Llama's. Each engine reads these flags in one
/// place per layer, so a family is a row here, not a copy of the decoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Family {
    /// Q, K and V projections add biases (`blk.N.attn_{q,k,v}.bias`): Qwen2.
    pub qkv_bias: bool,
    /// Each query and key head is RMS-normalised (`blk.N.attn_{q,k}_norm.weight`, `[head_dim]`)
    /// before rotation: Qwen3.
    pub qk_norm: bool,
    pub rope: RopeStyle,
}

impl Family {
    pub fn of(arch: &str) -> Option<Family> {
        let (qkv_bias, qk_norm, rope) = match arch {
            "llama" => (false, false, RopeStyle::Interleaved),
            "qwen2" => (true, false, RopeStyle::Halves),
            "qwen3" => (false, true, RopeStyle::Halves),
            _ => return None,
        };
        Some(Family { qkv_bias, qk_norm, rope })
    }
}

/// A family's per-layer extras (`Family`), as host values: the concatenated Q/K/V biases and
/// the per-head Q and K norm weights, where the family has them.
#[derive(Clone, Default)]
pub(crate) struct HeadExtras {
    pub qkv_bias: Option<Vec<f32>>,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
}
