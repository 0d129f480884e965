//! Llama-family GGUF models on CUDA through the crate's own step kernels (`gpu::cuda::decode`):
//! what the Burn engine loads on a CUDA device with `EXBURN_CUDA_DECODER` on, where every
//! matrix's format has a codes layout and the family's layer is the kernels' (Llama, Qwen2,
//! Phi-3: no Q/K norms, no Gemma norms or soft caps). Each session keeps its keys and values in device buffers of its own, grown by
//! doubling (or to what `reserve` asks); the chunks of a batch run as the rows of one step, a
//! prompt's tokens too, `MAX_ROWS` rows at a time.

use std::any::Any;
use std::path::Path;
use std::sync::Arc;

use super::decoder_family::{part_names, HeadExtras, RopeStyle};
use super::decoder_source::DecoderSource;
use super::llama_config::LlamaConfig;
use super::prefix_cache::SavedKv;
use super::{own_chunks, CausalLm, Chunk, LmSession, Next};
use crate::device::DeviceRef;
use crate::error::{catch, ExError, ExResult};
use crate::gpu::blocks::read_runs;
use crate::gpu::cuda::decode::{self, Answer, Cache, Decoder, Layer, Read, Shape, Stack, Weights, MAX_ROWS};

/// The smallest cache a session starts with, in positions.
const FIRST_CAP: usize = 64;

struct Model {
    cfg: LlamaConfig,
    d: Decoder,
}

pub struct CudaLlama {
    m: Arc<Model>,
}

fn failed(e: String) -> ExError {
    ExError::Execution(format!("CUDA decoder: {e}"))
}

/// The model at `path` on the CUDA device `device`; `None` where its family or formats are not
/// the kernels' (the caller keeps the tensor path).
pub fn load(path: &Path, device: &DeviceRef) -> ExResult<Option<CudaLlama>> {
    load_with(path, device, crate::process::env::cuda_graphs())
}

/// `load`, its steps replayed as graphs or not.
pub(crate) fn load_with(path: &Path, device: &DeviceRef, graphs: bool) -> ExResult<Option<CudaLlama>> {
    let mut g = DecoderSource::open(path)?;
    let cfg = g.config()?;
    let f = cfg.family;
    if f.gemma || f.qk_norm || f.post_norms || cfg.attn_softcap.is_some() || cfg.final_softcap.is_some() || cfg.rope_swa.is_some() {
        return Ok(None);
    }
    let (h, ffn, dh, nh, nkv) = (cfg.embedding_length, cfg.feed_forward_length, cfg.head_dim(), cfg.head_count, cfg.head_count_kv);
    let shape = Shape {
        hidden: h,
        heads: nh,
        kv_heads: nkv,
        head_dim: dh,
        ffn,
        rope_half: cfg.rope_dim / 2,
        interleaved: f.rope == RopeStyle::Interleaved,
        eps: cfg.rms_eps as f32,
        attn_scale: cfg.attn_scale as f32,
        vocab: cfg.vocab_size,
        context: cfg.context_length.max(1),
    };
    if !shape.fits() {
        return Ok(None);
    }
    let stream = decode::stream(device.index).map_err(failed)?;
    let stack = |g: &mut DecoderSource, parts: &[(&str, usize)], cols: usize| -> ExResult<Option<Stack>> {
        let Some(runs) = read_runs(g, parts, cols)? else { return Ok(None) };
        let up = runs.into_iter().map(|(groups, rows)| decode::matrix(&stream, groups, rows, cols).map(Arc::new));
        Ok(Some(Stack(up.collect::<Result<_, _>>().map_err(failed)?)))
    };
    let values = |v: &[f32]| decode::values(&stream, v).map_err(failed);
    let mut layers = Vec::with_capacity(cfg.block_count);
    for l in 0..cfg.block_count {
        let n = |name: &str| format!("blk.{l}.{name}.weight");
        let [qkv_parts, gate_up_parts] = f.projections(l, nh * dh, nkv * dh, ffn);
        let (Some(qkv), Some(out), Some(gate_up), Some(down)) = (
            stack(&mut g, &part_names(&qkv_parts), h)?,
            stack(&mut g, &[(&n("attn_output"), h)], nh * dh)?,
            stack(&mut g, &part_names(&gate_up_parts), h)?,
            stack(&mut g, &[(&n("ffn_down"), h)], ffn)?,
        ) else {
            return Ok(None);
        };
        let extras = HeadExtras::read(&mut g, &cfg, l)?;
        let qkv_bias = extras.qkv_bias.as_deref().map(values).transpose()?;
        let (attn_norm, ffn_norm) = (values(&g.values(&n("attn_norm"), &[h])?)?, values(&g.values(&n("ffn_norm"), &[h])?)?);
        layers.push(Layer { attn_norm, qkv, qkv_bias, out, ffn_norm, gate_up, down, window: cfg.window_of(l) });
    }
    let one = |s: Option<Stack>| s.and_then(|mut s| (s.0.len() == 1).then(|| s.0.remove(0)));
    let Some(embed) = one(stack(&mut g, &[("token_embd.weight", cfg.vocab_size)], h)?) else { return Ok(None) };
    let output = if g.contains("output.weight") {
        match one(stack(&mut g, &[("output.weight", cfg.vocab_size)], h)?) {
            Some(m) => m,
            None => return Ok(None),
        }
    } else {
        Arc::clone(&embed)
    };
    let out_norm = values(&g.values("output_norm.weight", &[h])?)?;
    let (cos, sin) = cfg.rope_tables(&g.rope_factors(&cfg)?);
    let w = Weights { layers, embed, out_norm, output, cos: values(&cos)?, sin: values(&sin)? };
    let d = Decoder::new(stream, shape, w, graphs).map_err(failed)?;
    Ok(Some(CudaLlama { m: Arc::new(Model { cfg, d }) }))
}

