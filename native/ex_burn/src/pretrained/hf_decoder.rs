//! A Hugging Face causal-LM directory (`config.json`, safetensors in one file or in shards named
//! by `model.safetensors.index.json`), read as the decoder engines read a GGUF file: tensors
//! under GGUF's names, hyperparameters as a `LlamaConfig`.
//!
//! Hugging Face keeps each head's Q and K rows in the order where a head's two halves rotate
//! together; llama.cpp's converter permutes Llama's rows into interleaved pairs. Read from here,
//! every family therefore rotates halves (`RopeStyle::Halves`) and no row is moved.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use burn::tensor::{bf16, f16};
use candle_core::quantized::{ggml_file, GgmlDType, QTensor};
use safetensors::Dtype;
use serde_json::Value as Json;

use super::llama_config::LlamaConfig;
use super::decoder_family::{Family, RopeStyle};
use super::errors::{self, kind};
use super::qmatmul::{QFormat, QMatrix};
use super::weights::Safetensors;
use crate::error::{Detail, ExError, ExResult};

use super::files::{HF_CONFIG as CONFIG, HF_INDEX as INDEX, HF_SINGLE as SINGLE};

/// config.json `model_type` values this reader takes, and the GGUF architecture each one is.
const MODEL_TYPES: &[(&str, &str)] =
    &[("llama", "llama"), ("mistral", "llama"), ("qwen2", "qwen2"), ("qwen3", "qwen3"), ("phi3", "phi3"), ("gemma", "gemma"), ("gemma2", "gemma2"), ("gemma3_text", "gemma3")];

/// A layer tensor's GGUF name part and its Hugging Face module path; Phi-3's fused gate/up
/// projection is `ffn_up` in GGUF, and Gemma names its norms apart (`GEMMA_NORMS`).
const LAYER_PARTS: &[(&str, &str)] = &[
    ("attn_norm", "input_layernorm"),
    ("ffn_norm", "post_attention_layernorm"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_qkv", "self_attn.qkv_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("attn_q_norm", "self_attn.q_norm"),
    ("attn_k_norm", "self_attn.k_norm"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
];

/// Gemma 2's and 3's four norms a layer: their `post_attention_layernorm` follows attention,
/// where other families' (Gemma 1's too) precedes the MLP.
const GEMMA_NORMS: &[(&str, &str)] = &[
    ("attn_norm", "input_layernorm"),
    ("post_attention_norm", "post_attention_layernorm"),
    ("ffn_norm", "pre_feedforward_layernorm"),
    ("post_ffw_norm", "post_feedforward_layernorm"),
];

pub struct HfDecoder {
    dir: PathBuf,
    cfg: LlamaConfig,
    shards: Vec<Safetensors>,
    /// Hugging Face tensor name → its shard.
    index: HashMap<String, usize>,
    /// Where the directory keeps the language model's tensors.
    layout: Layout,
    tied: bool,
    /// Llama 3 rope scaling's per-frequency divisors, as `rope_freqs.weight` holds them in GGUF.
    rope_factors: Option<Vec<f32>>,
}

fn read_json(path: &Path) -> ExResult<Json> {
    let text = std::fs::read_to_string(path).map_err(|e| errors::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| errors::bad_config(path, e))
}

/// The GGUF architecture of a config.json `model_type`, or the typed error naming those taken.
fn architecture(model_type: &str, config: &Path) -> ExResult<&'static str> {
    MODEL_TYPES.iter().find(|(m, _)| *m == model_type).map(|(_, a)| *a).ok_or_else(|| {
        let known: Vec<&str> = MODEL_TYPES.iter().map(|(m, _)| *m).collect();
        errors::err(
            kind::UNKNOWN_ARCHITECTURE,
            format!("unsupported model_type {model_type:?} in {} (supported: {})", config.display(), known.join(", ")),
            vec![("arch", Detail::Text(model_type.to_string())), errors::path_detail(config)],
        )
    })
}

/// Where a directory keeps the language model's tensors: at the top (`model.*`,
/// `lm_head.weight`), or in a multimodal checkpoint (Gemma 3's `Gemma3ForConditionalGeneration`),
/// as transformers saves one (`language_model.model.*`, `language_model.lm_head.weight`) or in
/// transformers 5's module paths (`model.language_model.*`, `lm_head.weight`). The other
/// towers' tensors are never read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Layout {
    Plain,
    LanguageModel,
    ModelLanguageModel,
}

