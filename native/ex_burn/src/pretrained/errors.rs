//! The typed errors of the pre-trained models layer.
//!
//! Every error is an `ExError::Invalid` whose details carry `kind: <atom>` (what went wrong, for
//! Elixir to match on) plus the facts behind it (path, counts, names), so a caller never has to
//! parse the message.

use std::path::Path;

use crate::error::{Detail, ExError};

/// The `kind` atoms this layer reports. One per distinct failure.
pub mod kind {
    pub const MISSING_FILE: &str = "missing_file";
    pub const NOT_FOUND: &str = "model_not_found";
    pub const IO: &str = "io_error";
    pub const CORRUPT_SAFETENSORS: &str = "corrupt_safetensors";
    pub const TRUNCATED_FILE: &str = "truncated_file";
    pub const NOT_GGUF: &str = "not_gguf";
    pub const CORRUPT_GGUF: &str = "corrupt_gguf";
    pub const BAD_CONFIG: &str = "bad_config";
    pub const BAD_REGISTRY: &str = "bad_registry";
    pub const BAD_TOKENIZER: &str = "bad_tokenizer";
    pub const UNKNOWN_ARCHITECTURE: &str = "unknown_architecture";
    pub const UNSUPPORTED_QUANTIZATION: &str = "unsupported_quantization";
    pub const UNSUPPORTED_TOKENIZER: &str = "unsupported_tokenizer";
    pub const UNSUPPORTED_MODULE: &str = "unsupported_module";
    pub const UNSUPPORTED_DEVICE: &str = "unsupported_device";
    pub const AMBIGUOUS_MODEL: &str = "ambiguous_model";
    pub const EMPTY_INPUT: &str = "empty_input";
    pub const EMPTY_PROMPT: &str = "empty_prompt";
    pub const PROMPT_TOO_LONG: &str = "prompt_too_long";
    pub const NO_CHAT_TEMPLATE: &str = "no_chat_template";
    pub const CHAT_TEMPLATE: &str = "chat_template_error";
    pub const TOKEN_OUT_OF_RANGE: &str = "token_out_of_range";
    pub const ENGINE: &str = "engine_error";
    /// A model feature one engine lacks (another engine may have it: `:auto` falls back).
    pub const UNSUPPORTED_FEATURE: &str = "unsupported_feature";
    pub const MISSING_TENSOR: &str = "missing_tensor";
    pub const TENSOR_MISMATCH: &str = "tensor_mismatch";
    pub const UNSUPPORTED_DTYPE: &str = "unsupported_dtype";
}

/// An error of `kind` with a message and further details.
pub fn err(kind: &'static str, reason: impl Into<String>, mut details: Vec<(&'static str, Detail)>) -> ExError {
    details.insert(0, ("kind", Detail::Atom(kind)));
    ExError::invalid_with(reason, details)
}

pub fn path_detail(path: &Path) -> (&'static str, Detail) {
    ("path", Detail::Text(path.display().to_string()))
}

pub fn missing_file(path: &Path) -> ExError {
    err(kind::MISSING_FILE, format!("file not found: {}", path.display()), vec![path_detail(path)])
}

/// An I/O error on `path`; a missing file gets its own kind.
pub fn io(path: &Path, e: std::io::Error) -> ExError {
    if e.kind() == std::io::ErrorKind::NotFound {
        return missing_file(path);
    }
    err(kind::IO, format!("cannot read {}: {e}", path.display()), vec![path_detail(path)])
}

pub fn bad_config(path: &Path, why: impl std::fmt::Display) -> ExError {
    err(kind::BAD_CONFIG, format!("invalid {}: {why}", path.display()), vec![path_detail(path), ("reason", Detail::Text(why.to_string()))])
}

pub fn truncated(path: &Path, expected: u64, actual: u64) -> ExError {
    err(
        kind::TRUNCATED_FILE,
        format!("{} is truncated: {expected} bytes expected, {actual} present", path.display()),
        vec![path_detail(path), ("expected_bytes", Detail::Int(expected as i128)), ("actual_bytes", Detail::Int(actual as i128))],
    )
}

/// A failure inside an engine (Candle) after the files were checked.
pub fn engine(engine: &'static str, what: impl std::fmt::Display) -> ExError {
    err(kind::ENGINE, format!("{engine}: {what}"), vec![("engine", Detail::Atom(engine))])
}

/// The `kind` atom of an error from this layer, if it has one (for tests).
pub fn kind_of(e: &ExError) -> Option<&'static str> {
    e.details().into_iter().find_map(|(k, v)| match (k, v) {
        ("kind", Detail::Atom(a)) => Some(a),
        _ => None,
    })
}

/// A feature of the model that `engine` does not implement.
pub fn unsupported(engine: &'static str, what: impl std::fmt::Display) -> ExError {
    err(kind::UNSUPPORTED_FEATURE, format!("{engine}: {what}"), vec![("engine", Detail::Atom(engine))])
}

/// A session's tokens given at `pos` where its cache holds `cached`: sessions take their tokens
/// in order, each step continuing where the cache ends.
pub fn out_of_order(cached: usize, pos: usize) -> ExError {
    ExError::invalid(format!("tokens must be fed in order: the cache holds {cached} tokens, got position {pos}"))
}
