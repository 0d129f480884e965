//! Loading errors, on small synthetic files: each bad input gives its own `kind`.

use std::path::Path;

use super::errors::{kind, kind_of};
use super::gguf::tests::{temp_dir, write_gguf};
use super::gguf::Value;
use super::{candle_llama, EmbeddingModel, Engine, TextModel};
use crate::device::{DeviceKind, DeviceRef};
use crate::error::ExError;

const BERT_CONFIG: &str = r#"{"model_type": "bert", "vocab_size": 3, "hidden_size": 4, "num_hidden_layers": 1,
 "num_attention_heads": 1, "intermediate_size": 8, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
 "max_position_embeddings": 16, "type_vocab_size": 2, "initializer_range": 0.02, "layer_norm_eps": 1e-12,
 "pad_token_id": 0}"#;

const TOKENIZER: &str = r#"{"version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
 "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
 "model": {"type": "WordLevel", "vocab": {"[PAD]": 0, "[UNK]": 1, "a": 2}, "unk_token": "[UNK]"}}"#;

/// A tiny BERT's safetensors: every tensor BertModel reads, filled with small values.
fn bert_safetensors(path: &Path) {
    let (h, i, v, p, t) = (4usize, 8usize, 3usize, 16usize, 2usize);
    let mut shapes: Vec<(String, Vec<usize>)> = vec![
        ("embeddings.word_embeddings.weight".into(), vec![v, h]),
        ("embeddings.position_embeddings.weight".into(), vec![p, h]),
        ("embeddings.token_type_embeddings.weight".into(), vec![t, h]),
        ("embeddings.LayerNorm.weight".into(), vec![h]),
        ("embeddings.LayerNorm.bias".into(), vec![h]),
    ];
    let l = "encoder.layer.0";
    for (name, shape) in [
        ("attention.self.query.weight", vec![h, h]),
        ("attention.self.query.bias", vec![h]),
        ("attention.self.key.weight", vec![h, h]),
        ("attention.self.key.bias", vec![h]),
        ("attention.self.value.weight", vec![h, h]),
        ("attention.self.value.bias", vec![h]),
        ("attention.output.dense.weight", vec![h, h]),
        ("attention.output.dense.bias", vec![h]),
        ("attention.output.LayerNorm.weight", vec![h]),
        ("attention.output.LayerNorm.bias", vec![h]),
        ("intermediate.dense.weight", vec![i, h]),
        ("intermediate.dense.bias", vec![i]),
        ("output.dense.weight", vec![h, i]),
        ("output.dense.bias", vec![h]),
        ("output.LayerNorm.weight", vec![h]),
        ("output.LayerNorm.bias", vec![h]),
    ] {
        shapes.push((format!("{l}.{name}"), shape));
    }
    let tensors: Vec<(String, candle_core::Tensor)> = shapes
        .into_iter()
        .enumerate()
        .map(|(k, (name, shape))| {
            let n: usize = shape.iter().product();
            let data: Vec<f32> = (0..n).map(|j| ((j * 7 + k * 3) % 11) as f32 / 10.0 - 0.5).collect();
            (name, candle_core::Tensor::from_vec(data, shape, &candle_core::Device::Cpu).unwrap())
        })
        .collect();
    candle_core::safetensors::save(&tensors.into_iter().collect(), path).unwrap();
}

fn bert_dir(tag: &str) -> super::weights::test_support::TempDir {
    let dir = temp_dir(tag);
    std::fs::write(dir.join("config.json"), BERT_CONFIG).unwrap();
    std::fs::write(dir.join("tokenizer.json"), TOKENIZER).unwrap();
    bert_safetensors(&dir.join("model.safetensors"));
    dir
}

fn kind_err<T>(r: Result<T, ExError>) -> &'static str {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => kind_of(&e).unwrap_or_else(|| panic!("untyped error: {e}")),
    }
}

