//! The device a Candle model runs on: the CPU, or a CUDA GPU where the library was built with
//! the `candle-cuda` feature (scripts/cuda-toolkit.sh, guides/devices.md).

use std::borrow::Cow;
use std::sync::Arc;

use candle_core::quantized::{QMatMul, QStorage, QTensor};
use candle_core::Device;

use super::errors::{self, kind};
use crate::device::{DeviceKind, DeviceRef};
use crate::error::{Detail, ExError, ExResult};

/// The device kinds the Candle engine runs on in this library.
pub fn kinds() -> Vec<DeviceKind> {
    let mut kinds = vec![DeviceKind::Cpu];
    if cfg!(feature = "candle-cuda") {
        kinds.push(DeviceKind::Cuda);
    }
    kinds
}

/// Candle's device for `device`, or an unsupported-device error naming what this build runs.
pub fn device(device: &DeviceRef) -> ExResult<Device> {
    match device.kind {
        DeviceKind::Cpu if device.index == 0 => Ok(Device::Cpu),
        #[cfg(feature = "candle-cuda")]
        DeviceKind::Cuda => {
            // f32 activations in quantised products: Candle's Q8_1 kernels round each row's
            // activations, so a last-bit difference in attention (cuBLAS picks its algorithm by
            // row count) flips roundings and a request's tokens would depend on its batch
            candle_core::quantized::cuda::set_force_dmmv(true);
            Device::new_cuda(device.index).map_err(|e| unsupported(device, format!("the candle engine could not open {device}: {e}")))
        }
        _ => {
            let runs = if kinds().contains(&DeviceKind::Cuda) { "the CPU and CUDA devices" } else { "the CPU only (this library was built without `candle-cuda`)" };
            Err(unsupported(device, format!("the candle engine runs on {runs}; {device} was asked for")))
        }
    }
}

fn unsupported(device: &DeviceRef, reason: String) -> ExError {
    errors::err(kind::UNSUPPORTED_DEVICE, reason, vec![("device", Detail::Text(device.to_string())), ("engine", Detail::Atom("candle"))])
}

/// A product with `q`'s matrix (read into host memory) on `dev`. On the CPU its blocks, shared.
/// On a GPU a copy of them, which Candle multiplies with f32 activations (`device`): its vector
/// kernel reads a row in groups of 64 columns, past the end of the activations where a row is
/// not a multiple of that, so such a matrix is dequantised instead.
pub fn quantised_matmul(q: Arc<QTensor>, dev: &Device) -> candle_core::Result<QMatMul> {
    if dev.is_cpu() {
        return QMatMul::from_arc(q);
    }
    let cols = q.shape().dims().last().copied().unwrap_or(0);
    if q.dtype().block_size() > 1 && cols % VECTOR_KERNEL_COLUMNS != 0 {
        return Ok(QMatMul::Tensor(q.dequantize(dev)?));
    }
    QMatMul::from_qtensor(qtensor_copy(&q, dev)?)
}

const VECTOR_KERNEL_COLUMNS: usize = 64;

/// A copy of `q`'s blocks on `dev`; on a GPU, followed by a row padding's worth of zero blocks.
/// Candle's CUDA kernels read weight rows in groups of blocks that may run past a row's end: for
/// the last row, into padding that Candle allocates uninitialised, where a NaN bit pattern times
/// the activations' zero padding would turn that output NaN. llama.cpp zeroes the same padding.
pub fn qtensor_copy(q: &QTensor, dev: &Device) -> candle_core::Result<QTensor> {
    let mut data = q.data()?.into_owned();
    if !dev.is_cpu() {
        let dtype = q.dtype();
        data.resize(data.len() + ROW_PADDING / dtype.block_size() * dtype.type_size(), 0);
    }
    // borrowed: Candle views the bytes as blocks without owning them
    QTensor::new(QStorage::from_data(Cow::Borrowed(&data), dev, q.dtype())?, q.shape().clone())
}