impl Layout {
    fn of(index: &HashMap<String, usize>) -> Layout {
        if index.contains_key("language_model.model.embed_tokens.weight") {
            Layout::LanguageModel
        } else if index.contains_key("model.language_model.embed_tokens.weight") {
            Layout::ModelLanguageModel
        } else {
            Layout::Plain
        }
    }

    /// The stored name of a language model tensor's top-level name.
    pub(super) fn real(self, name: &str) -> String {
        match (self, name.strip_prefix("model.")) {
            (Layout::LanguageModel, _) => format!("language_model.{name}"),
            (Layout::ModelLanguageModel, Some(rest)) => format!("model.language_model.{rest}"),
            _ => name.to_string(),
        }
    }
}

impl HfDecoder {
    /// Reads the config and every shard's header; tensor data is read when asked for. The
    /// architecture is checked first, and every shard's size against its header, so an
    /// unsupported or truncated model fails before any weight is read.
    pub fn open(dir: &Path) -> ExResult<Self> {
        let (config, config_path, arch) = model_config(dir)?;
        let (files, named): (Vec<String>, Option<HashMap<String, String>>) = if dir.join(INDEX).is_file() {
            let index_path = dir.join(INDEX);
            let map = read_json(&index_path)?
                .get("weight_map")
                .and_then(Json::as_object)
                .map(|m| m.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string()))).collect::<HashMap<_, _>>())
                .ok_or_else(|| errors::bad_config(&index_path, "no weight_map"))?;
            let files: BTreeSet<String> = map.values().cloned().collect();
            (files.into_iter().collect(), Some(map))
        } else {
            (vec![SINGLE.to_string()], None)
        };
        let mut shards = Vec::with_capacity(files.len());
        for f in &files {
            let path = dir.join(f);
            if !path.is_file() {
                return Err(errors::missing_file(&path));
            }
            super::files::check_safetensors(&path)?;
            shards.push(Safetensors::open(&path)?);
        }
        let mut index = HashMap::new();
        for (i, s) in shards.iter().enumerate() {
            for name in s.names() {
                index.insert(name, i);
            }
        }
        if let Some(map) = named {
            if let Some((name, file)) = map.iter().find(|(name, _)| !index.contains_key(*name)) {
                return Err(errors::err(
                    kind::MISSING_TENSOR,
                    format!("tensor `{name}` is missing from {file}, where {INDEX} places it"),
                    vec![errors::path_detail(&dir.join(file)), ("tensor", Detail::Text(name.clone()))],
                ));
            }
        }
        let layout = Layout::of(&index);
        let tied = config.get("tie_word_embeddings").and_then(Json::as_bool) == Some(true) || !index.contains_key(&layout.real("lm_head.weight"));
        let embed = layout.real("model.embed_tokens.weight");
        let embed_shape = index.get(&embed).and_then(|&i| shards[i].shape(&embed));
        let rope = rope_parameters(&config);
        let cfg = read_config(&config, &config_path, arch, &rope, embed_shape)?;
        let rope_factors = llama3_factors(&rope, &cfg, &config_path)?;
        Ok(HfDecoder { dir: dir.to_path_buf(), cfg, shards, index, layout, tied, rope_factors })
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    pub fn config(&self) -> LlamaConfig {
        self.cfg.clone()
    }

    /// The Hugging Face name of a GGUF tensor name.
    fn hf_name(&self, gguf: &str) -> Option<String> {
        match gguf {
            "token_embd.weight" => return Some("model.embed_tokens.weight".into()),
            "output_norm.weight" => return Some("model.norm.weight".into()),
            "output.weight" => return Some("lm_head.weight".into()),
            _ => {}
        }
        let (layer, rest) = gguf.strip_prefix("blk.")?.split_once('.')?;
        let (part, suffix) = rest.rsplit_once('.')?;
        let family = self.cfg.family;
        let gemma_norms = if family.post_norms { GEMMA_NORMS } else { &[] };
        let hf = match part {
            "ffn_up" if family.fused => "mlp.gate_up_proj",
            _ => gemma_norms.iter().chain(LAYER_PARTS).find(|(g, _)| *g == part)?.1,
        };
        Some(format!("model.layers.{layer}.{hf}.{suffix}"))
    }

    /// The shard holding GGUF tensor `name`, and its Hugging Face name.
    fn locate(&self, name: &str) -> ExResult<(&Safetensors, String)> {
        let hf = self.hf_name(name).filter(|_| name != "output.weight" || !self.tied).map(|h| self.layout.real(&h));
        match hf.as_ref().and_then(|h| self.index.get(h)) {
            Some(&i) => Ok((&self.shards[i], hf.unwrap())),
            None => Err(errors::err(
                kind::MISSING_TENSOR,
                format!("tensor `{}` is missing from {}", hf.as_deref().unwrap_or(name), self.dir.display()),
                vec![errors::path_detail(&self.dir), ("tensor", Detail::Text(hf.unwrap_or_else(|| name.to_string())))],
            )),
        }
    }

    pub fn contains(&self, name: &str) -> bool {
        match name {
            "rope_freqs.weight" => self.rope_factors.is_some(),
            _ => self.locate(name).is_ok(),
        }
    }

    pub fn shape(&self, name: &str) -> Option<Vec<usize>> {
        let (shard, hf) = self.locate(name).ok()?;
        shard.shape(&hf)
    }

    /// The tensor `name` as f32 host values, checked against `shape`.
    pub fn values(&self, name: &str, shape: &[usize]) -> ExResult<Vec<f32>> {
        if let ("rope_freqs.weight", Some(f)) = (name, &self.rope_factors) {
            if shape != [f.len()] {
                return Err(ExError::invalid(format!("rope factors hold {} values, not {shape:?}", f.len())));
            }
            return Ok(f.clone());
        }
        let (shard, hf) = self.locate(name)?;
        let mut values = shard.values(&hf, shape)?;
        // Gemma's RMSNorm scales by 1 + w; GGUF files store 1 + w, as the engines read it
        if self.cfg.family.gemma && name.ends_with("norm.weight") {
            values.iter_mut().for_each(|v| *v += 1.0);
        }
        Ok(values)
    }

    /// The `[rows, cols]` matrix `name` as `qmatmul`'s f16 rows (GGUF's F16 layout) where it is
    /// stored as f16, or as bf16 within f16's range: bf16's 8-bit significand fits f16's 11, so
    /// only values under 2⁻¹⁷ in magnitude round (to f16's subnormal grid, by at most 2⁻²⁵).
    /// `None` for f32, and for bf16 with a value past f16's range: the caller reads them as f32.
    pub fn quantised(&self, name: &str, rows: usize, cols: usize) -> ExResult<Option<QMatrix>> {
        let (shard, hf) = self.locate(name)?;
        let (dtype, bytes) = shard.raw(&hf, &[rows, cols])?;
        let halves: std::borrow::Cow<[u8]> = match dtype {
            Dtype::F16 => bytes.into(),
            Dtype::BF16 => {
                let mut out = Vec::with_capacity(bytes.len());
                for b in bytes.chunks_exact(2) {
                    let v = bf16::from_le_bytes([b[0], b[1]]).to_f32();
                    if !(v.abs() <= f16::MAX.to_f32()) {
                        return Ok(None);
                    }
                    out.extend(f16::from_f32(v).to_le_bytes());
                }
                out.into()
            }
            _ => return Ok(None),
        };
        let mut at = 0;
        Ok(QMatrix::read(QFormat::F16, rows, cols, |buf: &mut [u8]| {
            buf.copy_from_slice(&halves[at..at + buf.len()]);
            at += buf.len();
            Ok::<(), ()>(())
        })
        .ok())
    }

    /// The tensor `name` in its stored float type, for the Candle engine.
    pub fn qtensor(&self, name: &str) -> ExResult<QTensor> {
        let (shard, hf) = self.locate(name)?;
        let shape = shard.shape(&hf).unwrap_or_default();
        let (dtype, bytes) = shard.raw(&hf, &shape)?;
        let ggml = match dtype {
            Dtype::F16 => GgmlDType::F16,
            Dtype::BF16 => GgmlDType::BF16,
            _ => GgmlDType::F32,
        };
        ggml_file::qtensor_from_ggml(ggml, bytes, shape, &candle_core::Device::Cpu)
            .map_err(|e| errors::engine("candle", format!("cannot read tensor `{hf}` from {}: {e}", shard.path().display())))
    }
}

