//! Text generation, independent of the engine: prompt rendering (chat templates), sampling, stop
//! rules and streamed text.
//!
//! A `Generation` owns one `LmSession` (the engine's KV cache) and is advanced in steps. Each step
//! returns only text that can no longer change: complete UTF-8 characters, minus any suffix that
//! could still grow into a stop string. The concatenation of every step's text is therefore the
//! same whatever the step sizes, and equals the text a single call would return.

use std::sync::Arc;

use candle_transformers::generation::{LogitsProcessor, Sampling};
use serde::Serialize;

use super::errors::{self, kind};
use super::tokenizer::LmTokenizer;
use super::{CausalLm, Chunk, LmSession, Next};
use crate::error::{Detail, ExError, ExResult};

/// Crosses the NIF as `{role, content}`, two binaries.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[cfg_attr(feature = "nif", derive(rustler::NifTuple))]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

/// Crosses the NIF as `{:text, binary}` or `{:chat, [{role, content}]}` (`ExBurn.LLM` builds it).
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "nif", derive(rustler::NifTaggedEnum))]
pub enum Prompt {
    Text(String),
    Chat(Vec<ChatMessage>),
}

/// How to generate. Every field is given: the user-visible defaults are `ExBurn.LLM`'s, filled in
/// Elixir before the NIF decodes this (rustler, `nif` feature), so there are none here.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "nif", derive(rustler::NifMap))]
pub struct GenOptions {
    pub max_tokens: usize,
    /// ≤ 0: greedy (argmax).
    pub temperature: f64,
    pub top_k: Option<usize>,
    pub top_p: Option<f64>,
    pub seed: u64,
    /// Generation stops before the first occurrence of any of these; empty strings are ignored.
    pub stop: Vec<String>,
    /// Ids that end the generation besides the model's end-of-generation ids (not emitted).
    pub stop_token_ids: Vec<u32>,
    /// The model's end-of-generation ids do not end it: it runs to `max_tokens` (or the context,
    /// a stop string or `stop_token_ids`), as llama.cpp's and vLLM's `ignore_eos`.
    pub ignore_eos: bool,
}

impl GenOptions {
    /// Greedy decoding of at most `max_tokens`, without stop rules: the deterministic baseline
    /// tests and benchmarks compare engines with.
    pub fn greedy(max_tokens: usize) -> Self {
        GenOptions { max_tokens, temperature: 0.0, top_k: None, top_p: None, seed: 0, stop: vec![], stop_token_ids: vec![], ignore_eos: false }
    }

    pub fn sampling(&self) -> Sampling {
        if self.temperature <= 0.0 || !self.temperature.is_finite() {
            return Sampling::ArgMax;
        }
        let temperature = self.temperature;
        let k = self.top_k.filter(|k| *k > 0);
        let p = self.top_p.filter(|p| *p > 0.0 && *p < 1.0);
        match (k, p) {
            (Some(1), _) => Sampling::ArgMax,
            (Some(k), Some(p)) => Sampling::TopKThenTopP { k, p, temperature },
            (Some(k), None) => Sampling::TopK { k, temperature },
            (None, Some(p)) => Sampling::TopP { p, temperature },
            (None, None) => Sampling::All { temperature },
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-generation id, a stop id or a stop string.
    Stop,
    /// `max_tokens`, or the model's context is full.
    Length,
}

impl Finish {
    pub fn name(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

/// What one call to `Generation::next` produced.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// Newly completed text (possibly empty).
    pub text: String,
    /// Tokens sampled in this call, without end-of-generation/stop ids.
    pub ids: Vec<u32>,
    pub done: bool,
    pub finish: Option<Finish>,
}

/// Renders `messages` with a Hugging Face chat template, as transformers does (Jinja with
/// `trim_blocks` and `lstrip_blocks`, Python string methods, `raise_exception`).
pub fn render_chat(template: &str, messages: &[ChatMessage], bos_token: &str, eos_token: &str) -> ExResult<String> {
    let fail = |e: minijinja::Error| {
        let mut why = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            why.push_str(&format!(": {s}"));
            src = s.source();
        }
        errors::err(kind::CHAT_TEMPLATE, format!("chat template: {why}"), vec![("reason", Detail::Text(why.clone()))])
    };
    let mut env = minijinja::Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> Result<String, minijinja::Error> {
        Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
    });
    env.add_template("chat", template).map_err(fail)?;
    let tmpl = env.get_template("chat").map_err(fail)?;
    tmpl.render(minijinja::context! {
        messages => messages,
        add_generation_prompt => true,
        bos_token => bos_token,
        eos_token => eos_token,
    })
    .map_err(fail)
}

/// Generated bytes turned into text that is released only once final.
#[derive(Debug, Default)]
pub struct StreamText {
    bytes: Vec<u8>,
    /// Bytes already decoded into `text`.
    decoded: usize,
    text: String,
    /// Bytes of `text` already handed out.
    emitted: usize,
    stops: Vec<String>,
    /// A stop string was found (`text` ends just before it) or the stream was flushed.
    done: bool,
}

impl StreamText {
    pub fn new(stops: &[String]) -> Self {
        StreamText { stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(), ..Default::default() }
    }

