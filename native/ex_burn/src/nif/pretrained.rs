//! Pre-trained model NIFs: the models directory, sentence embedders and LLM generation.
//!
//! Every error is `{:error, {op, reason, details}}` with `op` the NIF's name and, for failures of
//! the models layer, `details.kind` an atom naming the failure (see `pretrained::errors::kind`).

use std::panic::{RefUnwindSafe, UnwindSafe};
use std::path::Path;
use std::sync::{Arc, Mutex, TryLockError};

use rustler::{Atom, Encoder, Env, NifMap, ResourceArc, Term};

use super::resource::BinaryOut;
use super::{guard, strict, term};
use crate::device::DeviceRef;
use crate::error::{ExError, ExResult};
use crate::pretrained::generate::{GenOptions, Generation, Prompt, Step};
use crate::pretrained::pooling::After;
use crate::pretrained::rerank::Reranker;
use crate::pretrained::{files, EmbeddingModel, Engine, TextModel};

pub struct EmbedderRes(EmbeddingModel);
pub struct RerankerRes(Reranker);
pub struct LlmRes(Arc<TextModel>);
pub struct GenerationRes {
    gen: Mutex<Generation>,
    prompt: Vec<u32>,
    /// Keeps the model's tokenizer and weights alive as long as the generation.
    model: Arc<TextModel>,
}

// Models are read-only after loading; a generation is only touched under its lock and every
// step leaves it consistent (an unwind mid-step at worst loses that step's text).
impl UnwindSafe for EmbedderRes {}
impl UnwindSafe for RerankerRes {}
impl RefUnwindSafe for RerankerRes {}
impl RefUnwindSafe for EmbedderRes {}
impl UnwindSafe for LlmRes {}
impl RefUnwindSafe for LlmRes {}
impl UnwindSafe for GenerationRes {}
impl RefUnwindSafe for GenerationRes {}

#[rustler::resource_impl]
impl rustler::Resource for EmbedderRes {}
#[rustler::resource_impl]
impl rustler::Resource for RerankerRes {}
#[rustler::resource_impl]
impl rustler::Resource for LlmRes {}
#[rustler::resource_impl]
impl rustler::Resource for GenerationRes {}

fn atom<'a>(env: Env<'a>, name: &str) -> Term<'a> {
    Atom::from_str(env, name).expect("atom").encode(env)
}

fn nil<'a>(env: Env<'a>) -> Term<'a> {
    rustler::types::atom::nil().encode(env)
}

/// A map with atom keys.
fn map<'a>(env: Env<'a>, pairs: &[(&str, Term<'a>)]) -> Term<'a> {
    let keys: Vec<Term> = pairs.iter().map(|(k, _)| atom(env, k)).collect();
    let values: Vec<Term> = pairs.iter().map(|(_, v)| *v).collect();
    Term::map_from_term_arrays(env, &keys, &values).expect("map with distinct keys")
}

fn opt_text<'a>(env: Env<'a>, s: Option<&str>) -> Term<'a> {
    s.map_or_else(|| nil(env), |s| s.encode(env))
}

fn string(t: Term, name: &'static str) -> ExResult<String> {
    t.decode::<String>().map_err(|_| ExError::Arg { name, expected: "a UTF-8 binary" })
}

fn strings(t: Term, name: &'static str) -> ExResult<Vec<String>> {
    t.decode::<Vec<String>>().map_err(|_| ExError::Arg { name, expected: "a list of UTF-8 binaries" })
}

fn ids(t: Term, name: &'static str) -> ExResult<Vec<u32>> {
    t.decode::<Vec<u32>>().map_err(|_| ExError::Arg { name, expected: "a list of token ids (non-negative integers)" })
}

/// How `embedder_load` and `llm_load` load a model: `:auto` and the models directory are
/// Elixir's (`ExBurn.Pretrained`), so only a concrete engine and device arrive here.
#[derive(NifMap)]
struct LoadOptions {
    engine: Engine,
    device: DeviceRef,
}

fn embedder(t: Term) -> ExResult<ResourceArc<EmbedderRes>> {
    t.decode().map_err(|_| ExError::Arg { name: "embedder", expected: "an ExBurn embedder reference" })
}

fn llm(t: Term) -> ExResult<ResourceArc<LlmRes>> {
    t.decode().map_err(|_| ExError::Arg { name: "llm", expected: "an ExBurn LLM reference" })
}

fn generation(t: Term) -> ExResult<ResourceArc<GenerationRes>> {
    t.decode().map_err(|_| ExError::Arg { name: "generation", expected: "an ExBurn generation reference" })
}

