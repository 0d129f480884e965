//! The device a Candle model runs on: the CPU, or a CUDA GPU where the library was built with
//! the `candle-cuda` feature (scripts/cuda-toolkit.sh, guides/devices.md).

use std::borrow::Cow;

use candle_core::quantized::{QStorage, QTensor};
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
        DeviceKind::Cuda => Device::new_cuda(device.index)
            .map_err(|e| unsupported(device, format!("the candle engine could not open {device}: {e}"))),
        _ => {
            let runs = if kinds().contains(&DeviceKind::Cuda) { "the CPU and CUDA devices" } else { "the CPU only (this library was built without `candle-cuda`)" };
            Err(unsupported(device, format!("the candle engine runs on {runs}; {device} was asked for")))
        }
    }
}

fn unsupported(device: &DeviceRef, reason: String) -> ExError {
    errors::err(kind::UNSUPPORTED_DEVICE, reason, vec![("device", Detail::Text(device.to_string())), ("engine", Detail::Atom("candle"))])
}

/// `q` (read into host memory) on `dev`, its blocks unchanged.
pub fn qtensor_on(q: QTensor, dev: &Device) -> candle_core::Result<QTensor> {
    if dev.is_cpu() {
        return Ok(q);
    }
    qtensor_copy(&q, dev)
}

/// A copy of `q`'s blocks on `dev`; on a GPU, followed by a row padding's worth of zero blocks.
/// Candle's CUDA matrix kernel (`mul_mat_q*`, more than 8 activation rows) reads each weight row
/// in groups of blocks that run past the row's end: for the last row, into padding that Candle
/// allocates uninitialised, where a NaN bit pattern times the activations' zero padding turns
/// that output NaN. llama.cpp zeroes the same padding for the same reason.
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
        let dev = device(&test_device()).unwrap();
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

    /// Candle quantises a product's activations to Q8_1 blocks of 32 on every device, so each
    /// output may move from the f32 product of the dequantised weights by half a step of each
    /// block's scale (`amax / 127`) times the block's weights, plus f32 rounding.
    #[test]
    fn a_quantised_product_on_the_device_stays_within_the_activations_quantisation() {
        use candle_core::quantized::{GgmlDType, QMatMul};
        use candle_core::{Module, Tensor};
        let dev = device(&test_device()).unwrap();
        let n = 96;
        for dtype in [GgmlDType::Q4_0, GgmlDType::Q4_1, GgmlDType::Q5_0, GgmlDType::Q5_1, GgmlDType::Q8_0] {
            for k in [576, 1536] {
                let w: Vec<f32> = (0..n * k).map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 0.2).collect();
                let q = QTensor::quantize(&Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap(), dtype).unwrap();
                let wd = q.dequantize(&Device::Cpu).unwrap().to_vec2::<f32>().unwrap();
                let on = QMatMul::from_qtensor(qtensor_copy(&q, &dev).unwrap()).unwrap();
                for m in [1, 3, 8, 9, 40] {
                    let x: Vec<f32> = (0..m * k).map(|i| ((i as f32) * 0.37).sin() * (1.0 + (i % 5) as f32)).collect();
                    let xt = Tensor::from_vec(x.clone(), (m, k), &dev).unwrap();
                    let got = on.forward(&xt).unwrap().to_vec2::<f32>().unwrap();
                    for r in 0..m {
                        let xr = &x[r * k..(r + 1) * k];
                        for j in 0..n {
                            let (mut exact, mut bound) = (0f64, 0f64);
                            for (b, xs) in xr.chunks(32).enumerate() {
                                let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs())) as f64;
                                let ws = &wd[j][b * 32..b * 32 + xs.len()];
                                exact += xs.iter().zip(ws).map(|(&a, &c)| a as f64 * c as f64).sum::<f64>();
                                let wabs = ws.iter().map(|c| c.abs() as f64).sum::<f64>();
                                bound += amax / 254.0 * wabs + 1e-5 * amax * wabs;
                            }
                            let diff = (got[r][j] as f64 - exact).abs();
                            assert!(diff <= bound, "{dtype:?} k {k}, {m} rows: row {r} column {j} is {} where the product is {exact} (bound {bound})", got[r][j]);
                        }
                    }
                }
            }
        }
    }
}
