//! NomicBERT (nomic-embed-text, its checkpoints' own tensor names) on the Candle engine.
//! `candle_transformers` has no such model, so its layers are put together here from
//! `candle_nn`'s parts: BERT's post-norm layers and token types, but rotary positions on Q and K
//! (`encoder_family::rope_tables`, which the Burn engine rotates with too), a SwiGLU MLP, and no
//! biases but the layer norms'.

use candle_core::{Module, Result, Tensor, D};
use candle_nn::{embedding, layer_norm, linear_no_bias, Embedding, LayerNorm, Linear, VarBuilder};

use super::burn_bert::BertConfig;
use super::encoder_family::{padding_bias, rope_tables};

struct Layer {
    /// Q, K and V in one `[3 hidden, hidden]` matrix.
    qkv: Linear,
    o: Linear,
    attn_norm: LayerNorm,
    gate: Linear,
    up: Linear,
    down: Linear,
    out_norm: LayerNorm,
}

pub struct NomicBert {
    word: Embedding,
    token_type: Embedding,
    emb_norm: LayerNorm,
    layers: Vec<Layer>,
    /// `[positions, head_dim]` rotary tables.
    cos: Tensor,
    sin: Tensor,
    heads: usize,
    hidden: usize,
}

impl NomicBert {
    /// The model from `vb` (the encoder's tensors, any checkpoint prefix already taken off).
    pub fn load(vb: VarBuilder, cfg: &BertConfig) -> Result<NomicBert> {
        let (h, i, eps) = (cfg.hidden_size, cfg.intermediate_size, cfg.layer_norm_eps);
        let emb = vb.pp("embeddings");
        let layers = (0..cfg.num_hidden_layers)
            .map(|l| {
                let n = vb.pp(format!("encoder.layers.{l}"));
                let (attn, mlp) = (n.pp("attn"), n.pp("mlp"));
                Ok(Layer {
                    qkv: linear_no_bias(h, 3 * h, attn.pp("Wqkv"))?,
                    o: linear_no_bias(h, h, attn.pp("out_proj"))?,
                    attn_norm: layer_norm(h, eps, n.pp("norm1"))?,
                    // the SwiGLU's gate is `fc12`, its up projection `fc11`
                    gate: linear_no_bias(h, i, mlp.pp("fc12"))?,
                    up: linear_no_bias(h, i, mlp.pp("fc11"))?,
                    down: linear_no_bias(i, h, mlp.pp("fc2"))?,
                    out_norm: layer_norm(h, eps, n.pp("norm2"))?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let dh = h / cfg.num_attention_heads;
        let (cos, sin) = rope_tables(cfg.max_position_embeddings, dh, cfg.rope_theta());
        let dev = vb.device();
        Ok(NomicBert {
            word: embedding(cfg.vocab_size, h, emb.pp("word_embeddings"))?,
            token_type: embedding(cfg.type_vocab_size, h, emb.pp("token_type_embeddings"))?,
            emb_norm: layer_norm(h, eps, vb.pp("emb_ln"))?,
            layers,
            cos: Tensor::from_vec(cos, (cfg.max_position_embeddings, dh), dev)?,
            sin: Tensor::from_vec(sin, (cfg.max_position_embeddings, dh), dev)?,
            heads: cfg.num_attention_heads,
            hidden: h,
        })
    }

    /// Hidden states `[batch, seq, hidden]` of a padded `[batch, seq]` batch of token ids and
    /// type ids (`mask` 0 at padding), row-major.
    pub fn forward(&self, ids: &Tensor, types: &Tensor, mask: &[u32], (b, s): (usize, usize)) -> Result<Tensor> {
        let (nh, dh) = (self.heads, self.hidden / self.heads);
        let dev = ids.device();
        let mut x = self.emb_norm.forward(&(self.word.forward(ids)? + self.token_type.forward(types)?)?)?;
        let bias = Tensor::from_vec(padding_bias(mask), (b, 1, 1, s), dev)?;
        let (cos, sin) = (self.cos.narrow(0, 0, s)?, self.sin.narrow(0, 0, s)?);
        // x·C + (x with its halves swapped)·S, as the tables are laid out
        let rotate = |t: Tensor| -> Result<Tensor> {
            let swapped = Tensor::cat(&[t.narrow(D::Minus1, dh / 2, dh / 2)?, t.narrow(D::Minus1, 0, dh / 2)?], D::Minus1)?;
            t.broadcast_mul(&cos)? + swapped.broadcast_mul(&sin)?
        };
        let heads = |t: Tensor| t.reshape((b, s, nh, dh))?.transpose(1, 2)?.contiguous();
        let scale = (dh as f64).powf(-0.5);
        for layer in &self.layers {
            let qkv = layer.qkv.forward(&x)?;
            let part = |i: usize| heads(qkv.narrow(D::Minus1, i * self.hidden, self.hidden)?);
            let (q, k, v) = (rotate(part(0)?)?, rotate(part(1)?)?, part(2)?);
            let scores = (q.matmul(&k.t()?)? * scale)?.broadcast_add(&bias)?;
            let probs = candle_nn::ops::softmax(&scores, D::Minus1)?;
            let ctx = probs.matmul(&v)?.transpose(1, 2)?.reshape((b, s, self.hidden))?;
            x = layer.attn_norm.forward(&(layer.o.forward(&ctx)? + x)?)?;
            let act = (candle_nn::ops::silu(&layer.gate.forward(&x)?)? * layer.up.forward(&x)?)?;
            x = layer.out_norm.forward(&(layer.down.forward(&act)? + x)?)?;
        }
        Ok(x)
    }
}
