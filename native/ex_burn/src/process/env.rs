//! The crate's `EXBURN_*` environment variables: the one table of them (`ALL`), one parsing rule
//! per kind, and a typed accessor per variable. No other file of the crate reads an `EXBURN_`
//! variable; `guides/configuration.md` is the table for users (every variable of the project).
//!
//! Parsing, the same for every variable of a kind:
//! * switch: unset or empty is the variable's default; `0`, `false`, `off` turn it off; `1`,
//!   `true`, `on` turn it on (any case, surrounding spaces ignored).
//! * count: unset or empty is the default; otherwise a non-negative integer.
//! * path: unset or empty is the default.
//! * device: `kind` or `kind:index` (`cpu`, `vulkan:1`, ...); unset or empty is the CPU.
//! * choice: one of the variable's names (any case, surrounding spaces ignored); unset or empty
//!   is the first.
//!
//! A value that does not parse falls back to the default with one warning on stderr, rather than
//! failing: the variables tune or compare, and a NIF library cannot refuse to load over one
//! (the test-only device is the exception: a bad one panics the test). The values the NIFs use
//! are read once per process and remembered, since they are checked on hot paths.

use std::fmt::Display;
use std::path::PathBuf;
use std::sync::OnceLock;

/// How a variable's value is read, with its default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Switch { default: bool },
    Count { default: usize },
    /// The default is relative to `$HOME` when it starts with `~/`, else to the repository root.
    Path { default: &'static str },
    Device,
    /// The accepted values, the default first.
    Choice { values: &'static [&'static str] },
}

/// Who reads a variable: the library at run time, or only the crate's tests and examples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reader {
    Library,
    Tests,
}

#[derive(Debug)]
pub struct Var {
    pub name: &'static str,
    pub kind: Kind,
    pub reader: Reader,
    pub about: &'static str,
}

pub const MALLOC_TUNE: Var = Var {
    name: "EXBURN_MALLOC_TUNE",
    kind: Kind::Switch { default: true },
    reader: Reader::Library,
    about: "raise glibc's mmap and trim thresholds at load, so tensor-sized blocks are reused (process/alloc.rs)",
};
pub const FLUSH_ELEMS: Var = Var {
    name: "EXBURN_FLUSH_ELEMS",
    kind: Kind::Count { default: 1 << 20 },
    reader: Reader::Library,
    about: "a GPU result of at least this many elements sends cubecl's queued batch at once; 0 never (gpu/flush.rs)",
};
pub const CUBLAS: Var = Var {
    name: "EXBURN_CUBLAS",
    kind: Kind::Switch { default: true },
    reader: Reader::Library,
    about: "CUDA matrix products on cuBLAS; off keeps Burn's own kernel (gpu/cuda/cublas.rs)",
};
pub const ROWS_KERNEL: Var = Var {
    name: "EXBURN_ROWS_KERNEL",
    kind: Kind::Switch { default: true },
    reader: Reader::Library,
    about: "a GPU decoding step's weight products, RoPE with the KV pool's writes, and single-query attention on the crate's kernels; off keeps Burn's ops (gpu/rows.rs, gpu/rope_cache.rs, gpu/paged_attention.rs)",
};
pub const CUDA_DECODER: Var = Var {
    name: "EXBURN_CUDA_DECODER",
    kind: Kind::Switch { default: false },
    reader: Reader::Library,
    about: "on: Llama-family GGUF models on CUDA decode on the crate's own step kernels, replayed as CUDA graphs, instead of the tensor path (gpu/cuda/decode.rs)",
};
pub const CUDA_GRAPHS: Var = Var {
    name: "EXBURN_CUDA_GRAPHS",
    kind: Kind::Switch { default: true },
    reader: Reader::Library,
    about: "the CUDA decoder records a step's launches once per row count and replays them as a CUDA graph; off launches every kernel of every step (gpu/cuda/decode.rs)",
};
pub const CELL_KERNEL: Var = Var {
    name: "EXBURN_CELL_KERNEL",
    kind: Kind::Switch { default: true },
    reader: Reader::Library,
    about: "an LSTM or GRU step's activations and state update as one op with a kernel each way, on the CPU and the cube GPUs; off composes Burn ops (model/cells.rs)",
};
pub const CUBLAS_EXCLUSIVE: Var = Var {
    name: "EXBURN_CUBLAS_EXCLUSIVE",
    kind: Kind::Switch { default: true },
    reader: Reader::Library,
    about: "a cuBLAS product's cubecl calls in one exclusive section; off makes each its own round trip (gpu/cuda/cublas.rs)",
};
pub const CUBLAS_HOST_SYNC: Var = Var {
    name: "EXBURN_CUBLAS_HOST_SYNC",
    kind: Kind::Switch { default: false },
    reader: Reader::Library,
    about: "order cuBLAS after cubecl's work by host waits instead of on the device (gpu/cuda/handoff.rs)",
};
pub const BF16_GEMM: Var = Var {
    name: "EXBURN_BF16_GEMM",
    kind: Kind::Switch { default: true },
    reader: Reader::Library,
    about: "bf16 CPU products on the crate's AVX-512 BF16 kernel where the CPU has it (kernels/cpu/bf16_gemm.rs)",
};
pub const BF16_AMX: Var = Var {
    name: "EXBURN_BF16_AMX",
    kind: Kind::Switch { default: true },
    reader: Reader::Library,
    about: "that kernel on AMX tiles where the CPU has them (kernels/cpu/bf16_gemm/amx.rs)",
};
pub const MATH: Var = Var {
    name: "EXBURN_MATH",
    kind: Kind::Choice { values: MATH_CHOICES },
    reader: Reader::Library,
    about: "the f32 math mode the process starts in; ExBurn.configure!(math: ...) changes it (ops/precision.rs)",
};
pub const MODELS_DIR: Var = Var {
    name: "EXBURN_MODELS_DIR",
    kind: Kind::Path { default: "~/models" },
    reader: Reader::Tests,
    about: "the models directory of the model tests and examples (the library gets it as an argument)",
};
pub const REFERENCE_DIR: Var = Var {
    name: "EXBURN_REFERENCE_DIR",
    kind: Kind::Path { default: "test/data/pretrained" },
    reader: Reader::Tests,
    about: "the pre-trained models' reference outputs the tests compare with",
};
pub const TEST_DEVICE: Var = Var {
    name: "EXBURN_TEST_DEVICE",
    kind: Kind::Device,
    reader: Reader::Tests,
    about: "the device the crate's tests (and burn_bench's device case) run on",
};
pub const TEST_CANDLE_DEVICE: Var = Var {
    name: "EXBURN_TEST_CANDLE_DEVICE",
    kind: Kind::Device,
    reader: Reader::Tests,
    about: "the device the crate's Candle tests run on, where Candle runs on its kind (a `candle-cuda` build: `cuda`)",
};
pub const KERNEL_CACHE: Var = Var {
    name: "EXBURN_KERNEL_CACHE",
    kind: Kind::Path { default: "~/.cache/ex_burn/kernels" },
    reader: Reader::Library,
    about: "where CUDA builds keep compiled kernels and autotune results between processes (gpu/kernel_cache.rs)",
};