#[rustler::nif(schedule = "DirtyCpu")]
fn pretrained_list<'a>(env: Env<'a>, dir: Term<'a>) -> Term<'a> {
    guard(env, "pretrained_list", || {
        let dir = string(dir, "dir")?;
        let entries = files::list(Path::new(&dir))?;
        Ok(entries
            .iter()
            .map(|e| {
                map(
                    env,
                    &[
                        ("name", e.name.encode(env)),
                        ("kind", atom(env, e.kind.name())),
                        ("path", e.path.display().to_string().encode(env)),
                        ("format", atom(env, e.format.name())),
                        ("arch", opt_text(env, e.arch.as_deref())),
                        ("bytes", e.bytes.encode(env)),
                        ("description", opt_text(env, e.description.as_deref())),
                    ],
                )
            })
            .collect::<Vec<_>>())
    })
}

#[rustler::nif(schedule = "DirtyCpu")]
fn embedder_load<'a>(env: Env<'a>, path: Term<'a>, opts: Term<'a>) -> Term<'a> {
    guard(env, "embedder_load", || {
        let path = string(path, "path")?;
        let LoadOptions { engine, device } = strict::decode(opts, "opts")?;
        let model = EmbeddingModel::load(Path::new(&path), engine, device)?;
        Ok(ResourceArc::new(EmbedderRes(model)))
    })
}

#[rustler::nif]
fn embedder_info<'a>(env: Env<'a>, m: Term<'a>) -> Term<'a> {
    guard(env, "embedder_info", || {
        let m = embedder(m)?;
        let m = &m.0;
        let pooling: Vec<Term> = m.pooling.modes.iter().map(|p| atom(env, p.name())).collect();
        let modules: Vec<Term> = m
            .after
            .iter()
            .map(|a| match a {
                After::Dense(d) => map(env, &[("type", atom(env, "dense")), ("in", d.in_features.encode(env)), ("out", d.out_features.encode(env))]),
                After::Normalize => map(env, &[("type", atom(env, "normalize"))]),
            })
            .collect();
        Ok(map(
            env,
            &[
                ("name", m.name.encode(env)),
                ("dim", m.dim().encode(env)),
                ("max_seq_len", m.max_seq_len.encode(env)),
                ("normalize", m.normalize.encode(env)),
                ("pooling", pooling.encode(env)),
                ("modules", modules.encode(env)),
                ("engine", atom(env, m.engine.name())),
                ("device", term::device(env, m.device)),
                ("arch", m.arch.encode(env)),
                ("path", m.path.display().to_string().encode(env)),
            ],
        ))
    })
}

#[rustler::nif(schedule = "DirtyCpu")]
fn embedder_tokenize<'a>(env: Env<'a>, m: Term<'a>, texts: Term<'a>) -> Term<'a> {
    guard(env, "embedder_tokenize", || embedder(m)?.0.tokenize(&strings(texts, "texts")?))
}

/// The rows as one native-endian f32 binary, row after row.
fn rows_binary(rows: &[Vec<f32>]) -> BinaryOut {
    let bytes: Vec<u8> = rows.iter().flatten().flat_map(|x| x.to_ne_bytes()).collect();
    BinaryOut::new(&bytes)
}

#[rustler::nif(schedule = "DirtyCpu")]
fn embedder_embed<'a>(env: Env<'a>, m: Term<'a>, texts: Term<'a>) -> Term<'a> {
    guard(env, "embedder_embed", || {
        let m = embedder(m)?;
        let (token_ids, rows) = m.0.embed(&strings(texts, "texts")?)?;
        Ok((token_ids, rows_binary(&rows), m.0.dim()).encode(env))
    })
}

/// Embeds rows of token ids (as `embedder_tokenize` returns them): the path of callers that
/// tokenise on their own side (`Nx.Serving`'s client preprocessing).
#[rustler::nif(schedule = "DirtyCpu")]
fn embedder_embed_ids<'a>(env: Env<'a>, m: Term<'a>, rows: Term<'a>) -> Term<'a> {
    guard(env, "embedder_embed_ids", || {
        let m = embedder(m)?;
        let items: Vec<Term> = rows.decode().map_err(|_| ExError::Arg { name: "ids", expected: "a list of lists of token ids" })?;
        let ids = items.into_iter().map(|r| ids(r, "ids")).collect::<ExResult<Vec<_>>>()?;
        Ok((rows_binary(&m.0.embed_ids(&ids)?), m.0.dim()).encode(env))
    })
}

