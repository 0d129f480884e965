//! Cross-encoder reranking, as sentence-transformers' `CrossEncoder.predict`: the query and each
//! document go through a BERT-family encoder together, the first token's hidden state through
//! the checkpoint's classification head, and the one logit through the model's activation.

use std::path::{Path, PathBuf};

use super::encoder_family::Family;
use super::errors::{self, kind};
use super::pooling::{Activation, Dense};
use super::tokenizer::EncoderTokenizer;
use super::weights::Safetensors;
use super::{burn_bert, candle_bert, files, max_seq_len, read_json, Encoder, Engine, EMBED_CHUNK};
use crate::device::DeviceRef;
use crate::error::{Detail, ExResult};

/// What `CrossEncoder.predict` applies to the logit by default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScoreActivation {
    Sigmoid,
    Identity,
}

impl ScoreActivation {
    pub fn name(self) -> &'static str {
        match self {
            ScoreActivation::Sigmoid => "sigmoid",
            ScoreActivation::Identity => "identity",
        }
    }

    fn apply(self, x: f32) -> f32 {
        match self {
            ScoreActivation::Sigmoid => (1.0 / (1.0 + (-(x as f64)).exp())) as f32,
            ScoreActivation::Identity => x,
        }
    }
}

pub struct Reranker {
    pub encoder: Box<dyn Encoder>,
    pub tokenizer: EncoderTokenizer,
    /// BERT: the pooler (tanh) then `classifier`; XLM-R and MPNet: `classifier.dense` (tanh) then
    /// `classifier.out_proj`.
    head: Vec<Dense>,
    pub activation: ScoreActivation,
    pub max_seq_len: usize,
    pub engine: Engine,
    pub device: DeviceRef,
    pub name: String,
    pub arch: String,
    pub path: PathBuf,
}

/// The activation sentence-transformers' CrossEncoder picks: the saved one
/// (`config_sentence_transformers.json`, then config.json's `sentence_transformers` or the
/// pre-4.0 `sbert_ce_default_activation_function`), else sigmoid for one label.
fn activation(dir: &Path, config: &serde_json::Value) -> ExResult<ScoreActivation> {
    let st_config = dir.join("config_sentence_transformers.json");
    let saved = if st_config.is_file() { read_json::<serde_json::Value>(&st_config)?.get("activation_fn").cloned() } else { None };
    let saved = saved
        .or_else(|| config.get("sentence_transformers").and_then(|v| v.get("activation_fn")).cloned())
        .or_else(|| config.get("sbert_ce_default_activation_function").cloned());
    match saved.as_ref().and_then(|v| v.as_str()) {
        None => Ok(ScoreActivation::Sigmoid),
        Some(path) => match path.rsplit('.').next().unwrap_or("") {
            "Sigmoid" => Ok(ScoreActivation::Sigmoid),
            "Identity" => Ok(ScoreActivation::Identity),
            _ => Err(errors::err(
                kind::UNSUPPORTED_MODULE,
                format!("unsupported cross-encoder activation {path:?} (sigmoid or identity)"),
                vec![("module", Detail::Text(path.to_string())), errors::path_detail(dir)],
            )),
        },
    }
}

