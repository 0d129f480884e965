//! The peer for the NIF-tax benchmark: the same ops done by Burn directly in Rust, same device and
//! dtype, in the same process.

use std::time::Instant;

use burn::backend::ops::FloatTensorOps;
use burn::backend::{DType, Dispatch, TensorData};
use crate::device::DeviceRef;
use crate::dispatch;
use crate::error::{ExError, ExResult};

fn ramp(n: usize) -> Vec<u8> {
    (0..n).flat_map(|i| ((i % 97) as f32 * 0.01).to_ne_bytes()).collect()
}

pub fn run(op: &str, size: usize, iters: usize) -> ExResult<f64> {
    let device = DeviceRef::CPU.burn()?;
    let shape = match op {
        "add" => vec![size],
        "matmul" => vec![size, size],
        _ => return Err(ExError::Arg { name: "op", expected: ":add or :matmul" }),
    };
    let n = shape.iter().product();
    let a = dispatch::from_data(TensorData::from_bytes_vec(ramp(n), shape.clone(), DType::F32), &device);
    let b = dispatch::from_data(TensorData::from_bytes_vec(ramp(n), shape, DType::F32), &device);
    let once = || match op {
        "add" => Dispatch::float_add(a.clone(), b.clone()),
        _ => Dispatch::float_matmul(a.clone(), b.clone()),
    };
    drop(once());
    let start = Instant::now();
    for _ in 0..iters.max(1) {
        drop(once());
    }
    Ok(start.elapsed().as_nanos() as f64 / iters.max(1) as f64)
}
