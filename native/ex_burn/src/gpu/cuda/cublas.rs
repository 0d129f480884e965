//! Matrix products on CUDA through cuBLAS, at the precision the user chose.
//!
//! Why: Burn 0.22's CUDA matmul (cubek-matmul) lowers f32 inputs to TF32 whenever the card has
//! tensor cores (`adjust_dtypes` in cubek-matmul's `multi_level/definition/blueprint.rs`), with no
//! switch, so an f32 product carries ~1e-3 relative error; and its kernels reach a fraction of
//! cuBLAS' throughput on Hopper. Here f32/f16/bf16/f64 products on a CUDA device go to
//! `cublasGemmStridedBatchedEx` instead, with `CUBLAS_COMPUTE_32F` (true f32) unless the user
//! opted into TF32 (`CUBLAS_COMPUTE_32F_FAST_TF32`, `crate::ops::precision`).
//!
//! How: a Burn backend extension (`#[backend_extension]`), so the call takes part in fusion's
//! ordering like any other op: fusion records it lazily and runs it on its execution thread with
//! the inputs materialised as `CubeTensor`s. cubecl does not expose its CUDA stream, so cuBLAS
//! runs on its own stream of the same (primary) context, ordered against cubecl's on the device
//! by `crate::gpu::cuda::handoff` (no host wait; where the driver refuses that, the call waits for
//! cubecl's queue before and for its stream after, as it did first).
//! libcublas/libcublasLt are loaded at run time (cudarc's dynamic loading): without them, or
//! on any non-CUDA cube device, the product falls back to Burn's own kernel.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

use burn::backend::fusion::custom::TensorSpec;
use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::{backend_extension, Backend, Dispatch, DispatchTensor};
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeBackend;
use cudarc::cublas::{result as blas, sys as bsys, CudaBlas};
use cudarc::driver::{CudaContext, CudaStream};

use super::CudaServer;
use crate::ops::precision::MatmulPrecision;

#[backend_extension(Cube: cfg(feature = "cuda"), Fusion: cfg(feature = "cuda"))]
pub trait VendorMatmul: Backend {
    /// `[.., m, k] x [.., k, n]` with equal batch dims; `tf32` lets f32 inputs round to TF32.
    #[fusion(meta = matmul_meta)]
    fn vendor_matmul(
        lhs: FloatTensor<Self>,
        rhs: FloatTensor<Self>,
        tf32: bool,
    ) -> FloatTensor<Self>;
}

fn matmul_meta(lhs: &TensorSpec, rhs: &TensorSpec, _tf32: &bool) -> TensorSpec {
    let mut shape = lhs.shape.clone();
    let rank = shape.num_dims();
    shape[rank - 1] = rhs.shape[rank - 1];
    TensorSpec::new(shape, lhs.dtype)
}

impl VendorMatmul for CubeBackend {
    fn vendor_matmul(lhs: CubeTensor, rhs: CubeTensor, tf32: bool) -> CubeTensor {
        match cublas_matmul(&lhs, &rhs, tf32) {
            Ok(out) => out,
            Err(reason) => {
                warn_once(&reason);
                Self::float_matmul(lhs, rhs)
            }
        }
    }
}

fn warn_once(reason: &str) {
    static WARNED: OnceLock<()> = OnceLock::new();
    if WARNED.set(()).is_ok() {
        eprintln!("ex_burn: cuBLAS matmul unavailable ({reason}); using Burn's CUDA kernel (TF32 for f32)");
    }
}

/// Whether `dot` should route this product to cuBLAS: both operands untracked float tensors on a
/// CUDA device, of a dtype cuBLAS multiplies.
pub fn applies(a: &DispatchTensor, b: &DispatchTensor, dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
        && enabled()
        && crate::gpu::dispatch_on_cuda(a)
        && crate::gpu::dispatch_on_cuda(b)
        && library_present()
}

/// `[bsz, m, k] x [bsz, k, n]` on cuBLAS.
pub fn matmul(a: DispatchTensor, b: DispatchTensor, precision: MatmulPrecision) -> DispatchTensor {
    Dispatch::vendor_matmul(a, b, precision.allows_tf32())
}

/// `EXBURN_CUBLAS=0` keeps every product on Burn's own kernel (TF32 for f32 on tensor-core
/// cards): for comparisons, and to show the precision tests catch it.
fn enabled() -> bool {
    crate::process::env::cublas()
}

fn library_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen the candidate library names.
    *PRESENT.get_or_init(|| unsafe { bsys::is_culib_present() })
}

struct Blas {
    stream: Arc<CudaStream>,
    blas: CudaBlas,
}

