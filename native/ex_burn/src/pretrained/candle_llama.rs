//! Llama-family decoder on the Candle engine (CPU): `candle_transformers`' quantised Llama, the
//! GGUF weights kept quantised. Each session is a clone of a pristine, never-run `ModelWeights`
//! (clones share the weights; the KV caches inside start empty).

use std::path::Path;

use candle_core::quantized::gguf_file;
use candle_core::{Device, Tensor};
use candle_transformers::models::quantized_llama::{ModelWeights, MAX_SEQ_LEN};

use super::candle_bert::check_cpu;
use super::errors;
use super::gguf::{self, Header};
use super::{CausalLm, LmSession};
use crate::device::DeviceRef;
use crate::error::ExResult;

/// GGUF `general.architecture` values this engine runs (Mistral-style GGUFs say "llama" too).
pub const ARCHITECTURES: &[&str] = &["llama"];

/// GGML tensor types Candle reads: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 and the
/// K-quants Q2_K…Q8_K.
pub const TENSOR_TYPES: &[u32] = &[0, 1, 30, 2, 3, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];

struct CandleLlama {
    pristine: ModelWeights,
    vocab: usize,
    context: usize,
}

struct CandleSession {
    model: ModelWeights,
}

fn engine_err(e: candle_core::Error) -> crate::error::ExError {
    errors::engine("candle", e)
}

impl CausalLm for CandleLlama {
    fn vocab_size(&self) -> usize {
        self.vocab
    }

    fn context_length(&self) -> usize {
        self.context
    }

    fn session(&self) -> ExResult<Box<dyn LmSession>> {
        Ok(Box::new(CandleSession { model: self.pristine.clone() }))
    }
}

impl CandleSession {
    fn run(&mut self, tokens: &[u32], pos: usize) -> ExResult<Vec<f32>> {
        let input = Tensor::new(tokens, &Device::Cpu).and_then(|t| t.unsqueeze(0)).map_err(engine_err)?;
        let logits = self.model.forward(&input, pos).map_err(engine_err)?;
        logits.squeeze(0).and_then(|t| t.to_dtype(candle_core::DType::F32)).and_then(|t| t.to_vec1::<f32>()).map_err(engine_err)
    }
}

impl LmSession for CandleSession {
    fn forward(&mut self, tokens: &[u32], pos: usize) -> ExResult<Vec<f32>> {
        if tokens.is_empty() {
            return Err(crate::error::ExError::invalid("forward needs at least one token"));
        }
        if pos + tokens.len() > MAX_SEQ_LEN {
            return Err(errors::engine("candle", format!("position {} is beyond the engine's {MAX_SEQ_LEN} positions", pos + tokens.len())));
        }
        // Candle's causal mask covers only a chunk starting at position 0 (a chunk later on would
        // need a rectangular mask), so later chunks run one token at a time. Position 0 resets
        // the cache, so a session can also start over.
        if pos == 0 || tokens.len() == 1 {
            return self.run(tokens, pos);
        }
        let mut last = Vec::new();
        for (i, t) in tokens.iter().enumerate() {
            last = self.run(&[*t], pos + i)?;
        }
        Ok(last)
    }
}

/// The checks both engines share before reading tensors: a Llama architecture, tensor types this
/// engine reads, and a complete file.
pub fn check_header(h: &Header, architectures: &[&str], tensor_types: &[u32]) -> ExResult<()> {
    let arch = h.architecture().unwrap_or("");
    if !architectures.contains(&arch) {
        return Err(errors::err(
            errors::kind::UNKNOWN_ARCHITECTURE,
            format!("unsupported GGUF architecture {arch:?} in {} (supported: {})", h.path.display(), architectures.join(", ")),
            vec![("arch", crate::error::Detail::Text(arch.to_string())), errors::path_detail(&h.path)],
        ));
    }
    let bad: Vec<String> = h.tensor_types().into_iter().filter(|(t, _)| !tensor_types.contains(&t.id)).map(|(t, n)| format!("{} ({n} tensors)", t.label())).collect();
    if !bad.is_empty() {
        return Err(errors::err(
            errors::kind::UNSUPPORTED_QUANTIZATION,
            format!("unsupported tensor types in {}: {}", h.path.display(), bad.join(", ")),
            vec![("types", crate::error::Detail::Text(bad.join(", "))), errors::path_detail(&h.path)],
        ));
    }
    h.check_complete()
}

/// The context length a GGUF Llama declares (`llama.context_length`), if any.
pub fn declared_context(h: &Header) -> Option<usize> {
    h.int("llama.context_length").and_then(|v| usize::try_from(v).ok()).filter(|v| *v > 0)
}

/// Loads a Llama-architecture GGUF file.
pub fn load(path: &Path, device: &DeviceRef) -> ExResult<Box<dyn CausalLm>> {
    check_cpu(device)?;
    let header = gguf::read_header(path)?;
    check_header(&header, ARCHITECTURES, TENSOR_TYPES)?;
    let mut file = std::io::BufReader::new(std::fs::File::open(path).map_err(|e| errors::io(path, e))?);
    let content = gguf_file::Content::read(&mut file).map_err(engine_err)?;
    let pristine = ModelWeights::from_gguf(content, &mut file, &Device::Cpu).map_err(engine_err)?;
    let vocab = header
        .int("llama.vocab_size")
        .and_then(|v| usize::try_from(v).ok())
        .or_else(|| header.get("tokenizer.ggml.tokens").and_then(|v| v.as_array()).map(|a| a.len()))
        .unwrap_or(0);
    // Candle precomputes rotary tables for MAX_SEQ_LEN positions: that caps the context.
    let context = declared_context(&header).unwrap_or(MAX_SEQ_LEN).min(MAX_SEQ_LEN);
    Ok(Box::new(CandleLlama { pristine, vocab, context }))
}
