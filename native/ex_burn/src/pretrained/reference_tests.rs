//! Tests against the real models and independent references (sentence-transformers and
//! transformers outputs in `test/data/pretrained/`). Each skips with a printed line when a model is
//! not installed; the references are committed, so a missing one fails.
//!
//! Models: `$EXBURN_MODELS_DIR` (default `~/models`): `embeddings/all-minilm-l6-v2/` and
//! `llm/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf`. References:
//! `$EXBURN_REFERENCE_DIR` (default the repository's `test/data/pretrained/`).



use super::errors::{self, kind};
use super::greedy_check::{chat_messages, ids};
use super::generate::{Finish, GenOptions, Prompt};
use super::tokenizer::LmTokenizer;
use super::{gguf, greedy_check, EmbeddingModel, Engine, TextModel};
use super::weights::test_support::{minilm_dir, reference, smollm_path};
use crate::device::DeviceRef;

fn cosine(a: &[f32], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * y).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|y| y.powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

#[test]
fn minilm_candle_matches_sentence_transformers() {
    let Some(dir) = minilm_dir() else { return };
    let r = reference("minilm_reference.json");
    let model = EmbeddingModel::load(&dir, Engine::Candle, super::candle_device::test_device()).unwrap();
    assert_eq!(model.dim(), r["dim"].as_u64().unwrap() as usize);
    assert_eq!(model.max_seq_len, r["max_seq_length"].as_u64().unwrap() as usize);
    assert!(model.normalize);
    let cases = r["cases"].as_array().unwrap();
    let texts: Vec<String> = cases.iter().map(|c| c["text"].as_str().unwrap().to_string()).collect();
    let (token_ids, rows) = model.embed(&texts).unwrap();
    assert_eq!(model.tokenize(&texts).unwrap(), token_ids);
    let mut worst = 1.0f64;
    for (i, c) in cases.iter().enumerate() {
        assert_eq!(token_ids[i], ids(&c["token_ids"]), "token ids of case {i} {:?}", texts[i]);
        let expected: Vec<f64> = c["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        let cos = cosine(&rows[i], &expected);
        worst = worst.min(cos);
        assert!(cos >= 0.9999, "case {i} {:?}: cosine {cos}", texts[i]);
        let norm: f64 = rows[i].iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5);
    }
    println!("MiniLM candle: {} cases, token ids identical, worst cosine {worst:.9} (1 - cos = {:.1e})", cases.len(), 1.0 - worst);
    // One text alone gives the same vector as inside the batch (padding does not leak).
    let (_, alone) = model.embed(&texts[..1]).unwrap();
    assert!(cosine(&alone[0], &rows[0].iter().map(|x| *x as f64).collect::<Vec<_>>()) > 0.99999);
    assert_eq!(errors::kind_of(&model.embed(&[]).unwrap_err()), Some(kind::EMPTY_INPUT));
    assert_eq!(errors::kind_of(&model.tokenize(&[]).unwrap_err()), Some(kind::EMPTY_INPUT));
}

#[test]
fn smollm_gguf_tokenizer_matches_transformers() {
    let Some(path) = smollm_path() else { return };
    let r = reference("smollm2_reference.json");
    let header = gguf::read_header(&path).unwrap();
    let tok = LmTokenizer::from_gguf(&header).unwrap();
    assert_eq!(tok.bos, Some(1));
    assert_eq!(tok.eos, Some(2));
    let cases = r["tokenize"].as_array().unwrap();
    for c in cases {
        let text = c["text"].as_str().unwrap();
        assert_eq!(tok.encode(text, false).unwrap(), ids(&c["ids_add_special_tokens_false"]), "{text:?}");
        assert_eq!(tok.encode(text, true).unwrap(), ids(&c["ids_add_special_tokens_true"]), "{text:?}");
        assert_eq!(tok.decode(&ids(&c["ids_add_special_tokens_false"])).unwrap(), text);
    }
    let mut n = cases.len();
    for g in r["generate"].as_array().unwrap() {
        if g["kind"] == "raw" {
            assert_eq!(tok.encode(g["prompt"].as_str().unwrap(), true).unwrap(), ids(&g["prompt_ids"]));
            n += 1;
        }
    }
    println!("SmolLM2 GGUF tokenizer: {n} texts, token ids identical");
}