fn blas_for(index: usize) -> Result<Arc<Mutex<Blas>>, String> {
    static HANDLES: OnceLock<Mutex<HashMap<usize, Arc<Mutex<Blas>>>>> = OnceLock::new();
    let mut map = HANDLES
        .get_or_init(Default::default)
        .lock()
        .map_err(|_| "cuBLAS handle lock poisoned")?;
    if let Some(b) = map.get(&index) {
        return Ok(b.clone());
    }
    // The primary context: the one cubecl-cuda retains, so device pointers are shared.
    let ctx = CudaContext::new(index).map_err(|e| format!("CUDA context {index}: {e:?}"))?;
    let stream = ctx
        .new_stream()
        .map_err(|e| format!("CUDA stream: {e:?}"))?;
    let blas = CudaBlas::new(stream.clone()).map_err(|e| format!("cublasCreate: {e:?}"))?;
    let b = Arc::new(Mutex::new(Blas { stream, blas }));
    map.insert(index, b.clone());
    Ok(b)
}

/// Row-major `rows x cols` matrices of one operand as cuBLAS sees them.
struct Operand {
    tensor: CubeTensor,
    /// stored column-major (the transpose of a row-major view)
    transposed: bool,
    ld: i32,
    batch_stride: i64,
}

fn operand(t: &CubeTensor) -> Operand {
    let classify = |t: &CubeTensor| -> Option<(bool, i32, i64)> {
        let shape = t.meta.shape();
        let strides = t.meta.strides();
        let r = shape.num_dims();
        if r < 2 {
            return None;
        }
        let (rows, cols) = (shape[r - 2], shape[r - 1]);
        let matrix = (rows * cols) as i64;
        // leading dims must step by whole matrices
        let mut expect = matrix as usize;
        for d in (0..r - 2).rev() {
            if shape[d] != 1 && strides[d] != expect {
                return None;
            }
            expect *= shape[d];
        }
        let (s_r, s_c) = (strides[r - 2], strides[r - 1]);
        if (s_c == 1 || cols == 1) && (s_r == cols || rows == 1) {
            Some((false, cols.max(1) as i32, matrix))
        } else if (s_r == 1 || rows == 1) && (s_c == rows || cols == 1) {
            Some((true, rows.max(1) as i32, matrix))
        } else {
            None
        }
    };
    if let Some((transposed, ld, batch_stride)) = classify(t) {
        return Operand {
            tensor: t.clone(),
            transposed,
            ld,
            batch_stride,
        };
    }
    let c = burn_cubecl::kernel::into_contiguous(t.clone());
    let cols = c.meta.shape()[c.meta.shape().num_dims() - 1];
    let rows = c.meta.shape()[c.meta.shape().num_dims() - 2];
    Operand {
        tensor: c,
        transposed: false,
        ld: cols.max(1) as i32,
        batch_stride: (rows * cols) as i64,
    }
}