    /// Decodes what is complete; with `flush`, an incomplete trailing sequence becomes U+FFFD.
    /// The result equals `String::from_utf8_lossy` of all bytes, however they arrived.
    fn decode(&mut self, flush: bool) {
        while self.decoded < self.bytes.len() {
            let rest = &self.bytes[self.decoded..];
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    self.text.push_str(s);
                    self.decoded = self.bytes.len();
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    self.text.push_str(std::str::from_utf8(&rest[..valid]).expect("valid prefix"));
                    self.decoded += valid;
                    match e.error_len() {
                        Some(n) => {
                            self.text.push('\u{FFFD}');
                            self.decoded += n;
                        }
                        None if flush => {
                            self.text.push('\u{FFFD}');
                            self.decoded = self.bytes.len();
                        }
                        None => break,
                    }
                }
            }
        }
    }

    /// Cuts the text before the earliest stop string, if any appeared; true when one did.
    fn find_stop(&mut self) -> bool {
        let tail = &self.text[self.emitted..];
        if let Some(at) = self.stops.iter().filter_map(|s| tail.find(s.as_str())).min() {
            self.text.truncate(self.emitted + at);
            self.done = true;
            return true;
        }
        false
    }

    /// Appends a token's bytes; true when a stop string completed.
    pub fn push(&mut self, bytes: &[u8]) -> bool {
        if self.done {
            return true;
        }
        self.bytes.extend_from_slice(bytes);
        self.decode(false);
        self.find_stop()
    }

    /// The length of the longest suffix of the unreleased text that starts some stop string.
    fn held(&self) -> usize {
        let tail = &self.text.as_bytes()[self.emitted..];
        let longest = self.stops.iter().map(|s| s.len().saturating_sub(1)).max().unwrap_or(0).min(tail.len());
        (1..=longest)
            .rev()
            .find(|&k| {
                let start = self.text.len() - k;
                self.text.is_char_boundary(start) && self.stops.iter().any(|s| s.as_bytes().starts_with(&self.text.as_bytes()[start..]))
            })
            .unwrap_or(0)
    }

    /// Text that can no longer change, not handed out before.
    pub fn take_ready(&mut self) -> String {
        let end = if self.done { self.text.len() } else { self.text.len() - self.held() };
        let out = self.text[self.emitted..end].to_string();
        self.emitted = end;
        out
    }

    /// Ends the stream: everything left, incomplete bytes as U+FFFD.
    pub fn finish(&mut self) -> String {
        if !self.done {
            self.decode(true);
            self.find_stop();
            self.done = true;
        }
        self.take_ready()
    }
}

/// One generation in progress.
pub struct Generation {
    session: Box<dyn LmSession>,
    tokenizer: Arc<LmTokenizer>,
    prompt: Vec<u32>,
    context_length: usize,
    opts: GenOptions,
    sampler: LogitsProcessor,
    stop_ids: Vec<u32>,
    generated: Vec<u32>,
    text: StreamText,
    /// Logits of the last position (or the greedy token they pick), not yet sampled from.
    logits: Option<Next>,
    /// The last sampled token, not yet fed to the model.
    pending: Option<u32>,
    /// Tokens in the session's cache.
    pos: usize,
    /// Prompt tokens the session started with (a reused prefix).
    cached: usize,
    finish: Option<Finish>,
}

