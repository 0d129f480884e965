//! Qwen2 and Qwen3 GGUF files on both engines against transformers (and llama.cpp, where the
//! reference holds its logits), on the tiny random models `test/data/gen_llm_refs.py` writes to
//! `test/data/llm/`: F32, F16 and Q8_0 files of each. The files and references are committed, so
//! a missing one fails.
//!
//! `gen_llm_refs.py --k-quants` writes the same models with rows of 256 as F32, F16, Q4_K_M,
//! Q5_K_M, Q6_K, Q3_K_M and Q2_K files to `~/.cache/ex_burn/llm-kquants/` (too large to commit);
//! their test skips, saying so, where they are absent. A few k-size files of the LLM families
//! are committed in `test/data/llm/kquants/` (`gen_kquant_subset.py`).
//!
//! Qwen2 has Q/K/V biases and an untied output projection; Qwen3 has per-head Q/K norms, heads
//! of 32 with hidden 64 and 4 heads, and a tied output; both rotate halves (`RopeStyle::Halves`).

use std::path::{Path, PathBuf};

use serde_json::Value as Json;

use super::burn_llama::BurnLlama;
use super::greedy_check::{self, distance, engines, floats, ids};
use super::tokenizer::LmTokenizer;
use super::{errors, gguf, Chunk, Engine, TextModel};
use crate::device::{DeviceKind, DeviceRef};

const ARCHS: [&str; 2] = ["qwen2", "qwen3"];
const FILES: [&str; 3] = ["F32", "F16", "Q8_0"];

/// First-step logits of an f32 or f16 file may differ from transformers' by this fraction of
/// the reference logits' range: the same weights, summed in another order. A missing bias,
/// norm or a wrong rotation moves them by a large part of the range.
const FLOAT_LOGIT_BOUND: f64 = 1e-5;

fn llm_dir() -> PathBuf {
    crate::process::env::reference_dir().parent().expect("reference dir has a parent").join("llm")
}

fn reference_in(dir: &Path) -> Json {
    let path = dir.join("reference.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reference {}: {e}", path.display()));
    serde_json::from_str(&text).expect("reference JSON")
}

fn reference() -> Json {
    reference_in(&llm_dir())
}

fn file_in(dir: &Path, r: &Json, arch: &str, label: &str) -> PathBuf {
    dir.join(r[arch]["files"][label].as_str().unwrap())
}

fn file(r: &Json, arch: &str, label: &str) -> PathBuf {
    file_in(&llm_dir(), r, arch, label)
}

#[test]
fn qwen_gguf_engines_match_transformers() {
    println!("{}", check_engines(&llm_dir(), &FILES).join("\n"));
}

/// The same with k-quant blocks (Q4_K and Q6_K, Q6_K alone, Q3_K with Q4_K to Q6_K, Q2_K with
/// Q3_K and Q6_K), where the files have been written.
#[test]
fn qwen_gguf_k_quants_match_transformers() {
    let Some(home) = std::env::var_os("HOME") else { return };
    let dir = PathBuf::from(home).join(".cache/ex_burn/llm-kquants");
    if !dir.join("reference.json").is_file() {
        println!("SKIPPED: {} not found (python3 test/data/gen_llm_refs.py --k-quants writes it)", dir.display());
        return;
    }
    println!("{}", check_engines(&dir, &["F32", "F16", "Q4_K_M", "Q5_K_M", "Q6_K", "Q3_K_M", "Q2_K"]).join("\n"));
    // on the CPU every layer keeps its blocks: Q3_K as the Q6_K blocks of its values, Q2_K as
    // f16 rows; on a GPU where the rows kernel runs, as codes (`greedy_check::gpu_keeps`)
    let dev = crate::testing::device();
    let r = reference_in(&dir);
    for arch in ARCHS {
        for label in ["Q4_K_M", "Q5_K_M", "Q6_K", "Q3_K_M", "Q2_K"] {
            let model = BurnLlama::load(&file_in(&dir, &r, arch, label), &dev).unwrap();
            let formats = model.host_formats();
            match (dev.kind, label) {
                (DeviceKind::Cpu, "Q3_K_M") => assert_eq!(formats.unwrap(), ["Q4_K", "Q5_K", "Q6_K"], "{arch} {label}"),
                (DeviceKind::Cpu, "Q2_K") => assert_eq!(formats.unwrap(), ["F16", "Q6_K"], "{arch} {label}"),
                (DeviceKind::Cpu, _) => assert!(formats.is_some(), "{arch} {label}"),
                _ => assert_eq!(model.kept(), greedy_check::gpu_keeps(&dev, &model, label), "{arch} {label}"),
            }
        }
    }
}