pub const CPUID_MASK: Var = Var {
    name: "EXBURN_CPUID_MASK",
    kind: Kind::Choice { values: &["none", "avx512"] },
    reader: Reader::Tests,
    about: "set by scripts/without_avx512.sh: the instruction sets hidden from the process, which the tests check are",
};

/// Every variable the crate reads.
pub const ALL: [&Var; 18] = [
    &MALLOC_TUNE, &FLUSH_ELEMS, &CUBLAS, &ROWS_KERNEL, &CUDA_DECODER, &CUDA_GRAPHS, &CELL_KERNEL, &CUBLAS_EXCLUSIVE, &CUBLAS_HOST_SYNC, &BF16_GEMM, &BF16_AMX, &MATH, &MODELS_DIR, &REFERENCE_DIR, &TEST_DEVICE, &TEST_CANDLE_DEVICE, &KERNEL_CACHE, &CPUID_MASK,
];

/// `$e`, computed the first time this call site runs and remembered for the process.
macro_rules! once {
    ($t:ty, $e:expr) => {{
        static V: OnceLock<$t> = OnceLock::new();
        *V.get_or_init(|| $e)
    }};
}

pub fn malloc_tune() -> bool {
    once!(bool, switch(&MALLOC_TUNE))
}

/// The flush threshold in elements; `None` is never.
pub fn flush_elems() -> Option<usize> {
    once!(Option<usize>, Some(count(&FLUSH_ELEMS)).filter(|&n| n > 0))
}

pub fn cublas() -> bool {
    once!(bool, switch(&CUBLAS))
}

pub fn rows_kernel() -> bool {
    once!(bool, switch(&ROWS_KERNEL))
}

pub fn cuda_decoder() -> bool {
    once!(bool, switch(&CUDA_DECODER))
}

pub fn cuda_graphs() -> bool {
    once!(bool, switch(&CUDA_GRAPHS))
}

