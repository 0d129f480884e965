//! Benchmarks of Burn itself, outside the shipped library (run with `--no-default-features`: an
//! executable cannot link the NIF layer, whose `enif_*` symbols only the BEAM provides).
//!
//!     cargo run --release -p ex_burn --no-default-features --example burn_bench -- <command>
//!
//! * `peer OP SIZE ITERS` - mean ns of `add` (SIZE elements) or `matmul` (SIZE²) done by Burn in
//!   Rust on the CPU: the peer of `bench/nif_tax.exs`, which runs it in the same invocation.
//! * `device [DEVICE]` - matmul 4096²/1024² and add of 16M f32 on DEVICE (`cpu`, `vulkan`,
//!   `cuda:0`, ...; default `EXBURN_TEST_DEVICE` or cpu), one parseable `BENCH` line each; the
//!   peer is `bench/torch_peer.py`.
//! * `kernels` - CPU kernel timings at MLP sizes ([128, 256] f32), to see where a compiled
//!   training step's time goes.
//! * `precision DIR [DEVICE]` - on DEVICE (default cuda), with the inputs `bench/cuda_precision.py
//!   prepare DIR` wrote: matmul 4096² through the crate's `dot` (the NIF's path: cuBLAS on CUDA) at
//!   `:highest`/`:high` and bf16, and through Burn's own kernel; conv2d forward and
//!   forward+backward; an MLP training step (Adam). Writes `burn_<case>.bin` products for the
//!   error report (`bench/cuda_precision.py errors DIR`).
//! * `steps DIR CASE [DEVICE]` - the NIF benchmark's two loops from one Rust thread, in rounds
//!   short enough to run under a kernel profiler: `bf16` (`acc + a·b`, 4096², eight rounds of 20
//!   steps, the sum read after each round) and `add` (16M f32, each result's first element read,
//!   five rounds of 10). One `STEPS` line per round; `bench/cuda_kernel_profile.sh` runs it beside
//!   PyTorch's same loops under Nsight Compute.

use std::time::Instant;

use burn::backend::ops::FloatTensorOps;
use burn::backend::{DType, Dispatch, TensorData};
use ex_burn::device::DeviceRef;
use ex_burn::dispatch;
use ex_burn::dtype::NxType;
use ex_burn::ops::elementwise as ew;
use ex_burn::ops::linalg::{self, DotSpec};
use ex_burn::ops::reduce;
use ex_burn::ops::vocab::{BinaryOp, ReduceOp, UnaryOp};
use ex_burn::tensor::Handle;

fn ramp(n: usize) -> Vec<u8> {
    (0..n).flat_map(|i| ((i % 97) as f32 * 0.01).to_ne_bytes()).collect()
}

fn parse_device(spec: &str) -> DeviceRef {
    DeviceRef::parse(spec).unwrap_or_else(|e| panic!("{e}"))
}

fn operands(device: &burn::tensor::Device, op: &str, size: usize) -> (dispatch::Prim, dispatch::Prim) {
    let shape = match op {
        "add" => vec![size],
        "matmul" => vec![size, size],
        _ => panic!("op must be add or matmul"),
    };
    let n = shape.iter().product();
    let a = dispatch::from_data(TensorData::from_bytes_vec(ramp(n), shape.clone(), DType::F32), device);
    let b = dispatch::from_data(TensorData::from_bytes_vec(ramp(n), shape, DType::F32), device);
    (a, b)
}

fn apply(op: &str, a: &dispatch::Prim, b: &dispatch::Prim) -> dispatch::Prim {
    match op {
        "add" => Dispatch::float_add(a.clone(), b.clone()),
        _ => Dispatch::float_matmul(a.clone(), b.clone()),
    }
}

/// Mean nanoseconds of one CPU op whose result is dropped at once, as the NIF side of
/// `bench/nif_tax.exs` does (flex runs eagerly, so each op completes before it returns).
fn peer(op: &str, size: usize, iters: usize) -> f64 {
    let device = DeviceRef::CPU.burn().expect("cpu");
    let (a, b) = operands(&device, op, size);
    drop(apply(op, &a, &b));
    let start = Instant::now();
    for _ in 0..iters.max(1) {
        drop(apply(op, &a, &b));
    }
    start.elapsed().as_nanos() as f64 / iters.max(1) as f64
}

