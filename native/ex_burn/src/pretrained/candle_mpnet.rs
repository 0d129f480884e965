//! MPNet (all-mpnet-base-v2) on the Candle engine. `candle_transformers` has no MPNet, so its
//! layers are put together here from `candle_nn`'s parts; what sets MPNet apart from BERT
//! (positions from padding index 1, the relative position bias of every layer's attention) comes
//! from `encoder_family`, which the Burn engine follows too.

use candle_core::{Device, Module, Result, Tensor, D};
use candle_nn::{embedding, layer_norm, linear, Embedding, LayerNorm, Linear, VarBuilder};

use super::burn_bert::BertConfig;
use super::encoder_family::{mpnet_position_bias, padding_bias, Family};

struct Layer {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    attn_norm: LayerNorm,
    intermediate: Linear,
    output: Linear,
    out_norm: LayerNorm,
}

pub struct MpNet {
    word: Embedding,
    position: Embedding,
    emb_norm: LayerNorm,
    layers: Vec<Layer>,
    /// The `[buckets, heads]` relative position table, row-major.
    relative: Vec<f32>,
    heads: usize,
    hidden: usize,
    pad: u32,
    dev: Device,
}

impl MpNet {
    /// The model from `vb` (the encoder's tensors, any checkpoint prefix already taken off).
    pub fn load(vb: VarBuilder, cfg: &BertConfig) -> Result<MpNet> {
        let (h, i, eps) = (cfg.hidden_size, cfg.intermediate_size, cfg.layer_norm_eps);
        let emb = vb.pp("embeddings");
        let enc = vb.pp("encoder");
        let layers = (0..cfg.num_hidden_layers)
            .map(|l| {
                let n = enc.pp(format!("layer.{l}"));
                let attn = n.pp("attention");
                Ok(Layer {
                    q: linear(h, h, attn.pp("attn.q"))?,
                    k: linear(h, h, attn.pp("attn.k"))?,
                    v: linear(h, h, attn.pp("attn.v"))?,
                    o: linear(h, h, attn.pp("attn.o"))?,
                    attn_norm: layer_norm(h, eps, attn.pp("LayerNorm"))?,
                    intermediate: linear(h, i, n.pp("intermediate.dense"))?,
                    output: linear(i, h, n.pp("output.dense"))?,
                    out_norm: layer_norm(h, eps, n.pp("output.LayerNorm"))?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let table = enc.get((cfg.relative_attention_num_buckets, cfg.num_attention_heads), "relative_attention_bias.weight")?;
        Ok(MpNet {
            word: embedding(cfg.vocab_size, h, emb.pp("word_embeddings"))?,
            position: embedding(cfg.max_position_embeddings, h, emb.pp("position_embeddings"))?,
            emb_norm: layer_norm(h, eps, emb.pp("LayerNorm"))?,
            layers,
            relative: table.flatten_all()?.to_vec1::<f32>()?,
            heads: cfg.num_attention_heads,
            hidden: h,
            pad: cfg.pad(),
            dev: vb.device().clone(),
        })
    }

    /// Hidden states `[batch, seq, hidden]` of a padded `[batch, seq]` batch of token ids
    /// (`mask` 0 at padding), row-major.
    pub fn forward(&self, ids: &[u32], mask: &[u32], (b, s): (usize, usize)) -> Result<Tensor> {
        let (nh, dh) = (self.heads, self.hidden / self.heads);
        let dev = &self.dev;
        let positions = Tensor::from_vec(Family::MpNet.position_ids(ids, s, self.pad), (b, s), dev)?;
        let ids = Tensor::from_slice(ids, (b, s), dev)?;
        let mut x = self.emb_norm.forward(&(self.word.forward(&ids)? + self.position.forward(&positions)?)?)?;
        // the relative bias (per head, the same for every text) and the padding mask, both added
        // to the scores
        let relative = Tensor::from_vec(mpnet_position_bias(&self.relative, nh, s), (1, nh, s, s), dev)?;
        let bias = relative.broadcast_add(&Tensor::from_vec(padding_bias(mask), (b, 1, 1, s), dev)?)?;
        let heads = |t: Tensor| t.reshape((b, s, nh, dh))?.transpose(1, 2)?.contiguous();
        let scale = (dh as f64).powf(-0.5);
        for layer in &self.layers {
            let (q, k, v) = (heads(layer.q.forward(&x)?)?, heads(layer.k.forward(&x)?)?, heads(layer.v.forward(&x)?)?);
            let scores = (q.matmul(&k.t()?)? * scale)?.broadcast_add(&bias)?;
            let probs = candle_nn::ops::softmax(&scores, D::Minus1)?;
            let ctx = probs.matmul(&v)?.transpose(1, 2)?.reshape((b, s, self.hidden))?;
            x = layer.attn_norm.forward(&(layer.o.forward(&ctx)? + x)?)?;
            let inter = layer.intermediate.forward(&x)?.gelu_erf()?;
            x = layer.out_norm.forward(&(layer.output.forward(&inter)? + x)?)?;
        }
        Ok(x)
    }
}
