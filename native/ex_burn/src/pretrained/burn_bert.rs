//! BERT-family encoder on the Burn engine (BERT, XLM-RoBERTa, MPNet, NomicBERT: `encoder_family`
//! says how they differ): Hugging Face `config.json` plus `model.safetensors`, run as one batched
//! forward pass on the device.

use std::path::Path;

use burn::tensor::activation::silu;
use burn::tensor::module::{attention, layer_norm};
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Device, Int, Tensor};
use serde::Deserialize;

use super::encoder_attention;
use super::encoder_family::{mpnet_position_bias, padding_bias, rope_tables, Family, MODEL_TYPES};
use super::weights::{f32_tensor, i32_tensor, Safetensors};
use super::{Encoder, TokenBatch};
use crate::device::{DeviceKind, DeviceRef};
use crate::error::{catch, ExError, ExResult};
use crate::kernels::cpu::linear::linear_f32;
use crate::kernels::cpu::linear_packed::PackedLinear;
use crate::kernels::cpu::vector::flex_f32;

/// The fields of a Hugging Face BERT `config.json` the forward pass needs.
#[derive(Clone, Debug, Deserialize)]
pub struct BertConfig {
    #[serde(default)]
    pub model_type: Option<String>,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    pub max_position_embeddings: usize,
    #[serde(default = "default_type_vocab")]
    pub type_vocab_size: usize,
    pub vocab_size: usize,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    #[serde(default)]
    pub position_embedding_type: Option<String>,
    #[serde(default)]
    pub pad_token_id: Option<u32>,
    #[serde(default = "default_buckets")]
    pub relative_attention_num_buckets: usize,
    /// NomicBERT's rotary settings (`rope_theta`, default 1000).
    #[serde(default)]
    pub rope_parameters: Option<serde_json::Value>,
    #[serde(skip, default = "default_family")]
    pub family: Family,
}

fn default_buckets() -> usize {
    32
}
fn default_family() -> Family {
    Family::Bert
}

fn default_eps() -> f64 {
    1e-12
}
fn default_type_vocab() -> usize {
    2
}
fn default_act() -> String {
    "gelu".into()
}

impl BertConfig {
    pub fn read(dir: &Path) -> ExResult<Self> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| super::errors::io(&path, e))?;
        let mut raw: serde_json::Value = serde_json::from_str(&text).map_err(|e| super::errors::bad_config(&path, format!("not a BERT config: {e}")))?;
        Family::hub_config(&mut raw, &path, "burn")?;
        let mut cfg: BertConfig = serde_json::from_value(raw).map_err(|e| super::errors::bad_config(&path, format!("not a BERT config: {e}")))?;
        cfg.check("burn")?;
        Ok(cfg)
    }

    /// Sets the family from `model_type` and refuses what the forward passes don't compute,
    /// naming `engine` in the error.
    pub(super) fn check(&mut self, engine: &'static str) -> ExResult<()> {
        self.family = match self.model_type.as_deref().map(Family::from_model_type) {
            None => Family::Bert,
            Some(Some(f)) => f,
            Some(None) => {
                return Err(super::errors::unsupported(
                    engine,
                    format!("unsupported model_type `{}` for the BERT-family engine (expected one of {})", self.model_type.as_deref().unwrap_or(""), MODEL_TYPES.join(", ")),
                ))
            }
        };
        // NomicBERT gates with SiLU; the others take the exact erf GELU
        let act = if self.family == Family::NomicBert { "silu" } else { "gelu" };
        if self.hidden_act != act {
            return Err(super::errors::unsupported(
                engine,
                format!("unsupported hidden_act `{}` for a {} encoder (only `{act}`)", self.hidden_act, self.family.model_type()),
            ));
        }
        let rope_type = self.rope_parameters.as_ref().and_then(|p| p.get("rope_type")).and_then(|t| t.as_str()).unwrap_or("default");
        if rope_type != "default" {
            return Err(super::errors::unsupported(engine, format!("unsupported rope scaling `{rope_type}` (the encoders rotate with the default rope)")));
        }
        if let Some(p) = &self.position_embedding_type {
            if p != "absolute" {
                return Err(super::errors::unsupported(engine, format!("unsupported position_embedding_type `{p}` (only `absolute`)")));
            }
        }
        if self.num_attention_heads == 0 || !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return Err(super::errors::bad_config(
                Path::new("config.json"),
                format!("hidden_size {} is not a multiple of num_attention_heads {}", self.hidden_size, self.num_attention_heads),
            ));
        }
        Ok(())
    }

    pub fn pad(&self) -> u32 {
        self.pad_token_id.unwrap_or(0)
    }

    /// The rotary base of a rotary family (NomicBERT: `rope_parameters.rope_theta`, 1000 when
    /// absent).
    pub fn rope_theta(&self) -> f64 {
        self.rope_parameters.as_ref().and_then(|p| p.get("rope_theta")).and_then(|t| t.as_f64()).unwrap_or(1000.0)
    }

    /// The longest input the position table takes.
    pub fn max_tokens(&self) -> usize {
        self.family.max_tokens(self.max_position_embeddings, self.pad())
    }
}