/// The k-quant files committed for every run (`test/data/gen_kquant_subset.py`: Qwen2 as Q4_K_M
/// and Q5_K_M, Phi-3 and Gemma 2 as Q4_K_M), as the caches' whole matrix is checked.
#[test]
fn committed_k_quant_files_match_transformers_and_llama_cpp() {
    greedy_check::k_quant_files_in(&llm_dir().join("kquants"), &["qwen2", "phi3", "gemma2"]);
}

/// Every architecture x file x engine against its reference (module doc); one summary line each.
fn check_engines(dir: &Path, files: &[&str]) -> Vec<String> {
    let r = reference_in(dir);
    let mut summary = vec![];
    for arch in ARCHS {
        let eos = r[arch]["eos_token_id"].as_u64().unwrap() as u32;
        for &label in files {
            let quantised = label != "F32" && label != "F16";
            let path = file_in(dir, &r, arch, label);
            // F32 and F16 files hold the transformers model's own weights; a Q8_0 file is held to
            // transformers on its weights, dequantised
            let cases = r[arch].get(format!("generate_{label}")).unwrap_or(&r[arch]["generate"]).as_array().unwrap();
            for (engine, lm, on_cpu) in engines(&path) {
                let tag = format!("{arch} {label} {engine}");
                assert_eq!(lm.vocab_size(), 384, "{tag}");
                assert_eq!(lm.context_length(), 128, "{tag}");
                let (mut worst, mut worst_cpp, mut flips, mut identical) = (0f64, 0f64, 0, 0);
                for (i, case) in cases.iter().enumerate() {
                    let case_tag = format!("{tag} case {i}");
                    let (forced, same) = greedy_check::check_case(&case_tag, &*lm, case, Some(eos));
                    flips += forced.flips.len();
                    identical += same as usize;

                    let want = floats(&case["first_step_logits"]);
                    let (diff, range) = distance(&forced.first, &want);
                    worst = worst.max(diff / range);
                    if quantised {
                        // against transformers on the file's dequantised weights: activations
                        // rounded to 8 bits on the quantised paths (greedy_check::Q8_LOGIT_DRIFT)
                        let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
                        assert!(diff < greedy_check::Q8_LOGIT_DRIFT as f64 * scale, "{case_tag}: first-step logits differ by {diff} (logits up to {scale})");
                    } else {
                        // TF32 matmuls off the CPU
                        let bound = if on_cpu { FLOAT_LOGIT_BOUND } else { 1e-2 };
                        assert!(diff < bound * range, "{case_tag}: first-step logits differ by {diff}, range {range}");
                    }
                    // both round activations to 8 bits, each its own way, on quantised files
                    if let Some(d) = greedy_check::against_llama_cpp(&case_tag, &r[arch], label, i, &forced.first, quantised) {
                        worst_cpp = worst_cpp.max(d);
                    }
                }
                let steps: usize = cases.iter().map(|c| c["generated_ids"].as_array().unwrap().len()).sum();
                summary.push(format!(
                    "{tag}: {identical}/{} greedy runs identical, {flips} of {steps} teacher-forced picks at near ties differ; \
                     first-step logits within {worst:.1e} of transformers' and {worst_cpp:.1e} of llama.cpp's (fractions of the range)",
                    cases.len()
                ));
            }
        }
    }
    summary
}

