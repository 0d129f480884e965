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
pub mod candle_device;
pub mod candle_kv;
pub mod candle_mpnet;
pub mod candle_nomic;
pub mod candle_llama;
#[cfg(feature = "cuda")]
pub mod cuda_llama;
pub mod decoder_family;
pub mod decoder_source;
mod encoder_attention;
pub mod encoder_family;
pub mod errors;
pub mod files;
pub mod generate;
pub mod gguf;
pub mod hf_decoder;
mod kv_pool;
pub mod llama_config;
mod llama_host;
#[cfg(test)]
mod greedy_check;
pub mod pooling;
pub mod prefix_cache;
pub mod qmatmul;
#[cfg(test)]
mod encoder_tests;
pub mod rerank;
#[cfg(test)]
mod reference_tests;
#[cfg(test)]
mod load_tests;
#[cfg(test)]
mod batch_tests;
#[cfg(test)]
mod embed_batch_tests;
#[cfg(test)]
mod llm_family_tests;
#[cfg(test)]
mod hf_llm_tests;
#[cfg(test)]
mod gemma_tests;
#[cfg(test)]
mod spm_tests;
pub mod tokenizer;
pub mod weights;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;

use crate::device::DeviceRef;
use crate::error::{Detail, ExResult};
use errors::kind;
use encoder_family::Family;
use generate::{ChatMessage, GenOptions, Generation, Prompt, Step};
use pooling::{After, PoolingConfig};
use prefix_cache::{PrefixCache, SavedKv};
use tokenizer::{EncoderTokenizer, LmTokenizer};

/// Which implementation runs a model. `:auto` is an Elixir-side policy (Burn, then Candle on
/// failure) and never reaches Rust.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "nif", derive(rustler::NifUnitEnum))]
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
    /// Bytes a session's KV cache takes per token.
    fn kv_bytes_per_token(&self) -> usize;
    /// Runs each chunk on its session (sessions of this model), as `LmSession::forward` would
    /// alone: with the same logits bit for bit where each row's sums don't depend on the rows
    /// beside it (Burn's quantised host path, Candle's quantised products), within last bits
    /// elsewhere. An engine that runs them in one pass, reading each weight once for all their
    /// rows, overrides it; the default runs them in turn.
    fn forward_batch(&self, batch: &mut [Chunk]) -> Vec<ExResult<Vec<f32>>> {
        one_by_one(batch)
    }
    /// `forward_batch` for callers that sample chunk `i` greedily where `greedy[i]`: such a chunk
    /// may be answered with a position of its logits' maximum instead of the logits, which an
    /// engine whose logits lie on a GPU takes there, so only the ids are read back.
    fn forward_batch_next(&self, batch: &mut [Chunk], greedy: &[bool]) -> Vec<ExResult<Next>> {
        debug_assert_eq!(batch.len(), greedy.len());
        self.forward_batch(batch).into_iter().map(|r| r.map(Next::Logits)).collect()
    }
    /// A copy of the first `len` rows of `session`'s cache, to start other sessions from
    /// (`prefix_cache`); `None` where the engine keeps no such copy.
    fn save_prefix(&self, _session: &mut dyn LmSession, _len: usize) -> Option<SavedKv> {
        None
    }
    /// A new session whose cache holds the first `len` rows of `saved` (from `save_prefix`).
    fn session_from(&self, _saved: &(dyn std::any::Any + Send + Sync), _len: usize) -> Option<Box<dyn LmSession>> {
        None
    }
}

/// What `forward_batch_next` answers for a chunk: its last position's logits, or, for a greedy
/// chunk, the token they pick.
#[derive(Clone, Debug, PartialEq)]
pub enum Next {
    Logits(Vec<f32>),
    Token(u32),
}

impl Next {
    /// The logits of an answer to a chunk that did not ask for its token.
    pub(crate) fn into_logits(self) -> Vec<f32> {
        match self {
            Next::Logits(logits) => logits,
            Next::Token(_) => unreachable!("a token answered a chunk that asked for logits"),
        }
    }
}

/// Tokens for one session in a `forward_batch`, at positions `pos..pos + tokens.len()`.
pub struct Chunk<'a> {
    pub session: &'a mut dyn LmSession,
    pub tokens: &'a [u32],
    pub pos: usize,
}

