//! f32 matmul precision: the user's choice, `:highest` (true f32) by default.
//!
//! PyTorch's `torch.set_float32_matmul_precision` names the same two levels:
//! * `Highest` — f32 products accumulate in f32 with f32 inputs (what Nx's f32 type promises).
//! * `High` — f32 inputs may be rounded to TF32 (10-bit mantissa) on tensor-core GPUs: several
//!   times the throughput, ~1e-3 relative error instead of ~1e-6.
//!
//! The level only changes CUDA f32 matrix products routed to cuBLAS (`crate::gpu::cuda::cublas`); flex (CPU)
//! and Vulkan are true f32 either way, and f16/bf16/f64 products are unaffected.
//!
//! f32 math mode: `Exact` (the default) or `Fast`, the CPU's other precision setting.
//! * `Exact` — f32 transcendentals give glibc's bits (libm's for erf), as Nx's own backend and
//!   PyTorch's scalar paths do.
//! * `Fast` — exp, log, tanh, erf, sigmoid and the fused softmax of f32 tensors on the CPU run
//!   `kernels::cpu::fast_math`: f32 lanes, within 2 ulp of the correctly rounded result, the same
//!   special values.

use std::sync::atomic::{AtomicU8, Ordering};

use crate::error::{ExError, ExResult};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulPrecision {
    Highest = 0,
    High = 1,
}

static GLOBAL: AtomicU8 = AtomicU8::new(MatmulPrecision::Highest as u8);

impl MatmulPrecision {
    pub fn parse(name: &str) -> ExResult<Self> {
        match name {
            "highest" => Ok(Self::Highest),
            "high" => Ok(Self::High),
            other => Err(ExError::invalid(format!(
                "matmul_precision must be :highest or :high, got :{other}"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Highest => "highest",
            Self::High => "high",
        }
    }

    /// The process-wide level (set by `ExBurn.configure!(matmul_precision: ...)`).
    pub fn global() -> Self {
        if GLOBAL.load(Ordering::Relaxed) == Self::High as u8 {
            Self::High
        } else {
            Self::Highest
        }
    }

    pub fn set_global(self) {
        GLOBAL.store(self as u8, Ordering::Relaxed);
    }

    /// `None` (no per-call option) means the global level.
    pub fn resolve(per_call: Option<Self>) -> Self {
        per_call.unwrap_or_else(Self::global)
    }

    /// Whether f32 inputs may be rounded to TF32.
    pub fn allows_tf32(self) -> bool {
        self == Self::High
    }
}

/// How f32 transcendentals are computed on the CPU; `ExBurn.configure!(math: :exact | :fast)`
/// sets it for the process, `EXBURN_MATH` gives the value it starts with.
#[cfg_attr(feature = "nif", derive(rustler::NifUnitEnum))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MathMode {
    Exact = 0,
    Fast = 1,
}

/// The process-wide mode; `UNSET` until first read or set, then `EXBURN_MATH`'s value.
static MATH: AtomicU8 = AtomicU8::new(UNSET);
const UNSET: u8 = u8::MAX;

impl MathMode {
    pub fn name(self) -> &'static str {
        match self {
            Self::Exact => "exact",
            Self::Fast => "fast",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        [Self::Exact, Self::Fast].into_iter().find(|m| m.name() == name)
    }

    /// The process-wide mode, read on every f32 transcendental: one relaxed load.
    pub fn global() -> Self {
        match MATH.load(Ordering::Relaxed) {
            0 => Self::Exact,
            1 => Self::Fast,
            _ => {
                // the first read: the environment's value, unless a set came first
                let start = Self::parse(crate::process::env::math()).unwrap_or(Self::Exact);
                let _ = MATH.compare_exchange(UNSET, start as u8, Ordering::Relaxed, Ordering::Relaxed);
                Self::global()
            }
        }
    }

    /// Makes `self` the process-wide mode; answers the previous one.
    pub fn set_global(self) -> Self {
        let old = Self::global();
        MATH.store(self as u8, Ordering::Relaxed);
        old
    }

    /// Whether the CPU's f32 kernels take `kernels::cpu::fast_math`: the one rule the ops follow.
    pub fn fast() -> bool {
        Self::global() == Self::Fast
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_exburn_math_value_names_a_mode_the_default_exact() {
        let values = crate::process::env::MATH_CHOICES;
        assert!(values.iter().all(|v| MathMode::parse(v).is_some()));
        assert_eq!(MathMode::parse(values[0]), Some(MathMode::Exact));
    }

    #[test]
    fn parse_names_and_reject_others() {
        assert_eq!(
            MatmulPrecision::parse("highest").unwrap(),
            MatmulPrecision::Highest
        );
        assert_eq!(
            MatmulPrecision::parse("high").unwrap(),
            MatmulPrecision::High
        );
        assert!(MatmulPrecision::parse("medium").is_err());
        assert!(MatmulPrecision::High.allows_tf32());
        assert!(!MatmulPrecision::Highest.allows_tf32());
        assert_eq!(
            MatmulPrecision::resolve(Some(MatmulPrecision::High)),
            MatmulPrecision::High
        );
    }

    #[test]
    fn math_modes_parse_by_name() {
        assert_eq!(MathMode::parse("exact"), Some(MathMode::Exact));
        assert_eq!(MathMode::parse("fast"), Some(MathMode::Fast));
        assert_eq!(MathMode::parse("Fast"), None);
        for m in [MathMode::Exact, MathMode::Fast] {
            assert_eq!(MathMode::parse(m.name()), Some(m));
        }
    }
}
