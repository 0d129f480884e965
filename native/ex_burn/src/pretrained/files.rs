//! The models directory.
//!
//! ```text
//! <dir>/embeddings/<name>/     config.json + model.safetensors (+ tokenizer.json, modules.json, …)
//! <dir>/llm/<name>/            one .gguf file, or a Hugging Face directory: config.json,
//!                              model.safetensors (or shards and their index), tokenizer.json
//! <dir>/rerankers/<name>/      a cross-encoder: config.json + model.safetensors + tokenizer.json
//! <dir>/registry.json          optional: {"models": [{"name", "kind", "path", "description"}]}
//! ```
//!
//! Registry entries (path relative to `dir` or absolute) override scanned ones of the same name.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::errors::{self, kind};
use super::gguf;
use crate::error::{Detail, ExResult};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ModelKind {
    Embedding,
    Llm,
    Reranker,
}

impl ModelKind {
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Embedding => "embedding",
            ModelKind::Llm => "llm",
            ModelKind::Reranker => "reranker",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "embedding" => Some(ModelKind::Embedding),
            "llm" => Some(ModelKind::Llm),
            "reranker" => Some(ModelKind::Reranker),
            _ => None,
        }
    }

    /// The subdirectory scanned for models of this kind.
    pub fn subdir(self) -> &'static str {
        match self {
            ModelKind::Embedding => "embeddings",
            ModelKind::Llm => "llm",
            ModelKind::Reranker => "rerankers",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelFormat {
    Gguf,
    Safetensors,
}

impl ModelFormat {
    pub fn name(self) -> &'static str {
        match self {
            ModelFormat::Gguf => "gguf",
            ModelFormat::Safetensors => "safetensors",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelEntry {
    pub name: String,
    pub kind: ModelKind,
    /// A `.gguf` file, or the directory holding `model.safetensors`.
    pub path: PathBuf,
    pub format: ModelFormat,
    /// GGUF `general.architecture` or config.json `model_type`.
    pub arch: Option<String>,
    /// Size on disk: the GGUF file, or every file of the model directory.
    pub bytes: u64,
    pub description: Option<String>,
}

#[derive(Deserialize)]
struct Registry {
    #[serde(default)]
    models: Vec<RegistryEntry>,
}

#[derive(Deserialize)]
struct RegistryEntry {
    name: String,
    kind: String,
    path: String,
    #[serde(default)]
    description: Option<String>,
}

/// A Hugging Face model directory's config, its weights in one file, and the index of weights
/// in shards.
pub const HF_CONFIG: &str = "config.json";
pub const HF_SINGLE: &str = "model.safetensors";
pub const HF_INDEX: &str = "model.safetensors.index.json";

/// Whether `path` is a directory holding a Hugging Face model's config and safetensors weights
/// (in one file or in shards).
pub fn is_hf_dir(path: &Path) -> bool {
    path.is_dir() && path.join(HF_CONFIG).is_file() && (path.join(HF_SINGLE).is_file() || path.join(HF_INDEX).is_file())
}

fn is_gguf(p: &Path) -> bool {
    p.is_file() && p.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

/// The `.gguf` files directly in `dir`, sorted.
pub fn gguf_files(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir).map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| is_gguf(p)).collect()).unwrap_or_default();
    out.sort();
    out
}

fn dir_bytes(dir: &Path, depth: usize) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| {
                    let p = e.path();
                    match e.metadata() {
                        Ok(m) if m.is_file() => m.len(),
                        Ok(m) if m.is_dir() && depth > 0 => dir_bytes(&p, depth - 1),
                        _ => 0,
                    }
                })
                .sum()
        })
        .unwrap_or(0)
}

/// `model_type` of a config.json, if readable.
pub fn config_model_type(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v.get("model_type")?.as_str().map(str::to_string)
}

/// The GGUF file's `general.architecture`, read from its header only.
pub fn gguf_arch(path: &Path) -> Option<String> {
    gguf::read_header(path).ok()?.architecture().map(str::to_string)
}