/// Mean nanoseconds per op on `device`. GPU work is asynchronous and fused: every iteration's
/// result feeds an accumulator that is read back at the end, so no iteration can be dropped
/// (timing `a + b` whose result is never read measured nothing on fused backends). For matmul
/// the accumulating add is a small extra (n² next to n³). One warm-up op (shader compilation,
/// autotuning) runs before the clock starts.
/// The device benchmark through the crate's own ops (what the NIF runs: `dot` is cuBLAS on
/// CUDA): matmul 4096² and 1024² f32 at the default precision, and add of 16M f32. Products are
/// timed as an accumulator that sums every iteration's product (`Read::SumAtEnd`); adds are timed
/// one at a time (`Read::FirstEach`), since fusion would merge a chain of adds into one kernel that
/// reads the operands once.
fn device_bench(device: DeviceRef) {
    let f32t = NxType::F(32);
    let sp = |c: usize| DotSpec { contract: vec![c], batch: vec![] };
    for (size, iters) in [(4096, 20), (1024, 50)] {
        let a = Handle::from_bytes(ramp(size * size), vec![size, size], f32t, device).expect("tensor");
        let ns = timed_handle(&a, iters, Read::SumAtEnd, |acc| {
            let p = linalg::dot(&a, &sp(1), &a, &sp(0), f32t).unwrap();
            ew::binary(BinaryOp::Add, acc, &p, f32t).unwrap()
        });
        let tflops = 2.0 * (size as f64).powi(3) / ns / 1e3;
        println!("BENCH device={device} op=matmul size={size} ms={:.4} {tflops:.2} TFLOP/s", ns / 1e6);
    }
    let n = 1 << 24;
    let x = Handle::from_bytes(ramp(n), vec![n], f32t, device).expect("tensor");
    let ns = timed_handle(&x, 50, Read::FirstEach, |acc| ew::binary(BinaryOp::Add, acc, &x, f32t).unwrap());
    // reads two operands and writes one
    println!("BENCH device={device} op=add size={n} ms={:.4} {:.1} GB/s", ns / 1e6, 12.0 * n as f64 / ns);
}

fn f32s(values: &[f32], shape: &[usize]) -> Handle {
    let bytes = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
    Handle::from_bytes(bytes, shape.to_vec(), NxType::F(32), DeviceRef::CPU).expect("tensor")
}

fn t<F: FnMut()>(name: &str, mut f: F) {
    for _ in 0..20 {
        f();
    }
    let n = 300;
    let s = Instant::now();
    for _ in 0..n {
        f();
    }
    println!("{name:40} {:8.1} us", s.elapsed().as_secs_f64() * 1e6 / n as f64);
}

