//! Batched steps (`TextModel::step`, `CausalLm::forward_batch`) against each generation run
//! alone, on the real SmolLM2 file: sequences of different lengths that join and leave the
//! batch at different steps, prompts split into chunks.

use super::generate::{GenOptions, Generation, Step};
use super::weights::test_support::smollm_path;
use super::{Chunk, Engine, Next, TextModel};
use crate::error::ExResult;

const PROMPTS: [&str; 5] = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "1, 2, 3, 4,",
    "Write a haiku about autumn leaves falling on a quiet river at dusk.",
    "def fib(n):",
];

/// Sixteen requests: the prompts numbered, so each is its own, of different lengths.
fn requests() -> Vec<(String, usize)> {
    (0..16).map(|i| (format!("{i}. {}", PROMPTS[i % PROMPTS.len()]), 3 + (i * 5) % 17)).collect()
}

/// The greedy ids of each request generated alone.
fn alone(model: &TextModel, requests: &[(String, usize)]) -> Vec<Vec<u32>> {
    requests.iter().map(|(p, n)| start(model, p, *n).run(&|| true).unwrap().1).collect()
}

/// A batched request's ids against the same request alone: equal, or, where the model's f32
/// products round differently at another row count (GPUs: TF32 tensor cores on CUDA), equal up
/// to a first difference at a near tie (`greedy_check::NEAR_TIE`) of the alone logits there,
/// after which the two texts go their own ways. On the CPU the ids must be equal.
fn assert_same_or_near_tie(model: &TextModel, prompt: &str, got: &[u32], want: &[u32], what: &str) {
    if got == want {
        return;
    }
    assert!(model.device.kind != crate::device::DeviceKind::Cpu, "{what} differs from alone: {got:?} against {want:?}");
    let d = got.iter().zip(want).position(|(g, w)| g != w).unwrap_or_else(|| panic!("{what}: {} ids against {} alone", got.len(), want.len()));
    let mut ids = model.prompt_ids(&super::generate::Prompt::Text(prompt.into())).unwrap();
    ids.extend(&want[..d]);
    let logits = model.lm.session().unwrap().forward(&ids, 0).unwrap();
    let margin = (logits[want[d] as usize] - logits[got[d] as usize]) as f64;
    assert!(
        margin.abs() <= super::greedy_check::NEAR_TIE,
        "{what}: token {d} is {} in the batch and {} alone, {margin} apart in the logits alone (near tie: {})",
        got[d],
        want[d],
        super::greedy_check::NEAR_TIE
    );
}

fn start(model: &TextModel, prompt: &str, max_tokens: usize) -> Generation {
    model.start(&super::generate::Prompt::Text(prompt.into()), GenOptions::greedy(max_tokens)).unwrap()
}

/// Runs the requests through batched steps: request `i` joins at step `i`, prompts run `chunk`
/// tokens a step, and each leaves when done. Returns each one's ids and the largest batch seen.
fn batched(model: &TextModel, requests: &[(String, usize)], chunk: usize) -> (Vec<Vec<u32>>, usize) {
    let n = requests.len();
    let mut gens: Vec<Option<Generation>> = (0..n).map(|_| None).collect();
    let mut ids: Vec<Vec<u32>> = vec![vec![]; n];
    let (mut done, mut widest, mut step) = (vec![false; n], 0, 0);
    while done.iter().any(|d| !d) {
        if step < n {
            gens[step] = Some(start(model, &requests[step].0, requests[step].1));
        }
        let live: Vec<usize> = (0..n).filter(|&i| gens[i].is_some() && !done[i]).collect();
        let mut refs: Vec<&mut Generation> = gens.iter_mut().zip(&done).filter(|(_, d)| !**d).filter_map(|(g, _)| g.as_mut()).collect();
        widest = widest.max(refs.len());
        let chunks = vec![chunk; refs.len()];
        let steps: Vec<ExResult<Step>> = model.step(&mut refs, &chunks);
        for (&i, s) in live.iter().zip(steps) {
            let s = s.unwrap();
            ids[i].extend(&s.ids);
            done[i] = s.done;
        }
        step += 1;
        assert!(step < 10_000, "the batch never finished");
    }
    (ids, widest)
}

/// `model` (loaded from `path` on the test device) on Burn's tensor path, every weight
/// dequantised as on GPUs, with an empty prefix cache.
fn on_the_tensor_path(model: &mut TextModel, path: &std::path::Path) {
    model.lm = Box::new(super::burn_llama::BurnLlama::load_with(path, &crate::testing::device(), false).unwrap());
    model.prefixes = super::prefix_cache::PrefixCache::new(super::PREFIX_CACHE_BYTES);
}