/// The hyperparameters of config.json `c` (at `path`), whose token embedding is `embed_shape`.
fn read_config(c: &Json, path: &Path, arch: &str, rope: &Json, embed_shape: Option<Vec<usize>>) -> ExResult<LlamaConfig> {
    let int = |key: &str| c.get(key).and_then(Json::as_u64).map(|v| v as usize);
    let need = |key: &str| int(key).ok_or_else(|| errors::bad_config(path, format!("`{key}` is missing or not a count")));
    let unsupported = |what: String| errors::unsupported("burn", format!("{what} in {}", path.display()));
    // Qwen2's Q/K/V biases are its family's; an output or MLP bias is in no family
    let flag = |key: &str| c.get(key).and_then(Json::as_bool) == Some(true);
    if (flag("attention_bias") && arch != "qwen2") || flag("mlp_bias") {
        return Err(unsupported("biases on the attention output or MLP projections".to_string()));
    }
    let gemma = Family::of(arch).is_some_and(|f| f.gemma);
    let act = c.get("hidden_activation").or(c.get("hidden_act")).and_then(Json::as_str);
    let runs = if gemma { matches!(act, None | Some("gelu_pytorch_tanh" | "gelu_tanh")) } else { matches!(act, None | Some("silu")) };
    if !runs {
        return Err(unsupported(format!("activation {act:?} (the decoders run silu, and Gemma's gelu_pytorch_tanh)")));
    }
    let embedding_length = need("hidden_size")?;
    let head_count = need("num_attention_heads")?;
    let head_count_kv = int("num_key_value_heads").unwrap_or(head_count);
    let head_dim = match int("head_dim") {
        Some(d) => d,
        None if head_count > 0 && embedding_length % head_count == 0 => embedding_length / head_count,
        None => return Err(errors::bad_config(path, format!("hidden_size {embedding_length} does not split into {head_count} heads"))),
    };
    let fraction = rope.get("partial_rotary_factor").or(c.get("partial_rotary_factor")).and_then(Json::as_f64).unwrap_or(1.0);
    let rope_dim = (head_dim as f64 * fraction) as usize;
    let rope_position_scale = rope_scale(rope).map_err(unsupported)?;
    let vocab_size = match embed_shape {
        Some(s) if s.len() == 2 && s[1] == embedding_length => s[0],
        Some(s) => {
            return Err(errors::err(
                kind::TENSOR_MISMATCH,
                format!("model.embed_tokens.weight beside {} is {s:?}, not [vocab, {embedding_length}]", path.display()),
                vec![errors::path_detail(path), ("tensor", Detail::Text("model.embed_tokens.weight".into())), ("shape", Detail::Dims(s))],
            ))
        }
        None => {
            return Err(errors::err(
                kind::MISSING_TENSOR,
                format!("tensor `model.embed_tokens.weight` is missing beside {}", path.display()),
                vec![errors::path_detail(path), ("tensor", Detail::Text("model.embed_tokens.weight".into()))],
            ))
        }
    };
    if let Some(v) = int("vocab_size").filter(|&v| v != vocab_size) {
        return Err(errors::bad_config(path, format!("vocab_size {v} disagrees with the embedding's {vocab_size} rows")));
    }
    // Attention over a window equals full attention while a sequence fits in it: sequences
    // are held to it, as for GGUF files. Gemma's windows are applied, layer by layer.
    let declared = need("max_position_embeddings")?;
    let window = int("sliding_window").filter(|&w| w > 0 && c.get("use_sliding_window").and_then(Json::as_bool) != Some(false));
    let family = Family::of(arch).expect("every model type maps to a family");
    let block_count = need("num_hidden_layers")?;
    let (context_length, window, sliding) = match (window, gemma) {
        (Some(w), false) => (declared.min(w), None, vec![false; block_count]),
        (None, _) => (declared, None, vec![false; block_count]),
        (Some(w), true) => {
            let sliding = match c.get("layer_types").and_then(Json::as_array) {
                Some(types) => types.iter().map(|t| t.as_str() == Some("sliding_attention")).collect(),
                None => {
                    let n = int("sliding_window_pattern").or(int("_sliding_window_pattern")).or(Family::swa_pattern(arch)).unwrap_or(0);
                    super::decoder_family::sliding_layers(block_count, n)
                }
            };
            (declared, Some(w), sliding)
        }
    };
    let attn_scale = match c.get("query_pre_attn_scalar").and_then(Json::as_f64) {
        Some(s) if gemma => s.powf(-0.5),
        _ => (head_dim as f64).powf(-0.5),
    };
    let cap = |key: &str| c.get(key).and_then(Json::as_f64).filter(|&v| v > 0.0);
    // Gemma 3's sliding layers rotate with their own base (and no scaling)
    let rope_swa = match (window, swa_rope_parameters(c, arch)) {
        (Some(_), Some(p)) => Some((p.get("rope_theta").and_then(Json::as_f64).unwrap_or(10000.0), rope_scale(&p).map_err(unsupported)?)),
        _ => None,
    };
    LlamaConfig {
        attn_scale,
        attn_softcap: cap("attn_logit_softcapping"),
        final_softcap: cap("final_logit_softcapping"),
        window,
        sliding,
        rope_swa,
        arch: arch.to_string(),
        family: Family { rope: RopeStyle::Halves, ..family },
        block_count,
        embedding_length,
        feed_forward_length: need("intermediate_size")?,
        head_count,
        head_count_kv,
        head_dim,
        rope_freq_base: rope.get("rope_theta").and_then(Json::as_f64).unwrap_or(10000.0),
        rope_position_scale,
        rms_eps: c.get("rms_norm_eps").and_then(Json::as_f64).unwrap_or(1e-6),
        context_length,
        rope_dim,
        vocab_size,
    }
    .checked(path)
}