/// Checks a prompt against the model before anything runs.
pub fn check_prompt(prompt: &[u32], context_length: usize, vocab_size: usize) -> ExResult<()> {
    if prompt.is_empty() {
        return Err(errors::err(
            kind::EMPTY_PROMPT,
            "the prompt has no tokens",
            vec![("prompt_tokens", Detail::Int(0)), ("context_length", Detail::Int(context_length as i128))],
        ));
    }
    if prompt.len() >= context_length {
        return Err(errors::err(
            kind::PROMPT_TOO_LONG,
            format!("the prompt has {} tokens; the model's context holds {context_length} (prompt and generated tokens together)", prompt.len()),
            vec![("prompt_tokens", Detail::Int(prompt.len() as i128)), ("context_length", Detail::Int(context_length as i128))],
        ));
    }
    if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= vocab_size) {
        return Err(errors::err(
            kind::TOKEN_OUT_OF_RANGE,
            format!("token id {bad} is outside the vocabulary ({vocab_size} tokens)"),
            vec![("token_id", Detail::Int(bad as i128)), ("vocab_size", Detail::Int(vocab_size as i128))],
        ));
    }
    Ok(())
}

impl Generation {
    /// Prepares a generation; nothing runs until the first `next`.
    pub fn new(session: Box<dyn LmSession>, tokenizer: Arc<LmTokenizer>, prompt: Vec<u32>, context_length: usize, opts: GenOptions) -> ExResult<Self> {
        Self::resume(session, 0, tokenizer, prompt, context_length, opts)
    }

    /// Like `new`, for a session whose cache already holds the prompt's first `cached` tokens.
    pub fn resume(session: Box<dyn LmSession>, cached: usize, tokenizer: Arc<LmTokenizer>, prompt: Vec<u32>, context_length: usize, opts: GenOptions) -> ExResult<Self> {
        if cached >= prompt.len().max(1) {
            return Err(ExError::invalid("a resumed generation must have prompt tokens left to run"));
        }
        let mut session = session;
        // the most it can hold: what `ExBurn.LLM.Scheduler` reserves of its KV budget
        session.reserve((prompt.len() + opts.max_tokens).min(context_length));
        check_prompt(&prompt, context_length, tokenizer.vocab_size())?;
        let mut stop_ids = if opts.ignore_eos { Vec::new() } else { tokenizer.eog.clone() };
        stop_ids.extend(opts.stop_token_ids.iter().copied());
        let sampler = LogitsProcessor::from_sampling(opts.seed, opts.sampling());
        Ok(Generation {
            session,
            text: StreamText::new(&opts.stop),
            tokenizer,
            prompt,
            context_length,
            opts,
            sampler,
            stop_ids,
            generated: vec![],
            logits: None,
            pending: None,
            pos: cached,
            cached,
            finish: None,
        })
    }

    pub fn prompt_ids(&self) -> &[u32] {
        &self.prompt
    }

    pub fn generated_ids(&self) -> &[u32] {
        &self.generated
    }

    pub fn finish(&self) -> Option<Finish> {
        self.finish
    }

    /// Prompt tokens taken from a saved prefix rather than run.
    pub fn cached_tokens(&self) -> usize {
        self.cached
    }

    /// Whether the whole prompt is in the session's cache.
    pub fn prompt_done(&self) -> bool {
        self.pos >= self.prompt.len()
    }

    pub(super) fn session_and_prompt(&mut self) -> (&mut dyn LmSession, &[u32]) {
        (&mut *self.session, &self.prompt)
    }

    fn sample(&mut self, logits: Vec<f32>) -> ExResult<u32> {
        let n = logits.len();
        let t = candle_core::Tensor::from_vec(logits, n, &candle_core::Device::Cpu).map_err(|e| errors::engine("sampling", e))?;
        self.sampler.sample(&t).map_err(|e| errors::engine("sampling", e))
    }