fn reranker(t: Term) -> ExResult<ResourceArc<RerankerRes>> {
    t.decode().map_err(|_| ExError::Arg { name: "reranker", expected: "an ExBurn reranker reference" })
}

#[rustler::nif(schedule = "DirtyCpu")]
fn reranker_load<'a>(env: Env<'a>, path: Term<'a>, opts: Term<'a>) -> Term<'a> {
    guard(env, "reranker_load", || {
        let path = string(path, "path")?;
        let LoadOptions { engine, device } = strict::decode(opts, "opts")?;
        Ok(ResourceArc::new(RerankerRes(Reranker::load(Path::new(&path), engine, device)?)))
    })
}

#[rustler::nif]
fn reranker_info<'a>(env: Env<'a>, m: Term<'a>) -> Term<'a> {
    guard(env, "reranker_info", || {
        let m = reranker(m)?;
        let m = &m.0;
        Ok(map(
            env,
            &[
                ("name", m.name.encode(env)),
                ("max_seq_len", m.max_seq_len.encode(env)),
                ("activation", atom(env, m.activation.name())),
                ("engine", atom(env, m.engine.name())),
                ("device", term::device(env, m.device)),
                ("arch", m.arch.encode(env)),
                ("path", m.path.display().to_string().encode(env)),
            ],
        ))
    })
}

/// Scores each document against the query: `{scores, tokens}`, the scores in the documents'
/// order (the logits when `raw`) and the token count of all pairs.
#[rustler::nif(schedule = "DirtyCpu")]
fn reranker_score<'a>(env: Env<'a>, m: Term<'a>, query: Term<'a>, documents: Term<'a>, raw: Term<'a>) -> Term<'a> {
    guard(env, "reranker_score", || {
        let m = reranker(m)?;
        let (query, documents) = (string(query, "query")?, strings(documents, "documents")?);
        let raw: bool = raw.decode().map_err(|_| ExError::Arg { name: "raw", expected: "a boolean" })?;
        let scores = m.0.score(&query, &documents, raw)?;
        let tokens: usize = m.0.tokenize(&query, &documents)?.iter().map(Vec::len).sum();
        Ok((scores, tokens).encode(env))
    })
}

/// The device kinds the Candle engine runs on in this library (`:cpu` always).
#[rustler::nif]
fn candle_kinds(env: Env) -> Term {
    guard(env, "candle_kinds", || {
        let kinds: Vec<Term> = crate::pretrained::candle_device::kinds().into_iter().map(|k| atom(env, k.name())).collect();
        Ok(kinds)
    })
}

#[rustler::nif(schedule = "DirtyCpu")]
fn llm_load<'a>(env: Env<'a>, path: Term<'a>, opts: Term<'a>) -> Term<'a> {
    guard(env, "llm_load", || {
        let path = string(path, "path")?;
        let LoadOptions { engine, device } = strict::decode(opts, "opts")?;
        let model = TextModel::load(Path::new(&path), engine, device)?;
        Ok(ResourceArc::new(LlmRes(Arc::new(model))))
    })
}

#[rustler::nif]
fn llm_info<'a>(env: Env<'a>, m: Term<'a>) -> Term<'a> {
    guard(env, "llm_info", || {
        let m = llm(m)?;
        let m = &m.0;
        Ok(map(
            env,
            &[
                ("name", m.name.encode(env)),
                ("vocab_size", m.vocab_size().encode(env)),
                ("context_length", m.context_length().encode(env)),
                ("kv_bytes_per_token", m.kv_bytes_per_token().encode(env)),
                ("engine", atom(env, m.engine.name())),
                ("device", term::device(env, m.device)),
                ("arch", m.arch.encode(env)),
                ("chat_template", opt_text(env, m.chat_template.as_deref())),
                ("bos_token_id", m.bos_token_id.map_or_else(|| nil(env), |i| i.encode(env))),
                ("eos_token_ids", m.eos_token_ids.encode(env)),
                ("path", m.path.display().to_string().encode(env)),
            ],
        ))
    })
}

#[rustler::nif(schedule = "DirtyCpu")]
fn llm_tokenize<'a>(env: Env<'a>, m: Term<'a>, text: Term<'a>, add_special: Term<'a>) -> Term<'a> {
    guard(env, "llm_tokenize", || {
        let add = term::boolean(add_special, "add_special")?;
        llm(m)?.0.tokenizer.encode(&string(text, "text")?, add)
    })
}