/// The position scale of rope settings `p`: 1, or 1 / factor for linear scaling (llama3's
/// factors are `llama3_factors`); the scaling's name where the engines apply no such scaling.
fn rope_scale(p: &Json) -> Result<f64, String> {
    match rope_type(p) {
        "default" | "llama3" => Ok(1.0),
        "linear" => Ok(1.0 / p.get("factor").and_then(Json::as_f64).unwrap_or(1.0)),
        other => Err(format!("rope scaling {other:?} (the engines apply none, linear and llama3)")),
    }
}

/// The rotary settings (of the global layers, where they differ by layer type):
/// `rope_parameters` (transformers 5), else `rope_scaling` with the top-level `rope_theta`
/// (earlier configs).
fn rope_parameters(c: &Json) -> Json {
    if let Some(p) = c.get("rope_parameters").filter(|p| p.is_object()) {
        return p.get("full_attention").filter(|f| f.is_object()).unwrap_or(p).clone();
    }
    let mut p = c.get("rope_scaling").filter(|p| p.is_object()).cloned().unwrap_or_else(|| Json::Object(Default::default()));
    if let (Some(obj), Some(theta)) = (p.as_object_mut(), c.get("rope_theta")) {
        obj.insert("rope_theta".into(), theta.clone());
    }
    p
}

