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
    // NomicBERT: rope scaling, variants of the hub uploads' config, and a cross-encoder
    let nomic = data_dir().join("tiny-nomic-bert-mean");
    let config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(nomic.join("config.json")).unwrap()).unwrap();
    let hub = nomic_hub_config(&config);
    for (tag, base, edit, want) in [
        ("yarn", &config, serde_json::json!({"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1000.0}}), kind::UNSUPPORTED_FEATURE),
        ("half-rotary", &hub, serde_json::json!({"rotary_emb_fraction": 0.5}), kind::UNSUPPORTED_FEATURE),
        ("qkv-bias", &hub, serde_json::json!({"qkv_proj_bias": null}), kind::UNSUPPORTED_FEATURE),
        ("prenorm", &hub, serde_json::json!({"prenorm": true}), kind::UNSUPPORTED_FEATURE),
        ("gelu", &hub, serde_json::json!({"activation_function": "gelu"}), kind::UNSUPPORTED_FEATURE),
        ("ntk", &hub, serde_json::json!({"rotary_scaling_factor": 2.0}), kind::UNSUPPORTED_FEATURE),
        ("no-n_head", &hub, serde_json::json!({"n_head": null}), kind::BAD_CONFIG),
    ] {
        let mut c = base.clone();
        for (k, v) in edit.as_object().unwrap() {
            if v.is_null() {
                c.as_object_mut().unwrap().remove(k);
            } else {
                c[k] = v.clone();
            }
        }
        let dir = nomic_with_config(&format!("nomic-{tag}"), &c);
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

/// `config`, a transformers `NomicBertConfig`, in the keys of nomic-embed-text's hub uploads
/// (GPT-2's names and the upload code's switches, as nomic-embed-text-v1.5's config.json has them).
fn nomic_hub_config(config: &serde_json::Value) -> serde_json::Value {
    let c = |k: &str| config[k].clone();
    let theta = config["rope_parameters"].get("rope_theta").cloned().unwrap_or(serde_json::json!(1000.0));
    serde_json::json!({
        "model_type": "nomic_bert", "architectures": ["NomicBertModel"], "vocab_size": c("vocab_size"),
        "n_embd": c("hidden_size"), "n_head": c("num_attention_heads"), "n_layer": c("num_hidden_layers"),
        "n_inner": c("intermediate_size"), "n_positions": c("max_position_embeddings"),
        "layer_norm_epsilon": c("layer_norm_eps"), "type_vocab_size": c("type_vocab_size"),
        "activation_function": "swiglu", "rotary_emb_base": theta, "rotary_emb_fraction": 1.0,
        "rotary_emb_interleaved": false, "rotary_scaling_factor": null, "rotary_emb_scale_base": null,
        "qkv_proj_bias": false, "mlp_fc1_bias": false, "mlp_fc2_bias": false, "prenorm": false,
        "parallel_block": false, "use_rms_norm": false, "causal": false, "max_trained_positions": 2048,
    })
}

/// A copy of the tiny NomicBERT directory with `config` as its config.json.
fn nomic_with_config(tag: &str, config: &serde_json::Value) -> super::weights::test_support::TempDir {
    let dir = super::gguf::tests::temp_dir(tag);
    for e in std::fs::read_dir(data_dir().join("tiny-nomic-bert-mean")).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() {
            std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
        }
    }
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    dir
}

/// The hub uploads' config form loads as the transformers form of the same model: the same
/// embeddings, bit for bit, on both engines, at the checkpoint's rotary base and at another.
#[test]
fn nomic_hub_config_gives_the_transformers_configs_embeddings() {
    let nomic = data_dir().join("tiny-nomic-bert-mean");
    let config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(nomic.join("config.json")).unwrap()).unwrap();
    let texts = vec!["a rotary encoder".to_string(), "the hub's own config keys, and a longer text than the first".to_string()];
    for engine in [Engine::Burn, Engine::Candle] {
        let mut seen = Vec::new();
        for theta in [1000.0, 10000.0] {
            let mut native = config.clone();
            native["rope_parameters"]["rope_theta"] = serde_json::json!(theta);
            let tag = format!("nomic-{engine:?}-{theta}");
            let (native_dir, hub_dir) = (nomic_with_config(&format!("{tag}-native"), &native), nomic_with_config(&format!("{tag}-hub"), &nomic_hub_config(&native)));
            let (ids, want) = EmbeddingModel::load(&native_dir, engine, DeviceRef::CPU).unwrap().embed(&texts).unwrap();
            let model = EmbeddingModel::load(&hub_dir, engine, DeviceRef::CPU).unwrap_or_else(|e| panic!("{engine:?}: {e}"));
            assert_eq!(model.arch, "nomic_bert");
            let (hub_ids, got) = model.embed(&texts).unwrap();
            assert_eq!(hub_ids, ids);
            assert_eq!(got, want, "{engine:?}, base {theta}");
            seen.push(got);
        }
        assert_ne!(seen[0], seen[1], "the rotary base reaches the forward pass");
    }
}
