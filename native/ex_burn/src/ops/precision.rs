//! f32 matmul precision: the user's choice, `:highest` (true f32) by default.
//!
//! PyTorch's `torch.set_float32_matmul_precision` names the same two levels:
//! * `Highest` — f32 products accumulate in f32 with f32 inputs (what Nx's f32 type promises).
//! * `High` — f32 inputs may be rounded to TF32 (10-bit mantissa) on tensor-core GPUs: several
//!   times the throughput, ~1e-3 relative error instead of ~1e-6.
//!
//! The level only changes CUDA f32 matrix products routed to cuBLAS (`crate::gpu::cuda::cublas`); flex (CPU)
//! and Vulkan are true f32 either way, and f16/bf16/f64 products are unaffected.

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