/// The tokenizer built from the GGUF metadata gives transformers' ids, and the chat template
/// renders and tokenises as transformers' `apply_chat_template`.
#[test]
fn qwen_gguf_tokenizer_and_chat_template_match_transformers() {
    let r = reference();
    for arch in ARCHS {
        let path = file(&r, arch, "Q8_0");
        let header = gguf::read_header(&path).unwrap();
        assert_eq!(header.str("tokenizer.ggml.pre"), Some("qwen2"));
        let tok = LmTokenizer::from_gguf(&header).unwrap();
        for c in r[arch]["tokenize"].as_array().unwrap() {
            let text = c["text"].as_str().unwrap();
            assert_eq!(tok.encode(text, false).unwrap(), ids(&c["ids"]), "{arch}: {text:?}");
            assert_eq!(tok.encode(text, true).unwrap(), ids(&c["ids"]), "{arch}: no BOS for {text:?}");
            assert_eq!(tok.decode(&ids(&c["ids"])).unwrap(), text);
        }
        let model = TextModel::load(&path, Engine::Candle, super::candle_device::test_device()).unwrap();
        assert_eq!(model.arch, arch);
        assert_eq!(model.bos_token_id, None);
        assert!(model.eos_token_ids.contains(&(r[arch]["eos_token_id"].as_u64().unwrap() as u32)));
        assert_eq!(model.chat_template.as_deref(), r[arch]["chat_template"].as_str());
        assert_eq!(greedy_check::assert_prompts(&model, &r[arch]["generate"], arch), 1);
    }
}

/// A row's logits are the same bits alone and in a batch with other sequences (Burn's host path
/// runs a batch's rows through each layer together), and within last bits on Burn's tensor path,
/// whose batches run ragged chunks padded and masked.
#[test]
fn qwen_gguf_batched_rows_equal_alone() {
    let r = reference();
    for arch in ARCHS {
        for label in FILES {
            for (engine, lm, cpu) in engines(&file(&r, arch, label)) {
                let prompts: [&[u32]; 3] = [&[5, 17, 42, 99, 3], &[300], &[7, 8, 9, 10, 11, 12, 13, 14]];
                let alone: Vec<Vec<f32>> = prompts.iter().map(|p| lm.session().unwrap().forward(p, 0).unwrap()).collect();
                let mut sessions: Vec<_> = prompts.iter().map(|_| lm.session().unwrap()).collect();
                let mut chunks: Vec<Chunk> = sessions.iter_mut().zip(prompts).map(|(s, p)| Chunk { session: s.as_mut(), tokens: p, pos: 0 }).collect();
                let batched: Vec<Vec<f32>> = lm.forward_batch(&mut chunks).into_iter().map(Result::unwrap).collect();
                // f32 products run at the batch's row count, where gemm may sum in another order:
                // Burn's tensor path (dequantised weights, F32 files, which have no blocks to keep,
                // and every file off the CPU) and Candle's F32 and F16 products (last bits)
                let tensor_path = engine == "burn f32" || (engine == "burn" && (label == "F32" || !cpu));
                if tensor_path || (engine == "candle" && label != "Q8_0") {
                    for (b, a) in batched.iter().zip(&alone) {
                        let range = a.iter().fold(0f32, |m, v| m.max(v.abs()));
                        let worst = b.iter().zip(a).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
                        let bound = greedy_check::batch_bound(if engine == "candle" { DeviceKind::Cpu } else { crate::testing::device().kind });
                        assert!(worst <= bound * range, "{arch} {label} {engine}: a batch's logits differ from each row alone by {worst}");
                    }
                } else {
                    assert_eq!(batched, alone, "{arch} {label} {engine}: a batch's logits differ from each row alone");
                }
            }
        }
    }
}

/// A GGUF of an architecture neither engine runs is still the typed error, before any tensor is
/// read; the Qwen files are only known by their own names.
#[test]
fn qwen_gguf_unknown_architecture_is_typed() {
    let r = reference();
    let dir = super::weights::test_support::TempDir::new("qwen-arch");
    let mut bytes = std::fs::read(file(&r, "qwen2", "Q8_0")).unwrap();
    // same length, so the rest of the header still parses: `qwen2` becomes `qwen9`
    let at = bytes.windows(5).position(|w| w == b"qwen2").unwrap();
    bytes[at + 4] = b'9';
    let path = dir.path().join("other.gguf");
    std::fs::write(&path, bytes).unwrap();
    assert_eq!(gguf::read_header(&path).unwrap().architecture(), Some("qwen9"));
    for engine in [Engine::Burn, Engine::Candle] {
        let e = TextModel::load(&path, engine, DeviceRef::CPU).err().unwrap();
        assert_eq!(errors::kind_of(&e), Some(errors::kind::UNKNOWN_ARCHITECTURE), "{engine:?}: {e}");
    }
}
