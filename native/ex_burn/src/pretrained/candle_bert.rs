//! BERT-family encoder on the Candle engine (CPU or CUDA): `candle_transformers`' `BertModel` and
//! `XLMRobertaModel`, MPNet from `candle_mpnet` and NomicBERT from `candle_nomic`, over the
//! `model.safetensors` read tensor by tensor.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use candle_transformers::models::xlm_roberta::{Config as XlmRobertaConfig, XLMRobertaModel};

use super::burn_bert::BertConfig;
use super::candle_device;
use super::candle_mpnet::MpNet;
use super::candle_nomic::NomicBert;
use super::encoder_family::Family;
use super::errors::{self, kind};
use super::{Encoder, TokenBatch};
use crate::device::DeviceRef;
use crate::error::{Detail, ExResult};

enum Model {
    Bert(BertModel),
    XlmRoberta(XLMRobertaModel),
    MpNet(MpNet),
    NomicBert(NomicBert),
}

struct CandleBert {
    model: Model,
    dev: Device,
    hidden: usize,
    /// The fewest outputs a dense layer has (`min(hidden, intermediate)`).
    narrowest: usize,
}

/// gemm (under candle's matmul) computes a product of at most this many outputs with another
/// kernel, which sums in another order; candle's dense layers multiply all the batch's tokens at
/// once, so a short text of a narrow model could take it alone and not in a batch.
const GEMM_SMALL_OUTPUTS: usize = 16 * 16;

fn engine_err(e: candle_core::Error) -> crate::error::ExError {
    errors::engine("candle", e)
}

impl Encoder for CandleBert {
    fn hidden_size(&self) -> usize {
        self.hidden
    }

    fn hidden_states(&self, batch: &TokenBatch) -> ExResult<Vec<f32>> {
        // where one text's dense products may take gemm's small kernel, each text runs alone, so
        // its embedding never depends on the texts that share the call
        if batch.batch > 1 && batch.seq * self.narrowest <= GEMM_SMALL_OUTPUTS {
            let mut out = Vec::with_capacity(batch.batch * batch.seq * self.hidden);
            for i in 0..batch.batch {
                let row = |v: &[u32]| v[i * batch.seq..(i + 1) * batch.seq].to_vec();
                let one = TokenBatch { ids: row(&batch.ids), type_ids: row(&batch.type_ids), mask: row(&batch.mask), batch: 1, seq: batch.seq };
                out.extend(self.hidden_states(&one)?);
            }
            return Ok(out);
        }
        let shape = (batch.batch, batch.seq);
        let ids = Tensor::from_slice(&batch.ids, shape, &self.dev).map_err(engine_err)?;
        let types = Tensor::from_slice(&batch.type_ids, shape, &self.dev).map_err(engine_err)?;
        let mask = Tensor::from_slice(&batch.mask, shape, &self.dev).map_err(engine_err)?;
        let out = match &self.model {
            Model::Bert(m) => m.forward(&ids, &types, Some(&mask)),
            Model::XlmRoberta(m) => m.forward(&ids, &mask, &types, None, None, None),
            Model::MpNet(m) => m.forward(&batch.ids, &batch.mask, shape),
            Model::NomicBert(m) => m.forward(&ids, &types, &batch.mask, shape),
        }
        .map_err(engine_err)?;
        out.flatten_all().and_then(|t| t.to_vec1::<f32>()).map_err(engine_err)
    }
}

