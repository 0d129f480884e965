//! Helpers for the crate's unit tests: build tensors from values and read them back as numbers.
//!
//! Tests run on the CPU unless `EXBURN_TEST_DEVICE` names another device (`vulkan`, `vulkan:1`,
//! `cuda`, ...), so the same suite checks a GPU backend. Types the device lacks are skipped by the
//! tests that loop over types.

use crate::device::DeviceRef;
use crate::dtype::NxType;
use crate::ops::elementwise::as_type;
use crate::tensor::Handle;

/// The device of `EXBURN_TEST_DEVICE`, the CPU when unset; a spec that names no device panics.
pub fn device() -> DeviceRef {
    static DEVICE: std::sync::OnceLock<DeviceRef> = std::sync::OnceLock::new();
    *DEVICE.get_or_init(|| {
        DeviceRef::parse_or_cpu(crate::process::env::test_device_spec().as_deref())
            .unwrap_or_else(|e| panic!("{}: {e}", crate::process::env::TEST_DEVICE.name))
    })
}

pub fn supports(ty: NxType) -> bool {
    device().supports(ty).unwrap()
}

pub fn f32s(values: &[f32], shape: &[usize]) -> Handle {
    let bytes = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
    Handle::from_bytes(bytes, shape.to_vec(), NxType::F(32), device()).unwrap()
}

pub fn f64s(values: &[f64], shape: &[usize]) -> Handle {
    let bytes = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
    Handle::from_bytes(bytes, shape.to_vec(), NxType::F(64), device()).unwrap()
}

pub fn i64s(values: &[i64], shape: &[usize]) -> Handle {
    let bytes = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
    Handle::from_bytes(bytes, shape.to_vec(), NxType::S(64), device()).unwrap()
}

pub fn as_f64(h: &Handle) -> Handle {
    as_type(h, NxType::F(64)).unwrap()
}

/// Values of a tensor of any type, as f64.
pub fn floats(h: &Handle) -> Vec<f64> {
    let h = as_f64(h);
    h.to_bytes().unwrap().chunks(8).map(|c| f64::from_ne_bytes(c.try_into().unwrap())).collect()
}

pub fn ints(h: &Handle) -> Vec<i64> {
    let h = as_type(h, NxType::S(64)).unwrap();
    h.to_bytes().unwrap().chunks(8).map(|c| i64::from_ne_bytes(c.try_into().unwrap())).collect()
}

pub fn assert_close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "got {got:?}, want {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= tol * (1.0 + w.abs()), "got {got:?}, want {want:?}");
    }
}

/// An f32 flex (CPU) primitive, for tests of the crate's own CPU kernels, which take primitives.
pub fn flex_f32s(values: Vec<f32>, shape: &[usize]) -> crate::dispatch::Prim {
    crate::dispatch::from_data(burn::backend::TensorData::new(values, shape.to_vec()), &burn::tensor::Device::flex())
}

/// The values of an f32 primitive.
pub fn prim_f32s(p: crate::dispatch::Prim) -> Vec<f32> {
    crate::dispatch::into_data(p).unwrap().try_to_vec::<f32>().unwrap()
}

/// Checks an f32 product `got` (`m x n`, row-major) of `a` (`a(i, l)`) and `b` (`k x n`,
/// row-major) against the product summed in f64: each entry within 8·√k·2⁻²⁴ of Σ|aₗ·bₗ|, the
/// reach of f32 rounding. A term dropped or taken twice moves an entry by about Σ|aₗ·bₗ|/k.
pub fn assert_f32_product(got: &[f64], a: impl Fn(usize, usize) -> f64, b: &[f32], (m, k, n): (usize, usize, usize), what: &str) {
    let bound = 8.0 * (k as f64).sqrt() * 2f64.powi(-24);
    assert!(1.0 / k as f64 > 4.0 * bound, "the bound would hide a dropped term at k = {k}");
    assert_eq!(got.len(), m * n, "{what}: result length");
    for i in 0..m {
        for j in 0..n {
            let (mut want, mut mass) = (0.0f64, 0.0f64);
            for l in 0..k {
                let t = a(i, l) * b[l * n + j] as f64;
                want += t;
                mass += t.abs();
            }
            let e = (got[i * n + j] - want).abs() / mass.max(f64::MIN_POSITIVE);
            assert!(e <= bound, "{what} {m}x{k}x{n} [{i},{j}]: {e:e} > {bound:e}");
        }
    }
}