/// A sequence: its cache (none before its first step) and how many tokens it holds.
pub struct CudaLlamaSession {
    m: Arc<Model>,
    cache: Option<Cache>,
    len: usize,
    /// A step failed part-way, leaving the cache inconsistent.
    failed: bool,
}

impl CudaLlamaSession {
    fn check(&self, tokens: &[u32], pos: usize) -> ExResult<()> {
        self.m.cfg.check_chunk(self.failed, self.len, tokens, pos)
    }

    /// Room for `need` positions: the cache doubled (at least `FIRST_CAP`, at most the context)
    /// with its tokens copied over.
    fn grow(&mut self, need: usize) -> Result<(), String> {
        let have = self.cache.as_ref().map_or(0, |c| c.cap);
        if need <= have {
            return Ok(());
        }
        let cap = need.next_power_of_two().max(FIRST_CAP).min(self.m.cfg.context_length.max(need));
        let grown = match &self.cache {
            Some(old) => self.m.d.copy(old, self.len, cap)?,
            None => self.m.d.cache(cap)?,
        };
        self.cache = Some(grown);
        Ok(())
    }
}

/// The chunks of sessions of one model (checked) as the rows of steps: what each chunk's last
/// row answers.
fn run(m: &Model, chunks: &mut [(&mut CudaLlamaSession, &[u32], usize)], greedy: &[bool]) -> Result<Vec<Next>, String> {
    for (s, tokens, pos) in chunks.iter_mut() {
        s.grow(*pos + tokens.len())?;
    }
    let mut rows = Vec::new();
    let mut last = Vec::with_capacity(chunks.len());
    for (s, tokens, pos) in chunks.iter() {
        let cache = s.cache.as_ref().expect("a cache grown for the chunk");
        rows.extend(tokens.iter().enumerate().map(|(i, &t)| m.d.row(cache, t, pos + i)));
        last.push(rows.len() - 1);
    }
    let mut answers: Vec<Option<Next>> = vec![None; chunks.len()];
    for (step, part) in rows.chunks(MAX_ROWS).enumerate() {
        let first = step * MAX_ROWS;
        let asked: Vec<usize> = (0..last.len()).filter(|&c| (first..first + part.len()).contains(&last[c])).collect();
        let read: Vec<(usize, Read)> = asked.iter().map(|&c| (last[c] - first, if greedy[c] { Read::Token } else { Read::Logits })).collect();
        for (c, answer) in asked.into_iter().zip(m.d.step(part, &read)?) {
            answers[c] = Some(match answer {
                Answer::Token(t) => Next::Token(t),
                Answer::Logits(l) => Next::Logits(l),
            });
        }
    }
    Ok(answers.into_iter().map(|a| a.expect("every chunk's last row read")).collect())
}