/// A dense layer: as PyTorch stores it (`[out, in]`), read through `wt`, its transposed view
/// (no copy on the CPU backend), or, on CPUs with AVX-512, in `linear_packed`'s panels.
struct Dense {
    /// None where `packed` holds the weights.
    wt: Option<Tensor<2>>,
    packed: Option<PackedLinear>,
    /// None where the layer has no bias (NomicBERT), or `packed` holds it.
    b: Option<Tensor<1>>,
}

impl Dense {
    /// The layers `names` (each `[out, in]`) stacked along their outputs as one layer, with
    /// their biases where every one has one. `host`: the weights serve the host's kernels (the
    /// CPU), which take them packed where they can.
    fn load(st: &Safetensors, names: &[String], out: usize, inp: usize, dev: &Device, host: bool) -> ExResult<Dense> {
        let mut w = Vec::with_capacity(names.len() * out * inp);
        for name in names {
            w.extend(st.values(&format!("{name}.weight"), &[out, inp])?);
        }
        let mut biases = Vec::with_capacity(names.len() * out);
        for name in names {
            let bias = format!("{name}.bias");
            if !st.contains(&bias) {
                biases.clear();
                break;
            }
            biases.extend(st.values(&bias, &[out])?);
        }
        let rows = names.len() * out;
        let biases = (!biases.is_empty()).then_some(biases);
        let packed = if host { PackedLinear::new(&w, biases.as_deref(), rows, inp) } else { None };
        // the packed layer adds its own bias
        let b = biases.filter(|_| packed.is_none()).map(|b| f32_tensor(b, [rows], dev));
        let wt = packed.is_none().then(|| f32_tensor(w, [rows, inp], dev).transpose());
        Ok(Dense { wt, packed, b })
    }

    /// `x @ W^T + b` on `[rows, in]`.
    fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        if let Some(y) = self.host_forward(&x) {
            return y;
        }
        let wt = self.wt.as_ref().expect("weights as a tensor where the host's kernels do not run");
        let y = x.matmul(wt.clone());
        match &self.b {
            Some(b) => y + b.clone().unsqueeze::<2>(),
            None => y,
        }
    }

    /// The same on the host on the CPU, whatever the number of rows: `linear_packed` (or
    /// `linear_f32` without AVX-512) sums each output in one order at any row count, so a text's
    /// embedding does not depend on the texts sharing its call, and reads `W` as loaded, where
    /// gemm would first pack all of it again on every call; `None` elsewhere.
    fn host_forward(&self, x: &Tensor<2>) -> Option<Tensor<2>> {
        let [m, k] = x.dims();
        let xp = x.clone().into_dispatch();
        let xs = flex_f32(&xp)?;
        let (mut y, n) = match (&self.packed, &self.wt) {
            (Some(p), _) => (p.matmul(xs, m), p.out_features()),
            (None, Some(wt)) => {
                let n = wt.dims()[1];
                let wp = wt.clone().transpose().into_dispatch();
                (linear_f32(flex_f32(&wp)?, n, k, xs, m), n)
            }
            (None, None) => unreachable!("a dense layer holds its weights"),
        };
        if let Some(b) = &self.b {
            let bp = b.clone().into_dispatch();
            let bs = flex_f32(&bp)?;
            for row in y.chunks_exact_mut(n) {
                row.iter_mut().zip(bs).for_each(|(v, b)| *v += b);
            }
        }
        Some(f32_tensor(y, [m, n], &x.device()))
    }
}