impl Reranker {
    /// Loads a cross-encoder directory: a `*ForSequenceClassification` checkpoint with one label
    /// (`config.json`, `model.safetensors`, `tokenizer.json`).
    pub fn load(dir: &Path, engine: Engine, device: DeviceRef) -> ExResult<Self> {
        if !dir.is_dir() {
            return Err(errors::missing_file(dir));
        }
        for f in ["config.json", "model.safetensors", "tokenizer.json"] {
            if !dir.join(f).is_file() {
                return Err(errors::missing_file(&dir.join(f)));
            }
        }
        let config_path = dir.join("config.json");
        let config: serde_json::Value = read_json(&config_path)?;
        let family = Family::of_config(&config, &config_path)?;
        let labels = config
            .get("num_labels")
            .and_then(|v| v.as_u64())
            .or_else(|| config.get("id2label").and_then(|v| v.as_object()).map(|o| o.len() as u64))
            .unwrap_or(1);
        if labels != 1 {
            return Err(errors::err(
                kind::UNSUPPORTED_MODULE,
                format!("a reranker has one label; {} has {labels}", config_path.display()),
                vec![("num_labels", Detail::Int(labels as i128)), errors::path_detail(&config_path)],
            ));
        }
        let activation = activation(dir, &config)?;
        let max_seq_len = max_seq_len(dir, &config, family)?;
        let weights = dir.join("model.safetensors");
        files::check_safetensors(&weights)?;
        let tokenizer = EncoderTokenizer::from_file(&dir.join("tokenizer.json"), max_seq_len)?;
        let st = Safetensors::open(&weights)?;
        let h = config.get("hidden_size").and_then(|v| v.as_u64()).unwrap_or(0) as usize;
        let head = match family {
            Family::Bert => vec![
                Dense::from_checkpoint(&st, "bert.pooler.dense", h, h, Activation::Tanh)?,
                Dense::from_checkpoint(&st, "classifier", h, 1, Activation::Identity)?,
            ],
            Family::XlmRoberta | Family::MpNet => vec![
                Dense::from_checkpoint(&st, "classifier.dense", h, h, Activation::Tanh)?,
                Dense::from_checkpoint(&st, "classifier.out_proj", h, 1, Activation::Identity)?,
            ],
            Family::NomicBert => {
                return Err(errors::err(
                    kind::UNSUPPORTED_MODULE,
                    format!("{} is a NomicBERT cross-encoder; rerankers load for bert, xlm-roberta and mpnet", config_path.display()),
                    vec![("arch", Detail::Text(family.model_type().into())), errors::path_detail(&config_path)],
                ))
            }
        };
        drop(st);
        let encoder = match engine {
            Engine::Burn => burn_bert::load(dir, &device)?,
            Engine::Candle => candle_bert::load(dir, &device)?,
        };
        crate::process::alloc::trim();
        let name = dir.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        Ok(Reranker {
            encoder,
            tokenizer,
            head,
            activation,
            max_seq_len,
            engine,
            device,
            name,
            arch: family.model_type().to_string(),
            path: dir.to_path_buf(),
        })
    }

    /// One score per document, in order: the activation of the head's logit, or the logit
    /// itself when `raw`.
    pub fn score(&self, query: &str, documents: &[String], raw: bool) -> ExResult<Vec<f32>> {
        if documents.is_empty() {
            return Err(errors::err(kind::EMPTY_INPUT, "rerank: the list of documents is empty", vec![]));
        }
        let size = self.encoder.hidden_size();
        let mut scores = Vec::with_capacity(documents.len());
        for chunk in documents.chunks(EMBED_CHUNK) {
            let batch = self.tokenizer.pair_batch(query, chunk)?;
            let hidden = self.encoder.hidden_states(&batch)?;
            if hidden.len() != batch.batch * batch.seq * size {
                return Err(errors::engine(self.engine.name(), format!("encoder returned {} values for a [{}, {}, {size}] batch", hidden.len(), batch.batch, batch.seq)));
            }
            for b in 0..batch.batch {
                let first = hidden[b * batch.seq * size..(b * batch.seq + 1) * size].to_vec();
                let logit = self.head.iter().fold(first, |x, d| d.forward(&x))[0];
                scores.push(if raw { logit } else { self.activation.apply(logit) });
            }
        }
        Ok(scores)
    }

    /// The token ids of each (query, document) pair, padding removed, as `score` reads them.
    pub fn tokenize(&self, query: &str, documents: &[String]) -> ExResult<Vec<Vec<u32>>> {
        let batch = self.tokenizer.pair_batch(query, documents)?;
        Ok((0..batch.batch)
            .map(|b| (0..batch.seq).filter(|&t| batch.mask[b * batch.seq + t] != 0).map(|t| batch.ids[b * batch.seq + t]).collect())
            .collect())
    }
}
