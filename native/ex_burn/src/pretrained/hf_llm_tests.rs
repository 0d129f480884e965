//! Hugging Face LLM directories (`hf_decoder`) on both engines against transformers, on the tiny
//! models `test/data/gen_hf_llm_dirs.py` writes to `test/data/llm/hf/` (committed, so nothing
//! skips): the Qwen2 (f16), Qwen3 (f32, tied output), Llama and Phi-3 (f16, SentencePiece
//! tokenizer.json) models whose GGUF files the other tests run, held to the same references, and
//! a Llama with Llama 3 rope scaling in bf16 shards, held to its own.

use std::path::{Path, PathBuf};

use serde_json::Value as Json;

use super::burn_llama::BurnLlama;
use super::errors::{self, kind};
use super::generate::Prompt;
use super::greedy_check::{self, engines, first_step_fraction, greedy, ids};
use super::weights::test_support::TempDir;
use super::{files, Engine, TextModel};
use crate::device::{DeviceKind, DeviceRef};
use crate::error::ExError;

fn llm_dir() -> PathBuf {
    crate::process::env::reference_dir().parent().expect("reference dir has a parent").join("llm")
}

fn json(path: &Path) -> Json {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("reference JSON")
}

/// A directory and what it is held to.
struct Model {
    name: &'static str,
    arch: &'static str,
    vocab: usize,
    /// Reference cases: prompt ids, greedy tokens and margins, and the first step's full logits
    /// (`first_step_logits`) or its top 10 (`first_step_top10`).
    cases: Vec<Json>,
    /// Where greedy decoding stops (the SentencePiece references ran on past eos).
    eos: Option<u32>,
}

fn models() -> Vec<Model> {
    let (qwen, hf, spm) = (json(&llm_dir().join("reference.json")), json(&llm_dir().join("hf/reference.json")), json(&llm_dir().join("reference_spm.json")));
    let cases = |v: &Json| v.as_array().unwrap().clone();
    let eos = |v: &Json| Some(v["eos_token_id"].as_u64().unwrap() as u32);
    vec![
        Model { name: "tiny-qwen2", arch: "qwen2", vocab: 384, cases: cases(&qwen["qwen2"]["generate"]), eos: eos(&qwen["qwen2"]) },
        Model { name: "tiny-qwen3", arch: "qwen3", vocab: 384, cases: cases(&qwen["qwen3"]["generate"]), eos: eos(&qwen["qwen3"]) },
        Model { name: "tiny-llama3", arch: "llama", vocab: 384, cases: cases(&hf["tiny-llama3"]["generate"]), eos: eos(&hf["tiny-llama3"]) },
        Model { name: "tiny-llama-spm", arch: "llama", vocab: 400, cases: cases(&spm["models"]["llama"]["generate"]), eos: None },
        Model { name: "tiny-phi3", arch: "phi3", vocab: 400, cases: cases(&spm["models"]["phi3"]["generate"]), eos: None },
    ]
}

fn dir(name: &str) -> PathBuf {
    llm_dir().join("hf").join(name)
}

/// The weights are f16-, f32- or bf16-stored copies of the reference model's own (rounded to
/// be exact in each), so on the CPU the logits differ from transformers' by f32 summation order
/// only; off the CPU, f32 products may run on TF32.
#[test]
fn hf_dirs_generate_as_transformers_on_both_engines() {
    for m in models() {
        assert_eq!(super::hf_decoder::peek(&dir(m.name)).unwrap(), m.arch, "{}", m.name);
        for (engine, lm, on_cpu) in engines(&dir(m.name)) {
            let tag = format!("{} {engine}", m.name);
            assert_eq!((lm.vocab_size(), lm.context_length()), (m.vocab, 128), "{tag}");
            let (mut worst, mut flips, mut identical) = (0f64, 0, 0);
            for (i, case) in m.cases.iter().enumerate() {
                let case_tag = format!("{tag} case {i}");
                let (forced, same) = greedy_check::check_case(&case_tag, &*lm, case, m.eos);
                flips += forced.flips.len();
                identical += same as usize;
                let err = first_step_fraction(&forced.first, case);
                worst = worst.max(err);
                let bound = if on_cpu { 1e-5 } else { 1e-2 };
                assert!(err < bound, "{case_tag}: first-step logits differ from transformers' by {err} of their range");
            }
            println!(
                "{tag}: {identical}/{} greedy runs identical, {flips} teacher-forced picks at near ties differ, first-step logits within {worst:.1e}",
                m.cases.len()
            );
        }
    }
}