fn kernels() {
    let v: Vec<f32> = (0..128 * 256).map(|i| ((i % 97) as f32) * 0.01 - 0.3).collect();
    let a = f32s(&v, &[128, 256]);
    let b = f32s(&v.iter().map(|x| x + 1.0).collect::<Vec<_>>(), &[128, 256]);
    let z = f32s(&[0.0], &[1]);
    let f32t = NxType::F(32);
    let f64t = NxType::F(64);
    let zf = ew::as_type(&ew::binary(BinaryOp::Multiply, &a, &z, f32t).unwrap(), f32t).unwrap();
    t("add", || drop(ew::binary(BinaryOp::Add, &a, &b, f32t).unwrap()));
    t("multiply", || drop(ew::binary(BinaryOp::Multiply, &a, &b, f32t).unwrap()));
    t("divide", || drop(ew::binary(BinaryOp::Divide, &a, &b, f32t).unwrap()));
    t("max dense", || drop(ew::binary(BinaryOp::Max, &a, &zf, f32t).unwrap()));
    t("max scalar", || drop(ew::binary(BinaryOp::Max, &a, &z, f32t).unwrap()));
    t("greater", || drop(ew::binary(BinaryOp::Greater, &a, &b, f32t).unwrap()));
    t("exp", || drop(ew::unary(UnaryOp::Exp, &a, f32t).unwrap()));
    t("cast f64", || drop(ew::as_type(&a, f64t).unwrap()));
    t("sum axis0", || drop(reduce::reduce(ReduceOp::Sum, &a, Some(vec![0]), false, f32t).unwrap()));
    t("sum axis1", || drop(reduce::reduce(ReduceOp::Sum, &a, Some(vec![1]), false, f32t).unwrap()));
    t("reduce_max axis0", || drop(reduce::reduce(ReduceOp::ReduceMax, &a, Some(vec![0]), false, f32t).unwrap()));
    let sp = |c: usize| DotSpec { contract: vec![c], batch: vec![] };
    let a64 = ew::as_type(&a, f64t).unwrap();
    let ones_r = ew::as_type(&f32s(&[1.0; 128], &[1, 128]), f64t).unwrap();
    let ones_c = ew::as_type(&f32s(&[1.0; 256], &[256, 1]), f64t).unwrap();
    t("f64 ones . a (axis0)", || drop(linalg::dot(&ones_r, &sp(1), &a64, &sp(0), f64t).unwrap()));
    t("f64 a . ones (axis1)", || drop(linalg::dot(&a64, &sp(1), &ones_c, &sp(0), f64t).unwrap()));
    t("f32 ones . a (axis0)", || drop(linalg::dot(&ew::as_type(&ones_r, f32t).unwrap(), &sp(1), &a, &sp(0), f32t).unwrap()));
    let x = f32s(&v[..128 * 16], &[128, 16]);
    let w = f32s(&v[..16 * 256], &[16, 256]);
    let g = f32s(&v[..128 * 10], &[128, 10]);
    let w2 = f32s(&v[..256 * 10], &[256, 10]);
    t("dot 128x16 . 16x256", || drop(linalg::dot(&x, &sp(1), &w, &sp(0), f32t).unwrap()));
    t("dot 128x10 . (256x10)^T", || drop(linalg::dot(&g, &sp(1), &w2, &sp(1), f32t).unwrap()));
    t("dot (128x256)^T . 128x16", || drop(linalg::dot(&a, &sp(0), &x, &sp(0), f32t).unwrap()));
    t("dot 128x256 . 256x10", || drop(linalg::dot(&a, &sp(1), &w2, &sp(0), f32t).unwrap()));
}

fn read_f32(dir: &str, name: &str, shape: &[usize], device: DeviceRef) -> Handle {
    let bytes = std::fs::read(format!("{dir}/{name}")).expect("input file (bench/cuda_precision.py prepare)");
    Handle::from_bytes(bytes, shape.to_vec(), NxType::F(32), device).expect("tensor")
}

/// How a timing loop makes sure the device did the work it times.
#[derive(Clone, Copy, PartialEq)]
enum Read {
    /// Read back the sum of the accumulator once at the end: every iteration feeds it, and only
    /// one number comes back (copying a 64 MB accumulator to the host can take longer than the
    /// work).
    SumAtEnd,
    /// Read each step's first element before the next step starts (`bench/cuda_precision.py`
    /// does the same with `.item()`): each step is its own kernel, since fusion would otherwise
    /// merge a chain of element-wise steps into one kernel that reads the operands once.
    FirstEach,
}

/// Mean ns of `step` over `iters` steps that each feed the next, after three untimed warm-up
/// steps (kernel compilation, autotuning).
fn timed_handle(start: &Handle, iters: usize, read: Read, step: impl Fn(&Handle) -> Handle) -> f64 {
    let run = |n: usize| {
        let mut acc = start.clone();
        for _ in 0..n {
            acc = step(&acc);
            if read == Read::FirstEach {
                let rank = acc.shape.len();
                let one = ex_burn::ops::shape::slice(&acc, vec![0; rank], vec![1; rank], vec![1; rank]).expect("slice");
                one.to_bytes().expect("read back");
            }
        }
        if read == Read::SumAtEnd {
            reduce::reduce(ReduceOp::Sum, &acc, None, false, acc.ty).expect("sum").to_bytes().expect("read back");
        }
    };
    run(3);
    let t0 = Instant::now();
    run(iters);
    t0.elapsed().as_nanos() as f64 / iters as f64
}