/// Runs chunks that passed `check`; a failed step fails them all (their caches may be half
/// written).
fn forward(m: &Model, mut chunks: Vec<(&mut CudaLlamaSession, &[u32], usize)>, greedy: &[bool]) -> Vec<ExResult<Next>> {
    match catch(|| run(m, &mut chunks, greedy).map_err(failed)) {
        Ok(next) => chunks
            .into_iter()
            .zip(next)
            .map(|((s, tokens, _), n)| {
                s.len += tokens.len();
                Ok(n)
            })
            .collect(),
        Err(e) => chunks
            .into_iter()
            .map(|(s, _, _)| {
                s.failed = true;
                Err(ExError::Execution(format!("step: {e}")))
            })
            .collect(),
    }
}

impl LmSession for CudaLlamaSession {
    fn forward(&mut self, tokens: &[u32], pos: usize) -> ExResult<Vec<f32>> {
        self.forward_next(tokens, pos, false).map(Next::into_logits)
    }

    fn forward_next(&mut self, tokens: &[u32], pos: usize, greedy: bool) -> ExResult<Next> {
        self.check(tokens, pos)?;
        let m = Arc::clone(&self.m);
        forward(&m, vec![(self, tokens, pos)], &[greedy]).remove(0)
    }

    /// A cache of `tokens` positions now; where the device cannot hold it, the next step fails
    /// with the reason.
    fn reserve(&mut self, tokens: usize) {
        let _ = self.grow(tokens.min(self.m.cfg.context_length));
    }
}

/// A prompt's keys and values, copied out of a session's cache.
struct SavedCache(Cache);

impl CausalLm for CudaLlama {
    fn vocab_size(&self) -> usize {
        self.m.cfg.vocab_size
    }

    fn context_length(&self) -> usize {
        self.m.cfg.context_length
    }

    fn kv_bytes_per_token(&self) -> usize {
        self.m.cfg.kv_bytes_per_token()
    }

    fn session(&self) -> ExResult<Box<dyn LmSession>> {
        Ok(Box::new(CudaLlamaSession { m: Arc::clone(&self.m), cache: None, len: 0, failed: false }))
    }

    fn forward_batch(&self, batch: &mut [Chunk]) -> Vec<ExResult<Vec<f32>>> {
        let greedy = vec![false; batch.len()];
        self.forward_batch_next(batch, &greedy).into_iter().map(|r| r.map(Next::into_logits)).collect()
    }

    fn forward_batch_next(&self, batch: &mut [Chunk], greedy: &[bool]) -> Vec<ExResult<Next>> {
        own_chunks(batch, |s: &CudaLlamaSession| Arc::ptr_eq(&s.m, &self.m), CudaLlamaSession::check, |ours, index| {
            forward(&self.m, ours, &index.iter().map(|&i| greedy[i]).collect::<Vec<_>>())
        })
    }

    fn save_prefix(&self, session: &mut dyn LmSession, len: usize) -> Option<SavedKv> {
        let any: &mut dyn Any = session;
        let s = any.downcast_mut::<CudaLlamaSession>().filter(|s| Arc::ptr_eq(&s.m, &self.m) && !s.failed && s.len >= len && len > 0)?;
        let copy = self.m.d.copy(s.cache.as_ref()?, len, len).ok()?;
        Some(Arc::new(SavedCache(copy)))
    }

