//! GGUF files with SentencePiece vocabularies (`tokenizer.ggml.model = "llama"`, as Llama 2,
//! Mistral, Phi-3 and Gemma files have) against llama.cpp's tokenizer and transformers' models,
//! on the tiny Llama and Phi-3 (fused Q/K/V and gate/up projections) that
//! `test/data/gen_spm_refs.py` writes (committed, so nothing skips): token ids of texts with
//! repeated spaces, digits, accents, emoji, CJK, control tokens and characters outside the
//! vocabulary, each token's text, and greedy tokens on both engines.

use std::path::PathBuf;

use serde_json::Value as Json;

use super::generate::Prompt;
use super::greedy_check::{self, ids};
use super::tokenizer::LmTokenizer;
use super::{gguf, Engine, TextModel};
use crate::device::DeviceRef;

fn dir() -> PathBuf {
    crate::process::env::reference_dir().parent().expect("reference dir has a parent").join("llm")
}

/// The reference, and the file whose tokenizer it records.
fn reference() -> (Json, PathBuf) {
    let text = std::fs::read_to_string(dir().join("reference_spm.json")).expect("test/data/llm/reference_spm.json");
    let r: Json = serde_json::from_str(&text).expect("reference JSON");
    let path = dir().join(r["file"].as_str().unwrap());
    (r, path)
}

#[test]
fn spm_tokenizer_matches_llama_cpp() {
    let (r, path) = reference();
    let tok = LmTokenizer::from_gguf(&gguf::read_header(&path).unwrap()).unwrap();
    assert_eq!(tok.vocab_size(), 400);
    assert_eq!((tok.bos, tok.eos, tok.add_bos), (Some(1), Some(2), true));
    for c in r["tokenize"].as_array().unwrap() {
        let text = c["text"].as_str().unwrap();
        let want = ids(&c["ids"]);
        assert_eq!(tok.encode(text, false).unwrap(), want, "{text:?}");
        // each token's text as llama.cpp's detokeniser gives it, where that is whole characters
        // (a byte piece of a longer character prints as U+FFFD there)
        for (&id, piece) in want.iter().zip(c["pieces"].as_array().unwrap()) {
            let piece = piece.as_str().unwrap();
            if !piece.contains('\u{FFFD}') && !tok.is_special(id) {
                assert_eq!(String::from_utf8_lossy(tok.token_bytes(id).unwrap()), piece, "{text:?}: token {id}");
            }
        }
        // the pieces' bytes give the text back after the prefixed space
        if !want.iter().any(|&id| tok.is_special(id)) {
            assert_eq!(tok.decode(&want).unwrap(), format!(" {text}"));
        }
    }
}

#[test]
fn spm_ggufs_generate_as_transformers_on_both_engines() {
    let (r, _) = reference();
    let models = r["models"].as_object().unwrap();
    assert_eq!(models.keys().collect::<Vec<_>>(), ["llama", "phi3"]);
    for ((arch, m), engine) in models.iter().flat_map(|m| [(m, Engine::Burn), (m, Engine::Candle)]) {
        let device = if engine == Engine::Burn { crate::testing::device() } else { DeviceRef::CPU };
        let model = TextModel::load(&dir().join(m["file"].as_str().unwrap()), engine, device.clone()).unwrap();
        assert_eq!(&model.arch, arch);
        for g in m["generate"].as_array().unwrap() {
            let label = format!("{arch} on {engine:?}, {:?}", g["prompt"]);
            assert_eq!(model.prompt_ids(&Prompt::Text(g["prompt"].as_str().unwrap().into())).unwrap(), ids(&g["prompt_ids"]), "{label}");
            let forced = greedy_check::teacher_forced(model.lm.session().unwrap().as_mut(), g);
            greedy_check::assert_forced(&label, &forced);
            // f32 weights (f16-representable): transformers' arithmetic up to f32 sums, or TF32
            // products off the CPU (CUDA's tensor cores)
            let worst = greedy_check::first_step_error(&forced.first, g);
            println!("{label}: {} of {} teacher-forced picks differ; first-step top-10 logits within {worst:.2e}", forced.flips.len(), forced.steps);
            let bound = if device.kind == crate::device::DeviceKind::Cpu { 1e-3 } else { 5e-2 };
            assert!(worst < bound, "{label}: first-step logits differ by {worst}");
        }
    }
}

/// Phi-3 quantised to Q8_0 by llama-quantize, against the f32 model's references: on the CPU
/// Burn keeps every fused projection's blocks (the host path) and Candle multiplies the file's
/// blocks, both rounding activations to 8 bits, so picks may differ at near ties only and the
/// first-step logits drift by at most `Q8_LOGIT_DRIFT` of the largest.
#[test]
fn spm_phi3_q8_0_follows_the_f32_model() {
    let (r, _) = reference();
    let m = &r["models"]["phi3"];
    let path = dir().join(m["quantised"]["file"].as_str().unwrap());
    for engine in [Engine::Burn, Engine::Candle] {
        let device = if engine == Engine::Burn { crate::testing::device() } else { DeviceRef::CPU };
        let model = TextModel::load(&path, engine, device).unwrap();
        for g in m["generate"].as_array().unwrap() {
            let label = format!("phi3 Q8_0 on {engine:?}, {:?}", g["prompt"]);
            let forced = greedy_check::teacher_forced(model.lm.session().unwrap().as_mut(), g);
            greedy_check::assert_forced(&label, &forced);
            let worst = greedy_check::first_step_error(&forced.first, g);
            let scale = g["first_step_top10"][0][1].as_f64().unwrap().abs();
            println!("{label}: {} of {} teacher-forced picks differ; first-step top-10 logits within {worst:.3} of {scale:.2}", forced.flips.len(), forced.steps);
            assert!(worst < greedy_check::Q8_LOGIT_DRIFT as f64 * scale.max(1.0), "{label}: first-step logits differ by {worst}");
        }
    }
}

/// The Llama and Phi-3 models with rows of 256 as F16, Q8_0, Q4_K_M, Q5_K_M and Q6_K files
/// (`gen_spm_refs.py --k-quants`, too large to commit: skips where absent), held as
/// `greedy_check::k_quant_files_match` holds them.
#[test]
fn spm_k_quants_match_transformers() {
    greedy_check::k_quant_files_match("spm-kquants", "gen_spm_refs.py", &["llama", "phi3"]);
}
