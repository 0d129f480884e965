//! Gemma, Gemma 2 and Gemma 3 (`Family::gemma`) on both engines against transformers, on the tiny
//! models `test/data/gen_gemma_refs.py` writes to `test/data/llm/gemma/` (committed, so nothing
//! skips): each as an F32 GGUF file, a Q8_0 file and a Hugging Face directory (f16).
//!
//! Gemma 2 caps attention scores and logits (at 5 and 15, low enough to bend them), and its
//! first layer of two slides over 8 positions; Gemma 3 has per-head Q/K norms and five sliding
//! layers with their own rope base before a global one; Gemma (the first) has neither windows,
//! caps nor norms after attention and the MLP. One prompt of each set is longer than the window,
//! so the windows decide its logits.

use std::path::PathBuf;

use serde_json::Value as Json;

use super::burn_llama::BurnLlama;
use super::greedy_check::{self, engines, first_step_fraction, ids};
use super::{Engine, TextModel};
use crate::device::DeviceKind;

fn dir() -> PathBuf {
    crate::process::env::reference_dir().parent().expect("reference dir has a parent").join("llm/gemma")
}

fn reference() -> Json {
    let path = dir().join("reference.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("reference JSON")
}

/// The model's files: the F32 and Q8_0 GGUF files and the Hugging Face directory.
fn sources(r: &Json, arch: &str) -> Vec<(&'static str, PathBuf)> {
    let file = |label: &str| dir().join(r[arch]["files"][label].as_str().unwrap());
    vec![("F32", file("F32")), ("Q8_0", file("Q8_0")), ("hf", dir().join(r[arch]["dir"].as_str().unwrap()))]
}

#[test]
fn gemma_configs_read_alike_from_gguf_and_hf() {
    let r = reference();
    for (arch, sliding, caps) in [
        ("gemma2", vec![true, false], (Some(5.0), Some(15.0))),
        ("gemma3", vec![true, true, true, true, true, false], (None, None)),
        ("gemma", vec![false, false], (None, None)),
    ] {
        for (label, path) in sources(&r, arch) {
            let model = BurnLlama::load_with(&path, &crate::testing::device(), false).unwrap();
            let cfg = model.config();
            let tag = format!("{arch} {label}");
            assert_eq!((cfg.arch.as_str(), cfg.family.gemma, cfg.context_length), (arch, true, 128), "{tag}");
            assert_eq!(cfg.family.post_norms, arch != "gemma", "{tag}");
            let window = (arch != "gemma").then_some(8);
            assert_eq!((cfg.window, &cfg.sliding), (window, &sliding), "{tag}");
            assert_eq!((cfg.attn_softcap, cfg.final_softcap), caps, "{tag}");
            assert_eq!(cfg.attn_scale, 0.25, "{tag}: 1/√query_pre_attn_scalar (Gemma 1: 1/√head_dim)");
            let swa = (arch == "gemma3").then_some((10000.0, 1.0));
            assert_eq!((cfg.rope_freq_base, cfg.rope_swa), (if arch == "gemma3" { 1e6 } else { 10000.0 }, swa), "{tag}");
        }
    }
}

#[test]
fn gemma_generates_as_transformers_on_both_engines() {
    let r = reference();
    for arch in ["gemma2", "gemma3", "gemma"] {
        for (label, path) in sources(&r, arch) {
            // the Q8_0 file is held to transformers on its own weights, dequantised
            let quantised = label == "Q8_0";
            let cases = r[arch].get(format!("generate_{label}")).unwrap_or(&r[arch]["generate"]).as_array().unwrap();
            for (engine, lm, on_cpu) in engines(&path) {
                let tag = format!("{arch} {label} {engine}");
                let (mut worst, mut worst_cpp, mut flips, mut identical) = (0f64, 0f64, 0, 0);
                for (i, case) in cases.iter().enumerate() {
                    let case_tag = format!("{tag} case {i}");
                    let (forced, same) = greedy_check::check_case(&case_tag, &*lm, case, Some(2));
                    flips += forced.flips.len();
                    identical += same as usize;
                    let err = first_step_fraction(&forced.first, case);
                    worst = worst.max(err);
                    // 8-bit activations on the quantised paths (greedy_check::Q8_LOGIT_DRIFT, of
                    // the largest logit, about half the range here); TF32 off the CPU
                    let bound = if quantised && engine != "burn f32" {
                        greedy_check::Q8_LOGIT_DRIFT as f64 / 2.0
                    } else if on_cpu {
                        1e-5
                    } else {
                        1e-2
                    };
                    assert!(err < bound, "{case_tag}: first-step logits differ from transformers' by {err} of their range");
                    if let Some(d) = greedy_check::against_llama_cpp(&case_tag, &r[arch], label, i, &forced.first, quantised) {
                        worst_cpp = worst_cpp.max(d);
                    }
                }
                println!(
                    "{tag}: {identical}/{} greedy runs identical, {flips} teacher-forced picks differ, first-step logits within {worst:.1e} of the range ({worst_cpp:.1e} of llama.cpp's)",
                    cases.len()
                );
            }
        }
    }
}

/// The directory's tokenizer.json gives transformers' ids.
#[test]
fn gemma_hf_tokenizer_matches_transformers() {
    let r = reference();
    for arch in ["gemma2", "gemma3", "gemma"] {
        let model = TextModel::load(&dir().join(r[arch]["dir"].as_str().unwrap()), Engine::Candle, super::candle_device::test_device()).unwrap();
        assert_eq!((model.arch.as_str(), model.bos_token_id), (arch, Some(1)));
        for c in r[arch]["tokenize"].as_array().unwrap() {
            assert_eq!(model.tokenizer.encode(c["text"].as_str().unwrap(), false).unwrap(), ids(&c["ids"]), "{arch}: {:?}", c["text"]);
        }
    }
}

/// The tokenizer read from a GGUF file's metadata gives llama.cpp's ids on that file. (The tiny
/// vocabulary's metadata asks for SentencePiece's leading space, which the directory's
/// tokenizer.json does not add, so the two references differ in a text's first token.)
#[test]
fn gemma_gguf_tokenizer_matches_llama_cpp() {
    use super::{gguf, tokenizer::LmTokenizer};
    let r = reference();
    for arch in ["gemma2", "gemma3", "gemma"] {
        let tok = LmTokenizer::from_gguf(&gguf::read_header(&dir().join(r[arch]["files"]["F32"].as_str().unwrap())).unwrap()).unwrap();
        let want = r[arch]["llama_cpp_tokenize"].as_array().unwrap();
        let cases = r[arch]["tokenize"].as_array().unwrap();
        assert_eq!(want.len(), cases.len());
        for (c, want) in cases.iter().zip(want) {
            let text = c["text"].as_str().unwrap();
            assert_eq!(tok.encode(text, false).unwrap(), ids(want), "{arch}: {text:?}");
        }
    }
}

/// A batch of sequences of different lengths, longer and shorter than the window, gives each
/// one's logits alone: bit for bit on the host path (the Q8_0 file and the directory on the CPU),
/// within `greedy_check::batch_bound` on the tensor path, whose batches pad ragged chunks and
/// mask each layer's window.
#[test]
fn gemma_batched_rows_equal_alone() {
    use super::Chunk;
    let r = reference();
    let prompts: [&[u32]; 3] = [&[5, 17, 42, 99, 3, 250, 77, 300, 12, 8, 60, 61, 7], &[300], &[7, 8, 9, 10, 11]];
    for arch in ["gemma2", "gemma3", "gemma"] {
        for (label, path) in sources(&r, arch) {
            for (engine, lm, cpu) in engines(&path) {
                let host_path = engine == "burn" && cpu && label != "F32";
                let mut alone: Vec<_> = prompts.iter().map(|_| lm.session().unwrap()).collect();
                let mut sessions: Vec<_> = prompts.iter().map(|_| lm.session().unwrap()).collect();
                // a step with each prompt, then a decoding step (past the window for the first)
                for step in 0..2 {
                    let chunk = |i: usize| -> (&[u32], usize) { if step == 0 { (prompts[i], 0) } else { (&[9], prompts[i].len()) } };
                    let want: Vec<Vec<f32>> = alone.iter_mut().enumerate().map(|(i, s)| s.forward(chunk(i).0, chunk(i).1).unwrap()).collect();
                    let mut chunks: Vec<Chunk> = sessions.iter_mut().enumerate().map(|(i, s)| Chunk { session: s.as_mut(), tokens: chunk(i).0, pos: chunk(i).1 }).collect();
                    let batched: Vec<Vec<f32>> = lm.forward_batch(&mut chunks).into_iter().map(Result::unwrap).collect();
                    for (i, (b, a)) in batched.iter().zip(&want).enumerate() {
                        let range = a.iter().fold(0f32, |m, v| m.max(v.abs()));
                        let worst = b.iter().zip(a).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
                        let tag = format!("{arch} {label} {engine} step {step} row {i}");
                        if host_path {
                            assert_eq!(b, a, "{tag}: a batch's logits differ from the row alone");
                        } else {
                            let bound = greedy_check::batch_bound(if engine == "candle" { DeviceKind::Cpu } else { crate::testing::device().kind });
                            assert!(worst <= bound * range, "{tag}: a batch's logits differ from the row alone by {worst}");
                        }
                    }
                }
            }
        }
    }
}

/// The same models with rows of 256 as F16, Q8_0, Q4_K_M, Q5_K_M and Q6_K files
/// (`gen_gemma_refs.py --k-quants`, too large to commit: skips where absent), held as
/// `greedy_check::k_quant_files_match` holds them.
#[test]
fn gemma_k_quants_match_transformers() {
    greedy_check::k_quant_files_match("gemma-kquants", "gen_gemma_refs.py", &["gemma2", "gemma3", "gemma"]);
}

/// A multimodal Gemma 3 checkpoint (`Gemma3ForConditionalGeneration`, its language model under
/// `language_model.`, a vision tower beside it) runs its language model: the same logits, bit for
/// bit, as the text-only directory of the same weights, on every engine.
#[test]
fn gemma3_multimodal_directory_runs_its_language_model() {
    let r = reference();
    let text = dir().join(r["gemma3"]["dir"].as_str().unwrap());
    let mm = dir().join(r["gemma3"]["multimodal_dir"].as_str().unwrap());
    assert_eq!(super::hf_decoder::peek(&mm).unwrap(), "gemma3");
    for ((engine, a, _), (_, b, _)) in engines(&text).into_iter().zip(engines(&mm)) {
        for case in r["gemma3"]["generate"].as_array().unwrap() {
            let ids = ids(&case["prompt_ids"]);
            let want = a.session().unwrap().forward(&ids, 0).unwrap();
            assert_eq!(b.session().unwrap().forward(&ids, 0).unwrap(), want, "{engine}: {ids:?}");
        }
    }
}

/// The hub's multimodal configs leave out what equals `Gemma3TextConfig`'s defaults; those are
/// filled in, and the tensors' three layouts map to their stored names.
#[test]
fn gemma3_multimodal_configs_take_transformers_defaults() {
    use super::hf_decoder::{model_config, Layout};
    let tmp = super::gguf::tests::temp_dir("gemma3-mm-config");
    let config = serde_json::json!({
        "model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
        "text_config": {"model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 34,
                        "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024},
        "vision_config": {"model_type": "siglip_vision_model"},
    });
    std::fs::write(tmp.join("config.json"), config.to_string()).unwrap();
    let (c, _, arch) = model_config(&tmp).unwrap();
    assert_eq!(arch, "gemma3");
    for (key, want) in [("hidden_size", 2560.0), ("num_attention_heads", 8.0), ("num_key_value_heads", 4.0), ("head_dim", 256.0), ("sliding_window", 1024.0), ("rope_theta", 1e6), ("rope_local_base_freq", 1e4), ("query_pre_attn_scalar", 256.0)] {
        assert_eq!(c[key].as_f64(), Some(want), "{key}");
    }
    std::fs::write(tmp.join("config.json"), r#"{"model_type": "gemma3"}"#).unwrap();
    assert_eq!(super::errors::kind_of(&model_config(&tmp).unwrap_err()), Some(super::errors::kind::BAD_CONFIG));
    for (layout, embed, head) in [
        (Layout::Plain, "model.embed_tokens.weight", "lm_head.weight"),
        (Layout::LanguageModel, "language_model.model.embed_tokens.weight", "language_model.lm_head.weight"),
        (Layout::ModelLanguageModel, "model.language_model.embed_tokens.weight", "lm_head.weight"),
    ] {
        assert_eq!((layout.real("model.embed_tokens.weight").as_str(), layout.real("lm_head.weight").as_str()), (embed, head));
    }
}