    fn session_from(&self, saved: &(dyn Any + Send + Sync), len: usize) -> Option<Box<dyn LmSession>> {
        let saved = saved.downcast_ref::<SavedCache>().filter(|s| s.0.cap >= len)?;
        let cap = len.next_power_of_two().max(FIRST_CAP).min(self.m.cfg.context_length.max(len));
        let cache = self.m.d.copy(&saved.0, len, cap).ok()?;
        Some(Box::new(CudaLlamaSession { m: Arc::clone(&self.m), cache: Some(cache), len, failed: false }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::DeviceKind;
    use crate::pretrained::burn_llama::BurnLlama;
    use crate::pretrained::greedy_check::{self, argmax};
    use crate::pretrained::weights::test_support::{reference, smollm_path};

    /// SmolLM2 on the test device when it is a CUDA device.
    fn smollm(graphs: bool) -> Option<CudaLlama> {
        let device = crate::testing::device();
        if device.kind != DeviceKind::Cuda {
            return None;
        }
        Some(load_with(&smollm_path()?, &device, graphs).unwrap().expect("SmolLM2's layers and formats are the decoder's"))
    }

    /// Arbitrary tokens of the vocabulary.
    fn tokens(n: usize, seed: u32) -> Vec<u32> {
        (0..n as u32).map(|i| (i * 7919 + seed * 104_729 + 11) % 49_152).collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Against transformers on the file's weights (`greedy_check`: every teacher-forced step, then
    /// a free-running generation), and against the tensor path on the same card (the same blocks,
    /// f32 activations in Burn's ops and the rows kernel): a prompt of 40 tokens (two steps of
    /// rows), then steps fed the tensor path's tokens, logits within 1e-3 of the largest.
    #[test]
    fn cuda_decoder_matches_transformers_and_the_tensor_path() {
        let Some(gpu) = smollm(true) else { return };
        let refs = reference("smollm2_reference.json");
        let mut worst_first = 0f64;
        for (i, case) in refs["generate"].as_array().expect("generate cases").iter().enumerate() {
            let (forced, _) = greedy_check::check_case(&format!("cuda decoder, case {i}"), &gpu, case, None);
            worst_first = worst_first.max(greedy_check::first_step_error(&forced.first, case));
        }
        assert!(worst_first < 0.01, "first-step logits {worst_first} from transformers'");
        let tensor = BurnLlama::load(&smollm_path().unwrap(), &crate::testing::device()).unwrap();
        let (mut g, mut t) = (gpu.session().unwrap(), tensor.session().unwrap());
        let prompt = tokens(40, 1);
        let (mut lg, mut lt) = (g.forward(&prompt, 0).unwrap(), t.forward(&prompt, 0).unwrap());
        let mut worst = 0f32;
        for pos in prompt.len()..prompt.len() + 24 {
            assert_eq!(lg.len(), lt.len());
            let largest = lt.iter().fold(0f32, |m, v| m.max(v.abs()));
            let diff = lg.iter().zip(&lt).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            worst = worst.max(diff / largest);
            assert!(diff <= 1e-3 * largest, "position {pos}: logits {diff} apart (largest {largest})");
            let next = argmax(&lt);
            lg = g.forward(&[next], pos).unwrap();
            lt = t.forward(&[next], pos).unwrap();
        }
        eprintln!(
            "first-step logits within {worst_first:e} of transformers'; within {worst:e} of the largest of the tensor path's; {} launches a step",
            gpu.m.d.launches()
        );
    }

    /// Five sequences in one batch (prompts of 3, 17, 40, 1 and 33 tokens: rows of a step split
    /// across sequences and a prompt across steps), then decoding steps together: every logit the
    /// same bits as each sequence alone, and as with every kernel launched instead of replayed.
    #[test]
    fn cuda_decoder_rows_do_not_depend_on_their_step() {
        let (Some(gpu), Some(direct)) = (smollm(true), smollm(false)) else { return };
        let prompts: Vec<Vec<u32>> = [3, 17, 40, 1, 33].iter().enumerate().map(|(i, &n)| tokens(n, i as u32 + 2)).collect();
        let mut together: Vec<Box<dyn LmSession>> = prompts.iter().map(|_| gpu.session().unwrap()).collect();
        let mut next: Vec<(Vec<u32>, usize)> = prompts.iter().map(|p| (p.clone(), 0)).collect();
        let mut seen: Vec<Vec<Vec<f32>>> = vec![vec![]; prompts.len()];
        for _ in 0..6 {
            let mut chunks: Vec<Chunk> = together.iter_mut().zip(&next).map(|(s, (t, p))| Chunk { session: s.as_mut(), tokens: t, pos: *p }).collect();
            let out: Vec<Vec<f32>> = gpu.forward_batch(&mut chunks).into_iter().map(|r| r.unwrap()).collect();
            drop(chunks);
            for (i, l) in out.into_iter().enumerate() {
                next[i] = (vec![argmax(&l)], next[i].1 + next[i].0.len());
                seen[i].push(l);
            }
        }
        for (model, what) in [(&gpu, "alone"), (&direct, "alone, launched")] {
            for (i, p) in prompts.iter().enumerate() {
                let mut s = model.session().unwrap();
                let mut l = s.forward(p, 0).unwrap();
                let mut pos = p.len();
                for (step, want) in seen[i].iter().enumerate() {
                    assert_eq!(bits(&l), bits(want), "sequence {i}, step {step}, {what}");
                    let t = argmax(&l);
                    l = s.forward(&[t], pos).unwrap();
                    pos += 1;
                }
            }
        }
    }

    /// Greedy steps answer the logits' first maximum; a saved prefix starts a session that goes
    /// on as the original; a cache grown past its first size keeps its rows.
    #[test]
    fn cuda_decoder_tokens_prefixes_and_growth() {
        let Some(gpu) = smollm(true) else { return };
        let prompt = tokens(70, 9);
        let mut a = gpu.session().unwrap();
        let la = a.forward(&prompt, 0).unwrap();
        let mut b = gpu.session().unwrap();
        b.reserve(200);
        assert_eq!(b.forward_next(&prompt, 0, true).unwrap(), Next::Token(argmax(&la)));
        let saved = gpu.save_prefix(a.as_mut(), 50).expect("a prefix of the session");
        let mut c = gpu.session_from(saved.as_ref(), 50).expect("a session from the prefix");
        let from_prefix = c.forward(&prompt[50..], 50).unwrap();
        assert_eq!(bits(&from_prefix), bits(&la));
        let t = argmax(&la);
        let (na, nb) = (a.forward(&[t], 70).unwrap(), b.forward(&[t], 70).unwrap());
        assert_eq!(bits(&na), bits(&nb));
    }

    /// Refused chunks leave the session as it was.
    #[test]
    fn cuda_decoder_refuses_bad_chunks() {
        let Some(gpu) = smollm(true) else { return };
        let mut s = gpu.session().unwrap();
        let l = s.forward(&[1, 2, 3], 0).unwrap();
        assert!(s.forward(&[49_152], 3).unwrap_err().to_string().contains("outside the vocabulary"));
        assert!(s.forward(&[5], 7).is_err(), "a position past the cache");
        assert!(s.forward(&[], 3).is_err(), "no tokens");
        assert!(s.forward(&[5], gpu.context_length()).is_err());
        let mut fresh = gpu.session().unwrap();
        fresh.forward(&[1, 2, 3], 0).unwrap();
        assert_eq!(bits(&s.forward(&[argmax(&l)], 3).unwrap()), bits(&fresh.forward(&[argmax(&l)], 3).unwrap()));
    }
}