struct Norm {
    gamma: Tensor<1>,
    beta: Tensor<1>,
}

impl Norm {
    fn load(st: &Safetensors, name: &str, size: usize, dev: &Device) -> ExResult<Norm> {
        Ok(Norm { gamma: st.tensor(&format!("{name}.weight"), [size], dev)?, beta: st.tensor(&format!("{name}.bias"), [size], dev)? })
    }

    fn forward(&self, x: Tensor<2>, eps: f64) -> Tensor<2> {
        layer_norm(x, self.gamma.clone(), Some(self.beta.clone()), eps)
    }
}

struct Layer {
    /// Query, key and value stacked into one `[hidden, 3 hidden]` projection.
    qkv: Dense,
    attn_out: Dense,
    attn_norm: Norm,
    /// GELU's input, or SwiGLU's gate and up projections side by side (NomicBERT).
    intermediate: Dense,
    output: Dense,
    out_norm: Norm,
}

pub struct BurnBert {
    cfg: BertConfig,
    device: Device,
    word: Tensor<2>,
    /// None for NomicBERT, whose positions rotate Q and K (`rope`).
    position: Option<Tensor<2>>,
    /// `encoder_family::rope_tables` as `[1, 1, positions, head_dim]` tensors, and as host
    /// values (`encoder_attention`).
    rope: Option<(Tensor<4>, Tensor<4>, Vec<f32>, Vec<f32>)>,
    /// None for MPNet, which has no token types.
    token_type: Option<Tensor<2>>,
    emb_norm: Norm,
    layers: Vec<Layer>,
    /// MPNet's `[buckets, heads]` relative position table, kept on the host: the bias it gives
    /// depends only on the sequence length.
    relative_bias: Option<Vec<f32>>,
}

/// Loads `config.json` and `model.safetensors` from the model directory `dir`.
pub fn load(dir: &Path, device: &DeviceRef) -> ExResult<Box<dyn Encoder>> {
    Ok(Box::new(BurnBert::load(dir, device)?))
}

impl BurnBert {
    pub fn load(dir: &Path, device: &DeviceRef) -> ExResult<BurnBert> {
        let cfg = BertConfig::read(dir)?;
        let st = Safetensors::open(&dir.join("model.safetensors"))?;
        let dev = device.burn()?;
        catch(|| Self::from_weights(cfg, &st, dev, device.kind == DeviceKind::Cpu))
    }