#[test]
fn pretrained_batched_steps_equal_alone() {
    let Some(path) = smollm_path() else { return };
    let requests = requests();
    for engine in [Engine::Burn, Engine::Candle] {
        let model = TextModel::load(&path, engine, if engine == Engine::Burn { crate::testing::device() } else { super::candle_device::test_device() }).unwrap();
        let want = alone(&model, &requests);
        // Both engines run the batch in one pass, each row's quantised products summed as alone.
        // Burn's host attention also sums each row alike, so even chunked prompts give the same
        // tokens; Candle's attention products (f32 gemm) sum a prompt cut into chunks in another
        // order, so its prompts run whole.
        let chunk = if engine == Engine::Burn { 5 } else { 64 };
        let (got, widest) = batched(&model, &requests, chunk);
        assert!(widest >= 10, "{engine:?}: at most {widest} generations ran together");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_same_or_near_tie(&model, &requests[i].0, g, w, &format!("{engine:?}: request {i} in a batch"));
        }
        assert!(want.iter().filter(|w| w.len() >= 3).count() >= 12, "{engine:?}: most requests generate text");
    }
}

/// The same on Burn's tensor path (every weight dequantised, as on GPUs), whose steps run the
/// sessions' chunks together over the shared KV pool: ragged prompt chunks and decodes in one
/// padded, masked attention. Its products run at the batch's row count, so logits may differ
/// from alone in last bits: on the CPU no greedy pick of these prompts is that close, while
/// CUDA's TF32 products can flip one at a near tie (`assert_same_or_near_tie`).
#[test]
fn pretrained_batched_steps_equal_alone_on_the_tensor_path() {
    let Some(path) = smollm_path() else { return };
    let requests = requests();
    let mut model = TextModel::load(&path, Engine::Burn, crate::testing::device()).unwrap();
    on_the_tensor_path(&mut model, &path);
    let want = alone(&model, &requests);
    let (got, widest) = batched(&model, &requests, 7);
    assert!(widest >= 10, "at most {widest} generations ran together");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_same_or_near_tie(&model, &requests[i].0, g, w, &format!("request {i} in a batch"));
    }
    assert!(want.iter().filter(|w| w.len() >= 3).count() >= 12, "most requests generate text");
}

/// The logits of a batched forward, those of each session alone: bit for bit on the CPU's host
/// path, whose rows are summed alike whatever the batch; on a GPU, whose products are tiled by
/// the batch's shape (`CausalLm::forward_batch`), within `greedy_check::batch_bound`.
#[test]
fn pretrained_forward_batch_logits_equal_alone() {
    let Some(path) = smollm_path() else { return };
    let device = crate::testing::device();
    let model = TextModel::load(&path, Engine::Burn, device.clone()).unwrap();
    let same = |got: &[f32], want: &[f32], what: &str| {
        if device.kind == crate::device::DeviceKind::Cpu {
            return assert_eq!(got, want, "{what}");
        }
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = got.iter().zip(want).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        let rel = super::greedy_check::batch_bound(device.kind);
        assert!(got.len() == want.len() && worst <= rel * scale, "{what}: off by {worst} at scale {scale}");
    };
    let lm = &*model.lm;
    let prompts: Vec<Vec<u32>> = PROMPTS.iter().map(|p| model.tokenizer.encode(p, true).unwrap()).collect();
    let alone: Vec<Vec<f32>> = prompts.iter().map(|p| lm.session().unwrap().forward(p, 0).unwrap()).collect();
    let mut sessions: Vec<_> = prompts.iter().map(|_| lm.session().unwrap()).collect();
    let mut chunks: Vec<Chunk> = sessions.iter_mut().zip(&prompts).map(|(s, p)| Chunk { session: s.as_mut(), tokens: p, pos: 0 }).collect();
    let together = lm.forward_batch(&mut chunks);
    for (i, (t, a)) in together.into_iter().zip(&alone).enumerate() {
        same(&t.unwrap(), a, &format!("prompt {i}: batched logits differ from alone"));
    }
    // a refused chunk (out of order) fails alone; the others run
    let mut s = lm.session().unwrap();
    let mut t = lm.session().unwrap();
    let mut chunks = vec![Chunk { session: s.as_mut(), tokens: &prompts[0], pos: 3 }, Chunk { session: t.as_mut(), tokens: &prompts[0], pos: 0 }];
    let r = lm.forward_batch(&mut chunks);
    assert!(r[0].is_err());
    same(r[1].as_ref().unwrap(), &alone[0], "the chunk beside a refused one");
}

