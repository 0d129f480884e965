//! Pre-trained model timings in Rust, outside the BEAM: the device side of
//! `bench/pretrained.exs`, for machines with no Erlang (a GPU host), where the peer is
//! `EXBURN_BENCH_TORCH_DEVICE=cuda python3 bench/pretrained_peer.py embed` in the same run.
//! Build without the NIF layer:
//!
//!     cargo build --release -p ex_burn --no-default-features --example pretrained_bench
//!     CARGO_TARGET_DIR=~/.cache/ex_burn/target-vulkan cargo build --release -p ex_burn \
//!         --no-default-features --features vulkan --example pretrained_bench
//!
//!     pretrained_bench [--device cpu|vulkan:0|cuda:0] [--engine burn|candle] [--models DIR]
//!                      [--bench DIR] [--reference FILE] [--embed-runs N] [--latency-runs N]
//!                      [--llm-runs N] [--skip embed|llm]
//!
//! Same cases and inputs as `bench/pretrained.exs` (`bench/data/pretrained_sentences.txt`,
//! `bench/data/pretrained_prompt.txt`; `--bench` is the folder holding `data/`, default `bench`),
//! and the same output lines as `bench/pretrained_peer.py`: `R<TAB>case<TAB>key=value...`.
//!
//! * `embed_batch32`: `EmbeddingModel::embed` of the 32 sentences in one call (median, p90 ms;
//!   embeddings/s); `embed_batch1`: one sentence a call, cycling through them. Every sentence is
//!   embedded once at batch 1 before timing, so GPU shaders of every length are compiled and
//!   autotuned first.
//! * `embed_check`: the minimum cosine between this device's embeddings and the
//!   sentence-transformers reference (`test/data/pretrained/minilm_reference.json`), when found.
//! * `llm`: 64 new greedy tokens (total, first = prompt + 1 token, tok/s, decode tok/s) and the
//!   token ids, to compare with the CPU's.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use ex_burn::device::{DeviceKind, DeviceRef};
use ex_burn::pretrained::generate::{GenOptions, Prompt};
use ex_burn::pretrained::{EmbeddingModel, Engine, TextModel};

struct Args {
    device: DeviceRef,
    engine: Engine,
    models: PathBuf,
    bench: PathBuf,
    reference: PathBuf,
    embed_runs: usize,
    latency_runs: usize,
    llm_runs: usize,
    skip: Vec<String>,
}

fn parse_device(spec: &str) -> DeviceRef {
    DeviceRef::parse(spec).unwrap_or_else(|e| panic!("{e}"))
}