    /// Runs the prompt (first call only), then samples up to `max_steps` tokens. `alive` is
    /// asked before every model call; when it says no, the generation stops with `Cancelled`.
    pub fn next(&mut self, max_steps: usize, alive: &dyn Fn() -> bool) -> ExResult<Step> {
        let mut ids = Vec::new();
        while self.running() && ids.len() < max_steps.max(1) {
            if let Some((tokens, pos)) = self.feed(usize::MAX) {
                if !alive() {
                    return Err(ExError::Cancelled);
                }
                let greedy = self.token_will_do(tokens.len());
                let next = self.session.forward_next(&tokens, pos, greedy)?;
                self.fed(tokens.len(), next);
            }
            self.emit(&mut ids)?;
        }
        Ok(self.step(ids))
    }

    /// False once the generation has finished (an empty `max_tokens` finishes it at once).
    fn running(&mut self) -> bool {
        if self.finish.is_none() && self.opts.max_tokens == 0 {
            self.finish = Some(Finish::Length);
        }
        self.finish.is_none()
    }

    /// What the model must run next, as `(tokens, position)`: up to `chunk` tokens of the prompt
    /// not yet run, or the last sampled token; `None` when logits wait to be sampled.
    fn feed(&self, chunk: usize) -> Option<(Vec<u32>, usize)> {
        if self.pos < self.prompt.len() {
            let end = self.prompt.len().min(self.pos.saturating_add(chunk.max(1)));
            return Some((self.prompt[self.pos..end].to_vec(), self.pos));
        }
        self.pending.map(|t| (vec![t], self.pos))
    }

    /// Whether running `n` more tokens needs only the token greedy sampling picks from their
    /// logits: a greedy generation, or a prompt chunk before the last, whose logits are dropped.
    fn token_will_do(&self, n: usize) -> bool {
        matches!(self.opts.sampling(), Sampling::ArgMax) || self.pos + n < self.prompt.len()
    }

    /// Takes the model's logits for the `n` tokens `feed` gave. A prompt's logits are kept only
    /// for its last token, the one sampling starts from.
    fn fed(&mut self, n: usize, logits: Next) {
        if self.pos >= self.prompt.len() {
            self.pending = None;
        }
        self.pos += n;
        if self.pos >= self.prompt.len() {
            self.logits = Some(logits);
        }
    }

    /// Samples one token from waiting logits (none waiting, as mid-prompt: nothing to do),
    /// applying the stop rules and limits.
    fn emit(&mut self, ids: &mut Vec<u32>) -> ExResult<()> {
        let token = match self.logits.take() {
            None => return Ok(()),
            Some(Next::Logits(logits)) => self.sample(logits)?,
            Some(Next::Token(token)) => token,
        };
        if self.stop_ids.contains(&token) {
            self.finish = Some(Finish::Stop);
            return Ok(());
        }
        self.generated.push(token);
        ids.push(token);
        let bytes = self.tokenizer.token_bytes(token)?.to_vec();
        if self.text.push(&bytes) {
            self.finish = Some(Finish::Stop);
        } else if self.generated.len() >= self.opts.max_tokens || self.prompt.len() + self.generated.len() >= self.context_length {
            self.finish = Some(Finish::Length);
        } else {
            self.pending = Some(token);
        }
        Ok(())
    }

    /// The step that reports `ids` and the text they completed.
    fn step(&mut self, ids: Vec<u32>) -> Step {
        let mut text = self.text.take_ready();
        if self.finish.is_some() {
            text.push_str(&self.text.finish());
        }
        Step { text, ids, done: self.finish.is_some(), finish: self.finish }
    }

    /// Runs to the end: all text, all ids, how it finished.
    pub fn run(&mut self, alive: &dyn Fn() -> bool) -> ExResult<(String, Vec<u32>, Finish)> {
        let (mut text, mut ids) = (String::new(), Vec::new());
        loop {
            let step = self.next(usize::MAX, alive)?;
            text.push_str(&step.text);
            ids.extend(step.ids);
            if let Some(f) = step.finish {
                return Ok((text, ids, f));
            }
        }
    }
}