/// config.json with the keys candle's configs require but Hugging Face may leave out (they
/// change nothing at inference) filled in.
fn read_config(dir: &Path) -> ExResult<(Family, serde_json::Value)> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| errors::io(&path, e))?;
    let mut raw: serde_json::Value = serde_json::from_str(&text).map_err(|e| errors::bad_config(&path, e))?;
    let family = Family::of_config(&raw, &path)?;
    Family::hub_config(&mut raw, &path, "candle")?;
    if let Some(obj) = raw.as_object_mut() {
        for (k, v) in [
            ("hidden_dropout_prob", serde_json::json!(0.1)),
            ("attention_probs_dropout_prob", serde_json::json!(0.1)),
            ("initializer_range", serde_json::json!(0.02)),
            ("position_embedding_type", serde_json::json!("absolute")),
            ("pad_token_id", serde_json::json!(0)),
            ("hidden_act", serde_json::json!("gelu")),
            ("layer_norm_eps", serde_json::json!(1e-12)),
            ("type_vocab_size", serde_json::json!(2)),
        ] {
            if obj.get(k).is_none_or(|x| x.is_null()) {
                obj.insert(k.to_string(), v);
            }
        }
    }
    Ok((family, raw))
}

fn config<T: for<'de> serde::Deserialize<'de>>(dir: &Path, raw: serde_json::Value) -> ExResult<T> {
    serde_json::from_value(raw).map_err(|e| errors::bad_config(&dir.join("config.json"), e))
}

/// Loads `config.json` and `model.safetensors` from the model directory `dir`.
pub fn load(dir: &Path, device: &DeviceRef) -> ExResult<Box<dyn Encoder>> {
    let dev = candle_device::device(device)?;
    let (family, raw) = read_config(dir)?;
    let weights = dir.join("model.safetensors");
    super::files::check_safetensors(&weights)?;
    // Read tensor by tensor through our reader, which drops each tensor's file pages once
    // converted: candle's own mmap loader kept the whole file resident while it copied, nearly
    // doubling a load's peak (guides/pretrained.md).
    let st = super::weights::Safetensors::open(&weights)?;
    let mut tensors = std::collections::HashMap::new();
    for name in st.names().into_iter().filter(|n| st.is_float(n)) {
        let shape = st.shape(&name).unwrap_or_default();
        let values = st.values(&name, &shape)?;
        tensors.insert(name, candle_core::Tensor::from_vec(values, shape, &dev).map_err(engine_err)?);
    }
    // Sequence-classification checkpoints prefix the encoder's tensors (`roberta.`, `bert.`).
    let prefixed = tensors.contains_key(&format!("{}embeddings.word_embeddings.weight", family.head_prefix()));
    let vb = VarBuilder::from_tensors(tensors, DType::F32, &dev);
    let vb = if prefixed { vb.pp(family.head_prefix().trim_end_matches('.')) } else { vb };
    let mismatch = |e: candle_core::Error| {
        errors::err(
            kind::BAD_CONFIG,
            format!("{} does not hold the {} weights config.json describes: {e}", weights.display(), family.model_type()),
            vec![errors::path_detail(&weights), ("reason", Detail::Text(e.to_string()))],
        )
    };
    let (model, hidden, intermediate) = match family {
        Family::XlmRoberta => {
            let cfg: XlmRobertaConfig = config(dir, raw)?;
            (Model::XlmRoberta(XLMRobertaModel::new(&cfg, vb).map_err(mismatch)?), cfg.hidden_size, cfg.intermediate_size)
        }
        Family::MpNet => {
            let mut cfg: BertConfig = config(dir, raw)?;
            cfg.check("candle")?;
            (Model::MpNet(MpNet::load(vb, &cfg).map_err(mismatch)?), cfg.hidden_size, cfg.intermediate_size)
        }
        Family::NomicBert => {
            let mut cfg: BertConfig = config(dir, raw)?;
            cfg.check("candle")?;
            (Model::NomicBert(NomicBert::load(vb, &cfg).map_err(mismatch)?), cfg.hidden_size, cfg.intermediate_size)
        }
        _ => {
            let cfg: Config = config(dir, raw)?;
            (Model::Bert(BertModel::load(vb, &cfg).map_err(mismatch)?), cfg.hidden_size, cfg.intermediate_size)
        }
    };
    Ok(Box::new(CandleBert { model, dev, hidden, narrowest: hidden.min(intermediate) }))
}
