//! The one rule by which a language model's greedy decoding is compared with a greedy reference
//! (transformers on the GGUF dequantised to f32, `test/data/gen_pretrained_refs.py`).
//!
//! Exact token equality over whole generations is not a sound criterion: the reference records
//! steps where its own top two logits are within 0.1 of each other, and an engine that multiplies
//! quantised weights (Candle's Q4_1 × Q8_1 dot products, as llama.cpp does) or merely sums in
//! another order (gemm's AVX-512 kernels against its AVX2 ones) may pick the other token there;
//! after that the texts part ways and every later step is a different question. So the reference's
//! own tokens are fed back (teacher forcing) and every step is checked: the model's argmax must be
//! the reference's token unless the reference's top-1 minus top-2 margin at that step is below
//! `NEAR_TIE`. A wrong layer, mask or rotary table moves argmaxes at steps with margins of several
//! logits, which this fails on; a free-running generation must agree up to its first divergence,
//! and that divergence must itself be at a near tie.

use serde_json::Value as Json;

use super::{CausalLm, LmSession};

/// The reference margin (in logits) below which the other token is an acceptable pick. Measured
/// (SmolLM2 Q4_1, 120 teacher-forced steps): Candle's quantised engine flips three steps, at margins
/// 0.082, 0.139 and 0.160, where gemm runs its AVX-512 kernels (first-step logits within 0.27 of
/// the reference's: Q8_1 activations), and two, at 0.082 and 0.220, with its AVX2 kernels (within
/// 0.50); Burn's engine flips none (logits within 6e-5). Deliberately broken Candle engines flip
/// steps above it: attention scaled by 1/sqrt(1.1·d) instead of 1/sqrt(d) at 0.352, the last of 30
/// layers skipped at margins up to 5.0.
pub const NEAR_TIE: f64 = 0.3;

/// How far an engine that rounds activations to 8 bits per block (llama.cpp's Q8_0/Q8_1, the
/// quantised layers of both engines) may move logits from the same model with f32 activations,
/// as a fraction of the largest logit: the rounding of each layer's inputs compounds over the
/// layers, while a wrong layer, mask or table moves logits by a large part of their range. Both
/// engines come closest on SmolLM2's Q5_K_M requantisation (guides/pretrained.md).
pub const Q8_LOGIT_DRIFT: f32 = 0.07;

pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

pub fn ids(v: &Json) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// A reference case's chat messages (`[{"role", "content"}, ...]`).
pub fn chat_messages(v: &Json) -> Vec<super::generate::ChatMessage> {
    let text = |m: &Json, key: &str| m[key].as_str().unwrap().to_string();
    v.as_array().unwrap().iter().map(|m| super::generate::ChatMessage { role: text(m, "role"), content: text(m, "content") }).collect()
}