#[test]
fn smollm_chat_template_renders_reference_prompts() {
    let Some(path) = smollm_path() else { return };
    let r = reference("smollm2_reference.json");
    let header = gguf::read_header(&path).unwrap();
    let tok = LmTokenizer::from_gguf(&header).unwrap();
    let template = header.str("tokenizer.chat_template").unwrap();
    assert_eq!(template, r["metadata"]["chat_template"].as_str().unwrap());
    let mut n = 0;
    for g in r["generate"].as_array().unwrap().iter().filter(|g| g["kind"] == "chat") {
        let messages = chat_messages(&g["messages"]);
        let text = super::generate::render_chat(template, &messages, "<|im_start|>", "<|im_end|>").unwrap();
        assert_eq!(text, g["prompt"].as_str().unwrap());
        assert_eq!(tok.encode(&text, false).unwrap(), ids(&g["prompt_ids"]));
        n += 1;
    }
    println!("SmolLM2 chat template: {n} prompts render and tokenise as the reference");
}

#[test]
fn smollm_candle_greedy_generation_matches_transformers() {
    let Some(path) = smollm_path() else { return };
    let r = reference("smollm2_reference.json");
    let model = TextModel::load(&path, Engine::Candle, super::candle_device::test_device()).unwrap();
    assert_eq!(model.arch, "llama");
    assert_eq!(model.vocab_size(), 49152);
    assert_eq!(model.context_length(), 8192); // as declared: the rotary tables are built for it
    assert_eq!(model.name, "smollm2-135m-instruct");
    assert!(model.eos_token_ids.contains(&2));
    let (mut identical, mut steps, mut flips) = (0, 0, vec![]);
    let gens = r["generate"].as_array().unwrap();
    for (i, g) in gens.iter().enumerate() {
        let prompt = if g["kind"] == "raw" {
            Prompt::Text(g["prompt"].as_str().unwrap().into())
        } else {
            Prompt::Chat(chat_messages(&g["messages"]))
        };
        let label = format!("{} prompt {i}", g["kind"].as_str().unwrap());
        // Every step, on the reference's own tokens (greedy_check says why).
        let forced = greedy_check::teacher_forced(model.lm.session().unwrap().as_mut(), g);
        greedy_check::assert_forced(&label, &forced);
        steps += forced.steps;
        flips.extend(forced.flips.iter().map(|f| (i, f.0, f.2)));

        let max = g["max_new_tokens"].as_u64().unwrap() as usize;
        let opts = GenOptions::greedy(max);
        let mut whole = model.start(&prompt, opts.clone()).unwrap();
        assert_eq!(whole.prompt_ids(), ids(&g["prompt_ids"]).as_slice());
        let (text, got, finish) = whole.run(&|| true).unwrap();
        // Streaming one token per step gives the same text, piece by piece.
        let mut streamed = model.start(&prompt, opts).unwrap();
        let mut pieces = String::new();
        loop {
            let s = streamed.next(1, &|| true).unwrap();
            pieces.push_str(&s.text);
            if s.done {
                assert_eq!(s.finish, Some(finish));
                break;
            }
        }
        assert_eq!(pieces, text);

        let stopped = g["stopped_at_eos"].as_bool().unwrap();
        if greedy_check::assert_free_run(&label, &got, g) {
            identical += 1;
            assert_eq!(finish, if stopped { Finish::Stop } else { Finish::Length });
            let mut ref_text = g["text"].as_str().unwrap().to_string();
            if stopped {
                ref_text = ref_text.trim_end_matches("<|im_end|>").to_string();
            }
            assert_eq!(text, ref_text);
        }
    }
    println!(
        "SmolLM2 candle greedy: {identical}/{} generations identical; teacher-forced {} of {steps} steps \
         pick another token, all at reference near ties (case, step, margin): {flips:?}",
        gens.len(),
        flips.len()
    );
}