/// tokenizer.json gives transformers' ids; the chat template, BOS and end-of-generation ids come
/// from the directory's configs.
#[test]
fn hf_dirs_tokenize_and_template_as_transformers() {
    let (qwen, hf) = (json(&llm_dir().join("reference.json")), json(&llm_dir().join("hf/reference.json")));
    for arch in ["qwen2", "qwen3"] {
        let model = TextModel::load(&dir(&format!("tiny-{arch}")), Engine::Candle, super::candle_device::test_device()).unwrap();
        let r = &qwen[arch];
        assert_eq!((model.arch.as_str(), model.bos_token_id), (arch, None));
        assert!(model.eos_token_ids.contains(&(r["eos_token_id"].as_u64().unwrap() as u32)), "{arch}: {:?}", model.eos_token_ids);
        assert_eq!(model.chat_template.as_deref(), r["chat_template"].as_str());
        for c in r["tokenize"].as_array().unwrap() {
            let text = c["text"].as_str().unwrap();
            assert_eq!(model.tokenizer.encode(text, true).unwrap(), ids(&c["ids"]), "{arch}: {text:?}");
            assert_eq!(model.tokenizer.decode(&ids(&c["ids"])).unwrap(), text);
        }
        assert_eq!(greedy_check::assert_prompts(&model, &r["generate"], arch), 1);
    }
    // SentencePiece with byte fallback, a BOS the tokenizer's post-processor adds, no template
    let spm = json(&llm_dir().join("reference_spm.json"));
    for name in ["tiny-llama-spm", "tiny-phi3"] {
        let model = TextModel::load(&dir(name), Engine::Candle, super::candle_device::test_device()).unwrap();
        let tok = &model.tokenizer;
        assert_eq!((tok.bos, tok.eos, tok.add_bos, tok.add_eos), (Some(1), Some(2), true, false), "{name}");
        assert_eq!(model.chat_template, None);
        for c in hf["spm_tokenize"].as_array().unwrap() {
            let (text, want) = (c["text"].as_str().unwrap(), ids(&c["ids"]));
            assert_eq!(tok.encode(text, false).unwrap(), want, "{name}: {text:?}");
            // `▁` pieces and `<0xNN>` byte pieces give the text back, after the prefixed space
            // (transformers' Metaspace merges that space into a text's leading ones)
            if !want.iter().any(|&id| tok.is_special(id)) && !text.starts_with(' ') {
                assert_eq!(tok.decode(&want).unwrap(), format!(" {text}"), "{name}");
            }
        }
        for g in spm["models"]["phi3"]["generate"].as_array().unwrap() {
            assert_eq!(model.prompt_ids(&Prompt::Text(g["prompt"].as_str().unwrap().into())).unwrap(), ids(&g["prompt_ids"]), "{name}");
        }
    }
}

/// Every file of `from` copied into a new temporary directory.
fn copy_of(from: &Path, tag: &str) -> TempDir {
    let to = TempDir::new(tag);
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, to.path().join(p.file_name().unwrap())).unwrap();
    }
    to
}

fn edit_json(path: &Path, f: impl FnOnce(&mut Json)) {
    let mut v = json(path);
    f(&mut v);
    std::fs::write(path, v.to_string()).unwrap();
}

fn load_kind(path: &Path, engine: Engine) -> Option<&'static str> {
    let e: ExError = TextModel::load(path, engine, DeviceRef::CPU).err().expect("the load fails");
    errors::kind_of(&e)
}