#[test]
fn tiny_bert_loads_and_embeds_on_candle() {
    let dir = bert_dir("bert-ok");
    let m = EmbeddingModel::load(&dir, Engine::Candle, DeviceRef::CPU).unwrap();
    assert_eq!((m.dim(), m.max_seq_len, m.normalize), (4, 16, false));
    let (ids, rows) = m.embed(&["a a".into(), "a b a a".into()]).unwrap();
    assert_eq!(ids, vec![vec![2, 2], vec![2, 1, 2, 2]]);
    // Padding must not change a row: the short text alone gives the same vector.
    let (_, alone) = m.embed(&["a a".into()]).unwrap();
    for (x, y) in rows[0].iter().zip(&alone[0]) {
        assert!((x - y).abs() < 1e-5, "{:?} vs {:?}", rows[0], alone[0]);
    }
    // With modules.json asking for Normalize, rows have unit norm.
    std::fs::write(dir.join("modules.json"), r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
        {"idx":1,"name":"1","path":"2_Normalize","type":"sentence_transformers.models.Normalize"}]"#).unwrap();
    let m = EmbeddingModel::load(&dir, Engine::Candle, DeviceRef::CPU).unwrap();
    let (_, rows) = m.embed(&["a".into()]).unwrap();
    assert!((rows[0].iter().map(|x| x * x).sum::<f32>() - 1.0).abs() < 1e-5);
    // Long inputs are truncated at max_position_embeddings (16).
    let (ids, _) = m.embed(&[["a"; 40].join(" ")]).unwrap();
    assert_eq!(ids[0].len(), 16);
}

#[test]
fn embedding_model_errors_are_distinct() {
    let cpu = DeviceRef::CPU;
    assert_eq!(kind_err(EmbeddingModel::load(Path::new("/nonexistent/model"), Engine::Candle, cpu)), kind::MISSING_FILE);

    let dir = bert_dir("bert-missing");
    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    assert_eq!(kind_err(EmbeddingModel::load(&dir, Engine::Candle, cpu)), kind::MISSING_FILE);

    let dir = bert_dir("bert-truncated");
    let p = dir.join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() - 10]).unwrap();
    assert_eq!(kind_err(EmbeddingModel::load(&dir, Engine::Candle, cpu)), kind::TRUNCATED_FILE);
    std::fs::write(&p, b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}").unwrap();
    assert_eq!(kind_err(EmbeddingModel::load(&dir, Engine::Candle, cpu)), kind::CORRUPT_SAFETENSORS);

    let dir = bert_dir("bert-arch");
    std::fs::write(dir.join("config.json"), BERT_CONFIG.replace("\"bert\"", "\"deberta-v2\"")).unwrap();
    assert_eq!(kind_err(EmbeddingModel::load(&dir, Engine::Candle, cpu)), kind::UNKNOWN_ARCHITECTURE);
    std::fs::write(dir.join("config.json"), "{\"model_type\": ").unwrap();
    assert_eq!(kind_err(EmbeddingModel::load(&dir, Engine::Candle, cpu)), kind::BAD_CONFIG);
    std::fs::write(dir.join("config.json"), BERT_CONFIG.replace("\"hidden_size\": 4", "\"hidden_size\": 8")).unwrap();
    assert_eq!(kind_err(EmbeddingModel::load(&dir, Engine::Candle, cpu)), kind::BAD_CONFIG);

    let dir = bert_dir("bert-module");
    std::fs::write(dir.join("modules.json"), r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
        {"idx":1,"name":"1","path":"2_Dense","type":"sentence_transformers.models.Dense"}]"#).unwrap();
    assert_eq!(kind_err(EmbeddingModel::load(&dir, Engine::Candle, cpu)), kind::MISSING_FILE);
    std::fs::write(dir.join("modules.json"), r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
        {"idx":1,"name":"1","path":"2_LayerNorm","type":"sentence_transformers.models.LayerNorm"}]"#).unwrap();
    assert_eq!(kind_err(EmbeddingModel::load(&dir, Engine::Candle, cpu)), kind::UNSUPPORTED_MODULE);

    let dir = bert_dir("bert-tokenizer");
    std::fs::write(dir.join("tokenizer.json"), "{}").unwrap();
    assert_eq!(kind_err(EmbeddingModel::load(&dir, Engine::Candle, cpu)), kind::BAD_TOKENIZER);

    let dir = bert_dir("bert-device");
    let gpu = DeviceRef { kind: DeviceKind::Vulkan, index: 0 };
    assert_eq!(kind_err(EmbeddingModel::load(&dir, Engine::Candle, gpu)), kind::UNSUPPORTED_DEVICE);
}