pub fn cell_kernel() -> bool {
    once!(bool, switch(&CELL_KERNEL))
}

pub fn cublas_exclusive() -> bool {
    once!(bool, switch(&CUBLAS_EXCLUSIVE))
}

pub fn cublas_host_sync() -> bool {
    once!(bool, switch(&CUBLAS_HOST_SYNC))
}

pub fn bf16_gemm() -> bool {
    once!(bool, switch(&BF16_GEMM))
}

pub fn bf16_amx() -> bool {
    once!(bool, switch(&BF16_AMX))
}

/// `EXBURN_MATH`'s values, the default first (`ops::precision::MathMode` names the same).
pub const MATH_CHOICES: &[&str] = &["exact", "fast"];

/// The math mode `EXBURN_MATH` names, `"exact"` unless it names another
/// (`ops::precision::MathMode::global` reads it once, at its first use).
pub fn math() -> &'static str {
    choice(&MATH)
}

pub fn models_dir() -> PathBuf {
    path(&MODELS_DIR)
}

pub fn reference_dir() -> PathBuf {
    path(&REFERENCE_DIR)
}

pub fn kernel_cache() -> PathBuf {
    path(&KERNEL_CACHE)
}

/// Whether scripts/without_avx512.sh hid AVX-512 from this process (the tests check it did).
pub fn avx512_hidden() -> bool {
    choice(&CPUID_MASK) == "avx512"
}

/// The spec of the device tests run on (`testing::device` parses it); `None` is the CPU.
pub fn test_device_spec() -> Option<String> {
    device_spec(raw(&TEST_DEVICE).as_deref()).map(str::to_string)
}

pub fn test_candle_device_spec() -> Option<String> {
    device_spec(raw(&TEST_CANDLE_DEVICE).as_deref()).map(str::to_string)
}

/// A switch's value: `Ok(None)` when unset or empty, `Err` when it is not a switch value.
pub fn parse_switch(raw: Option<&str>) -> Result<Option<bool>, String> {
    match raw.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
        None | Some("") => Ok(None),
        Some("0" | "false" | "off") => Ok(Some(false)),
        Some("1" | "true" | "on") => Ok(Some(true)),
        Some(_) => Err("expected 0/false/off or 1/true/on".into()),
    }
}

/// A count's value: `Ok(None)` when unset or empty, `Err` when it is not a non-negative integer.
pub fn parse_count(raw: Option<&str>) -> Result<Option<usize>, String> {
    match raw.map(str::trim) {
        None | Some("") => Ok(None),
        Some(v) => v.parse().map(Some).map_err(|_| "expected a non-negative integer".into()),
    }
}

/// One of `values`, as named there: `Ok(None)` when unset or empty.
pub fn parse_choice(raw: Option<&str>, values: &[&'static str]) -> Result<Option<&'static str>, String> {
    match raw.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
        None | Some("") => Ok(None),
        Some(v) => values.iter().find(|&&c| c == v).copied().map(Some).ok_or_else(|| format!("expected one of {}", values.join(", "))),
    }
}

/// A device spec `kind[:index]` as given, for `DeviceRef::parse`: `None` when unset or empty.
pub fn device_spec(raw: Option<&str>) -> Option<&str> {
    raw.map(str::trim).filter(|s| !s.is_empty())
}

/// The variable's value; unset and empty are the same (`FOO= cmd` is how a shell unsets it).
fn raw(var: &Var) -> Option<String> {
    std::env::var(var.name).ok()
}

/// A parsed value, or `default` with a warning when the value did not parse.
fn or_default<T: Display>(var: &Var, raw: Option<&str>, parsed: Result<Option<T>, String>, default: T) -> T {
    match parsed {
        Ok(v) => v.unwrap_or(default),
        Err(expected) => {
            eprintln!("ex_burn: ignoring {}={:?} ({expected}); using its default, {default}", var.name, raw.unwrap_or(""));
            default
        }
    }
}

fn switch(var: &Var) -> bool {
    let Kind::Switch { default } = var.kind else { unreachable!("{} is not a switch", var.name) };
    let raw = raw(var);
    or_default(var, raw.as_deref(), parse_switch(raw.as_deref()), default)
}

fn count(var: &Var) -> usize {
    let Kind::Count { default } = var.kind else { unreachable!("{} is not a count", var.name) };
    let raw = raw(var);
    or_default(var, raw.as_deref(), parse_count(raw.as_deref()), default)
}

fn choice(var: &Var) -> &'static str {
    let Kind::Choice { values } = var.kind else { unreachable!("{} is not a choice", var.name) };
    let raw = raw(var);
    or_default(var, raw.as_deref(), parse_choice(raw.as_deref(), values), values[0])
}