    /// `host`: the device is the CPU, whose dense layers run on the host's kernels.
    fn from_weights(cfg: BertConfig, st: &Safetensors, dev: Device, host: bool) -> ExResult<BurnBert> {
        // Checkpoints saved from `BertForSequenceClassification` and friends prefix every name
        // with `bert.` (`roberta.`, `mpnet.`).
        let family = cfg.family;
        let p = if st.contains(&format!("{}embeddings.word_embeddings.weight", family.head_prefix())) { family.head_prefix() } else { "" };
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        let word = st.tensor(&format!("{p}embeddings.word_embeddings.weight"), [cfg.vocab_size, h], &dev)?;
        let (position, rope) = if family.rotary() {
            let dh = h / cfg.num_attention_heads;
            let (cos, sin) = rope_tables(cfg.max_position_embeddings, dh, cfg.rope_theta());
            let table = |v: &[f32]| f32_tensor(v.to_vec(), [1, 1, cfg.max_position_embeddings, dh], &dev);
            (None, Some((table(&cos), table(&sin), cos, sin)))
        } else {
            (Some(st.tensor(&format!("{p}embeddings.position_embeddings.weight"), [cfg.max_position_embeddings, h], &dev)?), None)
        };
        let token_type = match family.has_token_types() {
            true => Some(st.tensor(&format!("{p}embeddings.token_type_embeddings.weight"), [cfg.type_vocab_size, h], &dev)?),
            false => None,
        };
        let emb_norm = Norm::load(st, &format!("{p}{}", if family == Family::NomicBert { "emb_ln" } else { "embeddings.LayerNorm" }), h, &dev)?;
        let relative_bias = match family {
            Family::MpNet => {
                let shape = [cfg.relative_attention_num_buckets, cfg.num_attention_heads];
                if shape[0] < 32 {
                    return Err(super::errors::bad_config(Path::new("config.json"), "MPNet needs relative_attention_num_buckets >= 32"));
                }
                Some(st.values(&format!("{p}encoder.relative_attention_bias.weight"), &shape)?)
            }
            _ => None,
        };
        // each layer's tensors: Q, K, V, the attention output and its norm, the MLP's input
        // projections, output and norm (MPNet names its attention `attn.{q,k,v,o}` with the
        // norm beside it; NomicBERT's layers are `layers.N`, its MLP a SwiGLU)
        let names = |l: usize| -> (Vec<String>, String, String, Vec<String>, String, String) {
            let n = |rest: &str| match family {
                Family::NomicBert => format!("{p}encoder.layers.{l}.{rest}"),
                _ => format!("{p}encoder.layer.{l}.{rest}"),
            };
            match family {
                // nomic-embed-text's own names (transformers writes them back on saving): Q, K
                // and V in one `Wqkv`, the SwiGLU's gate `fc12` and up `fc11`
                Family::NomicBert => (
                    vec![n("attn.Wqkv")],
                    n("attn.out_proj"),
                    n("norm1"),
                    vec![n("mlp.fc12"), n("mlp.fc11")],
                    n("mlp.fc2"),
                    n("norm2"),
                ),
                Family::MpNet => (
                    ["attn.q", "attn.k", "attn.v"].map(|m| n(&format!("attention.{m}"))).to_vec(),
                    n("attention.attn.o"),
                    n("attention.LayerNorm"),
                    vec![n("intermediate.dense")],
                    n("output.dense"),
                    n("output.LayerNorm"),
                ),
                _ => (
                    ["self.query", "self.key", "self.value"].map(|m| n(&format!("attention.{m}"))).to_vec(),
                    n("attention.output.dense"),
                    n("attention.output.LayerNorm"),
                    vec![n("intermediate.dense")],
                    n("output.dense"),
                    n("output.LayerNorm"),
                ),
            }
        };
        let layers = (0..cfg.num_hidden_layers)
            .map(|l| {
                let (qkv, out, attn_norm, inter, output, out_norm) = names(l);
                let dense = |names: &[String], rows: usize, cols: usize| Dense::load(st, names, rows, cols, &dev, host);
                Ok(Layer {
                    qkv: dense(&qkv, 3 * h / qkv.len(), h)?,
                    attn_out: dense(&[out], h, h)?,
                    attn_norm: Norm::load(st, &attn_norm, h, &dev)?,
                    intermediate: dense(&inter, i, h)?,
                    output: dense(&[output], h, i)?,
                    out_norm: Norm::load(st, &out_norm, h, &dev)?,
                })
            })
            .collect::<ExResult<Vec<_>>>()?;
        Ok(BurnBert { cfg, device: dev, word, position, rope, token_type, emb_norm, layers, relative_bias })
    }

