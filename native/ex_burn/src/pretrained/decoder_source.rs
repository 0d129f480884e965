//! Where a decoder's weights come from: a GGUF file, or a Hugging Face directory read under
//! GGUF's tensor names (`hf_decoder`). Both engines load through this, so a model loads the
//! same way from either format.

use std::path::Path;

use burn::tensor::{Device, Tensor};
use candle_core::quantized::QTensor;

use super::llama_config::LlamaConfig;
use super::files::is_hf_dir;
use super::hf_decoder::HfDecoder;
use super::qmatmul::{QFormat, QMatrix};
use super::weights::{f32_tensor, Gguf};
use crate::error::ExResult;

pub enum DecoderSource {
    Gguf(Gguf),
    Hf(HfDecoder),
}

impl DecoderSource {
    /// A Hugging Face model directory, else a GGUF file.
    pub fn open(path: &Path) -> ExResult<Self> {
        Ok(if is_hf_dir(path) { DecoderSource::Hf(HfDecoder::open(path)?) } else { DecoderSource::Gguf(Gguf::open(path)?) })
    }

    pub fn path(&self) -> &Path {
        match self {
            DecoderSource::Gguf(g) => g.path(),
            DecoderSource::Hf(h) => h.path(),
        }
    }

    pub fn config(&self) -> ExResult<LlamaConfig> {
        match self {
            DecoderSource::Gguf(g) => LlamaConfig::read(g),
            DecoderSource::Hf(h) => Ok(h.config()),
        }
    }

    pub fn contains(&self, name: &str) -> bool {
        match self {
            DecoderSource::Gguf(g) => g.contains(name),
            DecoderSource::Hf(h) => h.contains(name),
        }
    }

    /// The tensor `name` as f32 host values, checked against `shape`.
    pub fn values(&mut self, name: &str, shape: &[usize]) -> ExResult<Vec<f32>> {
        match self {
            DecoderSource::Gguf(g) => g.values(name, shape),
            DecoderSource::Hf(h) => h.values(name, shape),
        }
    }

    pub fn tensor<const D: usize>(&mut self, name: &str, shape: [usize; D], device: &Device) -> ExResult<Tensor<D>> {
        Ok(f32_tensor(self.values(name, &shape)?, shape, device))
    }

    /// The divisors of the rotary frequencies (`LlamaConfig::rope_tables`): `rope_freqs.weight`'s
    /// where the model has them (Llama 3 scaling), else ones.
    pub fn rope_factors(&mut self, cfg: &LlamaConfig) -> ExResult<Vec<f32>> {
        let half = cfg.rope_dim / 2;
        if self.contains("rope_freqs.weight") {
            self.values("rope_freqs.weight", &[half])
        } else {
            Ok(vec![1.0; half])
        }
    }

    /// The `[rows, cols]` matrix `name` in blocks `qmatmul` runs, where its stored format is one.
    pub fn quantised(&mut self, name: &str, rows: usize, cols: usize) -> ExResult<Option<QMatrix>> {
        match self {
            DecoderSource::Gguf(g) => g.quantised(name, rows, cols),
            DecoderSource::Hf(h) => h.quantised(name, rows, cols),
        }
    }

    /// The matrix `name` as whole rows of GGML blocks a kernel format holds (`Gguf::blocks`);
    /// `None` for a directory's float tensors and for other formats.
    pub fn blocks(&mut self, name: &str, rows: usize, cols: usize) -> ExResult<Option<(QFormat, Vec<u8>)>> {
        match self {
            DecoderSource::Gguf(g) => g.blocks(name, rows, cols),
            DecoderSource::Hf(_) => Ok(None),
        }
    }

    /// The tensor `name` as stored, for the Candle engine.
    pub fn qtensor(&mut self, name: &str) -> ExResult<QTensor> {
        match self {
            DecoderSource::Gguf(g) => g.qtensor(name),
            DecoderSource::Hf(h) => h.qtensor(name),
        }
    }
}