/// Unsupported or damaged directories get typed errors, before any weight is read where the
/// configs alone say so.
#[test]
fn hf_dir_errors_are_typed() {
    for engine in [Engine::Burn, Engine::Candle] {
        // an architecture neither engine runs, found before the tokenizer (removed here) is read
        let d = copy_of(&dir("tiny-qwen2"), "hf-arch");
        edit_json(&d.path().join("config.json"), |c| c["model_type"] = "gemma7".into());
        std::fs::remove_file(d.path().join("tokenizer.json")).unwrap();
        assert_eq!(load_kind(d.path(), engine), Some(kind::UNKNOWN_ARCHITECTURE), "{engine:?}");

        let d = copy_of(&dir("tiny-qwen2"), "hf-tokenizer");
        std::fs::remove_file(d.path().join("tokenizer.json")).unwrap();
        assert_eq!(load_kind(d.path(), engine), Some(kind::MISSING_FILE), "{engine:?}");

        let d = copy_of(&dir("tiny-qwen2"), "hf-truncated");
        let weights = d.path().join("model.safetensors");
        let len = std::fs::metadata(&weights).unwrap().len();
        std::fs::OpenOptions::new().write(true).open(&weights).unwrap().set_len(len - 100).unwrap();
        assert_eq!(load_kind(d.path(), engine), Some(kind::TRUNCATED_FILE), "{engine:?}");

        let d = copy_of(&dir("tiny-llama3"), "hf-rope");
        edit_json(&d.path().join("config.json"), |c| c["rope_parameters"]["rope_type"] = "yarn".into());
        assert_eq!(load_kind(d.path(), engine), Some(kind::UNSUPPORTED_FEATURE), "{engine:?}");

        let d = copy_of(&dir("tiny-llama3"), "hf-shard");
        std::fs::remove_file(d.path().join("model-00002-of-00002.safetensors")).unwrap();
        assert_eq!(load_kind(d.path(), engine), Some(kind::MISSING_FILE), "{engine:?}");

        let d = copy_of(&dir("tiny-qwen3"), "hf-tensor");
        edit_json(&d.path().join("config.json"), |c| c["num_hidden_layers"] = 3.into());
        assert_eq!(load_kind(d.path(), engine), Some(kind::MISSING_TENSOR), "{engine:?}");

        // a vocabulary the embedding does not have, however large, is refused before use
        let d = copy_of(&dir("tiny-qwen2"), "hf-vocab");
        edit_json(&d.path().join("config.json"), |c| c["vocab_size"] = 1_000_000_000_000u64.into());
        assert_eq!(load_kind(d.path(), engine), Some(kind::BAD_CONFIG), "{engine:?}");

        // weights without config.json are neither a Hugging Face model nor a GGUF directory
        let d = copy_of(&dir("tiny-qwen2"), "hf-config");
        std::fs::remove_file(d.path().join("config.json")).unwrap();
        assert_eq!(load_kind(d.path(), engine), Some(kind::MISSING_FILE), "{engine:?}");
    }
}

/// The models directory lists Hugging Face LLM directories, sharded ones too.
#[test]
fn hf_dirs_are_listed() {
    let root = TempDir::new("hf-list");
    std::fs::create_dir(root.path().join("llm")).unwrap();
    for name in ["tiny-qwen2", "tiny-llama3"] {
        let d = copy_of(&dir(name), "hf-list-model");
        std::fs::rename(d.path(), root.path().join("llm").join(name)).unwrap();
    }
    let listed: Vec<(String, Option<String>, &str)> =
        files::list(root.path()).unwrap().into_iter().map(|e| (e.name, e.arch, e.format.name())).collect();
    assert_eq!(
        listed,
        [("tiny-llama3".to_string(), Some("llama".to_string()), "safetensors"), ("tiny-qwen2".to_string(), Some("qwen2".to_string()), "safetensors")]
    );
}