#[rustler::nif(schedule = "DirtyCpu")]
fn llm_detokenize<'a>(env: Env<'a>, m: Term<'a>, token_ids: Term<'a>) -> Term<'a> {
    guard(env, "llm_detokenize", || llm(m)?.0.tokenizer.decode(&ids(token_ids, "ids")?))
}

#[rustler::nif(schedule = "DirtyCpu")]
fn llm_start<'a>(env: Env<'a>, m: Term<'a>, p: Term<'a>, opts: Term<'a>) -> Term<'a> {
    guard(env, "llm_start", || {
        let (prompt, opts): (Prompt, GenOptions) = (strict::decode(p, "prompt")?, strict::decode(opts, "opts")?);
        let m = llm(m)?;
        let gen = m.0.start(&prompt, opts)?;
        Ok(ResourceArc::new(GenerationRes { prompt: gen.prompt_ids().to_vec(), gen: Mutex::new(gen), model: m.0.clone() }))
    })
}

#[rustler::nif]
fn llm_prompt_ids<'a>(env: Env<'a>, g: Term<'a>) -> Term<'a> {
    guard(env, "llm_prompt_ids", || Ok(generation(g)?.prompt.clone()))
}

#[rustler::nif(schedule = "DirtyCpu")]
fn llm_next<'a>(env: Env<'a>, g: Term<'a>, max_steps: Term<'a>) -> Term<'a> {
    guard(env, "llm_next", || {
        let g = generation(g)?;
        let steps = term::usize_arg(max_steps, "max_steps").ok().filter(|n| *n > 0).ok_or(ExError::Arg { name: "max_steps", expected: "a positive integer" })?;
        // a dirty NIF keeps running after its caller is killed: stop generating then
        let alive = || unsafe { rustler::sys::enif_is_current_process_alive(env.as_c_arg()) != 0 };
        let step = g.gen.lock().unwrap_or_else(|e| e.into_inner()).next(steps, &alive)?;
        Ok(step_term(env, &step))
    })
}

/// One step of several generations of one model, run together (`TextModel::step`): a list of
/// each one's `{:ok, {status, text, ids, finish}}` or `{:error, {op, reason, details}}`.
/// `chunks` says how many prompt tokens each may run in this step.
#[rustler::nif(schedule = "DirtyCpu")]
fn llm_step<'a>(env: Env<'a>, gs: Term<'a>, chunks: Term<'a>) -> Term<'a> {
    guard(env, "llm_step", || {
        let gens: Vec<ResourceArc<GenerationRes>> =
            gs.decode().map_err(|_| ExError::Arg { name: "generations", expected: "a list of ExBurn generation references" })?;
        let chunks: Vec<usize> = chunks
            .decode::<Vec<usize>>()
            .ok()
            .filter(|c| c.len() == gens.len() && c.iter().all(|n| *n > 0))
            .ok_or(ExError::Arg { name: "chunks", expected: "a positive integer for each generation" })?;
        let Some(first) = gens.first() else { return Ok(Vec::<Term>::new()) };
        if gens.iter().any(|g| !Arc::ptr_eq(&g.model, &first.model)) {
            return Err(ExError::invalid("the generations of one step must come from the same model"));
        }
        let mut locked = Vec::with_capacity(gens.len());
        for g in &gens {
            match g.gen.try_lock() {
                Ok(l) => locked.push(l),
                Err(TryLockError::Poisoned(e)) => locked.push(e.into_inner()),
                // waiting could deadlock on a generation listed twice
                Err(TryLockError::WouldBlock) => return Err(ExError::invalid("a generation is listed twice, or is running in another call")),
            }
        }
        if unsafe { rustler::sys::enif_is_current_process_alive(env.as_c_arg()) } == 0 {
            return Err(ExError::Cancelled);
        }
        let mut refs: Vec<&mut Generation> = locked.iter_mut().map(|g| &mut **g).collect();
        let steps = first.model.step(&mut refs, &chunks);
        Ok(steps
            .iter()
            .map(|r| match r {
                Ok(step) => (rustler::types::atom::ok(), step_term(env, step)).encode(env),
                Err(e) => super::error_term(env, "llm_step", e),
            })
            .collect::<Vec<Term>>())
    })
}

fn step_term<'a>(env: Env<'a>, step: &Step) -> Term<'a> {
    let finish = step.finish.map_or_else(|| nil(env), |f| atom(env, f.name()));
    (atom(env, if step.done { "done" } else { "cont" }), step.text.as_str(), &step.ids, finish).encode(env)
}
