//! Tokenizers: Hugging Face `tokenizers`, built from `tokenizer.json` (encoders, and LLMs in
//! Hugging Face directories) or from a GGUF file's metadata (LLMs in GGUF files).
//!
//! Both engines share these, so token ids never depend on the engine.

use std::collections::HashMap;
use std::path::Path;

use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PaddingDirection, PaddingParams, PaddingStrategy, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer, TruncationParams};

use super::errors::{self, kind};
use super::gguf::{Header, Value};
use super::TokenBatch;
use crate::error::{Detail, ExError, ExResult};

fn tokenizer_error(what: impl std::fmt::Display) -> ExError {
    errors::err(kind::BAD_TOKENIZER, format!("tokenizer: {what}"), vec![("reason", Detail::Text(what.to_string()))])
}

/// A BERT-family tokenizer as sentence-transformers runs it: `[CLS] … [SEP]`, truncated at the
/// model's `max_seq_length`, padded to the longest input of each batch.
pub struct EncoderTokenizer {
    tok: Tokenizer,
    pub max_len: usize,
}

impl EncoderTokenizer {
    /// Loads `tokenizer.json`, replacing its own truncation and padding settings (all-MiniLM's say
    /// truncate at 128 and pad to 128, which sentence-transformers does not use).
    pub fn from_file(path: &Path, max_len: usize) -> ExResult<Self> {
        if !path.is_file() {
            return Err(errors::missing_file(path));
        }
        let mut tok = Tokenizer::from_file(path).map_err(|e| errors::err(
            kind::BAD_TOKENIZER,
            format!("cannot load {}: {e}", path.display()),
            vec![errors::path_detail(path), ("reason", Detail::Text(e.to_string()))],
        ))?;
        let (pad_id, pad_token, pad_type_id) = match tok.get_padding() {
            Some(p) => (p.pad_id, p.pad_token.clone(), p.pad_type_id),
            None => match tok.token_to_id("[PAD]") {
                Some(id) => (id, "[PAD]".to_string(), 0),
                None => (0, tok.id_to_token(0).unwrap_or_default(), 0),
            },
        };
        tok.with_truncation(Some(TruncationParams { max_length: max_len, ..Default::default() })).map_err(tokenizer_error)?;
        tok.with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::BatchLongest,
            direction: PaddingDirection::Right,
            pad_to_multiple_of: None,
            pad_id,
            pad_type_id,
            pad_token,
        }));
        Ok(EncoderTokenizer { tok, max_len })
    }

    /// Tokenises `texts` as one padded batch; also returns each row's ids without padding.
    pub fn batch(&self, texts: &[String]) -> ExResult<(TokenBatch, Vec<Vec<u32>>)> {
        let inputs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let encodings = self.tok.encode_batch(inputs, true).map_err(tokenizer_error)?;
        let seq = encodings.iter().map(|e| e.get_ids().len()).max().unwrap_or(0);
        let mut batch = TokenBatch { batch: encodings.len(), seq, ..Default::default() };
        let mut rows = Vec::with_capacity(encodings.len());
        for e in &encodings {
            debug_assert_eq!(e.get_ids().len(), seq);
            batch.ids.extend_from_slice(e.get_ids());
            batch.type_ids.extend_from_slice(e.get_type_ids());
            batch.mask.extend_from_slice(e.get_attention_mask());
            rows.push(e.get_ids().iter().zip(e.get_attention_mask()).filter(|(_, m)| **m != 0).map(|(i, _)| *i).collect());
        }
        Ok((batch, rows))
    }

    /// Tokenises `(query, document)` pairs as one padded batch, as a cross-encoder reads them
    /// (`[CLS] q [SEP] d [SEP]`, or the tokenizer's own pair template, with its segment ids), the
    /// longer text truncated first when a pair is over `max_len`.
    pub fn pair_batch(&self, query: &str, documents: &[String]) -> ExResult<TokenBatch> {
        let inputs: Vec<tokenizers::EncodeInput> = documents.iter().map(|d| (query, d.as_str()).into()).collect();
        let encodings = self.tok.encode_batch(inputs, true).map_err(tokenizer_error)?;
        let seq = encodings.iter().map(|e| e.get_ids().len()).max().unwrap_or(0);
        let mut batch = TokenBatch { batch: encodings.len(), seq, ..Default::default() };
        for e in &encodings {
            batch.ids.extend_from_slice(e.get_ids());
            batch.type_ids.extend_from_slice(e.get_type_ids());
            batch.mask.extend_from_slice(e.get_attention_mask());
        }
        Ok(batch)
    }

    pub fn tokenize(&self, texts: &[String]) -> ExResult<Vec<Vec<u32>>> {
        Ok(self.batch(texts)?.1)
    }

    /// One padded batch of already tokenised rows (special tokens included), as `batch` builds
    /// it from texts: single-segment type ids, mask 1 on the tokens, the tokenizer's padding.
    /// Rows longer than `max_len` or ids outside the vocabulary are errors, not truncated or
    /// clamped: the caller gave ids this model never produces.
    pub fn batch_ids(&self, rows: &[&[u32]]) -> ExResult<TokenBatch> {
        let vocab = self.tok.get_vocab_size(true) as u32;
        let pad = self.tok.get_padding().map_or(0, |p| p.pad_id);
        let seq = rows.iter().map(|r| r.len()).max().unwrap_or(0);
        if seq > self.max_len {
            return Err(errors::err(
                kind::PROMPT_TOO_LONG,
                format!("a row has {seq} token ids; the model takes at most {}", self.max_len),
                vec![("tokens", Detail::Int(seq as i128)), ("max_seq_len", Detail::Int(self.max_len as i128))],
            ));
        }
        if let Some(&id) = rows.iter().flat_map(|r| r.iter()).find(|&&id| id >= vocab) {
            return Err(errors::err(
                kind::TOKEN_OUT_OF_RANGE,
                format!("token id {id} is outside the vocabulary (size {vocab})"),
                vec![("token_id", Detail::Int(id as i128)), ("vocab_size", Detail::Int(vocab as i128))],
            ));
        }
        if rows.iter().any(|r| r.is_empty()) {
            return Err(errors::err(kind::EMPTY_INPUT, "a row of token ids is empty", vec![]));
        }
        let mut batch = TokenBatch { batch: rows.len(), seq, ..Default::default() };
        for r in rows {
            let padding = seq - r.len();
            batch.ids.extend_from_slice(r);
            batch.ids.extend(std::iter::repeat_n(pad, padding));
            batch.type_ids.extend(std::iter::repeat_n(0, seq));
            batch.mask.extend(std::iter::repeat_n(1, r.len()));
            batch.mask.extend(std::iter::repeat_n(0, padding));
        }
        Ok(batch)
    }
}