/// What `path` holds, as a model of `kind` named `name`; `None` when it holds no model.
fn describe(name: String, kind: ModelKind, path: &Path, description: Option<String>) -> Vec<ModelEntry> {
    if is_gguf(path) {
        let bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        return vec![ModelEntry { name, kind, path: path.to_path_buf(), format: ModelFormat::Gguf, arch: gguf_arch(path), bytes, description }];
    }
    if !path.is_dir() {
        return vec![];
    }
    if path.join(HF_SINGLE).is_file() || is_hf_dir(path) {
        return vec![ModelEntry {
            name,
            kind,
            path: path.to_path_buf(),
            format: ModelFormat::Safetensors,
            arch: config_model_type(path),
            bytes: dir_bytes(path, 2),
            description,
        }];
    }
    let ggufs = gguf_files(path);
    match ggufs.len() {
        0 => vec![],
        1 => describe(name, kind, &ggufs[0], description),
        // Several quantisations of one model: one entry each, `<name>/<file stem>`.
        _ => ggufs
            .iter()
            .flat_map(|g| {
                let stem = g.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
                describe(format!("{name}/{stem}"), kind, g, description.clone())
            })
            .collect(),
    }
}

fn scan(dir: &Path, kind: ModelKind) -> Vec<ModelEntry> {
    let sub = dir.join(kind.subdir());
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&sub).map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).collect()).unwrap_or_default();
    dirs.sort();
    dirs.into_iter()
        .flat_map(|p| {
            let name = p.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            let name = if is_gguf(&p) { p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or(name) } else { name };
            describe(name, kind, &p, None)
        })
        .collect()
}

/// Every model under `dir`, embeddings first, by name. A missing directory lists nothing.
pub fn list(dir: &Path) -> ExResult<Vec<ModelEntry>> {
    if !dir.is_dir() {
        return Ok(vec![]);
    }
    let mut entries: Vec<ModelEntry> =
        [ModelKind::Embedding, ModelKind::Llm, ModelKind::Reranker].into_iter().flat_map(|k| scan(dir, k)).collect();
    let registry = dir.join("registry.json");
    if registry.is_file() {
        let text = std::fs::read_to_string(&registry).map_err(|e| errors::io(&registry, e))?;
        let bad = |why: String| {
            errors::err(kind::BAD_REGISTRY, format!("invalid {}: {why}", registry.display()), vec![errors::path_detail(&registry), ("reason", Detail::Text(why))])
        };
        let reg: Registry = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        for r in reg.models {
            let kind = ModelKind::from_name(&r.kind).ok_or_else(|| bad(format!("model {:?}: kind must be \"embedding\", \"llm\" or \"reranker\", not {:?}", r.name, r.kind)))?;
            let path = if Path::new(&r.path).is_absolute() { PathBuf::from(&r.path) } else { dir.join(&r.path) };
            let mut found = describe(r.name.clone(), kind, &path, r.description.clone());
            // A registry entry always lists, even when its files are not there (yet).
            let entry = if found.len() == 1 {
                let mut e = found.remove(0);
                e.name = r.name.clone();
                e
            } else {
                let format = if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) || (kind == ModelKind::Llm && gguf_files(&path).len() > 1) {
                    ModelFormat::Gguf
                } else {
                    ModelFormat::Safetensors
                };
                ModelEntry { name: r.name.clone(), kind, path: path.clone(), format, arch: None, bytes: 0, description: r.description.clone() }
            };
            entries.retain(|e| e.name != entry.name);
            entries.push(entry);
        }
    }
    entries.sort_by(|a, b| (a.kind, &a.name).cmp(&(b.kind, &b.name)));
    Ok(entries)
}

/// A model to load: `name_or_path` when that path exists, else the model of that name and kind
/// under `dir`.
pub fn resolve(dir: &Path, name_or_path: &str, kind: ModelKind) -> ExResult<PathBuf> {
    let p = Path::new(name_or_path);
    if p.exists() {
        return Ok(p.to_path_buf());
    }
    let entries = list(dir)?;
    if let Some(e) = entries.iter().find(|e| e.kind == kind && e.name == name_or_path) {
        return Ok(e.path.clone());
    }
    let known: Vec<&str> = entries.iter().filter(|e| e.kind == kind).map(|e| e.name.as_str()).collect();
    Err(errors::err(
        kind::NOT_FOUND,
        format!("no {} model {name_or_path:?} in {} (known: {})", kind.name(), dir.display(), known.join(", ")),
        vec![("name", Detail::Text(name_or_path.to_string())), ("model_kind", Detail::Atom(kind.name())), errors::path_detail(dir)],
    ))
}