    fn check(&self, batch: &TokenBatch) -> ExResult<()> {
        let n = batch.batch * batch.seq;
        if batch.ids.len() != n || batch.type_ids.len() != n || batch.mask.len() != n {
            return Err(ExError::invalid(format!(
                "token batch of {}x{} needs {n} ids, type ids and mask values; got {}, {} and {}",
                batch.batch,
                batch.seq,
                batch.ids.len(),
                batch.type_ids.len(),
                batch.mask.len()
            )));
        }
        if batch.seq > self.cfg.max_tokens() {
            return Err(ExError::invalid(format!("sequence of {} tokens is longer than the model's {} positions", batch.seq, self.cfg.max_tokens())));
        }
        if let Some(id) = batch.ids.iter().find(|&&id| id as usize >= self.cfg.vocab_size) {
            return Err(super::errors::err(
                super::errors::kind::TOKEN_OUT_OF_RANGE,
                format!("token id {id} is outside the vocabulary of {}", self.cfg.vocab_size),
                vec![],
            ));
        }
        if let Some(t) = batch.type_ids.iter().find(|&&t| self.token_type.is_some() && t as usize >= self.cfg.type_vocab_size) {
            return Err(ExError::invalid(format!("token type id {t} is outside the {} token types", self.cfg.type_vocab_size)));
        }
        Ok(())
    }

    fn ids(&self, v: &[u32]) -> Tensor<1, Int> {
        i32_tensor(v.iter().map(|&x| x as i32).collect(), &self.device)
    }