fn precision_bench(dir: &str, device: DeviceRef) {
    use ex_burn::ops::precision::MatmulPrecision;
    let n = 4096;
    let (f32t, bf16t) = (NxType::F(32), NxType::BF16);
    let a = read_f32(dir, "a.bin", &[n, n], device);
    let b = read_f32(dir, "b.bin", &[n, n], device);
    let sp = |c: usize| DotSpec { contract: vec![c], batch: vec![] };
    let line = |case: &str, ns: f64| {
        println!(
            "BENCH side=burn device={device} case={case} size={n} ms={:.4} {:.2} TFLOP/s",
            ns / 1e6,
            2.0 * (n as f64).powi(3) / ns / 1e3
        )
    };
    let add = |x: &Handle, y: &Handle| ew::binary(BinaryOp::Add, x, y, x.ty).unwrap();
    for (case, ty, precision) in [
        ("f32_highest", f32t, MatmulPrecision::Highest),
        ("f32_high", f32t, MatmulPrecision::High),
        ("bf16", bf16t, MatmulPrecision::Highest),
    ] {
        let (ta, tb) = (ew::as_type(&a, ty).unwrap(), ew::as_type(&b, ty).unwrap());
        let mm = |x: &Handle, y: &Handle| linalg::dot_with(x, &sp(1), y, &sp(0), ty, Some(precision)).unwrap();
        let c = ew::as_type(&mm(&ta, &tb), f32t).unwrap();
        std::fs::write(format!("{dir}/burn_{case}.bin"), c.to_bytes().unwrap()).unwrap();
        line(case, timed_handle(&ta, 20, Read::SumAtEnd, |acc| add(acc, &mm(&ta, &tb))));
    }
    // Burn's own matmul kernel (cubek-matmul), for comparison: what `dot` ran before cuBLAS.
    for (case, ty) in [("f32_burnkernel", f32t), ("bf16_burnkernel", bf16t)] {
        let (ta, tb) = (ew::as_type(&a, ty).unwrap(), ew::as_type(&b, ty).unwrap());
        let mm = |x: &Handle, y: &Handle| {
            let p = Dispatch::float_matmul(x.prim.clone(), y.prim.clone());
            Handle::new(p, ty, vec![n, n], device)
        };
        let c = ew::as_type(&mm(&ta, &tb), f32t).unwrap();
        std::fs::write(format!("{dir}/burn_{case}.bin"), c.to_bytes().unwrap()).unwrap();
        line(case, timed_handle(&ta, 20, Read::SumAtEnd, |acc| add(acc, &mm(&ta, &tb))));
    }
    conv_and_mlp(&device.burn().expect("device"), device);
}

fn conv_and_mlp(dev: &burn::tensor::Device, label: DeviceRef) {
    use burn::backend::ops::ConvOptions;
    use burn::tensor::module::conv2d;
    use burn::tensor::{Distribution, Int, Tensor};
    let timed = |iters: usize, mut step: Box<dyn FnMut() -> Tensor<1>>| {
        // three warm-up steps: the optimizer's first step creates its state, so the second runs
        // other kernels (compiled and autotuned on first use)
        let _ = (step() + step() + step()).into_data();
        let t0 = Instant::now();
        let mut acc = step();
        for _ in 1..iters {
            acc = acc + step();
        }
        let _ = acc.into_data();
        t0.elapsed().as_nanos() as f64 / iters as f64
    };
    let opts = || ConvOptions::new([1, 1], [1, 1], [1, 1], 1);
    let flops = 2.0 * 32.0 * 128.0 * 56.0 * 56.0 * 64.0 * 9.0;
    let x = Tensor::<4>::random([32, 64, 56, 56], Distribution::Normal(0.0, 1.0), dev);
    let w = Tensor::<4>::random([128, 64, 3, 3], Distribution::Normal(0.0, 1.0), dev);
    let (xf, wf) = (x.clone(), w.clone());
    let ns = timed(20, Box::new(move || conv2d(xf.clone(), wf.clone(), None, opts()).sum()));
    println!("BENCH side=burn device={label} case=conv2d_fwd_f32 size=32x64x56x56*128x3x3 ms={:.4} {:.2} TFLOP/s", ns / 1e6, flops / ns / 1e3);
    let ad = dev.clone().autodiff();
    let xa = Tensor::<4>::random([32, 64, 56, 56], Distribution::Normal(0.0, 1.0), &ad);
    let wa = Tensor::<4>::random([128, 64, 3, 3], Distribution::Normal(0.0, 1.0), &ad).require_grad();
    let ns = timed(
        20,
        Box::new(move || {
            let out = conv2d(xa.clone(), wa.clone(), None, opts());
            let grads = out.powf_scalar(2.0).mean().backward();
            wa.grad(&grads).expect("weight gradient").sum()
        }),
    );
    println!("BENCH side=burn device={label} case=conv2d_fwdbwd_f32 size=32x64x56x56*128x3x3 ms={:.4} {:.2} TFLOP/s", ns / 1e6, 3.0 * flops / ns / 1e3);

    // MLP training step: 1024 -> 4096 -> 4096 -> 10, batch 1024, Adam (Burn's Linear: Burn's matmul kernel)
    use burn::module::Module;
    use burn::nn::loss::CrossEntropyLossConfig;
    use burn::nn::{Linear, LinearConfig};
    use burn::optim::{AdamConfig, GradientsParams};
    #[derive(Module, Debug)]
    struct Mlp {
        l1: Linear,
        l2: Linear,
        l3: Linear,
    }
    let relu = burn::tensor::activation::relu::<2>;
    let mut model = Mlp {
        l1: LinearConfig::new(1024, 4096).init(&ad),
        l2: LinearConfig::new(4096, 4096).init(&ad),
        l3: LinearConfig::new(4096, 10).init(&ad),
    };
    let mut optim = AdamConfig::new().init();
    let xb = Tensor::<2>::random([1024, 1024], Distribution::Normal(0.0, 1.0), &ad);
    let yb = Tensor::<1, Int>::random([1024], Distribution::Uniform(0.0, 10.0), &ad);
    let loss_fn = CrossEntropyLossConfig::new().init(&ad);
    let mut step = move || {
        let h = relu(model.l1.forward(xb.clone()));
        let h = relu(model.l2.forward(h));
        let loss = loss_fn.forward(model.l3.forward(h), yb.clone());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(1e-3, model.clone(), grads);
        loss.inner()
    };
    let ns = timed(20, Box::new(move || step()));
    println!("BENCH side=burn device={label} case=mlp_step_f32 size=1024x[1024,4096,4096,10] ms={:.4} {:.3} ms/step", ns / 1e6, ns / 1e6);
}

