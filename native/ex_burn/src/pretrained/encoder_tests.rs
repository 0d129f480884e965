//! The encoder families, pooling modes, modules and cross-encoders against sentence-transformers,
//! on the tiny random models `test/data/gen_encoder_refs.py` writes to `test/data/encoders/`
//! (committed, so these never skip), on both engines.

use std::path::PathBuf;

use super::errors::{kind, kind_of};
use super::greedy_check::ids;
use super::rerank::Reranker;
use super::{EmbeddingModel, Engine};
use crate::device::DeviceRef;

fn data_dir() -> PathBuf {
    crate::process::env::reference_dir().parent().expect("reference dir has a parent").join("encoders")
}

fn reference() -> serde_json::Value {
    let path = data_dir().join("reference.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reference {}: {e}", path.display()));
    serde_json::from_str(&text).expect("reference JSON")
}

fn cosine(a: &[f32], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * y).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|y| y.powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

fn floats(v: &serde_json::Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

/// Every embedding model on `engine`: identical token ids, cosine >= 0.9999 to
/// sentence-transformers, and (without Normalize) the same length too.
fn embeddings_match(engine: Engine) {
    let r = reference();
    for (name, m) in r["embeddings"].as_object().unwrap() {
        let dir = data_dir().join(m["path"].as_str().unwrap());
        let arch = m["arch"].as_str().unwrap();
        let model = EmbeddingModel::load(&dir, engine, DeviceRef::CPU).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(model.arch, arch);
        assert_eq!(model.dim(), m["dim"].as_u64().unwrap() as usize, "{name}");
        assert_eq!(model.max_seq_len, m["max_seq_length"].as_u64().unwrap() as usize, "{name}");
        assert_eq!(model.normalize, m["normalize"].as_bool().unwrap(), "{name}");
        let cases = m["cases"].as_array().unwrap();
        let texts: Vec<String> = cases.iter().map(|c| c["text"].as_str().unwrap().to_string()).collect();
        let (token_ids, rows) = model.embed(&texts).unwrap();
        let mut worst = 1.0f64;
        let mut worst_norm = 0.0f64;
        for (i, c) in cases.iter().enumerate() {
            assert_eq!(token_ids[i], ids(&c["token_ids"]), "{name}: token ids of {:?}", texts[i]);
            let want = floats(&c["embedding"]);
            let cos = cosine(&rows[i], &want);
            worst = worst.min(cos);
            assert!(cos >= 0.9999, "{name} on {engine:?}: cosine {cos} for {:?}", texts[i]);
            let (n, wn) = (rows[i].iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt(), want.iter().map(|x| x * x).sum::<f64>().sqrt());
            worst_norm = worst_norm.max((n / wn - 1.0).abs());
            assert!((n / wn - 1.0).abs() < 1e-4, "{name}: norm {n} vs {wn}");
        }
        // One text alone gives the vector it has inside the padded batch.
        let (_, alone) = model.embed(&texts[6..7]).unwrap();
        assert!(cosine(&alone[0], &rows[6].iter().map(|x| *x as f64).collect::<Vec<_>>()) > 0.99999);
        println!(
            "{name} ({arch}) on {}: {} texts, token ids identical, worst cosine {worst:.9} (1 - cos = {:.1e}), norms within {worst_norm:.1e}",
            engine.name(),
            cases.len(),
            1.0 - worst
        );
    }
}

#[test]
fn encoder_families_match_sentence_transformers_on_burn() {
    embeddings_match(Engine::Burn);
}

#[test]
fn encoder_families_match_sentence_transformers_on_candle() {
    embeddings_match(Engine::Candle);
}

fn rerankers_match(engine: Engine) {
    let r = reference();
    for (name, m) in r["rerankers"].as_object().unwrap() {
        let dir = data_dir().join(m["path"].as_str().unwrap());
        let model = Reranker::load(&dir, engine, DeviceRef::CPU).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(model.arch, m["arch"].as_str().unwrap());
        assert_eq!(model.activation.name(), m["activation"].as_str().unwrap());
        assert_eq!(model.max_seq_len, m["max_seq_length"].as_u64().unwrap() as usize);
        let query = m["query"].as_str().unwrap();
        let docs: Vec<String> = m["documents"].as_array().unwrap().iter().map(|d| d.as_str().unwrap().to_string()).collect();
        let pair_ids = model.tokenize(query, &docs).unwrap();
        for (i, want) in m["token_ids"].as_array().unwrap().iter().enumerate() {
            assert_eq!(pair_ids[i], ids(want), "{name}: pair {i}");
        }
        let mut worst = 0f64;
        for (raw, key) in [(false, "scores"), (true, "logits")] {
            let got = model.score(query, &docs, raw).unwrap();
            for (g, w) in got.iter().zip(floats(&m[key])) {
                worst = worst.max((*g as f64 - w).abs());
                assert!((*g as f64 - w).abs() < 1e-4, "{name} on {engine:?} {key}: {g} vs {w}");
            }
        }
        // One document alone scores as it does among the others (padding does not leak).
        let alone = model.score(query, &docs[3..4], false).unwrap();
        assert!((alone[0] as f64 - floats(&m["scores"])[3]).abs() < 1e-4);
        println!("{name} on {}: {} documents, token ids identical, scores and logits within {worst:.1e}", engine.name(), docs.len());
    }
}

#[test]
fn rerankers_match_cross_encoder_on_burn() {
    rerankers_match(Engine::Burn);
}

#[test]
fn rerankers_match_cross_encoder_on_candle() {
    rerankers_match(Engine::Candle);
}

#[test]
fn unknown_encoder_types_are_refused_before_the_weights() {
    let dir = super::gguf::tests::temp_dir("encoder-unknown");
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(data_dir().join("tiny-mpnet-mean").join(f), dir.join(f)).unwrap();
    }
    let cfg = std::fs::read_to_string(dir.join("config.json")).unwrap().replace("\"mpnet\"", "\"nomic_bert_v9\"");
    std::fs::write(dir.join("config.json"), cfg).unwrap();
    // not a safetensors file at all: the model type is refused first
    std::fs::write(dir.join("model.safetensors"), b"not weights").unwrap();
    for engine in [Engine::Burn, Engine::Candle] {
        let e = EmbeddingModel::load(&dir, engine, DeviceRef::CPU).err().unwrap();
        assert_eq!(kind_of(&e), Some(kind::UNKNOWN_ARCHITECTURE), "{e}");
        assert!(e.to_string().contains("nomic_bert_v9"), "{e}");
        let e = Reranker::load(&dir, engine, DeviceRef::CPU).err().unwrap();
        assert_eq!(kind_of(&e), Some(kind::UNKNOWN_ARCHITECTURE), "{e}");
    }
    // NomicBERT: a config in the first hub uploads' keys, rope scaling, and a cross-encoder
    let nomic = data_dir().join("tiny-nomic-bert-mean");
    let config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(nomic.join("config.json")).unwrap()).unwrap();
    for (tag, edit, want) in [
        ("n_embd", serde_json::json!({"n_embd": 32, "hidden_size": null}), kind::BAD_CONFIG),
        ("yarn", serde_json::json!({"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1000.0}}), kind::UNSUPPORTED_FEATURE),
    ] {
        let dir = super::gguf::tests::temp_dir(&format!("nomic-{tag}"));
        for e in std::fs::read_dir(&nomic).unwrap() {
            let p = e.unwrap().path();
            if p.is_file() {
                std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
            }
        }
        let mut c = config.clone();
        for (k, v) in edit.as_object().unwrap() {
            if v.is_null() {
                c.as_object_mut().unwrap().remove(k);
            } else {
                c[k] = v.clone();
            }
        }
        std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
        for engine in [Engine::Burn, Engine::Candle] {
            let e = EmbeddingModel::load(&dir, engine, DeviceRef::CPU).err().unwrap();
            assert_eq!(kind_of(&e), Some(want), "{tag} on {engine:?}: {e}");
        }
    }
    for engine in [Engine::Burn, Engine::Candle] {
        let e = Reranker::load(&nomic, engine, DeviceRef::CPU).err().unwrap();
        assert_eq!(kind_of(&e), Some(kind::UNSUPPORTED_MODULE), "{e}");
    }
    // A classifier with two labels is not a reranker.
    let dir = super::gguf::tests::temp_dir("reranker-labels");
    for f in ["config.json", "tokenizer.json", "model.safetensors"] {
        std::fs::copy(data_dir().join("tiny-bert-reranker").join(f), dir.join(f)).unwrap();
    }
    let cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let mut cfg = cfg.as_object().unwrap().clone();
    cfg.insert("id2label".into(), serde_json::json!({"0": "a", "1": "b"}));
    std::fs::write(dir.join("config.json"), serde_json::to_string(&cfg).unwrap()).unwrap();
    let e = Reranker::load(&dir, Engine::Burn, DeviceRef::CPU).err().unwrap();
    assert_eq!(kind_of(&e), Some(kind::UNSUPPORTED_MODULE), "{e}");
    let e = Reranker::score(&Reranker::load(&data_dir().join("tiny-bert-reranker"), Engine::Burn, DeviceRef::CPU).unwrap(), "q", &[], false);
    assert_eq!(kind_of(&e.err().unwrap()), Some(kind::EMPTY_INPUT));
}