/// Checks that `path` is a complete safetensors file (header parses, offsets cover the data
/// exactly) without reading tensor data: `missing_file`, `truncated_file` or `corrupt_safetensors`.
pub fn check_safetensors(path: &Path) -> ExResult<()> {
    use safetensors::SafeTensorError as E;
    let file = std::fs::File::open(path).map_err(|e| errors::io(path, e))?;
    // SAFETY: read-only map, read only during this call.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| errors::io(path, e))?;
    let corrupt = |why: String| {
        errors::err(
            kind::CORRUPT_SAFETENSORS,
            format!("corrupt safetensors file {}: {why}", path.display()),
            vec![errors::path_detail(path), ("reason", Detail::Text(why))],
        )
    };
    let size = map.len() as u64;
    let header_len = map.get(..8).map(|b| u64::from_le_bytes(b.try_into().unwrap()));
    match safetensors::SafeTensors::read_metadata(&map) {
        Ok(_) => Ok(()),
        Err(E::HeaderTooSmall) => Err(errors::truncated(path, 8, size)),
        Err(E::InvalidHeaderLength) if header_len.is_some_and(|n| n < 100_000_000) => Err(errors::truncated(path, 8 + header_len.unwrap(), size)),
        Err(E::MetadataIncompleteBuffer) => {
            // The header parsed: the data's end is the largest end offset it declares.
            let n = header_len.unwrap_or(0) as usize;
            let header: serde_json::Value = serde_json::from_slice(&map[8..8 + n]).map_err(|e| corrupt(e.to_string()))?;
            let end = header
                .as_object()
                .map(|o| o.values().filter_map(|t| t.get("data_offsets")?.get(1)?.as_u64()).max().unwrap_or(0))
                .unwrap_or(0);
            let expected = 8 + n as u64 + end;
            if expected > size {
                Err(errors::truncated(path, expected, size))
            } else {
                Err(corrupt(format!("{} bytes after the last tensor", size - expected)))
            }
        }
        Err(e) => Err(corrupt(format!("{e:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pretrained::gguf::tests::{temp_dir, write_gguf};
    use crate::pretrained::gguf::Value;

    #[test]
    fn scans_layout_and_registry() {
        let dir = temp_dir("files-list");
        let emb = dir.join("embeddings/mini");
        std::fs::create_dir_all(&emb).unwrap();
        std::fs::write(emb.join("config.json"), r#"{"model_type": "bert"}"#).unwrap();
        std::fs::write(emb.join("model.safetensors"), [0u8; 10]).unwrap();
        let llm = dir.join("llm/tiny");
        std::fs::create_dir_all(&llm).unwrap();
        write_gguf(&llm.join("tiny.Q4_0.gguf"), &[("general.architecture", Value::Str("llama".into()))], &[]);
        let multi = dir.join("llm/multi");
        std::fs::create_dir_all(&multi).unwrap();
        write_gguf(&multi.join("a.gguf"), &[("general.architecture", Value::Str("qwen2".into()))], &[]);
        write_gguf(&multi.join("b.gguf"), &[], &[]);
        std::fs::create_dir_all(dir.join("llm/empty")).unwrap();

        let entries = list(&dir).unwrap();
        let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, vec!["mini", "multi/a", "multi/b", "tiny"]);
        assert_eq!(entries[0].kind, ModelKind::Embedding);
        assert_eq!(entries[0].format, ModelFormat::Safetensors);
        assert_eq!(entries[0].arch.as_deref(), Some("bert"));
        assert_eq!(entries[0].bytes, 10 + 22);
        assert_eq!(entries[1].arch.as_deref(), Some("qwen2"));
        assert_eq!(entries[2].arch, None);
        assert_eq!(entries[3].format, ModelFormat::Gguf);
        assert_eq!(entries[3].path, llm.join("tiny.Q4_0.gguf"));
        assert_eq!(entries[3].arch.as_deref(), Some("llama"));

        // Registry: overrides "tiny" by name, adds an absolute-path entry.
        let elsewhere = temp_dir("files-elsewhere");
        write_gguf(&elsewhere.join("x.gguf"), &[("general.architecture", Value::Str("llama".into()))], &[]);
        std::fs::write(
            dir.join("registry.json"),
            format!(
                r#"{{"models": [{{"name": "tiny", "kind": "llm", "path": "llm/multi/a.gguf", "description": "override"}},
                               {{"name": "abs", "kind": "llm", "path": {:?}}}]}}"#,
                elsewhere.join("x.gguf").display().to_string()
            ),
        )
        .unwrap();
        let entries = list(&dir).unwrap();
        let tiny = entries.iter().find(|e| e.name == "tiny").unwrap();
        assert_eq!(tiny.arch.as_deref(), Some("qwen2"));
        assert_eq!(tiny.description.as_deref(), Some("override"));
        assert!(entries.iter().any(|e| e.name == "abs" && e.arch.as_deref() == Some("llama")));

        assert_eq!(resolve(&dir, "tiny", ModelKind::Llm).unwrap(), dir.join("llm/multi/a.gguf"));
        assert_eq!(resolve(&dir, "mini", ModelKind::Embedding).unwrap(), emb);
        let p = emb.display().to_string();
        assert_eq!(resolve(&dir, &p, ModelKind::Llm).unwrap(), emb);
        let e = resolve(&dir, "mini", ModelKind::Llm).unwrap_err();
        assert_eq!(errors::kind_of(&e), Some(kind::NOT_FOUND));

        std::fs::write(dir.join("registry.json"), "{not json").unwrap();
        assert_eq!(errors::kind_of(&list(&dir).unwrap_err()), Some(kind::BAD_REGISTRY));
        assert!(list(&dir.join("does-not-exist")).unwrap().is_empty());
    }
}

#[cfg(test)]
mod safetensors_tests {
    use super::*;
    use crate::pretrained::gguf::tests::temp_dir;

    fn file(tensors: &str, data: usize) -> Vec<u8> {
        let mut out = (tensors.len() as u64).to_le_bytes().to_vec();
        out.extend(tensors.as_bytes());
        out.extend(vec![0u8; data]);
        out
    }

    #[test]
    fn safetensors_problems_are_distinct() {
        let dir = temp_dir("st-check");
        let p = dir.join("model.safetensors");
        let good = file(r#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#, 16);
        std::fs::write(&p, &good).unwrap();
        check_safetensors(&p).unwrap();
        std::fs::write(&p, &good[..good.len() - 5]).unwrap();
        let e = check_safetensors(&p).unwrap_err();
        assert_eq!(errors::kind_of(&e), Some(kind::TRUNCATED_FILE), "{e}");
        std::fs::write(&p, &good[..20]).unwrap();
        assert_eq!(errors::kind_of(&check_safetensors(&p).unwrap_err()), Some(kind::TRUNCATED_FILE));
        std::fs::write(&p, file(r#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]"#, 16)).unwrap();
        assert_eq!(errors::kind_of(&check_safetensors(&p).unwrap_err()), Some(kind::CORRUPT_SAFETENSORS));
        std::fs::write(&p, file(r#"{"w":{"dtype":"F32","shape":[5],"data_offsets":[0,16]}}"#, 16)).unwrap();
        assert_eq!(errors::kind_of(&check_safetensors(&p).unwrap_err()), Some(kind::CORRUPT_SAFETENSORS));
        std::fs::write(&p, [0xffu8; 16]).unwrap();
        assert_eq!(errors::kind_of(&check_safetensors(&p).unwrap_err()), Some(kind::CORRUPT_SAFETENSORS));
        assert_eq!(errors::kind_of(&check_safetensors(&dir.join("none")).unwrap_err()), Some(kind::MISSING_FILE));
    }
}