fn steps(dir: &str, case: &str, device: DeviceRef) {
    let add = |x: &Handle, y: &Handle| ew::binary(BinaryOp::Add, x, y, x.ty).unwrap();
    type Step = Box<dyn Fn(&Handle) -> Handle>;
    let (rounds, iters, read, start, step): (usize, usize, Read, Handle, Step) = match case {
        "bf16" => {
            let a = ew::as_type(&read_f32(dir, "a.bin", &[4096, 4096], device), NxType::BF16).unwrap();
            let b = ew::as_type(&read_f32(dir, "b.bin", &[4096, 4096], device), NxType::BF16).unwrap();
            let sp = |c: usize| DotSpec { contract: vec![c], batch: vec![] };
            let mm = move |x: &Handle, y: &Handle| linalg::dot(x, &sp(1), y, &sp(0), NxType::BF16).unwrap();
            (8, 20, Read::SumAtEnd, a.clone(), Box::new(move |acc: &Handle| add(acc, &mm(&a, &b))))
        }
        "add" => {
            let m = 1 << 24;
            let x = read_f32(dir, "x.bin", &[m], device);
            let y = read_f32(dir, "y.bin", &[m], device);
            (5, 10, Read::FirstEach, x, Box::new(move |acc: &Handle| add(acc, &y)))
        }
        other => panic!("unknown case {other} (bf16 or add)"),
    };
    for round in 0..rounds {
        // timed_handle's three warm-up steps run before each round's timed ones
        let ns = timed_handle(&start, iters, read, &step);
        println!("STEPS side=burn device={device} case={case} round={round} us_per_step={:.1}", ns / 1e3);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["peer", op, size, iters] => {
            let ns = peer(op, size.parse().expect("size"), iters.parse().expect("iters"));
            println!("{ns}");
        }
        ["device"] => device_bench(DeviceRef::parse_or_cpu(ex_burn::process::env::test_device_spec().as_deref()).unwrap_or_else(|e| panic!("{e}"))),
        ["device", spec] => device_bench(parse_device(spec)),
        ["kernels"] => kernels(),
        ["precision", dir] => precision_bench(dir, parse_device("cuda")),
        ["precision", dir, spec] => precision_bench(dir, parse_device(spec)),
        ["steps", dir, case] => steps(dir, case, parse_device("cuda")),
        ["steps", dir, case, spec] => steps(dir, case, parse_device(spec)),
        _ => {
            eprintln!(
                "usage: burn_bench (peer OP SIZE ITERS | device [DEVICE] | kernels | precision DIR [DEVICE] | steps DIR CASE [DEVICE])"
            );
            std::process::exit(2);
        }
    }
}