fn args() -> Args {
    let mut a = Args {
        device: DeviceRef::CPU,
        engine: Engine::Burn,
        models: ex_burn::process::env::models_dir(),
        bench: PathBuf::from("bench"),
        reference: PathBuf::from("test/data/pretrained/minilm_reference.json"),
        embed_runs: 20,
        latency_runs: 64,
        llm_runs: 3,
        skip: vec![],
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--device" => a.device = parse_device(&val()),
            "--engine" => a.engine = Engine::from_name(&val()).expect("engine is burn or candle"),
            "--models" => a.models = PathBuf::from(val()),
            "--bench" => a.bench = PathBuf::from(val()),
            "--reference" => a.reference = PathBuf::from(val()),
            "--embed-runs" => a.embed_runs = val().parse().expect("number"),
            "--latency-runs" => a.latency_runs = val().parse().expect("number"),
            "--llm-runs" => a.llm_runs = val().parse().expect("number"),
            "--skip" => a.skip.push(val()),
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

fn pct(xs: &[f64], q: usize) -> f64 {
    let mut s = xs.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = s.len();
    if q == 50 {
        return if n % 2 == 1 { s[n / 2] } else { (s[n / 2 - 1] + s[n / 2]) / 2.0 };
    }
    s[((q as f64 / 100.0 * (n - 1) as f64).round() as usize).min(n - 1)]
}

fn ms<T>(f: impl FnOnce() -> T) -> (f64, T) {
    let t = Instant::now();
    let r = f();
    (t.elapsed().as_secs_f64() * 1e3, r)
}

fn emit(case: &str, kv: &[(&str, String)]) {
    let fields: Vec<String> = kv.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!("R\t{case}\t{}", fields.join("\t"));
}

fn f(v: f64) -> String {
    format!("{v:.4}")
}

fn cosine(a: &[f32], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * y).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|y| y.powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

fn bench_embed(a: &Args) {
    let texts: Vec<String> = std::fs::read_to_string(a.bench.join("data/pretrained_sentences.txt"))
        .expect("bench/data/pretrained_sentences.txt")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect();
    let dir = a.models.join("embeddings/all-minilm-l6-v2");
    let (load_ms, model) = ms(|| EmbeddingModel::load(&dir, a.engine, a.device).unwrap_or_else(|e| panic!("load {}: {e:?}", dir.display())));
    let embed = |t: &[String]| model.embed(t).unwrap_or_else(|e| panic!("embed: {e:?}"));
    let (first_ms, _) = ms(|| embed(&texts));
    for _ in 0..3 {
        embed(&texts);
    }
    let times: Vec<f64> = (0..a.embed_runs).map(|_| ms(|| embed(&texts)).0).collect();
    let med = pct(&times, 50);
    emit(
        "embed_batch32",
        &[
            ("median_ms", f(med)),
            ("p90_ms", f(pct(&times, 90))),
            ("per_s", f(32.0 / med * 1e3)),
            ("runs", times.len().to_string()),
            ("load_ms", f(load_ms)),
            ("first_call_ms", f(first_ms)),
        ],
    );
    let (warm_ms, _) = ms(|| {
        for t in &texts {
            embed(std::slice::from_ref(t));
        }
    });
    let lat: Vec<f64> = (0..a.latency_runs).map(|i| ms(|| embed(std::slice::from_ref(&texts[i % texts.len()]))).0).collect();
    emit(
        "embed_batch1",
        &[("median_ms", f(pct(&lat, 50))), ("p90_ms", f(pct(&lat, 90))), ("runs", lat.len().to_string()), ("warmup_32_ms", f(warm_ms))],
    );

    match std::fs::read_to_string(&a.reference) {
        Ok(json) => {
            let v: serde_json::Value = serde_json::from_str(&json).expect("reference JSON");
            let cases = v["cases"].as_array().expect("cases");
            let ref_texts: Vec<String> = cases.iter().map(|c| c["text"].as_str().unwrap().to_string()).collect();
            let (ids, rows) = model.embed(&ref_texts).unwrap_or_else(|e| panic!("embed reference texts: {e:?}"));
            let mut min_cos = f64::INFINITY;
            let mut ids_equal = 0;
            for ((c, row), id) in cases.iter().zip(&rows).zip(&ids) {
                let r: Vec<f64> = c["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
                min_cos = min_cos.min(cosine(row, &r));
                let rid: Vec<u32> = c["token_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
                ids_equal += (rid == *id) as usize;
            }
            emit(
                "embed_check",
                &[("min_cosine_vs_reference", format!("{min_cos:.7}")), ("texts", cases.len().to_string()), ("token_ids_equal", ids_equal.to_string())],
            );
        }
        Err(e) => println!("SKIP\tembed_check\t{}: {e}", a.reference.display()),
    }
}

fn bench_llm(a: &Args) {
    let prompt = std::fs::read_to_string(a.bench.join("data/pretrained_prompt.txt")).expect("bench/data/pretrained_prompt.txt");
    let file = a.models.join("llm/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    let (load_ms, model) = ms(|| TextModel::load(&file, a.engine, a.device).unwrap_or_else(|e| panic!("load {}: {e:?}", file.display())));
    let model = Arc::new(model);
    let p = Prompt::Text(prompt);
    let alive = || true;
    let run = |n: usize| {
        let mut g = model.start(&p, GenOptions::greedy(n)).unwrap_or_else(|e| panic!("start: {e:?}"));
        let (_, ids, _) = g.run(&alive).unwrap_or_else(|e| panic!("generate: {e:?}"));
        (g.prompt_ids().len(), ids)
    };
    let (first_call_ms, _) = ms(|| run(64));
    run(64);
    let mut firsts = vec![];
    let mut totals = vec![];
    let mut last = (0, vec![]);
    for _ in 0..a.llm_runs {
        firsts.push(ms(|| run(1)).0);
        let (t, r) = ms(|| run(64));
        totals.push(t);
        last = r;
    }
    let (prompt_len, ids) = last;
    let n = ids.len() as f64;
    let total = pct(&totals, 50);
    let first = pct(&firsts, 50);
    emit(
        "llm",
        &[
            ("prompt_tokens", prompt_len.to_string()),
            ("new_tokens", ids.len().to_string()),
            ("total_ms", f(total)),
            ("first_ms", f(first)),
            ("tok_s", f(n / total * 1e3)),
            ("decode_tok_s", f((n - 1.0) / (total - first).max(1e-9) * 1e3)),
            ("runs", totals.len().to_string()),
            ("load_ms", f(load_ms)),
            ("first_call_ms", f(first_call_ms)),
            ("ids", ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",")),
        ],
    );
}

fn main() {
    let a = args();
    println!(
        "INFO\tdevice={}\tengine={}\tcompiled={:?}\trayon_threads={}",
        a.device,
        a.engine.name(),
        DeviceKind::compiled().iter().map(|k| k.name()).collect::<Vec<_>>(),
        std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| std::thread::available_parallelism().map(|n| n.get().to_string()).unwrap_or_default())
    );
    if !a.skip.iter().any(|s| s == "embed") {
        bench_embed(&a);
    }
    if !a.skip.iter().any(|s| s == "llm") {
        bench_llm(&a);
    }
}