    fn forward(&self, batch: &TokenBatch) -> ExResult<Vec<f32>> {
        let (b, s, h) = (batch.batch, batch.seq, self.cfg.hidden_size);
        let (nh, eps) = (self.cfg.num_attention_heads, self.cfg.layer_norm_eps);
        let dh = h / nh;
        let padded = b * s;
        // Packed rows: only the real tokens (mask 1) go through the dense layers, layer norms and
        // GELU, which treat rows independently; attention alone sees the padded [b, s] layout.
        // Texts of unequal length pad the shorter ones (32 sentences of 13-20 tokens: 640 rows
        // padded, 528 real).
        let real: Vec<usize> = (0..padded).filter(|&p| batch.mask[p] != 0).collect();
        let packing = !real.is_empty() && real.len() < padded;
        let pick = |v: &[u32]| -> Vec<u32> { if packing { real.iter().map(|&p| v[p]).collect() } else { v.to_vec() } };
        let index = |v: Vec<usize>| -> Tensor<1, Int> { self.ids(&v.into_iter().map(|p| p as u32).collect::<Vec<_>>()) };
        let mut emb = self.word.clone().select(0, self.ids(&pick(&batch.ids)));
        if let Some(position) = &self.position {
            let positions = self.cfg.family.position_ids(&batch.ids, s, self.cfg.pad());
            emb = emb + position.clone().select(0, self.ids(&pick(&positions)));
        }
        if let Some(token_type) = &self.token_type {
            emb = emb + token_type.clone().select(0, self.ids(&pick(&batch.type_ids)));
        }
        let mut x = self.emb_norm.forward(emb, eps);
        // padded position -> its packed row (padding reads row 0: masked as a key, dropped as a
        // query), and packed row -> padded position
        let (to_packed, to_padded) = if packing {
            let mut at = vec![0usize; padded];
            real.iter().enumerate().for_each(|(r, &p)| at[p] = r);
            (Some(index(at)), Some(index(real.clone())))
        } else {
            (None, None)
        };
        let unpack = |t: Tensor<2>| match &to_packed {
            Some(i) => t.select(0, i.clone()),
            None => t,
        };

        // none when no position is masked (one text, or texts of equal length), where it adds 0
        let mask_bias = batch.mask.contains(&0).then(|| f32_tensor(padding_bias(&batch.mask), [b, 1, 1, s], &self.device));
        // MPNet adds its relative position bias (per head, the same for every text) before the mask.
        let relative = self.relative_bias.as_ref().map(|table| mpnet_position_bias(table, nh, s));
        let bias = match (&relative, mask_bias) {
            (Some(table), mask) => {
                let rel = f32_tensor(table.clone(), [1, nh, s, s], &self.device).expand([b, nh, s, s]);
                Some(match mask {
                    Some(m) => rel + m.expand([b, nh, s, s]),
                    None => rel,
                })
            }
            (None, mask) => mask.map(|m| m.expand([b, 1, s, s])),
        };
        let heads = |t: Tensor<2>| t.reshape([b, s, nh, dh]).swap_dims(1, 2);
        // the rotary tables' first `s` positions, and a head's halves swapped
        let rope = self.rope.as_ref().map(|(c, sn, _, _)| (c.clone().slice([0..1, 0..1, 0..s, 0..dh]), sn.clone().slice([0..1, 0..1, 0..s, 0..dh])));
        let rotate = |x: Tensor<4>, c: &Tensor<4>, sn: &Tensor<4>| {
            let swapped = x.clone().reshape([b, nh, s, 2, dh / 2]).flip([3]).reshape([b, nh, s, dh]);
            x * c.clone() + swapped * sn.clone()
        };
        // the host's attention over the packed rows (`encoder_attention`), where the rows are
        // the real tokens and on the CPU
        let lens: Vec<usize> = batch.mask.chunks(s).map(|m| m.iter().filter(|&&v| v != 0).count()).collect();
        let positions: Vec<usize> = real.iter().map(|&p| p % s).collect();
        let host = (packing || real.len() == padded).then(|| encoder_attention::Layout {
            lens: &lens,
            positions: &positions,
            heads: nh,
            bias: relative.as_deref().map(|b| (b, s)),
            rope: self.rope.as_ref().map(|(_, _, c, sn)| (&c[..], &sn[..])),
        });
        for layer in &self.layers {
            let qkv = layer.qkv.forward(x.clone());
            let on_host = host.as_ref().and_then(|l| {
                let p = qkv.clone().into_dispatch();
                flex_f32(&p).map(|v| f32_tensor(encoder_attention::attend(v, h, l), [real.len(), h], &self.device))
            });
            let ctx = match on_host {
                Some(ctx) => ctx,
                None => {
                    let qkv = unpack(qkv);
                    let part = |i: usize| heads(qkv.clone().slice([0..padded, i * h..(i + 1) * h]));
                    let (q, k, v) = (part(0), part(1), part(2));
                    let (q, k) = match &rope {
                        Some((c, sn)) => (rotate(q, c, sn), rotate(k, c, sn)),
                        None => (q, k),
                    };
                    let ctx = attention(q, k, v, None, bias.clone(), AttentionModuleOptions::default());
                    let ctx = ctx.swap_dims(1, 2).reshape([padded, h]);
                    match &to_padded {
                        Some(i) => ctx.select(0, i.clone()),
                        None => ctx,
                    }
                }
            };
            x = layer.attn_norm.forward(layer.attn_out.forward(ctx) + x, eps);
            let inter = layer.intermediate.forward(x.clone());
            let inter = match self.cfg.family {
                Family::NomicBert => {
                    let [rows, width] = inter.dims();
                    silu(inter.clone().slice([0..rows, 0..width / 2])) * inter.slice([0..rows, width / 2..width])
                }
                _ => crate::kernels::cpu::vector::gelu_tensor(inter),
            };
            x = layer.out_norm.forward(layer.output.forward(inter) + x, eps);
        }
        let data = unpack(x).try_into_data().map_err(|e| ExError::Execution(format!("{e:?}")))?;
        data.try_into_vec::<f32>().map_err(|e| ExError::Execution(format!("{e:?}")))
    }
}