/// Gemma 3's sliding layers' rotary settings: `rope_parameters.sliding_attention`, else
/// `rope_local_base_freq` (earlier configs), else base 10 000.
fn swa_rope_parameters(c: &Json, arch: &str) -> Option<Json> {
    if arch != "gemma3" {
        return None;
    }
    if let Some(p) = c.get("rope_parameters").and_then(|p| p.get("sliding_attention")).filter(|p| p.is_object()) {
        return Some(p.clone());
    }
    let base = c.get("rope_local_base_freq").and_then(Json::as_f64).unwrap_or(10000.0);
    Some(serde_json::json!({ "rope_theta": base }))
}

fn rope_type(p: &Json) -> &str {
    p.get("rope_type").or(p.get("type")).and_then(Json::as_str).unwrap_or("default")
}

/// Llama 3's per-frequency divisors: 1 for wavelengths under the original context over
/// `high_freq_factor`, `factor` for those over it over `low_freq_factor`, and a smooth blend of
/// the two rates between (transformers' `_compute_llama3_parameters`).
fn llama3_factors(p: &Json, cfg: &LlamaConfig, path: &Path) -> ExResult<Option<Vec<f32>>> {
    if rope_type(p) != "llama3" {
        return Ok(None);
    }
    let get = |key: &str| p.get(key).and_then(Json::as_f64).ok_or_else(|| errors::bad_config(path, format!("llama3 rope scaling without `{key}`")));
    let (factor, low, high, original) =
        (get("factor")?, get("low_freq_factor")?, get("high_freq_factor")?, get("original_max_position_embeddings")?);
    if high <= low {
        return Err(errors::bad_config(path, "llama3 rope scaling needs high_freq_factor > low_freq_factor"));
    }
    let (low_wavelen, high_wavelen) = (original / low, original / high);
    let factors = (0..cfg.rope_dim / 2)
        .map(|i| {
            let theta = cfg.rope_freq_base.powf(-((2 * i) as f64) / cfg.rope_dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / theta;
            if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor as f32
            } else {
                let smooth = (original / wavelen - low) / (high - low);
                (1.0 / ((1.0 - smooth) / factor + smooth)) as f32
            }
        })
        .collect();
    Ok(Some(factors))
}

