//! Nx's float remainder (C `fmod`, the dividend's sign) as one CUDA kernel, exact for every
//! pair of operands.
//!
//! Why: Burn's float remainder on cube devices is `a - b·floor(a/b)`, which rounds the quotient:
//! once it passes the mantissa (2^53 for f64) the result can be off by a multiple of the divisor
//! (1e30 rem 3.25 came out 26388279066624). A float `%` in a cube kernel does no better: the CUDA
//! build compiles through LLVM, whose NVPTX backend lowers `frem` to `a - b·trunc(a/b)`. So the
//! kernel finds the quotient itself (`fmod_value`). Vulkan's fused multiply-add may be two
//! roundings, so other devices keep the composed remainder of `ops::elementwise`.

use burn::backend::fusion::custom::TensorSpec;
use burn::backend::tensor::FloatTensor;
use burn::backend::{backend_extension, Backend, Dispatch, DispatchTensor};
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeBackend;
use cubecl::ir::{ElemType, FloatKind};
use cubecl::prelude::*;

/// Threads per workgroup.
const THREADS: u32 = 256;

/// `fmod(a, b)` element by element, for f32 or f64 tensors of one shape and dtype on a CUDA
/// device (`crate::gpu::dispatch_on_cuda`).
pub fn fmod(a: DispatchTensor, b: DispatchTensor) -> DispatchTensor {
    Dispatch::float_fmod(a, b)
}

#[backend_extension(Cube: cfg(feature = "cuda"), Fusion: cfg(feature = "cuda"))]
pub trait FloatFmod: Backend {
    /// `fmod(a, b)`; `a` and `b` of one shape, both f32 or both f64.
    #[fusion(meta = fmod_meta)]
    fn float_fmod(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self>;
}

fn fmod_meta(a: &TensorSpec, _b: &TensorSpec) -> TensorSpec {
    a.clone()
}

impl FloatFmod for CubeBackend {
    fn float_fmod(a: CubeTensor, b: CubeTensor) -> CubeTensor {
        let [a, b] = [a, b].map(crate::gpu::contiguous);
        let out = crate::gpu::output(&a, a.meta.shape().clone());
        let total = out.meta.shape().num_elements();
        // the type's mantissa bits, its implicit one included
        let (kind, bits) = if a.dtype == DType::F64 { (FloatKind::F64, 53) } else { (FloatKind::F32, 24) };
        if total > 0 {
            fmod_kernel::launch(
                &a.client.clone(),
                CubeCount::Static((total as u32).div_ceil(THREADS), 1, 1),
                CubeDim::new_1d(THREADS),
                a.into_buffer_arg(),
                b.into_buffer_arg(),
                out.clone().into_buffer_arg(),
                total,
                (2f32).powi(bits - 1),
                ElemType::Float(kind),
            );
        }
        out
    }
}

/// One thread per value.
#[cube(launch)]
fn fmod_kernel<F: Float>(a: &[F], b: &[F], out: &mut [F], total: usize, limit: f32, #[define(F)] _dtype: ElemType) {
    let i = ABSOLUTE_POS as usize;
    if i < total {
        out[i] = fmod_value::<F>(a[i], b[i], F::cast_from(limit));
    }
}

/// `fmod(x, y)` with no rounding. Where the quotient `|x / y|` is below `limit` (2^(p-1) for a
/// p-bit mantissa) the rounded quotient is within one of the true one, so its integer part `n`
/// is exact or one too large, and `|x| - n|y|` in one fused multiply-add is exact for the true
/// `n` (that difference is the result, which is representable); a negative one takes `n - 1`.
/// Above it, `|y|` doubled up to `|x|` and halved back down, subtracted wherever it fits: each
/// subtraction is of two values within a factor of two, which is exact (Sterbenz).
#[cube]
fn fmod_value<F: Float>(x: F, y: F, limit: F) -> F {
    let (zero, inf) = (F::new(0.0), F::new(f32::INFINITY));
    let (ax, ay) = (F::abs(x), F::abs(y));
    let mut out = x;
    // NaN compares false: an infinite or NaN x, a NaN or zero y
    if !(ax < inf) || !(ay <= inf) || ay == zero {
        out = F::NAN;
    } else if ax >= ay {
        let mut r = ax;
        let q = ax / ay;
        if q < limit {
            let mut n = F::trunc(q);
            r = fma(-n, ay, ax);
            while r < zero {
                n -= F::new(1.0);
                r = fma(-n, ay, ax);
            }
            while r >= ay {
                n += F::new(1.0);
                r = fma(-n, ay, ax);
            }
        } else {
            let mut t = ay;
            while t + t <= ax {
                t += t;
            }
            while t >= ay {
                if r >= t {
                    r -= t;
                }
                t /= F::new(2.0);
            }
        }
        out = if x < zero { -r } else { r };
    }
    out
}