fn margins(case: &Json) -> Vec<f64> {
    case["step_margins"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

/// The largest distance of `first` (the logits after `case`'s prompt) from transformers' top 10
/// there (`first_step_top10`: `[id, logit]` pairs).
pub fn first_step_error(first: &[f32], case: &Json) -> f64 {
    case["first_step_top10"].as_array().unwrap().iter().fold(0f64, |worst, pair| {
        let (id, logit) = (pair[0].as_u64().unwrap() as usize, pair[1].as_f64().unwrap());
        worst.max((first[id] as f64 - logit).abs())
    })
}

/// What teacher forcing found for one reference case.
pub struct Forced {
    pub steps: usize,
    /// (step, the model's token, the reference's margin there) where the argmaxes differ.
    pub flips: Vec<(usize, u32, f64)>,
    /// The logits after the prompt (first generated step).
    pub first: Vec<f32>,
}

/// Feeds `case`'s prompt and then the reference's own generated tokens (the final eos included) one
/// at a time, recording where the model's argmax differs from the reference's token.
pub fn teacher_forced(session: &mut dyn LmSession, case: &Json) -> Forced {
    let prompt = ids(&case["prompt_ids"]);
    let want = ids(&case["generated_ids"]);
    let m = margins(case);
    assert_eq!(m.len(), want.len(), "one margin per generated step");
    let first = session.forward(&prompt, 0).unwrap();
    let mut logits = first.clone();
    let mut flips = vec![];
    for (step, &tok) in want.iter().enumerate() {
        let pick = argmax(&logits);
        if pick != tok {
            flips.push((step, pick, m[step]));
        }
        if step + 1 < want.len() {
            logits = session.forward(&[tok], prompt.len() + step).unwrap();
        }
    }
    Forced { steps: want.len(), flips, first }
}

/// Asserts the teacher-forced rule: every flip is at a reference near tie.
pub fn assert_forced(label: &str, f: &Forced) {
    for &(step, pick, margin) in &f.flips {
        assert!(
            margin < NEAR_TIE,
            "{label}: step {step} picks {pick} where the reference's token leads by {margin} logits (near tie < {NEAR_TIE})"
        );
    }
}

/// Asserts the free-running rule: `got` (generated tokens, eos excluded when the reference stopped
/// there) equals the reference up to its first divergence, which must be at a near tie; returns
/// whether the two are identical.
pub fn assert_free_run(label: &str, got: &[u32], case: &Json) -> bool {
    let mut want = ids(&case["generated_ids"]);
    if case["stopped_at_eos"].as_bool().unwrap() {
        want.pop();
    }
    let m = margins(case);
    let same = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
    if same == got.len() && same == want.len() {
        return true;
    }
    // Running out of tokens early or late is a divergence too: at step `same` one side chose eos
    // (or the limit) where the other went on.
    let margin = m.get(same).copied().unwrap_or(f64::INFINITY);
    assert!(
        margin < NEAR_TIE,
        "{label}: greedy output leaves the reference at step {same}, where its token leads by {margin} logits\n  got  {got:?}\n  want {want:?}"
    );
    false
}

/// Both checks of one reference case on `lm` (module doc): every step teacher-forced, then a
/// free-running greedy generation of the reference's length, stopping at `eos`. The forced run,
/// and whether the free run equals the reference.
pub fn check_case(tag: &str, lm: &dyn CausalLm, case: &Json, eos: Option<u32>) -> (Forced, bool) {
    let forced = teacher_forced(lm.session().unwrap().as_mut(), case);
    assert_forced(tag, &forced);
    let got = greedy(lm, &ids(&case["prompt_ids"]), ids(&case["generated_ids"]).len(), eos);
    (forced, assert_free_run(tag, &got, case))
}

/// Greedy decoding of `n` tokens, stopping at (and leaving out) `eos`.
pub fn greedy(lm: &dyn CausalLm, prompt: &[u32], n: usize, eos: Option<u32>) -> Vec<u32> {
    let mut s = lm.session().unwrap();
    let mut logits = s.forward(prompt, 0).unwrap();
    let mut out = vec![];
    while out.len() < n {
        let tok = argmax(&logits);
        if Some(tok) == eos {
            break;
        }
        out.push(tok);
        logits = s.forward(&[tok], prompt.len() + out.len() - 1).unwrap();
    }
    out
}

/// The largest distance of `got` from `want`, and `want`'s range.
pub fn distance(got: &[f32], want: &[f64]) -> (f64, f64) {
    assert_eq!(got.len(), want.len());
    let diff = got.iter().zip(want).map(|(a, b)| (*a as f64 - b).abs()).fold(0f64, f64::max);
    let (lo, hi) = want.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
    (diff, hi - lo)
}

pub fn floats(v: &Json) -> Vec<f64> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

/// The largest distance of the first-step logits from the reference's, as a fraction of the
/// reference logits' range (full logits) or of the top logit (top 10).
pub fn first_step_fraction(first: &[f32], case: &Json) -> f64 {
    match case.get("first_step_logits") {
        Some(want) => {
            let (diff, range) = distance(first, &floats(want));
            diff / range
        }
        None => first_step_error(first, case) / case["first_step_top10"][0][1].as_f64().unwrap().abs().max(1.0),
    }
}

/// How far first-step logits may be from llama.cpp's on the same file where neither side rounds
/// activations to 8 bits, as a fraction of llama.cpp's range: its f16 KV cache rounds keys and
/// values, and on F16 files its products take f16 activations. Where either side rounds
/// activations to 8 bits, `Q8_LOGIT_DRIFT` of the range.
pub const LLAMA_CPP_FLOAT_BOUND: f64 = 2e-3;

/// Asserts `first` (the logits after case `i` of `entry`'s file `label`) against llama.cpp's on
/// that file (`llama_cpp_first_step_logits`, `test/data/gen_llama_cpp_refs.py`), where the
/// reference holds them; `q8`: either side rounds activations to 8 bits. Returns the distance
/// as a fraction of llama.cpp's range.
pub fn against_llama_cpp(tag: &str, entry: &Json, label: &str, i: usize, first: &[f32], q8: bool) -> Option<f64> {
    let want = floats(entry.get("llama_cpp_first_step_logits")?.get(label)?.get(i)?);
    let (diff, range) = distance(first, &want);
    let bound = if q8 { Q8_LOGIT_DRIFT as f64 } else { LLAMA_CPP_FLOAT_BOUND };
    assert!(diff < bound * range, "{tag}: first-step logits differ from llama.cpp's by {diff}, range {range}");
    Some(diff / range)
}

/// How far logits computed for a row in a batch may be from the row's alone, as a fraction of
/// their scale, where the products round differently at another row count: last bits of f32 on
/// the CPU (1e-5) and on GPUs (1e-4), or of TF32 on CUDA, whose f32 products run on tensor cores
/// with 10-bit mantissas (3e-3). Candle runs on the CPU.
pub fn batch_bound(kind: crate::device::DeviceKind) -> f32 {
    match kind {
        crate::device::DeviceKind::Cpu => 1e-5,
        crate::device::DeviceKind::Cuda => 3e-3,
        _ => 1e-4,
    }
}

/// The engines an LLM test runs a model on: Burn as loaded for the test device (on the CPU, the
/// host path where the weights keep their blocks or rows), Burn with every weight as f32 tensors
/// (the other devices' path), and Candle; each with whether it runs on the CPU.
pub fn engines(path: &std::path::Path) -> Vec<(&'static str, Box<dyn CausalLm>, bool)> {
    use super::{burn_llama::BurnLlama, Engine, TextModel};
    let dev = crate::testing::device();
    let cpu = dev.kind == crate::device::DeviceKind::Cpu;
    vec![
        ("burn", TextModel::load(path, Engine::Burn, dev.clone()).unwrap().lm, cpu),
        ("burn f32", Box::new(BurnLlama::load_with(path, &dev, false).unwrap()) as Box<dyn CausalLm>, cpu),
        ("candle", TextModel::load(path, Engine::Candle, crate::device::DeviceRef::CPU).unwrap().lm, true),
    ]
}

/// Each raw and chat case of `cases` gives the reference's prompt ids on `model`, a chat through
/// the model's template rendered as the reference's text; the number of chat cases.
pub fn assert_prompts(model: &super::TextModel, cases: &Json, tag: &str) -> usize {
    use super::generate::Prompt;
    let mut chats = 0;
    for g in cases.as_array().unwrap() {
        let prompt = match g["kind"].as_str().unwrap() {
            "raw" => Prompt::Text(g["prompt"].as_str().unwrap().into()),
            "chat" => {
                let messages = chat_messages(&g["messages"]);
                assert_eq!(model.render_chat(&messages).unwrap(), g["prompt"].as_str().unwrap(), "{tag}");
                chats += 1;
                Prompt::Chat(messages)
            }
            _ => continue,
        };
        assert_eq!(model.prompt_ids(&prompt).unwrap(), ids(&g["prompt_ids"]), "{tag}: {:?}", g["prompt"]);
    }
    chats
}

/// Where a GPU keeps a quantised file's matrices: as blocks wherever the rows kernel runs the
/// model's layers (not Gemma's), and F16 and F32 files as tensors. A Q2_K file keeps a mix
/// (`Keep::Dense` in `BurnLlama::kept`): its Q2_K matrices, whose offsets per 16 values fit no
/// block layout, are tensors beside the other formats' blocks.
pub fn gpu_keeps(dev: &crate::device::DeviceRef, model: &super::burn_llama::BurnLlama, label: &str) -> super::burn_llama::Keep {
    use super::burn_llama::Keep;
    let runs = crate::gpu::kernels_run(&super::weights::f32_tensor(vec![0.0], [1], &dev.burn().unwrap()));
    if runs && !model.config().family.gemma && !matches!(label, "F16" | "F32" | "Q2_K") {
        Keep::Gpu
    } else {
        Keep::Dense
    }
}

/// The k-size models of `archs` in `~/.cache/ex_burn/<cache>/` (written by `test/data/<script>
/// --k-quants`; skips where absent) as F16, Q8_0, Q4_K_M, Q5_K_M and Q6_K files: `k_quant_files_in`.
pub fn k_quant_files_match(cache: &str, script: &str, archs: &[&str]) {
    let Some(home) = std::env::var_os("HOME") else { return };
    let dir = std::path::PathBuf::from(home).join(".cache/ex_burn").join(cache);
    if !dir.join("reference.json").is_file() {
        println!("SKIPPED: {} not found (python3 test/data/{script} --k-quants writes it)", dir.display());
        return;
    }
    k_quant_files_in(&dir, archs);
}

/// Every file but the F32 one of each of `archs` in `dir`'s reference.json, against transformers
/// on the file's own weights: on the CPU every layer keeps its blocks on Burn;
/// first-step logits within 1e-5 of the largest on f16 rows and f32 tensors (1e-2 off the CPU:
/// TF32), and within `Q8_LOGIT_DRIFT` on the quantised paths, whose activations are rounded to 8
/// bits; every teacher-forced pick is the reference's but where the reference's lead is below
/// `NEAR_TIE`, or on a quantised path below the largest first-step logit error measured on that
/// file and path (a lead smaller than the error the rounding makes tells nothing of the model);
/// and first-step logits against llama.cpp's on the same file (`against_llama_cpp`) where the
/// reference holds them.
pub fn k_quant_files_in(dir: &std::path::Path, archs: &[&str]) {
    use crate::device::DeviceKind;
    let r: Json = serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
    let dev = crate::testing::device();
    for arch in archs {
        let labels: Vec<&str> = r[arch]["files"].as_object().unwrap().keys().map(String::as_str).filter(|l| *l != "F32").collect();
        for label in labels {
            let path = dir.join(r[arch]["files"][label].as_str().unwrap());
            let model = super::burn_llama::BurnLlama::load(&path, &dev).unwrap();
            if dev.kind == DeviceKind::Cpu {
                assert!(model.host_formats().is_some(), "{arch} {label}: every layer in its blocks");
            } else {
                assert_eq!(model.kept(), gpu_keeps(&dev, &model, label), "{arch} {label}");
            }
            let cases = r[arch][format!("generate_{label}")].as_array().unwrap();
            for (engine, lm, on_cpu) in engines(&path) {
                let tag = format!("{arch} {label} {engine}");
                let exact = label == "F16" || engine == "burn f32";
                let (mut worst, mut drift, mut flips, mut cpp) = (0f64, 0f64, vec![], None::<f64>);
                for (i, case) in cases.iter().enumerate() {
                    let forced = teacher_forced(lm.session().unwrap().as_mut(), case);
                    let q8 = !matches!(label, "F16" | "F32");
                    if let Some(d) = against_llama_cpp(&format!("{tag} case {i}"), &r[arch], label, i, &forced.first, q8) {
                        cpp = Some(cpp.unwrap_or(0.0).max(d));
                    }
                    let want: Vec<f64> = case["first_step_logits"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
                    let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
                    let diff = forced.first.iter().zip(&want).map(|(a, b)| (*a as f64 - b).abs()).fold(0f64, f64::max);
                    worst = worst.max(diff / scale);
                    drift = drift.max(diff);
                    let bound = match (exact, on_cpu) {
                        (true, true) => 1e-5,
                        (true, false) => 1e-2,
                        (false, _) => Q8_LOGIT_DRIFT as f64,
                    };
                    assert!(diff < bound * scale, "{tag} case {i}: first-step logits differ by {diff} (largest {scale})");
                    flips.extend(forced.flips.into_iter().map(|f| (i, f)));
                }
                let tie = if exact { NEAR_TIE } else { NEAR_TIE.max(drift) };
                for (i, (step, pick, margin)) in &flips {
                    assert!(*margin < tie, "{tag} case {i}: step {step} picks {pick} where the reference's token leads by {margin} logits (ties below {tie})");
                }
                let cpp = cpp.map_or("no llama.cpp logits".into(), |d| format!("{d:.1e} of llama.cpp's range"));
                println!(
                    "{tag}: {} teacher-forced picks differ (leads below {tie:.2}), first-step logits within {worst:.1e} of the largest, {cpp}",
                    flips.len()
                );
            }
        }
    }
}