fn path(var: &Var) -> PathBuf {
    let Kind::Path { default } = var.kind else { unreachable!("{} is not a path", var.name) };
    match raw(var).filter(|v| !v.trim().is_empty()) {
        Some(v) => PathBuf::from(v),
        None => default_path(default),
    }
}

fn default_path(default: &str) -> PathBuf {
    match default.strip_prefix("~/") {
        Some(rest) => PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into())).join(rest),
        // cargo sets CARGO_MANIFEST_DIR when it runs a test too; that one is preferred to the value
        // compiled in, which names wherever the binary was built (a cached test binary built from
        // another checkout would read that checkout's files)
        None => {
            let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into());
            PathBuf::from(manifest).join("../..").join(default)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switches_parse_by_one_rule() {
        for unset in [None, Some(""), Some("  ")] {
            assert_eq!(parse_switch(unset), Ok(None));
        }
        for off in ["0", "false", "off", "OFF", " False "] {
            assert_eq!(parse_switch(Some(off)), Ok(Some(false)), "{off:?}");
        }
        for on in ["1", "true", "on", "ON", " True "] {
            assert_eq!(parse_switch(Some(on)), Ok(Some(true)), "{on:?}");
        }
        for bad in ["2", "yes", "no", "00"] {
            assert!(parse_switch(Some(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_bad_value_is_the_default() {
        let var = &CUBLAS_HOST_SYNC;
        assert!(!or_default(var, Some("yes"), parse_switch(Some("yes")), false));
        assert!(or_default(var, Some("maybe"), parse_switch(Some("maybe")), true));
        assert!(or_default(var, None, parse_switch(None), true));
        assert!(!or_default(var, Some("off"), parse_switch(Some("off")), true));
        assert_eq!(or_default(&FLUSH_ELEMS, Some("lots"), parse_count(Some("lots")), 7), 7);
    }

    #[test]
    fn counts_parse() {
        assert_eq!(parse_count(None), Ok(None));
        assert_eq!(parse_count(Some("")), Ok(None));
        assert_eq!(parse_count(Some("0")), Ok(Some(0)));
        assert_eq!(parse_count(Some(" 4096 ")), Ok(Some(4096)));
        assert!(parse_count(Some("-1")).is_err());
        assert!(parse_count(Some("lots")).is_err());
    }

    #[test]
    fn choices_parse() {
        let values = MATH_VALUES;
        assert_eq!(parse_choice(None, values), Ok(None));
        assert_eq!(parse_choice(Some(" "), values), Ok(None));
        assert_eq!(parse_choice(Some("fast"), values), Ok(Some("fast")));
        assert_eq!(parse_choice(Some(" Exact "), values), Ok(Some("exact")));
        assert!(parse_choice(Some("quick"), values).is_err());
        assert_eq!(or_default(&MATH, Some("quick"), parse_choice(Some("quick"), values), values[0]), "exact");
    }

    const MATH_VALUES: &[&str] = match MATH.kind {
        Kind::Choice { values } => values,
        _ => &[],
    };

    #[test]
    fn device_specs_are_trimmed_and_empty_is_unset() {
        assert_eq!(device_spec(None), None);
        assert_eq!(device_spec(Some(" ")), None);
        assert_eq!(device_spec(Some(" vulkan:1 ")), Some("vulkan:1"));
    }

    #[test]
    fn path_defaults() {
        let home = default_path("~/models");
        assert!(home.ends_with("models") && home.is_absolute(), "{home:?}");
        // the repository's own reference data
        assert!(default_path("test/data/pretrained").join("minilm_reference.json").is_file());
    }

    #[test]
    fn the_table_names_each_variable_once() {
        let mut names: Vec<_> = ALL.iter().map(|v| v.name).collect();
        assert!(names.iter().all(|n| n.starts_with("EXBURN_")));
        names.sort();
        names.dedup();
        assert_eq!(names.len(), ALL.len());
    }

    #[test]
    fn each_accessor_reads_a_variable_of_its_kind() {
        // a mismatch panics (unreachable!) here rather than in a NIF
        let _ = (malloc_tune(), flush_elems(), cublas(), cublas_exclusive(), cublas_host_sync(), bf16_gemm(), bf16_amx(), math());
        let _ = (models_dir(), reference_dir(), test_device_spec(), kernel_cache());
    }
}
