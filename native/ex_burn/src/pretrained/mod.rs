//! Pre-trained models: sentence embeddings (BERT family) and text generation (Llama family),
//! loaded from safetensors or GGUF and run on either engine.
//!
//! What does not depend on the engine lives once, here: the models directory (`files`), the
//! tokenizer (`tokenizer`), sentence-transformers pooling (`pooling`), sampling, stop rules and
//! streaming text (`generate`), and the weight readers the Burn engine uses (`weights`). Each
//! engine implements the two traits below in its own modules; nothing above them knows which
//! engine runs.

pub mod burn_bert;
pub mod burn_llama;
pub mod candle_bert;
pub mod candle_llama;
pub mod files;
pub mod generate;
pub mod pooling;
pub mod tokenizer;
pub mod weights;

use crate::error::ExResult;

/// Which implementation runs a model. `:auto` is an Elixir-side policy (Burn, then Candle on
/// failure) and never reaches Rust.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    Burn,
    Candle,
}

impl Engine {
    pub fn name(self) -> &'static str {
        match self {
            Engine::Burn => "burn",
            Engine::Candle => "candle",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "burn" => Some(Engine::Burn),
            "candle" => Some(Engine::Candle),
            _ => None,
        }
    }
}

/// A padded batch of token ids, row-major `[batch, seq]`. `mask` is 1 for real tokens and 0 for
/// padding; `type_ids` are BERT's segment ids (all 0 for single sentences).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenBatch {
    pub ids: Vec<u32>,
    pub type_ids: Vec<u32>,
    pub mask: Vec<u32>,
    pub batch: usize,
    pub seq: usize,
}

/// An encoder-only transformer (BERT family): token ids in, last hidden states out. Pooling and
/// normalisation are `pooling`'s, so both engines share them.
pub trait Encoder: Send + Sync {
    fn hidden_size(&self) -> usize;
    /// The last hidden states, row-major `[batch.batch, batch.seq, hidden_size]`.
    fn hidden_states(&self, batch: &TokenBatch) -> ExResult<Vec<f32>>;
}

/// A decoder-only language model (Llama family). The loaded weights are shared (`Sync`); each
/// generation gets its own `LmSession`, which owns the KV cache.
pub trait CausalLm: Send + Sync {
    fn vocab_size(&self) -> usize;
    /// The longest sequence (prompt + generated tokens) the model accepts.
    fn context_length(&self) -> usize;
    fn session(&self) -> ExResult<Box<dyn LmSession>>;
}

pub trait LmSession: Send {
    /// Runs `tokens` at positions `pos..pos + tokens.len()`, appending them to the KV cache, and
    /// returns the logits (`vocab_size` values) of the last one. `pos` is the number of tokens
    /// already in the cache; a session is fed strictly in order.
    fn forward(&mut self, tokens: &[u32], pos: usize) -> ExResult<Vec<f32>>;
}