#[test]
fn smollm_candle_sessions_are_independent_and_first_logits_match() {
    let Some(path) = smollm_path() else { return };
    let r = reference("smollm2_reference.json");
    let model = TextModel::load(&path, Engine::Candle, super::candle_device::test_device()).unwrap();
    let gens = r["generate"].as_array().unwrap();
    let (p0, p1) = (ids(&gens[0]["prompt_ids"]), ids(&gens[1]["prompt_ids"]));
    let mut a = model.lm.session().unwrap();
    let first = a.forward(&p1, 0).unwrap();
    // A used session, then a fresh one: the fresh one must not see the other's cache.
    let _ = a.forward(&p0, 0).unwrap();
    let _ = a.forward(&[42], p0.len()).unwrap();
    let mut b = model.lm.session().unwrap();
    assert_eq!(b.forward(&p1, 0).unwrap(), first);
    // a position other than the cache's length is refused, and leaves the session usable
    let e = b.forward(&[42], p1.len() + 3).unwrap_err().to_string();
    assert!(e.contains("fed in order"), "{e}");
    b.forward(&[42], p1.len()).unwrap();
    // Feeding a prompt in two chunks gives the logits of feeding it whole.
    let mut c = model.lm.session().unwrap();
    let _ = c.forward(&p1[..2], 0).unwrap();
    let chunked = c.forward(&p1[2..], 2).unwrap();
    let diff = chunked.iter().zip(&first).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    assert!(diff < 1e-3, "chunked prompt differs by {diff}");
    // First-step logits against transformers' (dequantised f32) top 10.
    let worst = greedy_check::first_step_error(&first, &gens[1]);
    println!("SmolLM2 candle: first-step top-10 logits within {worst:.4} of transformers'");
    // measured 0.27 where gemm runs its AVX-512 kernels and 0.50 with its AVX2 ones (the Q8_1-
    // quantised activations, greedy_check); one layer skipped gives 9.0
    assert!(worst < 0.75, "first-step logits differ by {worst}");
}

#[test]
fn smollm_text_model_errors() {
    let Some(path) = smollm_path() else { return };
    let model = TextModel::load(&path, Engine::Candle, super::candle_device::test_device()).unwrap();
    let e = model.start(&Prompt::Text(String::new()), GenOptions::greedy(256)).err().unwrap();
    assert_eq!(errors::kind_of(&e), Some(kind::EMPTY_PROMPT));
    // A stop string spanning tokens, streamed one token at a time: text up to it, never past.
    let prompt = Prompt::Text("Here is a list of three fruits:\n1.".into());
    let opts = GenOptions { stop: vec!["\n3.".into()], ..GenOptions::greedy(16) };
    let (whole, _, finish) = model.start(&prompt, opts.clone()).unwrap().run(&|| true).unwrap();
    let mut g = model.start(&prompt, opts).unwrap();
    let mut pieces = vec![];
    while !g.next(1, &|| true).map(|s| { pieces.push(s.text); s.done }).unwrap() {}
    assert_eq!(finish, Finish::Stop);
    assert_eq!(pieces.concat(), whole);
    assert!(!whole.contains("\n3"), "{whole:?}");
    println!("SmolLM2 stop string: {whole:?} in {} pieces {pieces:?}", pieces.len());
    let long = "word ".repeat(9000); // past the 8192 positions SmolLM2 declares
    let e = model.start(&Prompt::Text(long), GenOptions::greedy(256)).err().unwrap();
    assert_eq!(errors::kind_of(&e), Some(kind::PROMPT_TOO_LONG));
    // The Burn engine is another agent's; whatever it answers, it must be an error or a model.
    let gpu = DeviceRef { kind: crate::device::DeviceKind::Vulkan, index: 0 };
    let e = TextModel::load(&path, Engine::Candle, gpu).err().unwrap();
    assert_eq!(errors::kind_of(&e), Some(kind::UNSUPPORTED_DEVICE));
}