/// On the tensor path, a greedy chunk is answered with its token, taken where the logits lie,
/// the others with their logits: each prompt runs twice in one batch, once greedy and once not,
/// and the token is a maximum of its twin's logits (within the batch's rounding on GPUs).
#[test]
fn pretrained_greedy_chunks_get_the_logits_maximum() {
    let Some(path) = smollm_path() else { return };
    let device = crate::testing::device();
    let mut model = TextModel::load(&path, Engine::Burn, device.clone()).unwrap();
    on_the_tensor_path(&mut model, &path);
    let lm = &*model.lm;
    let prompts: Vec<Vec<u32>> = PROMPTS.iter().map(|p| model.tokenizer.encode(p, true).unwrap()).collect();
    for all_greedy in [false, true] {
        let mut sessions: Vec<_> = (0..2 * prompts.len()).map(|_| lm.session().unwrap()).collect();
        let mut chunks: Vec<Chunk> = sessions.iter_mut().enumerate().map(|(i, s)| Chunk { session: s.as_mut(), tokens: &prompts[i / 2], pos: 0 }).collect();
        let greedy: Vec<bool> = (0..chunks.len()).map(|i| all_greedy || i % 2 == 0).collect();
        let answers: Vec<Next> = lm.forward_batch_next(&mut chunks, &greedy).into_iter().map(Result::unwrap).collect();
        let twins: Vec<Vec<f32>> = match all_greedy {
            false => answers.iter().skip(1).step_by(2).map(|a| match a {
                Next::Logits(l) => l.clone(),
                Next::Token(_) => panic!("a chunk that asked for logits got a token"),
            }).collect(),
            true => prompts.iter().map(|p| lm.session().unwrap().forward(p, 0).unwrap()).collect(),
        };
        for (i, twin) in twins.iter().enumerate() {
            let Next::Token(t) = answers[2 * i] else { panic!("prompt {i}: a greedy chunk got logits") };
            let max = twin.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            let scale = twin.iter().fold(0f32, |m, v| m.max(v.abs()));
            let slack = if all_greedy { super::greedy_check::batch_bound(device.kind) * scale } else { 0.0 };
            assert!(twin[t as usize] >= max - slack, "prompt {i} (all greedy: {all_greedy}): token {t} at {} against the maximum {max}", twin[t as usize]);
        }
        if all_greedy {
            assert!(answers.iter().all(|a| matches!(a, Next::Token(_))), "every greedy chunk gets its token");
        }
    }
}

