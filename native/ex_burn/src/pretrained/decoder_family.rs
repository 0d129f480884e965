//! The decoder families the Llama-family engines run (`general.architecture`): how each one's
//! layer departs from Llama's, read by the Burn tensor path, the host layer path and Candle.

/// GGUF `general.architecture` values this decoder runs (Mistral-style GGUFs say "llama" too).
pub const ARCHITECTURES: &[&str] = &["llama", "qwen2", "qwen3", "phi3", "gemma", "gemma2", "gemma3"];

/// Which pairs of a head's values rotate together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// `(2i, 2i+1)`: llama.cpp's converter permutes Llama's Q and K rows into this layout
    /// (`LLAMA_ROPE_TYPE_NORM`), as candle's `rope_i` rotates.
    Interleaved,
    /// `(i, i + rope_dim / 2)`: Hugging Face's layout, which the converter keeps for Qwen
    /// and Phi-3 (`LLAMA_ROPE_TYPE_NEOX`), as candle's `rope` rotates.
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
    /// Q, K and V in one matrix (`blk.N.attn_qkv.weight`) and the gate and up projections in one
    /// (`blk.N.ffn_up.weight`, gate rows first): Phi-3.
    pub fused: bool,
    /// Gemma (1, 2 and 3): embeddings scaled by √hidden, GELU (tanh form) gating in place of
    /// SiLU, and RMSNorms that scale by 1 + w (GGUF files store 1 + w).
    pub gemma: bool,
    /// An RMSNorm on the attention's and the MLP's outputs before each joins the residual
    /// (`blk.N.post_attention_norm.weight`, `blk.N.post_ffw_norm.weight`): Gemma 2 and 3.
    pub post_norms: bool,
}

impl Family {
    /// The tensors, each `(name, rows)`, that stack into a layer's Q/K/V projection and into its
    /// gate/up projection, in that row order.
    pub fn projections(&self, l: usize, q_rows: usize, kv_rows: usize, ffn: usize) -> [Vec<(String, usize)>; 2] {
        let n = |name: &str| format!("blk.{l}.{name}.weight");
        if self.fused {
            [vec![(n("attn_qkv"), q_rows + 2 * kv_rows)], vec![(n("ffn_up"), 2 * ffn)]]
        } else {
            [vec![(n("attn_q"), q_rows), (n("attn_k"), kv_rows), (n("attn_v"), kv_rows)], vec![(n("ffn_gate"), ffn), (n("ffn_up"), ffn)]]
        }
    }

    pub fn of(arch: &str) -> Option<Family> {
        let (qkv_bias, qk_norm, rope, fused, gemma, post_norms) = match arch {
            "llama" => (false, false, RopeStyle::Interleaved, false, false, false),
            "qwen2" => (true, false, RopeStyle::Halves, false, false, false),
            "qwen3" => (false, true, RopeStyle::Halves, false, false, false),
            "phi3" => (false, false, RopeStyle::Halves, true, false, false),
            "gemma" => (false, false, RopeStyle::Halves, false, true, false),
            "gemma2" => (false, false, RopeStyle::Halves, false, true, true),
            "gemma3" => (false, true, RopeStyle::Halves, false, true, true),
            _ => return None,
        };
        Some(Family { qkv_bias, qk_norm, rope, fused, gemma, post_norms })
    }

    /// Where the family's sliding-window layers fall when the file does not say: every `n`-th
    /// layer attends to all positions, the others to the window (llama.cpp's defaults).
    pub fn swa_pattern(arch: &str) -> Option<usize> {
        match arch {
            "gemma2" => Some(2),
            "gemma3" => Some(6),
            _ => None,
        }
    }
}

/// Which of `layers` layers slide, with every `n`-th one global (`n` 0: all slide), as
/// llama.cpp's `set_swa_pattern`.
pub fn sliding_layers(layers: usize, n: usize) -> Vec<bool> {
    (0..layers).map(|l| n == 0 || l % n < n - 1).collect()
}

/// GELU in its tanh form (PyTorch's `gelu(approximate="tanh")`, Gemma's activation):
/// `0.5·x·(1 + tanh(GELU_SCALE·(x + GELU_CUBIC·x³)))`; the tensor path applies the same constants.
pub const GELU_SCALE: f32 = 0.797_884_6; // √(2/π)
pub const GELU_CUBIC: f32 = 0.044_715;

pub fn gelu_tanh(x: f32) -> f32 {
    0.5 * x * (1.0 + (GELU_SCALE * (x + GELU_CUBIC * x * x * x)).tanh())
}

/// A family's per-layer extras (`Family`), as host values: the concatenated Q/K/V biases and
/// the per-head Q and K norm weights, where the family has them.
#[derive(Clone, Default)]
pub(crate) struct HeadExtras {
    pub qkv_bias: Option<Vec<f32>>,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    /// Gemma's norms of the attention output and of the MLP output.
    pub post_norms: Option<(Vec<f32>, Vec<f32>)>,
}

/// `projections`' parts as `(name, rows)` pairs of borrowed names.
pub fn part_names(parts: &[(String, usize)]) -> Vec<(&str, usize)> {
    parts.iter().map(|(name, rows)| (name.as_str(), *rows)).collect()
}