/// The chat template a directory declares: `chat_template.jinja`, else tokenizer_config.json's
/// `chat_template` (a string, or named templates of which `default` is taken).
pub fn chat_template(dir: &Path) -> ExResult<Option<String>> {
    let jinja = dir.join("chat_template.jinja");
    if jinja.is_file() {
        return std::fs::read_to_string(&jinja).map(Some).map_err(|e| errors::io(&jinja, e));
    }
    let config = dir.join("tokenizer_config.json");
    if !config.is_file() {
        return Ok(None);
    }
    Ok(match read_json(&config)?.get("chat_template") {
        Some(Json::String(t)) => Some(t.clone()),
        Some(Json::Array(named)) => named
            .iter()
            .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
            .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
        _ => None,
    })
}

/// A Hugging Face directory's GGUF architecture (the typed error where its `model_type` is not
/// one this reader takes), read from config.json alone.
pub fn peek(dir: &Path) -> ExResult<&'static str> {
    Ok(model_config(dir)?.2)
}

/// config.json, its path, and the GGUF architecture its `model_type` maps to.
pub(super) fn model_config(dir: &Path) -> ExResult<(Json, PathBuf, &'static str)> {
    let path = dir.join(CONFIG);
    let mut config = read_json(&path)?;
    if config.get("model_type").and_then(Json::as_str) == Some("gemma3") {
        config = gemma3_text_config(&config, &path)?;
    }
    let model_type = config.get("model_type").and_then(Json::as_str).ok_or_else(|| errors::bad_config(&path, "no model_type"))?;
    let arch = architecture(model_type, &path)?;
    Ok((config, path, arch))
}

/// A multimodal Gemma 3 config's language model (`text_config`), as transformers'
/// `Gemma3TextConfig` reads it: the hub's configs leave out what equals the class's defaults,
/// which are filled in here.
fn gemma3_text_config(config: &Json, path: &Path) -> ExResult<Json> {
    let mut text = config.get("text_config").filter(|t| t.is_object()).cloned().ok_or_else(|| errors::bad_config(path, "a gemma3 config without its text_config"))?;
    let defaults = serde_json::json!({
        "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "query_pre_attn_scalar": 256, "sliding_window": 4096,
        "rope_theta": 1_000_000.0, "rope_local_base_freq": 10000.0,
    });
    let obj = text.as_object_mut().expect("checked above");
    for (k, v) in defaults.as_object().expect("an object") {
        obj.entry(k.clone()).or_insert_with(|| v.clone());
    }
    if let Some(tied) = config.get("tie_word_embeddings") {
        obj.entry("tie_word_embeddings").or_insert_with(|| tied.clone());
    }
    obj.insert("model_type".into(), "gemma3_text".into());
    Ok(text)
}