/// Aggregate decode speed by batch size (run with `--ignored --nocapture`; `BATCH_ENGINE=candle`
/// for Candle, `BATCH_WEIGHTS=f32` for Burn with f32 weights, `BATCH_PROMPT_REPEAT=k` for each
/// prompt's text k times, so that attention reads serving-length caches); the serving benchmark
/// (`bench/llm_serving.exs`) is where CPU figures come from.
/// Sessions are driven directly with their argmax, past any end-of-sequence token, so every step
/// decodes all `n` sequences; the argmax is the engine's (`forward_batch_next`), or the host's
/// over the logits read back with `BATCH_ARGMAX=host`.
#[test]
#[ignore]
fn pretrained_batched_decode_timing() {
    let Some(path) = smollm_path() else { return };
    let (engine, device) = match std::env::var("BATCH_ENGINE").as_deref() {
        Ok("candle") => (Engine::Candle, super::candle_device::test_device()),
        _ => (Engine::Burn, crate::testing::device()),
    };
    let mut model = TextModel::load(&path, engine, device.clone()).unwrap();
    // BATCH_WEIGHTS=f32: every weight as f32 tensors (on a GPU, instead of the file's blocks)
    if std::env::var("BATCH_WEIGHTS").as_deref() == Ok("f32") && matches!(engine, Engine::Burn) {
        model.lm = Box::new(super::burn_llama::BurnLlama::load_with(&path, &device, false).unwrap());
    }
    let sizes: Vec<usize> = std::env::var("BATCH_SIZES").map(|s| s.split(',').map(|n| n.parse().unwrap()).collect()).unwrap_or(vec![1, 2, 4, 8, 16, 32]);
    let steps = 64;
    let repeat = std::env::var("BATCH_PROMPT_REPEAT").map_or(1, |k| k.parse().unwrap());
    // the prompt step, then `steps` decoding steps; the seconds of the decoding steps
    let run = |n: usize| {
        let prompts: Vec<Vec<u32>> = (0..n).map(|i| model.tokenizer.encode(&vec![PROMPTS[i % PROMPTS.len()]; repeat].join(" "), true).unwrap()).collect();
        let mut sessions: Vec<_> = (0..n).map(|_| model.lm.session().unwrap()).collect();
        // cache room for the prompt and the answer, as a generation reserves it
        sessions.iter_mut().zip(&prompts).for_each(|(s, p)| s.reserve(p.len() + steps + 1));
        let mut next: Vec<(Vec<u32>, usize)> = prompts.iter().map(|p| (p.clone(), 0)).collect();
        // the host's share of a step: the argmax over each sequence's logits, where it takes it
        let mut host = std::time::Duration::ZERO;
        let greedy = vec![std::env::var("BATCH_ARGMAX").as_deref() != Ok("host"); n];
        let mut step = |sessions: &mut Vec<Box<dyn super::LmSession>>, next: &mut Vec<(Vec<u32>, usize)>| {
            let mut chunks: Vec<Chunk> = sessions.iter_mut().zip(next.iter()).map(|(s, (t, p))| Chunk { session: s.as_mut(), tokens: t, pos: *p }).collect();
            let answers: Vec<Next> = model.lm.forward_batch_next(&mut chunks, &greedy).into_iter().map(|r| r.unwrap()).collect();
            drop(chunks);
            let t = std::time::Instant::now();
            for ((tokens, pos), a) in next.iter_mut().zip(answers) {
                *pos += tokens.len();
                *tokens = vec![match a {
                    Next::Token(t) => t,
                    Next::Logits(l) => super::greedy_check::argmax(&l),
                }];
            }
            host += t.elapsed();
        };
        step(&mut sessions, &mut next);
        let t = std::time::Instant::now();
        for _ in 0..steps {
            step(&mut sessions, &mut next);
        }
        (t.elapsed().as_secs_f64(), host.as_secs_f64())
    };
    for n in sizes {
        // a first run at the same shapes compiles and tunes the device's kernels (GPUs)
        let (cold, _) = run(n);
        let (dt, host) = run(n);
        println!(
            "batch {n:2}: {:7.1} tok/s aggregate, {:6.2} ms a step, {:5.2} ms of it the host's argmax (first run {:6.2} ms a step)",
            (n * steps) as f64 / dt,
            dt * 1e3 / steps as f64,
            host * 1e3 / (steps + 1) as f64,
            cold * 1e3 / steps as f64
        );
    }
}

/// A prompt that starts like a saved one reuses its cache rows, with the tokens it gets without:
/// on the model's own path (the host path on the CPU), and on the tensor path, whose rows are
/// copied out of the KV pool and back into a new session's pages.
#[test]
fn pretrained_prefix_reuse_gives_the_same_tokens() {
    let Some(path) = smollm_path() else { return };
    let mut model = TextModel::load(&path, Engine::Burn, crate::testing::device()).unwrap();
    prefix_reuse(&model);
    on_the_tensor_path(&mut model, &path);
    prefix_reuse(&model);
}

fn prefix_reuse(model: &TextModel) {
    let shared = "You are a careful assistant. Answer in one short sentence, and never use lists. Question: ";
    let (a, b) = (format!("{shared}What is the capital of France?"), format!("{shared}Why is the sky blue?"));
    let run_steps = |g: &mut Generation| {
        while !g.finish().is_some() {
            model.step(&mut [&mut *g], &[7]).pop().unwrap().unwrap();
        }
        g.generated_ids().to_vec()
    };
    let mut first = start(&model, &a, 8);
    assert_eq!(first.cached_tokens(), 0);
    run_steps(&mut first);
    assert_eq!(model.prefixes.usage().0, 1);

    let mut second = start(&model, &b, 8);
    let ids = model.tokenizer.encode(&b, true).unwrap();
    let shared_ids = model.tokenizer.encode(shared, true).unwrap();
    assert!(second.cached_tokens() + 2 >= shared_ids.len() && second.cached_tokens() < ids.len(), "reused {}", second.cached_tokens());
    let reused = run_steps(&mut second);
    let mut fresh = Generation::new(model.lm.session().unwrap(), model.tokenizer.clone(), ids, model.context_length(), GenOptions::greedy(8)).unwrap();
    assert_eq!(reused, fresh.run(&|| true).unwrap().1);

    // the same prompt again: all but its last token reused, in steps or by `next`
    let mut again = start(&model, &a, 8);
    assert_eq!(again.cached_tokens(), again.prompt_ids().len() - 1);
    let mut by_next = start(&model, &a, 8);
    assert_eq!(by_next.run(&|| true).unwrap().1, run_steps(&mut again));
    assert_eq!(run_steps(&mut start(&model, &a, 8)), first.generated_ids());
}

