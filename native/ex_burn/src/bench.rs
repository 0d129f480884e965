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
    use crate::dtype::NxType;
    use crate::ops::elementwise as ew;
    use crate::ops::linalg::{self, DotSpec};
    use crate::ops::reduce;
    use crate::testing::f32s;


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

    fn t<F: FnMut()>(name: &str, mut f: F) {
        for _ in 0..20 { f(); }
        let n = 300;
        let s = Instant::now();
        for _ in 0..n { f(); }
        println!("{name:40} {:8.1} us", s.elapsed().as_secs_f64() * 1e6 / n as f64);
    }

    /// CPU kernel timings at MLP sizes ([128, 256] f32), to see where a training step's time goes
    /// (`cargo test --release -p ex_burn --no-default-features -- --ignored --nocapture kernel_bench`).
    #[test]
    #[ignore]
    fn kernel_bench() {
        let v: Vec<f32> = (0..128 * 256).map(|i| ((i % 97) as f32) * 0.01 - 0.3).collect();
        let a = f32s(&v, &[128, 256]);
        let b = f32s(&v.iter().map(|x| x + 1.0).collect::<Vec<_>>(), &[128, 256]);
        let z = f32s(&[0.0], &[1]);
        let zf = ew::as_type(&ew::binary("multiply", &a, &z, NxType::F(32)).unwrap(), NxType::F(32)).unwrap();
        let f32t = NxType::F(32);
        t("add", || drop(ew::binary("add", &a, &b, f32t).unwrap()));
        t("multiply", || drop(ew::binary("multiply", &a, &b, f32t).unwrap()));
        t("divide", || drop(ew::binary("divide", &a, &b, f32t).unwrap()));
        t("max dense", || drop(ew::binary("max", &a, &zf, f32t).unwrap()));
        t("max scalar", || drop(ew::binary("max", &a, &z, f32t).unwrap()));
        t("greater", || drop(ew::binary("greater", &a, &b, f32t).unwrap()));
        t("exp", || drop(ew::unary("exp", &a, f32t).unwrap()));
        t("cast f64", || drop(ew::as_type(&a, NxType::F(64)).unwrap()));
        t("sum axis0", || drop(reduce::reduce("sum", &a, Some(vec![0]), false, f32t).unwrap()));
        t("sum axis1", || drop(reduce::reduce("sum", &a, Some(vec![1]), false, f32t).unwrap()));
        t("reduce_max axis0", || drop(reduce::reduce("reduce_max", &a, Some(vec![0]), false, f32t).unwrap()));
        let a64 = ew::as_type(&a, NxType::F(64)).unwrap();
        let ones_r = ew::as_type(&f32s(&vec![1.0; 128], &[1, 128]), NxType::F(64)).unwrap();
        let ones_c = ew::as_type(&f32s(&vec![1.0; 256], &[256, 1]), NxType::F(64)).unwrap();
        let f64t = NxType::F(64);
        t("f64 ones . a (axis0)", || drop(linalg::dot(&ones_r, &DotSpec { contract: vec![1], batch: vec![] }, &a64, &DotSpec { contract: vec![0], batch: vec![] }, f64t).unwrap()));
        t("f64 a . ones (axis1)", || drop(linalg::dot(&a64, &DotSpec { contract: vec![1], batch: vec![] }, &ones_c, &DotSpec { contract: vec![0], batch: vec![] }, f64t).unwrap()));
        t("f32 ones . a (axis0)", || drop(linalg::dot(&ew::as_type(&ones_r, f32t).unwrap(), &DotSpec { contract: vec![1], batch: vec![] }, &a, &DotSpec { contract: vec![0], batch: vec![] }, f32t).unwrap()));
        let x = f32s(&v[..128 * 16], &[128, 16]);
        let w = f32s(&v[..16 * 256], &[16, 256]);
        let g = f32s(&v[..128 * 10], &[128, 10]);
        let w2 = f32s(&v[..256 * 10], &[256, 10]);
        let sp = |c: usize| DotSpec { contract: vec![c], batch: vec![] };
        t("dot 128x16 . 16x256", || drop(linalg::dot(&x, &sp(1), &w, &sp(0), f32t).unwrap()));
        t("dot 128x10 . (256x10)^T", || drop(linalg::dot(&g, &sp(1), &w2, &sp(1), f32t).unwrap()));
        t("dot (128x256)^T . 128x16", || drop(linalg::dot(&a, &sp(0), &x, &sp(0), f32t).unwrap()));
        t("dot 128x256 . 256x10", || drop(linalg::dot(&a, &sp(1), &w2, &sp(0), f32t).unwrap()));
    }
}