/// One step for each of several generations of `lm`, their model calls run together
/// (`CausalLm::forward_batch`): generation `i` in its prompt runs up to `chunks[i]` more prompt
/// tokens, one past it runs its last token; then each samples where its prompt is complete. A
/// step is what `next(1, ..)` gives alone, except that a prompt longer than its chunk takes
/// several steps, the ones before its last reporting nothing.
pub fn step_batch(lm: &dyn CausalLm, gens: &mut [&mut Generation], chunks: &[usize]) -> Vec<ExResult<Step>> {
    assert_eq!(gens.len(), chunks.len(), "step_batch: one chunk size per generation");
    let feeds: Vec<Option<(Vec<u32>, usize)>> =
        gens.iter_mut().zip(chunks).map(|(g, &chunk)| if g.running() { g.feed(chunk) } else { None }).collect();
    let (mut chunks, mut greedy) = (Vec::new(), Vec::new());
    for (g, feed) in gens.iter_mut().zip(&feeds) {
        if let Some((tokens, pos)) = feed {
            greedy.push(g.token_will_do(tokens.len()));
            chunks.push(Chunk { session: &mut *g.session, tokens, pos: *pos });
        }
    }
    let mut results = lm.forward_batch_next(&mut chunks, &greedy).into_iter();
    drop(chunks);
    gens.iter_mut()
        .zip(feeds)
        .map(|(g, feed)| {
            let mut ids = Vec::new();
            if let Some((tokens, _)) = feed {
                let logits = results.next().expect("one result per chunk")?;
                g.fed(tokens.len(), logits);
                g.emit(&mut ids)?;
            }
            Ok(g.step(ids))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pretrained::tokenizer::tests::tiny;

    /// A model that answers a fixed script: the n-th forward returns logits peaking at
    /// `script[n]`. It checks that positions arrive in order.
    struct Scripted {
        script: Vec<u32>,
        calls: usize,
        vocab: usize,
        next_pos: usize,
    }

    impl LmSession for Scripted {
        fn forward(&mut self, tokens: &[u32], pos: usize) -> ExResult<Vec<f32>> {
            assert_eq!(pos, self.next_pos, "positions must be contiguous");
            self.next_pos = pos + tokens.len();
            let mut l = vec![0.0f32; self.vocab];
            let t = *self.script.get(self.calls).unwrap_or(&0);
            l[t as usize] = 10.0;
            self.calls += 1;
            Ok(l)
        }
    }

    fn ids_of(t: &LmTokenizer, s: &str) -> Vec<u32> {
        t.encode(s, false).unwrap()
    }

    fn generation(script: Vec<u32>, prompt: Vec<u32>, ctx: usize, opts: GenOptions) -> Generation {
        let t = Arc::new(tiny());
        let session = Box::new(Scripted { script, calls: 0, vocab: t.vocab_size(), next_pos: 0 });
        Generation::new(session, t, prompt, ctx, opts).unwrap()
    }

    /// Runs with steps of `step` tokens, returning each step's text and the final result.
    fn stream(script: &[u32], ctx: usize, opts: &GenOptions, step: usize) -> (Vec<String>, String, Vec<u32>, Finish) {
        let mut g = generation(script.to_vec(), vec![1, 2, 3], ctx, opts.clone());
        let (mut pieces, mut ids) = (vec![], vec![]);
        loop {
            let s = g.next(step, &|| true).unwrap();
            pieces.push(s.text.clone());
            ids.extend(s.ids);
            if s.done {
                let after = g.next(step, &|| true).unwrap();
                assert_eq!(after, Step { text: String::new(), ids: vec![], done: true, finish: s.finish });
                return (pieces.clone(), pieces.concat(), ids, s.finish.unwrap());
            }
        }
    }

    #[test]
    fn emoji_split_over_byte_tokens_streams_whole_characters() {
        let t = tiny();
        let script = ids_of(&t, "a😀b👍🏽");
        let opts = GenOptions::greedy(script.len());
        let (pieces, text, ids, finish) = stream(&script, 100, &opts, 1);
        assert_eq!(text, "a😀b👍🏽");
        assert_eq!(ids, script);
        assert_eq!(finish, Finish::Length);
        // Every piece is whole characters: none is empty except while a character is incomplete.
        assert_eq!(pieces.iter().filter(|p| !p.is_empty()).count(), 5);
        for step in [2, 3, 100] {
            assert_eq!(stream(&script, 100, &opts, step).1, text);
        }
    }

    #[test]
    fn stop_string_across_tokens_is_never_emitted() {
        let t = tiny();
        let script = ids_of(&t, "hello wo world! tail");
        for stop in ["world", "o w", "d!", "wor"] {
            let opts = GenOptions { stop: vec![stop.into(), "never".into()], ..GenOptions::greedy(256) };
            let full = "hello wo world! tail";
            let expected = &full[..full.find(stop).unwrap()];
            for step in [1, 2, 5, 100] {
                let (pieces, text, _, finish) = stream(&script, 100, &opts, step);
                assert_eq!(text, expected, "stop {stop:?}, step {step}");
                assert_eq!(finish, Finish::Stop);
                assert!(pieces.iter().all(|p| !p.contains(stop)));
            }
        }
        // A suffix that only looked like a stop string is released at the end.
        let opts = GenOptions { stop: vec!["tails".into()], ..GenOptions::greedy(script.len()) };
        let (_, text, _, finish) = stream(&script, 100, &opts, 1);
        assert_eq!(finish, Finish::Length);
        assert_eq!(text, "hello wo world! tail");
    }

    /// "hi", the end-of-sequence id, "more".
    fn hi_eos_more(t: &LmTokenizer) -> Vec<u32> {
        [ids_of(t, "hi"), vec![t.eos.unwrap()], ids_of(t, "more")].concat()
    }

    #[test]
    fn eos_and_stop_ids_end_without_being_emitted() {
        let t = tiny();
        let script = hi_eos_more(&t);
        let (_, text, ids, finish) = stream(&script, 100, &GenOptions::greedy(256), 1);
        assert_eq!((text.as_str(), finish), ("hi", Finish::Stop));
        assert_eq!(ids, ids_of(&t, "hi"));
        let x = ids_of(&t, "i")[0];
        let opts = GenOptions { stop_token_ids: vec![x], ..GenOptions::greedy(256) };
        assert_eq!(stream(&script, 100, &opts, 3).1, "h");
    }

    /// With `ignore_eos` the end-of-sequence id is generated like any other and the run goes on
    /// to `max_tokens`; `stop_token_ids` still end it.
    #[test]
    fn ignore_eos_runs_past_the_end_of_sequence() {
        let t = tiny();
        let script = hi_eos_more(&t);
        let opts = GenOptions { ignore_eos: true, ..GenOptions::greedy(script.len()) };
        let (_, text, ids, finish) = stream(&script, 100, &opts, 1);
        assert_eq!((ids.as_slice(), finish), (script.as_slice(), Finish::Length));
        assert!(text.starts_with("hi") && text.ends_with("more"), "{text:?}");
        let hi = ids_of(&t, "hi").len();
        let opts = GenOptions { ignore_eos: true, stop_token_ids: vec![ids_of(&t, "more")[0]], ..GenOptions::greedy(256) };
        let (_, _, ids, finish) = stream(&script, 100, &opts, 1);
        assert_eq!((ids.as_slice(), finish), (&script[..hi + 1], Finish::Stop));
    }

    #[test]
    fn max_tokens_and_context_length_finish_with_length() {
        let t = tiny();
        let script = ids_of(&t, "abcdefghijklmnop");
        let opts = GenOptions::greedy(5);
        let (_, text, ids, finish) = stream(&script, 100, &opts, 2);
        assert_eq!((text.as_str(), ids.len(), finish), ("abcde", 5, Finish::Length));
        // Prompt of 3 in a context of 7: 4 tokens fit.
        let (_, text, _, finish) = stream(&script, 7, &GenOptions::greedy(256), 3);
        assert_eq!((text.as_str(), finish), ("abcd", Finish::Length));
        let (_, text, _, finish) = stream(&script, 100, &GenOptions::greedy(0), 3);
        assert_eq!((text.as_str(), finish), ("", Finish::Length));
    }

    #[test]
    fn prompt_errors_are_typed() {
        let t = Arc::new(tiny());
        let mk = |p: Vec<u32>, ctx| {
            let session = Box::new(Scripted { script: vec![], calls: 0, vocab: t.vocab_size(), next_pos: 0 });
            Generation::new(session, t.clone(), p, ctx, GenOptions::greedy(256)).err().unwrap()
        };
        let e = mk(vec![1, 2, 3, 4], 4);
        assert_eq!(errors::kind_of(&e), Some(kind::PROMPT_TOO_LONG));
        let d = e.details();
        assert!(d.iter().any(|(k, v)| *k == "prompt_tokens" && matches!(v, Detail::Int(4))));
        assert!(d.iter().any(|(k, v)| *k == "context_length" && matches!(v, Detail::Int(4))));
        assert_eq!(errors::kind_of(&mk(vec![], 4)), Some(kind::EMPTY_PROMPT));
        assert_eq!(errors::kind_of(&mk(vec![100_000], 4)), Some(kind::TOKEN_OUT_OF_RANGE));
    }

    #[test]
    fn cancellation_stops_between_tokens() {
        let t = tiny();
        let mut g = generation(ids_of(&t, "abcdef"), vec![1], 100, GenOptions::greedy(256));
        assert!(matches!(g.next(3, &|| false), Err(ExError::Cancelled)));
        let mut g = generation(ids_of(&t, "abcdef"), vec![1], 100, GenOptions::greedy(256));
        let calls = std::cell::Cell::new(0);
        let alive = || {
            calls.set(calls.get() + 1);
            calls.get() < 3
        };
        assert!(matches!(g.next(10, &alive), Err(ExError::Cancelled)));
    }

    #[test]
    fn sampling_is_seeded_and_greedy_at_zero_temperature() {
        let opts = |temperature, seed| GenOptions { temperature, seed, top_k: Some(50), top_p: Some(0.9), ..GenOptions::greedy(256) };
        assert!(matches!(opts(0.0, 0).sampling(), Sampling::ArgMax));
        assert!(matches!(opts(0.7, 0).sampling(), Sampling::TopKThenTopP { k: 50, .. }));
        // Flat logits: the seed decides, and the same seed decides the same way.
        let t = Arc::new(tiny());
        let run = |seed| {
            let session = Box::new(Flat { vocab: t.vocab_size() });
            let o = GenOptions { temperature: 1.0, seed, ..GenOptions::greedy(20) };
            Generation::new(session, t.clone(), vec![1], 100, o).unwrap().run(&|| true).unwrap().1
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    struct Flat {
        vocab: usize,
    }

    impl LmSession for Flat {
        fn forward(&mut self, _: &[u32], _: usize) -> ExResult<Vec<f32>> {
            // Only plain bytes 'a'..='z' are possible, so no eos ends the run early.
            let mut l = vec![f32::NEG_INFINITY; self.vocab];
            (b'a'..=b'z').for_each(|b| l[b as usize] = 0.0);
            Ok(l)
        }
    }

    #[test]
    fn chat_template_renders_like_transformers() {
        let tmpl = "{% for message in messages %}\n{{ '<|' + message['role'] + '|>' + message.content.strip() }}\n{% endfor %}\n{% if add_generation_prompt %}{{ bos_token }}{% endif %}";
        let msgs = vec![ChatMessage { role: "user".into(), content: " hi ".into() }];
        assert_eq!(render_chat(tmpl, &msgs, "<s>", "</s>").unwrap(), "<|user|>hi\n<s>");
        let e = render_chat("{{ raise_exception('no system') }}", &msgs, "", "").unwrap_err();
        assert_eq!(errors::kind_of(&e), Some(kind::CHAT_TEMPLATE));
        assert!(e.to_string().contains("no system"));
        assert_eq!(errors::kind_of(&render_chat("{% for %}", &msgs, "", "").unwrap_err()), Some(kind::CHAT_TEMPLATE));
    }
}