/// GGUF metadata of a Llama with a 4-token byte-level vocabulary.
fn llama_metadata(arch: &str, tokenizer: &str) -> Vec<(&'static str, Value)> {
    let s = |v: &str| Value::Str(v.to_string());
    vec![
        ("general.architecture", s(arch)),
        ("llama.context_length", Value::U32(64)),
        ("tokenizer.ggml.model", s(tokenizer)),
        ("tokenizer.ggml.tokens", Value::Array(vec![s("a"), s("b"), s("ab"), s("<|end|>")])),
        ("tokenizer.ggml.merges", Value::Array(vec![s("a b")])),
        ("tokenizer.ggml.token_type", Value::Array(vec![Value::I32(1), Value::I32(1), Value::I32(1), Value::I32(3)])),
        ("tokenizer.ggml.eos_token_id", Value::U32(3)),
    ]
}

#[test]
fn llm_load_errors_are_distinct() {
    let cpu = DeviceRef::CPU;
    let dir = temp_dir("llm-errors");
    assert_eq!(kind_err(TextModel::load(&dir.join("none.gguf"), Engine::Candle, cpu)), kind::MISSING_FILE);
    assert_eq!(kind_err(TextModel::load(&dir, Engine::Candle, cpu)), kind::MISSING_FILE); // no .gguf in it

    let p = dir.join("m.gguf");
    write_gguf(&p, &llama_metadata("qwen3moe", "gpt2"), &[]);
    assert_eq!(kind_err(TextModel::load(&p, Engine::Candle, cpu)), kind::UNKNOWN_ARCHITECTURE);
    assert_eq!(kind_err(TextModel::load(&p, Engine::Burn, cpu)), kind::UNKNOWN_ARCHITECTURE);

    write_gguf(&p, &llama_metadata("llama", "t5"), &[]);
    assert_eq!(kind_err(TextModel::load(&p, Engine::Candle, cpu)), kind::UNSUPPORTED_TOKENIZER);

    // IQ2_XXS (16) and an id no table knows (99).
    write_gguf(&p, &llama_metadata("llama", "gpt2"), &[("w", vec![256], 16, vec![0u8; 66]), ("v", vec![32], 99, vec![0u8; 32])]);
    let e = TextModel::load(&p, Engine::Candle, cpu).err().unwrap();
    assert_eq!(kind_of(&e), Some(kind::UNSUPPORTED_QUANTIZATION));
    assert!(e.to_string().contains("IQ2_XXS") && e.to_string().contains("type 99"), "{e}");

    write_gguf(&p, &llama_metadata("llama", "gpt2"), &[("w", vec![64], 0, vec![0u8; 256])]);
    let full = std::fs::read(&p).unwrap();
    std::fs::write(&p, &full[..full.len() - 64]).unwrap();
    assert_eq!(kind_err(candle_llama::load(&p, &cpu)), kind::TRUNCATED_FILE);

    std::fs::write(&p, b"PK\x03\x04 a zip, not a model").unwrap();
    assert_eq!(kind_err(TextModel::load(&p, Engine::Candle, cpu)), kind::NOT_GGUF);

    let two = temp_dir("llm-two");
    write_gguf(&two.join("a.gguf"), &llama_metadata("llama", "gpt2"), &[]);
    write_gguf(&two.join("b.gguf"), &llama_metadata("llama", "gpt2"), &[]);
    assert_eq!(kind_err(TextModel::load(&two, Engine::Candle, cpu)), kind::AMBIGUOUS_MODEL);

    let gpu = DeviceRef { kind: DeviceKind::Vulkan, index: 0 };
    assert_eq!(kind_err(candle_llama::load(&two.join("a.gguf"), &gpu)), kind::UNSUPPORTED_DEVICE);
}
