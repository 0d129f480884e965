//! BERT-family encoder on the Candle engine (CPU): `candle_transformers`' `BertModel` over the
//! `model.safetensors` read tensor by tensor.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};

use super::errors::{self, kind};
use super::{Encoder, TokenBatch};
use crate::device::DeviceRef;
use crate::error::{Detail, ExResult};

/// The model types whose weights and forward pass are BERT's.
pub const ARCHITECTURES: &[&str] = &["bert"];

struct CandleBert {
    model: BertModel,
    hidden: usize,
}

fn engine_err(e: candle_core::Error) -> crate::error::ExError {
    errors::engine("candle", e)
}

impl Encoder for CandleBert {
    fn hidden_size(&self) -> usize {
        self.hidden
    }

    fn hidden_states(&self, batch: &TokenBatch) -> ExResult<Vec<f32>> {
        let shape = (batch.batch, batch.seq);
        let ids = Tensor::from_slice(&batch.ids, shape, &Device::Cpu).map_err(engine_err)?;
        let types = Tensor::from_slice(&batch.type_ids, shape, &Device::Cpu).map_err(engine_err)?;
        let mask = Tensor::from_slice(&batch.mask, shape, &Device::Cpu).map_err(engine_err)?;
        let out = self.model.forward(&ids, &types, Some(&mask)).map_err(engine_err)?;
        out.flatten_all().and_then(|t| t.to_vec1::<f32>()).map_err(engine_err)
    }
}

/// Candle is built for the CPU only here.
pub fn check_cpu(device: &DeviceRef) -> ExResult<()> {
    if device.kind == crate::device::DeviceKind::Cpu && device.index == 0 {
        return Ok(());
    }
    Err(errors::err(
        kind::UNSUPPORTED_DEVICE,
        format!("the candle engine runs on the CPU only; {device} was asked for"),
        vec![("device", Detail::Text(device.to_string())), ("engine", Detail::Atom("candle"))],
    ))
}

/// Reads and checks `config.json` as a BERT configuration.
pub fn read_config(dir: &Path) -> ExResult<Config> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| errors::io(&path, e))?;
    let raw: serde_json::Value = serde_json::from_str(&text).map_err(|e| errors::bad_config(&path, e))?;
    let model_type = raw.get("model_type").and_then(|v| v.as_str()).unwrap_or("bert");
    if !ARCHITECTURES.contains(&model_type) {
        return Err(errors::err(
            kind::UNKNOWN_ARCHITECTURE,
            format!("unsupported encoder architecture {model_type:?} (supported: {})", ARCHITECTURES.join(", ")),
            vec![("arch", Detail::Text(model_type.to_string())), errors::path_detail(&path)],
        ));
    }
    serde_json::from_value(raw).map_err(|e| errors::bad_config(&path, e))
}

/// Loads `config.json` and `model.safetensors` from the model directory `dir`.
pub fn load(dir: &Path, device: &DeviceRef) -> ExResult<Box<dyn Encoder>> {
    check_cpu(device)?;
    let config = read_config(dir)?;
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
        tensors.insert(name, candle_core::Tensor::from_vec(values, shape, &Device::Cpu).map_err(engine_err)?);
    }
    let vb = VarBuilder::from_tensors(tensors, DType::F32, &Device::Cpu);
    let model = BertModel::load(vb, &config).map_err(|e| {
        errors::err(
            kind::BAD_CONFIG,
            format!("{} does not hold the BERT weights config.json describes: {e}", weights.display()),
            vec![errors::path_detail(&weights), ("reason", Detail::Text(e.to_string()))],
        )
    })?;
    Ok(Box::new(CandleBert { model, hidden: config.hidden_size }))
}