/// `forward_batch` for an engine whose sessions are `S`: the chunks of this model's sessions
/// (`mine`) that pass `check` go to `run` together, with their places in `batch`, and `run`
/// answers each in order; a refused chunk gets its error, and a session of another model an
/// error too.
pub(crate) fn own_chunks<'a, S: LmSession, T>(
    batch: &'a mut [Chunk],
    mine: impl Fn(&S) -> bool,
    check: impl Fn(&S, &[u32], usize) -> ExResult<()>,
    run: impl FnOnce(Vec<(&'a mut S, &'a [u32], usize)>, &[usize]) -> Vec<ExResult<T>>,
) -> Vec<ExResult<T>> {
    let mut out: Vec<Option<ExResult<T>>> = Vec::with_capacity(batch.len());
    let (mut index, mut ours) = (Vec::new(), Vec::new());
    for (i, c) in batch.iter_mut().enumerate() {
        let any: &mut dyn std::any::Any = &mut *c.session;
        match any.downcast_mut::<S>() {
            Some(s) if mine(s) => match check(s, c.tokens, c.pos) {
                Ok(()) => {
                    index.push(i);
                    ours.push((s, c.tokens, c.pos));
                    out.push(None);
                }
                Err(e) => out.push(Some(Err(e))),
            },
            _ => out.push(Some(Err(crate::error::ExError::invalid("forward_batch: a session of another model")))),
        }
    }
    let answers = run(ours, &index);
    for (i, r) in index.into_iter().zip(answers) {
        out[i] = Some(r);
    }
    out.into_iter().map(|r| r.expect("every chunk answered")).collect()
}

/// `forward_batch` one chunk at a time.
pub fn one_by_one(batch: &mut [Chunk]) -> Vec<ExResult<Vec<f32>>> {
    batch.iter_mut().map(|c| c.session.forward(c.tokens, c.pos)).collect()
}

/// `Any` lets an engine's `forward_batch` reach its own sessions' caches.
pub trait LmSession: Send + std::any::Any {
    /// Runs `tokens` at positions `pos..pos + tokens.len()`, appending them to the KV cache, and
    /// returns the logits (`vocab_size` values) of the last one. `pos` is the number of tokens
    /// already in the cache; a session is fed strictly in order.
    fn forward(&mut self, tokens: &[u32], pos: usize) -> ExResult<Vec<f32>>;
    /// `forward` for a caller that samples greedily when `greedy`: it may be answered with the
    /// token the logits pick instead (`CausalLm::forward_batch_next`).
    fn forward_next(&mut self, tokens: &[u32], pos: usize, _greedy: bool) -> ExResult<Next> {
        self.forward(tokens, pos).map(Next::Logits)
    }
    /// Sets aside cache room for `tokens` tokens in all, so the cache never grows past what a
    /// memory budget reserved for it (a growing buffer would double): Burn's host buffers and
    /// its tensor path's pool pages, Candle's cache buffers.
    fn reserve(&mut self, _tokens: usize) {}
}

/// Texts per encoder call: bounds memory and the padding one long text imposes on the others.
const EMBED_CHUNK: usize = 32;