/// GPT-2's byte-to-character table: printable bytes map to themselves, the others to code points
/// from U+0100 on, so every byte string is a string of "visible" characters.
fn bytes_to_unicode() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..=255u32 {
        let printable = (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        table[b as usize] = if printable {
            char::from_u32(b).unwrap()
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap()
        };
    }
    table
}

/// GGUF token types (`tokenizer.ggml.token_type`).
const TOKEN_UNKNOWN: i64 = 2;
const TOKEN_CONTROL: i64 = 3;
const TOKEN_USER_DEFINED: i64 = 4;
const TOKEN_BYTE: i64 = 6;

/// SentencePiece's stand-in for a space.
const SPM_SPACE: char = '\u{2581}';

/// The pre-tokenizer regexes llama.cpp uses for a `tokenizer.ggml.pre` value, as Split rules.
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The parts of a GGUF tokenizer, from metadata or built by hand in tests.
#[derive(Clone, Debug, Default)]
pub struct LmTokenizerSpec {
    /// `tokenizer.ggml.model`.
    pub model: String,
    /// `tokenizer.ggml.pre` (pre-tokenizer flavour); empty = GPT-2's.
    pub pre: String,
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores`: SentencePiece pieces' scores (the `llama` model).
    pub scores: Vec<f32>,
    pub merges: Vec<String>,
    pub token_types: Vec<i64>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// Further end-of-generation ids (eot, eom).
    pub extra_eos: Vec<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    pub add_space_prefix: bool,
}

impl LmTokenizerSpec {
    /// Token `i`'s GGUF type; normal (1) where the file lists none.
    fn token_type(&self, i: usize) -> i64 {
        self.token_types.get(i).copied().unwrap_or(1)
    }

    pub fn from_gguf(h: &Header) -> ExResult<Self> {
        let model = h.str("tokenizer.ggml.model").unwrap_or("").to_string();
        let strings = |key: &str| -> Vec<String> {
            h.get(key).and_then(Value::as_array).map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect()).unwrap_or_default()
        };
        let id = |key: &str| h.int(key).and_then(|v| u32::try_from(v).ok());
        let flag = |key: &str, default: bool| h.get(key).and_then(Value::as_bool).unwrap_or(default);
        let spec = LmTokenizerSpec {
            pre: h.str("tokenizer.ggml.pre").unwrap_or("").to_string(),
            tokens: strings("tokenizer.ggml.tokens"),
            scores: h.get("tokenizer.ggml.scores").and_then(Value::as_array).map(|a| a.iter().map(|v| v.as_f64().unwrap_or(0.0) as f32).collect()).unwrap_or_default(),
            merges: strings("tokenizer.ggml.merges"),
            token_types: h.get("tokenizer.ggml.token_type").and_then(Value::as_array).map(|a| a.iter().map(|v| v.as_i64().unwrap_or(1)).collect()).unwrap_or_default(),
            bos: id("tokenizer.ggml.bos_token_id"),
            eos: id("tokenizer.ggml.eos_token_id"),
            extra_eos: ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"].iter().filter_map(|k| id(k)).collect(),
            // Absent keys mean no (transformers' GGUF loader reads the same keys).
            add_bos: flag("tokenizer.ggml.add_bos_token", false),
            add_eos: flag("tokenizer.ggml.add_eos_token", false),
            // llama.cpp's default: SentencePiece vocabularies prefix a space
            add_space_prefix: flag("tokenizer.ggml.add_space_prefix", model == "llama"),
            model,
        };
        if spec.tokens.is_empty() && spec.model.is_empty() {
            return Err(errors::err(
                kind::UNSUPPORTED_TOKENIZER,
                format!("{} has no tokenizer in its metadata", h.path.display()),
                vec![errors::path_detail(&h.path), ("tokenizer", Detail::Text(String::new()))],
            ));
        }
        Ok(spec)
    }
}

/// A decoder-only model's tokenizer (GGUF `gpt2` byte-level BPE, or `llama` SentencePiece BPE),
/// with the byte string of every token so generated text can be streamed as exact UTF-8.
pub struct LmTokenizer {
    tok: Tokenizer,
    token_bytes: Vec<Vec<u8>>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// Every id that ends a generation: eos, eot/eom, and control tokens that close a turn.
    pub eog: Vec<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    special: Vec<bool>,
}

/// Control tokens llama.cpp also treats as end of generation.
const EOG_TEXTS: &[&str] = &["<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>", "<|end_of_text|>"];

impl LmTokenizer {
    pub fn from_gguf(h: &Header) -> ExResult<Self> {
        Self::from_spec(LmTokenizerSpec::from_gguf(h)?)
    }

    pub fn from_spec(spec: LmTokenizerSpec) -> ExResult<Self> {
        let n = spec.tokens.len();
        if n == 0 && matches!(spec.model.as_str(), "gpt2" | "llama") {
            return Err(tokenizer_error("the GGUF file lists no tokens"));
        }
        let ty = |i: usize| spec.token_type(i);
        let special: Vec<bool> = (0..n).map(|i| ty(i) == TOKEN_CONTROL || ty(i) == TOKEN_USER_DEFINED).collect();
        let (mut tok, token_bytes) = match spec.model.as_str() {
            "gpt2" => byte_level_bpe(&spec, &special)?,
            "llama" => sentencepiece_bpe(&spec, &special)?,
            other => {
                return Err(errors::err(
                    kind::UNSUPPORTED_TOKENIZER,
                    format!("unsupported GGUF tokenizer model {other:?} (supported: byte-level BPE, \"gpt2\", and SentencePiece BPE, \"llama\")"),
                    vec![("tokenizer", Detail::Text(other.to_string()))],
                ))
            }
        };
        let added: Vec<AddedToken> = (0..n)
            .filter(|&i| special[i])
            .map(|i| AddedToken::from(spec.tokens[i].clone(), ty(i) == TOKEN_CONTROL).normalized(false))
            .collect();
        if !added.is_empty() {
            tok.add_special_tokens(added).map_err(tokenizer_error)?;
        }
        let controls = spec.tokens.iter().enumerate().filter(|&(i, _)| ty(i) == TOKEN_CONTROL).map(|(i, t)| (i as u32, t.as_str()));
        let eog = end_of_generation(spec.eos.into_iter().chain(spec.extra_eos.iter().copied()), controls, n);
        Ok(LmTokenizer { tok, token_bytes, bos: spec.bos, eos: spec.eos, eog, add_bos: spec.add_bos, add_eos: spec.add_eos, special })
    }

    /// A Hugging Face directory's `tokenizer.json`, with the special tokens its
    /// `tokenizer_config.json`, `generation_config.json` and `config.json` name.
    pub fn from_hf_dir(dir: &Path) -> ExResult<Self> {
        let path = dir.join("tokenizer.json");
        if !path.is_file() {
            return Err(errors::missing_file(&path));
        }
        let tok = Tokenizer::from_file(&path).map_err(|e| tokenizer_error(format!("{}: {e}", path.display())))?;
        let added = tok.get_added_tokens_decoder();
        let decoder = serde_json::to_string(&tok.get_decoder()).unwrap_or_default();
        let byte_level = decoder.contains("\"ByteLevel\"");
        let byte_fallback = decoder.contains("\"ByteFallback\"");
        let n = tok.get_vocab_size(true).max(added.keys().map(|&i| i as usize + 1).max().unwrap_or(0));
        let inverse: HashMap<char, u8> = bytes_to_unicode().iter().enumerate().map(|(b, c)| (*c, b as u8)).collect();
        let mut special = vec![false; n];
        let mut token_bytes = Vec::with_capacity(n);
        for id in 0..n as u32 {
            if let Some(a) = added.get(&id) {
                special[id as usize] = true;
                token_bytes.push(a.content.as_bytes().to_vec());
                continue;
            }
            let Some(t) = tok.id_to_token(id) else {
                // a gap in the ids
                special[id as usize] = true;
                token_bytes.push(Vec::new());
                continue;
            };
            token_bytes.push(if byte_level {
                t.chars().flat_map(|c| match inverse.get(&c) {
                    Some(b) => vec![*b],
                    None => c.to_string().into_bytes(),
                }).collect()
            } else {
                match t.strip_prefix("<0x").and_then(|h| h.strip_suffix('>')).filter(|h| byte_fallback && h.len() == 2) {
                    Some(hex) => u8::from_str_radix(hex, 16).map(|b| vec![b]).unwrap_or_else(|_| t.clone().into_bytes()),
                    None => t.replace(SPM_SPACE, " ").into_bytes(),
                }
            });
        }
        let config = |file: &str| -> ExResult<serde_json::Value> {
            let p = dir.join(file);
            if !p.is_file() {
                return Ok(serde_json::Value::Null);
            }
            let text = std::fs::read_to_string(&p).map_err(|e| errors::io(&p, e))?;
            serde_json::from_str(&text).map_err(|e| errors::bad_config(&p, e))
        };
        let (tok_config, gen_config, model_config) = (config("tokenizer_config.json")?, config("generation_config.json")?, config("config.json")?);
        // `bos_token` is a string or an added token's {"content": …}
        let named = |key: &str| -> Option<u32> {
            let v = tok_config.get(key)?;
            tok.token_to_id(v.as_str().or_else(|| v.get("content")?.as_str())?)
        };
        let ids = |v: Option<&serde_json::Value>| -> Vec<u32> {
            match v {
                Some(serde_json::Value::Array(a)) => a.iter().filter_map(|x| x.as_u64()).map(|x| x as u32).collect(),
                Some(x) => x.as_u64().map(|x| x as u32).into_iter().collect(),
                None => vec![],
            }
        };
        let bos = named("bos_token").or_else(|| ids(model_config.get("bos_token_id")).first().copied());
        let eos = named("eos_token").or_else(|| ids(model_config.get("eos_token_id")).first().copied());
        // what the tokenizer's own post-processor adds around a text
        let (with, without) = (tok.encode("a", true).map_err(tokenizer_error)?, tok.encode("a", false).map_err(tokenizer_error)?);
        let (with, without) = (with.get_ids(), without.get_ids());
        let add_bos = bos.is_some_and(|b| with.first() == Some(&b) && without.first() != Some(&b));
        let add_eos = eos.is_some_and(|e| with.last() == Some(&e) && without.last() != Some(&e));
        let extra = ids(gen_config.get("eos_token_id")).into_iter().chain(ids(model_config.get("eos_token_id")));
        let controls = added.iter().filter(|(_, a)| a.special).map(|(&i, a)| (i, a.content.as_str()));
        let eog = end_of_generation(eos.into_iter().chain(extra), controls, n);
        Ok(LmTokenizer { tok, token_bytes, bos, eos, eog, add_bos, add_eos, special })
    }

    pub fn vocab_size(&self) -> usize {
        self.token_bytes.len()
    }

    /// Ids up to `rows` (a model's embedding rows, which may be padded past the tokenizer's
    /// vocabulary), those added standing for no text.
    pub fn cover(&mut self, rows: usize) {
        if rows > self.token_bytes.len() {
            self.token_bytes.resize(rows, Vec::new());
            self.special.resize(rows, true);
        }
    }

    /// Token ids of `text`; with `add_special`, the BOS/EOS the model's metadata asks for.
    pub fn encode(&self, text: &str, add_special: bool) -> ExResult<Vec<u32>> {
        let enc = self.tok.encode(text, false).map_err(tokenizer_error)?;
        let mut ids = Vec::with_capacity(enc.get_ids().len() + 2);
        if add_special && self.add_bos {
            ids.extend(self.bos);
        }
        ids.extend_from_slice(enc.get_ids());
        if add_special && self.add_eos {
            ids.extend(self.eos);
        }
        Ok(ids)
    }

    /// The bytes token `id` stands for (special tokens: their text).
    pub fn token_bytes(&self, id: u32) -> ExResult<&[u8]> {
        self.token_bytes.get(id as usize).map(Vec::as_slice).ok_or_else(|| {
            errors::err(
                kind::TOKEN_OUT_OF_RANGE,
                format!("token id {id} is outside the vocabulary ({} tokens)", self.token_bytes.len()),
                vec![("token_id", Detail::Int(id as i128)), ("vocab_size", Detail::Int(self.token_bytes.len() as i128))],
            )
        })
    }

    pub fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(false)
    }

    /// The text of `ids`, special tokens included; invalid UTF-8 becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> ExResult<String> {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(self.token_bytes(id)?);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The token's text (special tokens' names), for chat templates' `bos_token`/`eos_token`.
    pub fn token_text(&self, id: u32) -> Option<String> {
        self.token_bytes.get(id as usize).map(|b| String::from_utf8_lossy(b).into_owned())
    }
}

/// Every id that ends a generation: `ids` (eos and the others the model names), then the
/// control tokens whose text closes a turn, once each, below `n`.
fn end_of_generation<'a>(ids: impl IntoIterator<Item = u32>, controls: impl Iterator<Item = (u32, &'a str)>, n: usize) -> Vec<u32> {
    let mut eog: Vec<u32> = Vec::new();
    let mut controls: Vec<(u32, &str)> = controls.collect();
    controls.sort();
    let found = controls.into_iter().filter(|(_, t)| EOG_TEXTS.contains(t)).map(|(i, _)| i);
    for i in ids.into_iter().chain(found) {
        if (i as usize) < n && !eog.contains(&i) {
            eog.push(i);
        }
    }
    eog
}

/// A vocabulary as `tokenizers` takes it: as Python's dict(zip(tokens, ids)), a repeated token
/// string keeps its last id.
fn vocab(spec: &LmTokenizerSpec) -> tokenizers::models::bpe::Vocab {
    spec.tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect()
}

/// GPT-2's byte-level BPE with the file's merges and the pre-tokenizer `tokenizer.ggml.pre` names;
/// each token's bytes through GPT-2's byte-to-character table.
fn byte_level_bpe(spec: &LmTokenizerSpec, special: &[bool]) -> ExResult<(Tokenizer, Vec<Vec<u8>>)> {
    let merges: Vec<(String, String)> = spec
        .merges
        .iter()
        .map(|m| m.split_once(' ').map(|(a, b)| (a.to_string(), b.to_string())).ok_or_else(|| tokenizer_error(format!("malformed merge {m:?}"))))
        .collect::<ExResult<_>>()?;
    let bpe = BPE::builder().vocab_and_merges(vocab(spec), merges).build().map_err(tokenizer_error)?;
    let mut tok = Tokenizer::new(bpe);
    let byte_level = ByteLevel::new(spec.add_space_prefix, true, true);
    let pre: PreTokenizerWrapper = match spec.pre.as_str() {
        "llama3" | "llama-bpe" | "falcon3" | "pixtral" => split_then_bytes(LLAMA3_REGEX)?,
        "qwen2" | "deepseek-r1-qwen" => split_then_bytes(QWEN2_REGEX)?,
        // These split digits one by one before GPT-2's rules (llama.cpp's `\p{N}` rule).
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b" => {
            Sequence::new(vec![Digits::new(true).into(), byte_level.into()]).into()
        }
        _ => byte_level.into(),
    };
    tok.with_pre_tokenizer(Some(pre));
    tok.with_decoder(Some(ByteLevel::default()));
    let chars = bytes_to_unicode();
    let inverse: HashMap<char, u8> = chars.iter().enumerate().map(|(b, c)| (*c, b as u8)).collect();
    let token_bytes = spec
        .tokens
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if special[i] {
                return t.as_bytes().to_vec();
            }
            let mut out = Vec::with_capacity(t.len());
            for c in t.chars() {
                match inverse.get(&c) {
                    Some(b) => out.push(*b),
                    None => out.extend(c.to_string().as_bytes()),
                }
            }
            out
        })
        .collect();
    Ok((tok, token_bytes))
}

/// SentencePiece BPE (`llama`: Llama 2, Mistral, Phi-3, Gemma files), as llama.cpp tokenises
/// it: spaces become `▁`, a `▁` is prepended to the text and to the text after each control
/// token (`add_space_prefix`), the adjacent pair whose merged piece scores highest merges first,
/// and characters outside the vocabulary fall back to their `<0xNN>` byte pieces. Merges ranked
/// by the merged piece's score (then by its id and its parts' ids, as transformers' SentencePiece
/// conversion ranks them) give `tokenizers`' BPE that order.
fn sentencepiece_bpe(spec: &LmTokenizerSpec, special: &[bool]) -> ExResult<(Tokenizer, Vec<Vec<u8>>)> {
    use tokenizers::normalizers::{Prepend, Replace, Sequence as Normalizers};
    let ty = |i: usize| spec.token_type(i);
    let ids: HashMap<&str, u32> = spec.tokens.iter().enumerate().map(|(i, t)| (t.as_str(), i as u32)).collect();
    let mut ranked: Vec<(f32, usize, u32, u32)> = Vec::new();
    for (i, t) in spec.tokens.iter().enumerate().filter(|&(i, _)| !special[i] && ty(i) != TOKEN_BYTE) {
        let score = spec.scores.get(i).copied().unwrap_or(0.0);
        for (at, _) in t.char_indices().skip(1) {
            if let (Some(&l), Some(&r)) = (ids.get(&t[..at]), ids.get(&t[at..])) {
                ranked.push((score, i, l, r));
            }
        }
    }
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then((a.1, a.2, a.3).cmp(&(b.1, b.2, b.3))));
    let merges = ranked.iter().map(|&(_, _, l, r)| (spec.tokens[l as usize].clone(), spec.tokens[r as usize].clone())).collect();
    let mut bpe = BPE::builder().vocab_and_merges(vocab(spec), merges).byte_fallback(true);
    if let Some(unk) = (0..spec.tokens.len()).find(|&i| ty(i) == TOKEN_UNKNOWN) {
        bpe = bpe.unk_token(spec.tokens[unk].clone());
    }
    let mut tok = Tokenizer::new(bpe.build().map_err(tokenizer_error)?);
    let space = Replace::new(" ", SPM_SPACE.to_string()).map_err(tokenizer_error)?;
    tok.with_normalizer(Some(if spec.add_space_prefix {
        Normalizers::new(vec![Prepend::new(SPM_SPACE.to_string()).into(), space.into()])
    } else {
        Normalizers::new(vec![space.into()])
    }))
    .map_err(tokenizer_error)?;
    let token_bytes = spec
        .tokens
        .iter()
        .enumerate()
        .map(|(i, t)| match t.strip_prefix("<0x").and_then(|h| h.strip_suffix('>')).filter(|_| ty(i) == TOKEN_BYTE) {
            Some(hex) => u8::from_str_radix(hex, 16).map(|b| vec![b]).map_err(|_| tokenizer_error(format!("byte piece {t:?} is not <0xNN>"))),
            None if special[i] => Ok(t.as_bytes().to_vec()),
            None => Ok(t.replace(SPM_SPACE, " ").into_bytes()),
        })
        .collect::<ExResult<_>>()?;
    Ok((tok, token_bytes))
}

fn split_then_bytes(regex: &str) -> ExResult<PreTokenizerWrapper> {
    let split = Split::new(SplitPattern::Regex(regex.to_string()), SplitDelimiterBehavior::Isolated, false).map_err(tokenizer_error)?;
    Ok(Sequence::new(vec![split.into(), ByteLevel::new(false, true, false).into()]).into())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A byte-level BPE over all 256 bytes plus a few merges and two control tokens:
    /// ids 0..256 are the bytes (in GPT-2's character form), then merges' results, then
    /// `<|im_start|>` and `<|im_end|>`.
    pub fn tiny_spec() -> LmTokenizerSpec {
        let chars = bytes_to_unicode();
        let mut tokens: Vec<String> = chars.iter().map(|c| c.to_string()).collect();
        let merges = vec!["h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o"];
        for m in &merges {
            tokens.push(m.replace(' ', ""));
        }
        tokens.push("<|im_start|>".into());
        tokens.push("<|im_end|>".into());
        let n = tokens.len();
        let mut types = vec![1i64; n];
        types[n - 2] = 3;
        types[n - 1] = 3;
        LmTokenizerSpec {
            model: "gpt2".into(),
            tokens,
            merges: merges.into_iter().map(String::from).collect(),
            token_types: types,
            bos: Some(n as u32 - 2),
            eos: Some(n as u32 - 1),
            ..Default::default()
        }
    }

    pub fn tiny() -> LmTokenizer {
        LmTokenizer::from_spec(tiny_spec()).unwrap()
    }

    #[test]
    fn tiny_bpe_roundtrips_bytes_and_control_tokens() {
        let t = tiny();
        let ids = t.encode("hello wo<|im_end|>", false).unwrap();
        assert_eq!(t.token_text(ids[0]).unwrap(), "hello");
        assert_eq!(*ids.last().unwrap(), t.eos.unwrap());
        assert_eq!(t.decode(&ids).unwrap(), "hello wo<|im_end|>");
        let emoji = "é😀";
        let ids = t.encode(emoji, false).unwrap();
        assert_eq!(ids.len(), 6); // one token per byte
        assert_eq!(t.decode(&ids).unwrap(), emoji);
        assert!(t.eog.contains(&t.eos.unwrap()));
    }

    #[test]
    fn other_tokenizer_models_are_unsupported() {
        let spec = LmTokenizerSpec { model: "rwkv".into(), ..tiny_spec() };
        let e = LmTokenizer::from_spec(spec).err().unwrap();
        assert_eq!(errors::kind_of(&e), Some(kind::UNSUPPORTED_TOKENIZER));
    }
}