/// SmolLM2-135M-Instruct as a Hugging Face directory: the f32 weights transformers dequantised
/// from the installed GGUF, saved by `test/data/gen_smollm2_hf_dir.py` (540 MB, not committed;
/// skips where absent), against test/data/pretrained/smollm2_reference.json, which transformers
/// computed on the same weights. A real vocabulary (49152 byte-level tokens from tokenizer.json),
/// chat template and 30 layers, on Burn (f32 tensors) and Candle.
#[test]
fn hf_smollm2_dir_matches_transformers() {
    let Some(home) = std::env::var_os("HOME") else { return };
    let dir = PathBuf::from(home).join(".cache/ex_burn/smollm2-135m-instruct-hf");
    if !super::files::is_hf_dir(&dir) {
        println!("SKIPPED: {} not found (python3 test/data/gen_smollm2_hf_dir.py writes it)", dir.display());
        return;
    }
    let r = super::weights::test_support::reference("smollm2_reference.json");
    for engine in [Engine::Burn, Engine::Candle] {
        let device = if engine == Engine::Burn { crate::testing::device() } else { super::candle_device::test_device() };
        let model = TextModel::load(&dir, engine, device).unwrap();
        assert_eq!((model.arch.as_str(), model.vocab_size(), model.context_length()), ("llama", 49152, 8192));
        assert_eq!((model.tokenizer.bos, model.tokenizer.eos, model.tokenizer.add_bos), (Some(1), Some(2), false));
        assert_eq!(model.chat_template.as_deref(), r["metadata"]["chat_template"].as_str());
        for c in r["tokenize"].as_array().unwrap() {
            let text = c["text"].as_str().unwrap();
            assert_eq!(model.tokenizer.encode(text, false).unwrap(), ids(&c["ids_add_special_tokens_false"]), "{text:?}");
            assert_eq!(model.tokenizer.encode(text, true).unwrap(), ids(&c["ids_add_special_tokens_true"]), "{text:?}");
            assert_eq!(model.tokenizer.decode(&ids(&c["ids_add_special_tokens_false"])).unwrap(), text);
        }
        let (mut worst, mut flips, mut identical) = (0f64, 0, 0);
        let gens = r["generate"].as_array().unwrap();
        for (i, g) in gens.iter().enumerate() {
            let label = format!("SmolLM2 directory on {engine:?}, prompt {i}");
            let prompt = if g["kind"] == "raw" { Prompt::Text(g["prompt"].as_str().unwrap().into()) } else { Prompt::Chat(greedy_check::chat_messages(&g["messages"])) };
            assert_eq!(model.prompt_ids(&prompt).unwrap(), ids(&g["prompt_ids"]), "{label}");
            let forced = greedy_check::teacher_forced(model.lm.session().unwrap().as_mut(), g);
            greedy_check::assert_forced(&label, &forced);
            flips += forced.flips.len();
            worst = worst.max(greedy_check::first_step_error(&forced.first, g));
            let max = g["max_new_tokens"].as_u64().unwrap() as usize;
            let got = greedy(&*model.lm, &ids(&g["prompt_ids"]), max, Some(2));
            identical += greedy_check::assert_free_run(&label, &got, g) as usize;
        }
        println!("SmolLM2 directory on {engine:?}: {identical}/{} greedy runs identical, {flips} teacher-forced picks differ, first-step top-10 logits within {worst:.1e}", gens.len());
        // the reference's own weights in f32: its arithmetic up to summation order
        assert!(worst < 1e-3, "{engine:?}: first-step logits differ by {worst}");
    }
}

/// On the CPU, bf16 weights run on the host path as f16 rows (the generation test holds them to
/// transformers); a matrix with a value past f16's range stays f32, so the model takes the
/// tensor path.
#[test]
fn hf_bf16_weights_become_f16_rows_within_its_range() {
    let dev = crate::testing::device();
    if dev.kind != DeviceKind::Cpu {
        return;
    }
    let model = BurnLlama::load(&dir("tiny-llama3"), &dev).unwrap();
    assert_eq!(model.host_formats(), Some(vec!["F16".to_string()]));
    let d = copy_of(&dir("tiny-llama3"), "hf-bf16-range");
    let name = "model.layers.0.mlp.down_proj.weight";
    let index = json(&d.path().join("model.safetensors.index.json"));
    let shard = d.path().join(index["weight_map"][name].as_str().unwrap());
    let mut bytes = std::fs::read(&shard).unwrap();
    let (header, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let at = 8 + header + meta.info(name).unwrap().data_offsets.0;
    bytes[at..at + 2].copy_from_slice(&burn::tensor::bf16::from_f32(1e5).to_le_bytes());
    std::fs::write(&shard, bytes).unwrap();
    let model = BurnLlama::load(d.path(), &dev).unwrap();
    assert_eq!(model.host_formats(), None);
}