#[cfg(feature = "candle-cuda")]
const ROW_PADDING: usize = candle_core::quantized::cuda::MATRIX_ROW_PADDING;
#[cfg(not(feature = "candle-cuda"))]
const ROW_PADDING: usize = 0;

/// The device the Candle tests run on: `EXBURN_TEST_CANDLE_DEVICE` (the CPU when unset), apart
/// from the Burn tests' `EXBURN_TEST_DEVICE`: a library holds one CUDA engine (`lib.rs`).
#[cfg(test)]
pub fn test_device() -> DeviceRef {
    static DEVICE: std::sync::OnceLock<DeviceRef> = std::sync::OnceLock::new();
    *DEVICE.get_or_init(|| {
        DeviceRef::parse_or_cpu(crate::process::env::test_candle_device_spec().as_deref())
            .unwrap_or_else(|e| panic!("{}: {e}", crate::process::env::TEST_CANDLE_DEVICE.name))
    })
}

/// Candle's own device for `test_device`.
#[cfg(test)]
pub fn test_candle_device() -> Device {
    device(&test_device()).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candle_devices_are_the_cpu_and_cuda_where_built() {
        assert_eq!(kinds()[0], DeviceKind::Cpu);
        assert_eq!(kinds().contains(&DeviceKind::Cuda), cfg!(feature = "candle-cuda"));
        assert!(device(&DeviceRef::CPU).unwrap().is_cpu());
        for kind in [DeviceKind::Vulkan, DeviceKind::Metal, DeviceKind::Rocm] {
            let e = device(&DeviceRef { kind, index: 0 }).unwrap_err();
            assert_eq!(errors::kind_of(&e), Some(kind::UNSUPPORTED_DEVICE), "{e}");
        }
        let cpu1 = device(&DeviceRef { kind: DeviceKind::Cpu, index: 1 }).unwrap_err();
        assert_eq!(errors::kind_of(&cpu1), Some(kind::UNSUPPORTED_DEVICE));
        if !cfg!(feature = "candle-cuda") {
            let e = device(&DeviceRef { kind: DeviceKind::Cuda, index: 0 }).unwrap_err();
            assert!(e.to_string().contains("built without `candle-cuda`"), "{e}");
        }
    }

    #[test]
    fn a_copied_qtensor_keeps_its_blocks() {
        let dev = test_candle_device();
        let values: Vec<f32> = (0..64).map(|i| (i as f32 - 20.0) / 7.0).collect();
        let t = candle_core::Tensor::from_vec(values, (2, 32), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&t, candle_core::quantized::GgmlDType::Q4_1).unwrap();
        let bytes = q.data().unwrap().to_vec();
        let on = qtensor_copy(&q, &dev).unwrap();
        assert_eq!((on.dtype(), on.shape().dims()), (q.dtype(), q.shape().dims()));
        let copied = on.data().unwrap().to_vec();
        assert_eq!(copied[..bytes.len()], bytes[..]);
        assert!(copied[bytes.len()..].iter().all(|&b| b == 0), "the padding after the blocks is zeros");
        assert_eq!(copied.len() > bytes.len(), !dev.is_cpu());
        let back = on.dequantize(&Device::Cpu).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(back, q.dequantize(&Device::Cpu).unwrap().to_vec2::<f32>().unwrap());
    }

    /// A quantised product against the f64 product of the dequantised weights. On the CPU Candle
    /// quantises the activations to Q8_1 blocks of 32, so an output may move by half a step of
    /// each block's scale (`amax / 127`) times the block's weights; on a GPU they stay f32
    /// (`device`), within f32 summation's `k · ε` of the absolute products. A row's outputs are
    /// the same among others as alone. `rows` are activation row counts: one row and several
    /// run different kernels on a GPU.
    fn assert_product_within_bound(q: &QTensor, dev: &Device, rows: &[usize], activation: impl Fn(usize) -> f32, label: &str) {
        use candle_core::{Module, Tensor};
        let (n, k) = q.shape().dims2().unwrap();
        let wd = q.dequantize(&Device::Cpu).unwrap().to_vec2::<f32>().unwrap();
        let on = quantised_matmul(Arc::new(qtensor_copy(q, &Device::Cpu).unwrap()), dev).unwrap();
        let summation = k as f64 * f32::EPSILON as f64;
        // every output of a small matrix; of a large one a spread of them and the last
        let checked: Vec<usize> = (0..n).step_by((n / 256).max(1)).chain([n - 1]).collect();
        for &m in rows {
            let x: Vec<f32> = (0..m * k).map(&activation).collect();
            let got = on.forward(&Tensor::from_vec(x.clone(), (1, m, k), dev).unwrap()).unwrap();
            assert_eq!(got.dims(), [1, m, n]);
            let got = got.squeeze(0).unwrap().to_vec2::<f32>().unwrap();
            for r in 0..m {
                let xr = &x[r * k..(r + 1) * k];
                let alone = on.forward(&Tensor::from_slice(xr, (1, 1, k), dev).unwrap()).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
                for &j in &checked {
                    let (mut exact, mut bound, mut scale) = (0f64, 0f64, 0f64);
                    for (b, xs) in xr.chunks(32).enumerate() {
                        let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs())) as f64;
                        let ws = &wd[j][b * 32..b * 32 + xs.len()];
                        exact += xs.iter().zip(ws).map(|(&a, &c)| a as f64 * c as f64).sum::<f64>();
                        scale += xs.iter().zip(ws).map(|(&a, &c)| (a as f64 * c as f64).abs()).sum::<f64>();
                        bound += amax / 254.0 * ws.iter().map(|c| c.abs() as f64).sum::<f64>();
                    }
                    let bound = if dev.is_cpu() { bound * (1.0 + summation) } else { 0.0 } + summation * scale;
                    let diff = (got[r][j] as f64 - exact).abs();
                    assert!(diff <= bound, "{label}, {m} rows: row {r} column {j} is {} where the product is {exact} (bound {bound})", got[r][j]);
                    let apart = (got[r][j] as f64 - alone[j] as f64).abs();
                    assert!(apart <= 2.0 * summation * scale, "{label}, {m} rows: row {r} column {j} is {} among them and {} alone", got[r][j], alone[j]);
                }
            }
        }
    }

    #[test]
    fn a_quantised_product_on_the_device_stays_within_its_rounding() {
        use candle_core::quantized::GgmlDType;
        let dev = test_candle_device();
        let n = 96;
        for dtype in [GgmlDType::Q4_0, GgmlDType::Q4_1, GgmlDType::Q5_0, GgmlDType::Q5_1, GgmlDType::Q8_0] {
            // 544: rows that end half-way through the vector kernel's 64 columns
            for k in [544, 576, 1536] {
                let w: Vec<f32> = (0..n * k).map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 0.2).collect();
                let q = QTensor::quantize(&candle_core::Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap(), dtype).unwrap();
                let x = |i: usize| ((i as f32) * 0.37).sin() * (1.0 + (i % 5) as f32);
                assert_product_within_bound(&q, &dev, &[1, 2, 3, 8, 9, 40, 70], x, &format!("{dtype:?} k {k}"));
            }
        }
    }

    /// The same for a real model's matrices (every shape SmolLM2's layers and its tied
    /// output use), with activations that carry a few large channels as a transformer's do.
    #[test]
    fn a_model_s_quantised_products_on_the_device_stay_within_their_rounding() {
        let Some(path) = crate::pretrained::weights::test_support::smollm_path() else { return };
        let mut source = crate::pretrained::decoder_source::DecoderSource::open(&path).unwrap();
        let dev = test_candle_device();
        let x = |i: usize| 0.4 + ((i as f32) * 0.37).sin() * if i % 97 == 5 { 60.0 } else { 1.0 + (i % 5) as f32 };
        for name in ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"].map(|t| format!("blk.0.{t}.weight")).into_iter().chain(["token_embd.weight".to_string()]) {
            let q = source.qtensor(&name).unwrap();
            assert_product_within_bound(&q, &dev, &[1, 2, 5, 8, 9, 17, 40, 70], x, &format!("{name} ({:?})", q.dtype()));
        }
    }
}