impl Encoder for BurnBert {
    fn hidden_size(&self) -> usize {
        self.cfg.hidden_size
    }

    fn hidden_states(&self, batch: &TokenBatch) -> ExResult<Vec<f32>> {
        self.check(batch)?;
        if batch.batch == 0 || batch.seq == 0 {
            return Ok(Vec::new());
        }
        catch(|| self.forward(batch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pretrained::pooling::{normalize, PoolingConfig};
    use crate::pretrained::weights::test_support::{err_text, minilm_dir, peak_rss_mib, reference, TempDir};



    /// Pads token id lists into one batch (pad id 0, type ids 0).
    fn pad(cases: &[Vec<u32>]) -> TokenBatch {
        let seq = cases.iter().map(Vec::len).max().unwrap_or(0);
        let mut batch = TokenBatch { batch: cases.len(), seq, ..Default::default() };
        for ids in cases {
            batch.ids.extend(ids.iter().copied().chain(std::iter::repeat_n(0, seq - ids.len())));
            batch.mask.extend((0..seq).map(|i| (i < ids.len()) as u32));
        }
        batch.type_ids = vec![0; batch.ids.len()];
        batch
    }

    fn embed(model: &BurnBert, batch: &TokenBatch) -> Vec<Vec<f32>> {
        let hidden = model.hidden_states(batch).unwrap();
        assert_eq!(hidden.len(), batch.batch * batch.seq * model.hidden_size());
        let mut pooled = PoolingConfig::default().pool(&hidden, batch, model.hidden_size());
        pooled.iter_mut().for_each(|v| normalize(v));
        pooled
    }

    fn cosine(a: &[f32], b: &[f64]) -> f64 {
        let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * y).sum();
        let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
        let nb: f64 = b.iter().map(|y| y * y).sum::<f64>().sqrt();
        dot / (na * nb)
    }

    #[test]
    fn pretrained_burn_bert_matches_sentence_transformers() {
        let Some(dir) = minilm_dir() else { return };
        let refs = reference("minilm_reference.json");
        let model = BurnBert::load(&dir, &crate::testing::device()).unwrap();
        println!("burn bert: peak RSS after load {:.0} MiB", peak_rss_mib());
        let cases = refs["cases"].as_array().expect("cases");
        let ids: Vec<Vec<u32>> =
            cases.iter().map(|c| c["token_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect()).collect();
        let batch = pad(&ids);
        let got = embed(&model, &batch);
        let mut worst = 1.0f64;
        for (case, emb) in cases.iter().zip(&got) {
            let want: Vec<f64> = case["embedding"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
            let cos = cosine(emb, &want);
            println!(
                "burn bert: 1 - cosine = {:.1e} for {:?}",
                1.0 - cos,
                case["text"].as_str().unwrap_or("").chars().take(40).collect::<String>()
            );
            worst = worst.min(cos);
            assert!(cos >= 0.9999, "cosine {cos} for {}", case["text"]);
        }
        println!("burn bert: {} cases, worst cosine {worst:.9}; peak RSS {:.0} MiB", cases.len(), peak_rss_mib());

        // The same inputs one at a time (no padding) agree with the padded batch.
        for (i, one) in ids.iter().enumerate().take(3) {
            let single = embed(&model, &pad(std::slice::from_ref(one)));
            let want: Vec<f64> = got[i].iter().map(|&x| x as f64).collect();
            assert!(cosine(&single[0], &want) > 0.99999);
        }
    }

    /// Embedding latency on MiniLM per batch size, printed (bench/rust_timings.sh runs it).
    #[test]
    #[ignore]
    fn pretrained_burn_bert_timing() {
        let Some(dir) = minilm_dir() else { return };
        let model = BurnBert::load(&dir, &crate::testing::device()).unwrap();
        // 32 short texts: [CLS] + 6..13 word pieces + [SEP], ids drawn from the vocabulary.
        let texts: Vec<Vec<u32>> = (0..32u32)
            .map(|i| {
                let n = 6 + (i % 8) as usize;
                std::iter::once(101).chain((0..n).map(|j| 2000 + (i * 131 + j as u32 * 17) % 20000)).chain(std::iter::once(102)).collect()
            })
            .collect();
        for batch in [pad(&texts), pad(&texts[..4]), pad(&texts[..3]), pad(&texts[..2]), pad(&texts[3..4])] {
            embed(&model, &batch);
            let mut ms: Vec<f64> = (0..15)
                .map(|_| {
                    let t = std::time::Instant::now();
                    embed(&model, &batch);
                    t.elapsed().as_secs_f64() * 1000.0
                })
                .collect();
            ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
            println!(
                "burn bert: batch of {} texts (seq {}): min {:.2} ms, median {:.2} ms over {} runs; {} cores; peak RSS {:.0} MiB",
                batch.batch,
                batch.seq,
                ms[0],
                ms[ms.len() / 2],
                ms.len(),
                rayon_threads(),
                peak_rss_mib()
            );
        }
    }

    fn rayon_threads() -> usize {
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    }

    #[test]
    fn pretrained_burn_bert_bad_inputs() {
        let dir = TempDir::new("bert");
        let dev = crate::testing::device();
        assert!(err_text(load(dir.path(), &dev)).contains("file not found"));
        let cfg = r#"{"model_type":"bert","hidden_size":8,"num_hidden_layers":1,"num_attention_heads":2,
            "intermediate_size":16,"max_position_embeddings":16,"vocab_size":10,"hidden_act":"gelu"}"#;
        std::fs::write(dir.path().join("config.json"), cfg).unwrap();
        assert!(err_text(load(dir.path(), &dev)).contains("file not found"));
        std::fs::write(dir.path().join("model.safetensors"), b"\x10\x00\x00\x00\x00\x00\x00\x00{}").unwrap();
        let e = err_text(load(dir.path(), &dev));
        assert!(e.contains("cannot read safetensors file"), "{e}");
        // A well-formed file without the model's tensors.
        let data = [0u8; 16];
        let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![4], &data).unwrap();
        safetensors::serialize_to_file(vec![("other", view)], None, &dir.path().join("model.safetensors")).unwrap();
        let e = err_text(load(dir.path(), &dev));
        assert!(e.contains("tensor `embeddings.word_embeddings.weight` is missing"), "{e}");

        std::fs::write(dir.path().join("config.json"), cfg.replace("\"gelu\"", "\"relu\"")).unwrap();
        assert!(err_text(load(dir.path(), &dev)).contains("unsupported hidden_act `relu`"));
        std::fs::write(dir.path().join("config.json"), cfg.replace("\"bert\"", "\"roberta\"")).unwrap();
        assert!(err_text(load(dir.path(), &dev)).contains("unsupported model_type `roberta`"));
        std::fs::write(dir.path().join("config.json"), "{not json").unwrap();
        assert!(err_text(load(dir.path(), &dev)).contains("not a BERT config"));
    }

    #[test]
    fn pretrained_burn_bert_rejects_bad_batches() {
        let Some(dir) = minilm_dir() else { return };
        let model = BurnBert::load(&dir, &crate::testing::device()).unwrap();
        let mut b = pad(&[vec![101, 7592, 102]]);
        b.ids[1] = 40000;
        assert!(err_text(model.hidden_states(&b)).contains("outside the vocabulary"));
        let mut b = pad(&[vec![101, 7592, 102]]);
        b.mask.pop();
        assert!(err_text(model.hidden_states(&b)).contains("needs 3 ids"));
        let b = pad(&[vec![101; 600]]);
        assert!(err_text(model.hidden_states(&b)).contains("longer than the model's 512 positions"));
    }
}