fn empty_input(what: &str) -> crate::error::ExError {
    errors::err(kind::EMPTY_INPUT, format!("{what}: the list of texts is empty"), vec![])
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> ExResult<T> {
    let text = std::fs::read_to_string(path).map_err(|e| errors::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| errors::bad_config(path, e))
}

#[derive(Deserialize)]
struct StModule {
    #[serde(default)]
    path: String,
    #[serde(rename = "type")]
    ty: String,
}

/// The longest input, as sentence-transformers takes it: `sentence_bert_config.json`'s
/// `max_seq_length` (before version 6) or `tokenizer_config.json`'s `model_max_length`, capped at
/// what the position table holds; that alone when neither says.
pub fn max_seq_len(dir: &Path, config: &serde_json::Value, family: Family) -> ExResult<usize> {
    let int = |v: &serde_json::Value, key: &str| v.get(key).and_then(|x| x.as_u64()).map(|x| x as usize);
    let positions = int(config, "max_position_embeddings")
        .map(|p| family.max_tokens(p, int(config, "pad_token_id").unwrap_or(0) as u32));
    let mut declared = None;
    for (file, key) in [("sentence_bert_config.json", "max_seq_length"), ("tokenizer_config.json", "model_max_length")] {
        let path = dir.join(file);
        if declared.is_none() && path.is_file() {
            // tokenizers without a limit say model_max_length = 1e30
            declared = int(&read_json::<serde_json::Value>(&path)?, key).filter(|&n| n > 0 && n < 1 << 24);
        }
    }
    Ok(match (declared, positions) {
        (Some(s), Some(p)) => s.min(p),
        (Some(s), None) => s,
        (None, Some(p)) => p,
        (None, None) => 512,
    })
}

/// A sentence-transformers model: encoder, pooling, then `Dense` and `Normalize` modules.
pub struct EmbeddingModel {
    pub encoder: Box<dyn Encoder>,
    pub tokenizer: EncoderTokenizer,
    pub pooling: PoolingConfig,
    pub after: Vec<After>,
    /// The last module normalises (vectors have unit length).
    pub normalize: bool,
    dim: usize,
    pub max_seq_len: usize,
    pub engine: Engine,
    pub device: DeviceRef,
    pub name: String,
    pub arch: String,
    pub path: PathBuf,
}

impl EmbeddingModel {
    /// Loads a sentence-transformers directory: `config.json`, `model.safetensors`,
    /// `tokenizer.json`, and when present `modules.json`, `1_Pooling/config.json`,
    /// `sentence_bert_config.json`.
    pub fn load(dir: &Path, engine: Engine, device: DeviceRef) -> ExResult<Self> {
        if !dir.is_dir() {
            return Err(if dir.exists() {
                errors::err(kind::MISSING_FILE, format!("{} is not a model directory", dir.display()), vec![errors::path_detail(dir)])
            } else {
                errors::missing_file(dir)
            });
        }
        for f in ["config.json", "model.safetensors", "tokenizer.json"] {
            if !dir.join(f).is_file() {
                return Err(errors::missing_file(&dir.join(f)));
            }
        }
        let config: serde_json::Value = read_json(&dir.join("config.json"))?;
        // The architecture comes first, so an unknown one never reaches the weights.
        let family = Family::of_config(&config, &dir.join("config.json"))?;
        let arch = family.model_type().to_string();

        // modules.json: Transformer, Pooling, then Dense and Normalize in order; anything else
        // (a second Transformer, LayerNorm, …) would change the vectors.
        let mut pooling_dir = dir.join("1_Pooling");
        let mut after = Vec::new();
        let modules_path = dir.join("modules.json");
        if modules_path.is_file() {
            let modules: Vec<StModule> = read_json(&modules_path)?;
            for m in &modules {
                match m.ty.rsplit('.').next().unwrap_or("") {
                    "Transformer" => {}
                    "Pooling" => pooling_dir = dir.join(&m.path),
                    "Dense" => after.push(After::Dense(pooling::Dense::load(&dir.join(&m.path))?)),
                    "Normalize" => after.push(After::Normalize),
                    other => {
                        return Err(errors::err(
                            kind::UNSUPPORTED_MODULE,
                            format!("unsupported sentence-transformers module {other:?} in {}", modules_path.display()),
                            vec![("module", Detail::Text(m.ty.clone())), errors::path_detail(&modules_path)],
                        ))
                    }
                }
            }
        }
        let pooling_path = pooling_dir.join("config.json");
        let pooling = if pooling_path.is_file() { PoolingConfig::read(&pooling_path)? } else { PoolingConfig::default() };
        let hidden = config.get("hidden_size").and_then(|v| v.as_u64()).unwrap_or(0) as usize;
        let mut dim = pooling.modes() * hidden;
        for a in &after {
            if let After::Dense(d) = a {
                if d.in_features != dim {
                    return Err(errors::bad_config(&modules_path, format!("a Dense module takes {} values where the one before gives {dim}", d.in_features)));
                }
                dim = d.out_features;
            }
        }
        let normalize = matches!(after.last(), Some(After::Normalize));
        let max_seq_len = max_seq_len(dir, &config, family)?;
        files::check_safetensors(&dir.join("model.safetensors"))?;
        let tokenizer = EncoderTokenizer::from_file(&dir.join("tokenizer.json"), max_seq_len)?;
        let encoder = match engine {
            Engine::Burn => burn_bert::load(dir, &device)?,
            Engine::Candle => candle_bert::load(dir, &device)?,
        };
        crate::process::alloc::trim();
        let name = dir.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        Ok(EmbeddingModel { encoder, tokenizer, pooling, after, normalize, dim, max_seq_len, engine, device, name, arch, path: dir.to_path_buf() })
    }

    /// The length of each embedding.
    pub fn dim(&self) -> usize {
        self.dim
    }

    pub fn tokenize(&self, texts: &[String]) -> ExResult<Vec<Vec<u32>>> {
        if texts.is_empty() {
            return Err(empty_input("tokenize"));
        }
        self.tokenizer.tokenize(texts)
    }

    /// Each text's token ids (special tokens included, truncated) and embedding.
    pub fn embed(&self, texts: &[String]) -> ExResult<(Vec<Vec<u32>>, Vec<Vec<f32>>)> {
        if texts.is_empty() {
            return Err(empty_input("embed"));
        }
        let ids = self.tokenizer.tokenize(texts)?;
        let rows = self.embed_ids(&ids)?;
        Ok((ids, rows))
    }

    /// The embedding of each row of token ids (as `tokenize` returns them). Rows are grouped by
    /// length into chunks of `EMBED_CHUNK`, so a long text pads only its neighbours in length,
    /// and the embeddings come back in the rows' order.
    pub fn embed_ids(&self, ids: &[Vec<u32>]) -> ExResult<Vec<Vec<f32>>> {
        if ids.is_empty() {
            return Err(empty_input("embed"));
        }
        let mut order: Vec<usize> = (0..ids.len()).collect();
        order.sort_by_key(|&i| ids[i].len());
        let size = self.encoder.hidden_size();
        let mut rows = vec![Vec::new(); ids.len()];
        for chunk in order.chunks(EMBED_CHUNK) {
            let chunk_rows: Vec<&[u32]> = chunk.iter().map(|&i| ids[i].as_slice()).collect();
            let batch = self.tokenizer.batch_ids(&chunk_rows)?;
            let hidden = self.encoder.hidden_states(&batch)?;
            if hidden.len() != batch.batch * batch.seq * size {
                return Err(errors::engine(self.engine.name(), format!("encoder returned {} values for a [{}, {}, {size}] batch", hidden.len(), batch.batch, batch.seq)));
            }
            let pooled = self.pooling.pool(&hidden, &batch, size);
            for (&i, v) in chunk.iter().zip(pooled) {
                rows[i] = self.after.iter().fold(v, |v, m| m.apply(v));
            }
        }
        Ok(rows)
    }
}

/// A loaded LLM: weights (behind the engine), tokenizer and chat template.
pub struct TextModel {
    pub lm: Box<dyn CausalLm>,
    pub tokenizer: Arc<LmTokenizer>,
    pub chat_template: Option<String>,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    pub engine: Engine,
    pub device: DeviceRef,
    pub name: String,
    pub arch: String,
    pub path: PathBuf,
    /// Saved prompts, reused by later prompts that start the same way.
    pub prefixes: PrefixCache,
}

/// Bytes of saved prompt caches a model keeps for reuse, beside its generations' own caches.
const PREFIX_CACHE_BYTES: usize = 64 << 20;

/// The GGUF file `path` names: the file itself, or the only `.gguf` in a directory (one that is
/// not a Hugging Face model directory, `files::is_hf_dir`).
pub fn gguf_path(path: &Path) -> ExResult<PathBuf> {
    if path.is_file() {
        return Ok(path.to_path_buf());
    }
    if !path.exists() {
        return Err(errors::missing_file(path));
    }
    let found = files::gguf_files(path);
    match found.len() {
        1 => Ok(found[0].clone()),
        0 => Err(if path.join("model.safetensors").is_file() {
            errors::missing_file(&path.join("config.json"))
        } else {
            errors::err(kind::MISSING_FILE, format!("no .gguf file in {}", path.display()), vec![errors::path_detail(path)])
        }),
        n => Err(errors::err(
            kind::AMBIGUOUS_MODEL,
            format!("{} holds {n} .gguf files; name one", path.display()),
            vec![errors::path_detail(path), ("files", Detail::Text(found.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")))],
        )),
    }
}

impl TextModel {
    /// Loads an LLM: a `.gguf` file, a directory holding one, or a Hugging Face directory
    /// (config.json, safetensors weights, tokenizer.json).
    pub fn load(path: &Path, engine: Engine, device: DeviceRef) -> ExResult<Self> {
        // The architecture check comes first so an unknown model never reaches the tokenizer.
        let hf = files::is_hf_dir(path);
        let (file, arch, mut tokenizer, chat_template) = if hf {
            let arch = hf_decoder::peek(path)?;
            (path.to_path_buf(), arch.to_string(), LmTokenizer::from_hf_dir(path)?, hf_decoder::chat_template(path)?)
        } else {
            let file = gguf_path(path)?;
            let header = gguf::read_header(&file)?;
            let arch = header.architecture().unwrap_or("").to_string();
            if !candle_llama::ARCHITECTURES.contains(&arch.as_str()) {
                candle_llama::check_header(&header, candle_llama::ARCHITECTURES, &[])?;
            }
            let chat_template = header.str("tokenizer.chat_template").map(str::to_string);
            (file, arch, LmTokenizer::from_gguf(&header)?, chat_template)
        };
        let lm = match engine {
            Engine::Burn => burn_llama::load(&file, &device)?,
            Engine::Candle => candle_llama::load(&file, &device)?,
        };
        if hf {
            // an embedding padded past the tokenizer (Qwen's): those ids stand for no text
            tokenizer.cover(lm.vocab_size());
        }
        let tokenizer = Arc::new(tokenizer);
        crate::process::alloc::trim();
        let name = if path.is_dir() {
            path.file_name()
        } else {
            match file.parent() {
                Some(parent) if files::gguf_files(parent).len() == 1 && parent.file_name().is_some() => parent.file_name(),
                _ => file.file_stem(),
            }
        }
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
        Ok(TextModel {
            bos_token_id: tokenizer.bos,
            eos_token_ids: tokenizer.eog.clone(),
            lm,
            tokenizer,
            chat_template,
            engine,
            device,
            name,
            arch,
            path: file,
            prefixes: PrefixCache::new(PREFIX_CACHE_BYTES),
        })
    }

    pub fn vocab_size(&self) -> usize {
        self.lm.vocab_size()
    }

    pub fn context_length(&self) -> usize {
        self.lm.context_length()
    }

    pub fn kv_bytes_per_token(&self) -> usize {
        self.lm.kv_bytes_per_token()
    }

    /// The chat template applied to `messages`, with the generation prompt.
    pub fn render_chat(&self, messages: &[ChatMessage]) -> ExResult<String> {
        let template = self.chat_template.as_deref().ok_or_else(|| {
            errors::err(kind::NO_CHAT_TEMPLATE, format!("{} has no chat template (tokenizer.chat_template)", self.name), vec![errors::path_detail(&self.path)])
        })?;
        let text = |id: Option<u32>| id.and_then(|i| self.tokenizer.token_text(i)).unwrap_or_default();
        generate::render_chat(template, messages, &text(self.tokenizer.bos), &text(self.tokenizer.eos))
    }

    /// The prompt's token ids: raw text gets the model's BOS/EOS policy; a rendered chat is
    /// tokenised as is (its template writes any special tokens itself).
    pub fn prompt_ids(&self, prompt: &Prompt) -> ExResult<Vec<u32>> {
        match prompt {
            Prompt::Text(t) => self.tokenizer.encode(t, true),
            Prompt::Chat(messages) => self.tokenizer.encode(&self.render_chat(messages)?, false),
        }
    }

    /// Tokenises and checks the prompt, and opens a session; the model runs on the first `next`.
    /// A saved prompt that starts the same way gives the session its cache rows
    /// (`prefix_cache`).
    pub fn start(&self, prompt: &Prompt, opts: GenOptions) -> ExResult<Generation> {
        let ids = self.prompt_ids(prompt)?;
        generate::check_prompt(&ids, self.context_length(), self.tokenizer.vocab_size())?;
        let (session, cached) = match self.prefixes.session_for(&*self.lm, &ids)? {
            Some(found) => found,
            None => (self.lm.session()?, 0),
        };
        Generation::resume(session, cached, self.tokenizer.clone(), ids, self.context_length(), opts)
    }

    /// One step of each generation (all started from this model), run together; see
    /// `generate::step_batch`.
    /// A prompt completed in the step is saved for reuse.
    pub fn step(&self, gens: &mut [&mut Generation], chunks: &[usize]) -> Vec<ExResult<Step>> {
        let before: Vec<bool> = gens.iter().map(|g| g.prompt_done()).collect();
        let steps = generate::step_batch(&*self.lm, gens, chunks);
        for (g, was) in gens.iter_mut().zip(before) {
            if !was && g.prompt_done() {
                let (session, prompt) = g.session_and_prompt();
                self.prefixes.save(&*self.lm, session, prompt);
            }
        }
        steps
    }
}
