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

/// Mean nanoseconds per op on the CPU.
pub fn run(op: &str, size: usize, iters: usize) -> ExResult<f64> {
    run_on(DeviceRef::CPU, op, size, iters)
}

/// Mean nanoseconds per op on `device`. GPU work is asynchronous: the loop is bracketed by device
/// syncs, and one warm-up op (shader compilation, autotuning) runs before the clock starts.
pub fn run_on(device: DeviceRef, op: &str, size: usize, iters: usize) -> ExResult<f64> {
    let device = device.burn()?;
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
    let sync = || device.sync().map_err(|e| ExError::Execution(format!("{e:?}")));
    drop(once());
    sync()?;
    let start = Instant::now();
    for _ in 0..iters.max(1) {
        drop(once());
    }
    sync()?;
    Ok(start.elapsed().as_nanos() as f64 / iters.max(1) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Device benchmark for the GPU runs (`EXBURN_TEST_DEVICE=vulkan cargo test ... -- --ignored
    /// --nocapture device_bench`); prints one parseable line per op.
    #[test]
    #[ignore]
    fn device_bench() {
        let device = crate::testing::device();
        for (op, size, iters) in [("matmul", 4096, 20), ("matmul", 1024, 50), ("add", 1 << 24, 50)] {
            let ns = run_on(device, op, size, iters).unwrap();
            let rate = match op {
                "matmul" => format!("{:.2} TFLOP/s", 2.0 * (size as f64).powi(3) / ns / 1e3),
                _ => format!("{:.1} GB/s", 12.0 * size as f64 / ns),
            };
            println!("BENCH device={device} op={op} size={size} ms={:.4} {rate}", ns / 1e6);
        }
    }

    #[test]
    fn cpu_bench_reports_a_positive_time() {
        assert!(run("add", 1024, 2).unwrap() > 0.0);
        assert!(run("bogus", 1, 1).is_err());
    }
}
