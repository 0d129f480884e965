//! The instruction sets of the integer kernels (`packed`), picked once at run time.

use crate::kernels::cpu::vector::{simd, Simd};

/// The instruction sets the integer kernels are written for, narrowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum IntIsa {
    Scalar,
    /// `maddubs` + `madd` on 256 bits.
    Avx2,
    /// `dpbusd` on 256 bits (AVX-512 VNNI with VL): one instruction for a block's byte
    /// products and their sum, where AVX2 needs two.
    Avx2Vnni,
}

impl IntIsa {
    /// Every path this CPU runs, narrowest first (the tests run them all).
    pub(super) fn available() -> Vec<IntIsa> {
        let mut out = vec![IntIsa::Scalar];
        let level = simd();
        if level >= Simd::Avx2 {
            out.push(IntIsa::Avx2);
        }
        #[cfg(target_arch = "x86_64")]
        if level >= Simd::Avx512 && is_x86_feature_detected!("avx512vnni") {
            out.push(IntIsa::Avx2Vnni);
        }
        out
    }

    /// The path the layers take: the widest this CPU has.
    pub(super) fn best() -> IntIsa {
        static BEST: std::sync::OnceLock<IntIsa> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| *IntIsa::available().last().expect("the scalar path is always there"))
    }
}