fn cublas_matmul(lhs: &CubeTensor, rhs: &CubeTensor, tf32: bool) -> Result<CubeTensor, String> {
    let index = match &lhs.device {
        cubecl::Device::Cuda(d) => d.index,
        other => return Err(format!("not a CUDA device: {other:?}")),
    };
    let (data_type, compute) = match lhs.dtype {
        DType::F32 if tf32 => (
            bsys::cudaDataType::CUDA_R_32F,
            bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
        ),
        DType::F32 => (
            bsys::cudaDataType::CUDA_R_32F,
            bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        ),
        DType::F16 => (
            bsys::cudaDataType::CUDA_R_16F,
            bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        ),
        DType::BF16 => (
            bsys::cudaDataType::CUDA_R_16BF,
            bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        ),
        DType::F64 => (
            bsys::cudaDataType::CUDA_R_64F,
            bsys::cublasComputeType_t::CUBLAS_COMPUTE_64F,
        ),
        other => return Err(format!("dtype {other:?}")),
    };
    if rhs.dtype != lhs.dtype {
        return Err("mixed dtypes".into());
    }
    let ls = lhs.meta.shape().clone();
    let rs = rhs.meta.shape().clone();
    let r = ls.num_dims();
    if r < 2 || rs.num_dims() != r || ls[r - 1] != rs[r - 2] || (0..r - 2).any(|d| ls[d] != rs[d]) {
        return Err(format!("shapes {ls:?} x {rs:?}"));
    }
    let (m, k, n) = (ls[r - 2], ls[r - 1], rs[r - 1]);
    let batch: usize = (0..r - 2).map(|d| ls[d]).product();
    let fits = |x: usize| x <= i32::MAX as usize;
    if !(fits(m) && fits(k) && fits(n) && fits(batch)) {
        return Err("dimension beyond i32".into());
    }

    let a = operand(lhs);
    let b = operand(rhs);
    let mut out_shape = ls.clone();
    out_shape[r - 1] = n;
    let bytes = batch * m * n * lhs.dtype.size();
    let client = lhs.client.clone();
    let handle = client.empty(bytes.max(lhs.dtype.size()));
    let out = CubeTensor::new_contiguous(
        client.clone(),
        lhs.device.clone(),
        out_shape,
        handle,
        lhs.dtype,
    );

    // Everything below talks to cubecl's server: three resource lookups, the handoff's two
    // launches and its flush. From the fusion thread each is a round trip to cubecl's device
    // thread; run as one exclusive task on that thread they are direct calls, and the product
    // pays one round trip (guides/devices.md has the timings).
    let run = || -> Result<(), String> {
        let ra = client
            .get_resource::<CudaServer>(a.tensor.handle.clone())
            .map_err(|e| format!("{e:?}"))?;
        let rb = client
            .get_resource::<CudaServer>(b.tensor.handle.clone())
            .map_err(|e| format!("{e:?}"))?;
        let rc = client
            .get_resource::<CudaServer>(out.handle.clone())
            .map_err(|e| format!("{e:?}"))?;

        let blas = blas_for(index)?;
        let blas = blas.lock().map_err(|_| "cuBLAS handle lock poisoned")?;
        blas.stream
            .context()
            .bind_to_thread()
            .map_err(|e| format!("{e:?}"))?;
        let size = |t: &CubeTensor| t.meta.shape().num_elements() * t.dtype.size();
        let inputs = [(&a.tensor.handle, size(&a.tensor)), (&b.tensor.handle, size(&b.tensor))];
        // cuBLAS must start after the inputs' producers: ordered on the device where the driver
        // allows it (crate::gpu::cuda::handoff), else by waiting for cubecl's queue here
        let handoff = crate::gpu::cuda::handoff::Handoff::begin(&client, index, blas.stream.cu_stream(), inputs);
        if handoff.is_none() {
            cubecl::future::block_on(client.sync()).map_err(|e| format!("{e:?}"))?;
        }
        let op = |t: bool| {
            if t {
                bsys::cublasOperation_t::CUBLAS_OP_T
            } else {
                bsys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        // Row-major C = A B is column-major C^T = B^T A^T: B comes first.
        let (one32, zero32) = (1.0f32, 0.0f32);
        let (one64, zero64) = (1.0f64, 0.0f64);
        let (alpha, beta): (*const c_void, *const c_void) = if lhs.dtype == DType::F64 {
            (&one64 as *const f64 as _, &zero64 as *const f64 as _)
        } else {
            (&one32 as *const f32 as _, &zero32 as *const f32 as _)
        };
        // SAFETY: the pointers are live device allocations held by the `ManagedResource`s above
        // while the call is queued, sized for the shapes checked above. After they are released,
        // cubecl reuses the memory only after the handoff's `wait` kernel, which is bound to all
        // three and ends after the product; without a handoff the stream is synchronised first.
        unsafe {
            blas::gemm_strided_batched_ex(
                *blas.blas.handle(),
                op(b.transposed),
                op(a.transposed),
                n as i32,
                m as i32,
                k as i32,
                alpha,
                rb.resource().ptr as *const c_void,
                data_type,
                b.ld,
                b.batch_stride,
                ra.resource().ptr as *const c_void,
                data_type,
                a.ld,
                a.batch_stride,
                beta,
                rc.resource().ptr as *mut c_void,
                data_type,
                n.max(1) as i32,
                (m * n) as i64,
                batch.max(1) as i32,
                compute,
                bsys::cublasGemmAlgo_t::CUBLAS_GEMM_DFALT,
            )
            .map_err(|e| format!("cublasGemmStridedBatchedEx: {e:?}"))?;
        }
        match handoff {
            Some(h) => {
                let flops = 2 * (batch.max(1) * m * n) as u64 * k as u64;
                h.end(&client, blas.stream.cu_stream(), inputs, (&out.handle, bytes.max(lhs.dtype.size())), flops)?
            }
            None => blas.stream.synchronize().map_err(|e| format!("{e:?}"))?,
        }
        drop((ra, rb, rc));
        Ok(())
    };
    if exclusive() {
        client.exclusive(run).map_err(|e| format!("{e:?}"))??;
    } else {
        run()?;
    }
    Ok(out)
}

/// `EXBURN_CUBLAS_EXCLUSIVE=0` makes each cubecl call of a product its own round trip again (for
/// comparison).
fn exclusive() -> bool {
    crate::process::env::cublas_exclusive()
}

