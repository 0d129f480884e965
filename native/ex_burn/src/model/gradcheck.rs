//! Autodiff gradients of every layer kind against central finite differences, in f64.
//!
//! The probe loss is `sum(out · r)` with a fixed pseudo-random `r`, so every output element
//! contributes a distinct weight. Gradients are checked with respect to the input (float layers)
//! and to a sample of parameter elements (all layers with parameters).

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::{DType, Device, Int, Tensor, TensorData};

use super::init::SeededRng;
use super::net::{build, Act, Net};
use super::spec::{Activation, LayerSpec, Padding};

fn device() -> Device {
    Device::flex().autodiff()
}

struct ToF64;
impl ModuleMapper for ToF64 {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        param.map(|t| t.cast(DType::F64))
    }
}

/// Adds `delta` to element `index` of the `target`-th float parameter.
struct Perturb {
    target: usize,
    index: usize,
    delta: f64,
    seen: usize,
}
impl ModuleMapper for Perturb {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let k = self.seen;
        self.seen += 1;
        if k != self.target {
            return param;
        }
        let (index, delta) = (self.index, self.delta);
        param.map(move |t| {
            let dims = t.dims();
            let n = t.shape().num_elements();
            let mut bump = vec![0.0f64; n];
            bump[index] = delta;
            let bump = Tensor::<1>::from_data(TensorData::new(bump, [n]), (&t.device(), t.dtype())).reshape(dims);
            t + bump
        })
    }
}

/// Float parameters (flattened values and gradients) in visiting order.
struct Grads<'a> {
    grads: &'a burn::tensor::Gradients,
    out: Vec<(Vec<f64>, Vec<f64>)>,
}
impl ModuleVisitor for Grads<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let v = param.val();
        let g = v.grad(self.grads).map(values).unwrap_or_default();
        self.out.push((values(v.inner()), g));
    }
}

fn values<const D: usize>(t: Tensor<D>) -> Vec<f64> {
    t.cast(DType::F64).into_data().try_to_vec::<f64>().unwrap()
}

fn pseudo_random(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) as f64 / (1u64 << 31) as f64) - 0.5
        })
        .collect()
}

fn input_act(dims: &[usize], seed: u64, p: Precision) -> Act {
    let n: usize = dims.iter().product();
    let data = TensorData::new(pseudo_random(n, seed).iter().map(|v| v * 2.0).collect::<Vec<f64>>(), [n]);
    shaped(float_tensor(data, p), dims)
}

fn shaped(t: Tensor<1>, dims: &[usize]) -> Act {
    match dims.len() {
        2 => Act::F2(t.reshape([dims[0], dims[1]])),
        3 => Act::F3(t.reshape([dims[0], dims[1], dims[2]])),
        _ => Act::F4(t.reshape([dims[0], dims[1], dims[2], dims[3]])),
    }
}

/// `from_data` uses the device's default float type (f32 on flex); the checks need f64.
fn float_tensor(data: TensorData, p: Precision) -> Tensor<1> {
    let dtype = if p == Precision::F64 { DType::F64 } else { DType::F32 };
    Tensor::<1>::from_data(data, (&device(), dtype))
}

fn probe_loss(net: &Net, x: Act) -> Tensor<1> {
    let out = net.forward(x).unwrap();
    let flat = match out {
        Act::F2(t) => t.reshape([-1]),
        Act::F3(t) => t.reshape([-1]),
        Act::F4(t) => t.reshape([-1]),
        Act::I2(_) => unreachable!(),
    };
    let n = flat.shape().num_elements();
    let r = Tensor::<1>::from_data(TensorData::new(pseudo_random(n, 99), [n]), &flat.device()).cast(flat.dtype());
    (flat * r).sum()
}

fn loss_value(net: &Net, x: Act) -> f64 {
    values(probe_loss(net, x).inner())[0]
}

fn rel_err(a: f64, b: f64) -> f64 {
    (a - b).abs() / (a.abs() + b.abs()).max(1e-6)
}

fn with_x(x: &Act, p: Precision, f: impl FnOnce(Vec<f64>) -> Vec<f64>) -> Act {
    let dims = x.dims();
    let v = match x.clone() {
        Act::F2(t) => values(t.inner()),
        Act::F3(t) => values(t.inner()),
        Act::F4(t) => values(t.inner()),
        Act::I2(_) => unreachable!(),
    };
    let v = f(v);
    shaped(float_tensor(TensorData::new(v, [dims.iter().product::<usize>()]), p), &dims)
}

fn require_grad(x: Act) -> Act {
    match x {
        Act::F2(t) => Act::F2(t.require_grad()),
        Act::F3(t) => Act::F3(t.require_grad()),
        Act::F4(t) => Act::F4(t.require_grad()),
        other => other,
    }
}

fn input_grad(x: &Act, grads: &burn::tensor::Gradients) -> Vec<f64> {
    match x {
        Act::F2(t) => values(t.grad(grads).unwrap()),
        Act::F3(t) => values(t.grad(grads).unwrap()),
        Act::F4(t) => values(t.grad(grads).unwrap()),
        Act::I2(_) => unreachable!(),
    }
}

const H: f64 = 1e-6;
const TOL: f64 = 1e-3;

/// Float width of a check. Burn creates LSTM/GRU initial states and batch-norm running
/// statistics in the device's default f32, so those layers are checked in f32, with a larger
/// step and a tolerance that allows for f32 rounding.
#[derive(Clone, Copy, PartialEq)]
enum Precision {
    F64,
    F32,
}

fn agree(analytic: f64, numeric: f64, p: Precision) -> bool {
    match p {
        Precision::F64 => rel_err(analytic, numeric) <= TOL,
        Precision::F32 => (analytic - numeric).abs() <= 2e-2 * (analytic.abs() + numeric.abs()).max(0.05),
    }
}

/// Checks d(loss)/d(input) for up to 6 input elements and d(loss)/d(param) for up to 4 elements
/// of each parameter tensor.
fn check(specs: Vec<LayerSpec>, input: &[usize], check_input: bool) {
    check_at(specs, input, check_input, Precision::F64)
}

fn check_at(specs: Vec<LayerSpec>, input: &[usize], check_input: bool, precision: Precision) {
    let dev = device();
    let (net, _) = build(&specs, &input[1..], false, &dev, &mut SeededRng::new(1)).unwrap();
    let (net, h) = match precision {
        Precision::F64 => (net.map(&mut ToF64), H),
        Precision::F32 => (net, 1e-3),
    };
    let x = require_grad(input_act(input, 7, precision));
    let grads = probe_loss(&net, x.clone()).backward();
    let label = format!("{:?}", specs.iter().map(|s| s.name()).collect::<Vec<_>>());

    if check_input {
        let analytic = input_grad(&x, &grads);
        let n = analytic.len();
        for i in (0..n).step_by((n / 6).max(1)).take(6) {
            let plus = loss_value(&net, with_x(&x, precision, |mut v| { v[i] += h; v }));
            let minus = loss_value(&net, with_x(&x, precision, |mut v| { v[i] -= h; v }));
            let numeric = (plus - minus) / (2.0 * h);
            assert!(agree(analytic[i], numeric, precision), "{label}: input grad [{i}] autodiff {} vs numeric {numeric}", analytic[i]);
        }
    }

    let mut visitor = Grads { grads: &grads, out: Vec::new() };
    net.visit(&mut visitor);
    for (p, (vals, analytic)) in visitor.out.iter().enumerate() {
        if analytic.is_empty() {
            continue; // running statistics are not parameters of the loss
        }
        for i in (0..vals.len()).step_by((vals.len() / 4).max(1)).take(4) {
            let plus = loss_value(&net.clone().map(&mut Perturb { target: p, index: i, delta: h, seen: 0 }), x.clone());
            let minus = loss_value(&net.clone().map(&mut Perturb { target: p, index: i, delta: -h, seen: 0 }), x.clone());
            let numeric = (plus - minus) / (2.0 * h);
            assert!(agree(analytic[i], numeric, precision), "{label}: param {p}[{i}] autodiff {} vs numeric {numeric}", analytic[i]);
        }
    }
}

fn dense(units: usize) -> LayerSpec {
    LayerSpec::Dense { units, use_bias: true }
}

#[test]
fn dense_layer() {
    check(vec![dense(3)], &[2, 4], true);
}

#[test]
fn every_activation() {
    for a in [
        Activation::Relu,
        Activation::Gelu,
        Activation::Sigmoid,
        Activation::Tanh,
        Activation::Softmax,
        Activation::LogSoftmax,
        Activation::LeakyRelu(0.1),
        Activation::Silu,
    ] {
        check(vec![dense(4), LayerSpec::Activation(a)], &[3, 5], true);
    }
}

#[test]
fn conv_layers() {
    check(vec![LayerSpec::Conv1d { filters: 2, kernel_size: vec![3], strides: vec![1], padding: Padding::Same }], &[2, 6, 3], true);
    check(vec![LayerSpec::Conv2d { filters: 2, kernel_size: vec![2, 2], strides: vec![1], padding: Padding::Valid }], &[2, 4, 4, 2], true);
}

#[test]
fn pooling_and_reshaping_layers() {
    check(vec![LayerSpec::MaxPool { kernel_size: vec![2], strides: vec![2] }, LayerSpec::Flatten, dense(2)], &[2, 4, 4, 2], true);
    check(vec![LayerSpec::AvgPool { kernel_size: vec![2], strides: vec![1] }, LayerSpec::Flatten], &[2, 5, 3], true);
    check(vec![LayerSpec::GlobalAvgPool, dense(2)], &[2, 3, 3, 2], true);
}

#[test]
fn normalisation_layers() {
    check_at(vec![dense(3), LayerSpec::BatchNorm { epsilon: 1e-5, momentum: 0.1 }], &[4, 3], true, Precision::F32);
    check(vec![dense(4), LayerSpec::LayerNorm { epsilon: 1e-5 }], &[3, 5], true);
}

#[test]
fn recurrent_layers() {
    check_at(vec![LayerSpec::Lstm { units: 3, return_sequences: true }], &[2, 3, 2], true, Precision::F32);
    check_at(vec![LayerSpec::Gru { units: 3, return_sequences: false }], &[2, 3, 2], true, Precision::F32);
}

#[test]
fn embedding_weights() {
    let dev = device();
    // Burn's embedding kernel is f32-only on flex; the probe loss is linear in the weights, so
    // f32 central differences with a large step are exact up to rounding.
    let specs = [LayerSpec::Embedding { vocab_size: 5, embedding_size: 3 }, LayerSpec::Flatten];
    let (net, _) = build(&specs, &[2], true, &dev, &mut SeededRng::new(1)).unwrap();
    const H: f64 = 1e-2;
    let tokens = || Act::I2(Tensor::<2, Int>::from_data(TensorData::new(vec![1i64, 4, 4, 0], [2, 2]), &dev));
    let grads = probe_loss(&net, tokens()).backward();
    let mut visitor = Grads { grads: &grads, out: Vec::new() };
    net.visit(&mut visitor);
    let (vals, analytic) = &visitor.out[0];
    for i in 0..vals.len() {
        let plus = loss_value(&net.clone().map(&mut Perturb { target: 0, index: i, delta: H, seen: 0 }), tokens());
        let minus = loss_value(&net.clone().map(&mut Perturb { target: 0, index: i, delta: -H, seen: 0 }), tokens());
        let numeric = (plus - minus) / (2.0 * H);
        // Rows of unused tokens (2, 3) get a zero gradient from both sides.
        assert!((analytic[i] - numeric).abs() <= 1e-6 || rel_err(analytic[i], numeric) <= TOL, "embedding[{i}] {} vs {numeric}", analytic[i]);
    }
}

#[test]
fn dropout_gradient_is_the_kept_mask_scaled() {
    // Dropout is random, so finite differences cannot see it; its gradient must be exactly
    // out / x: zero where dropped, 1 / keep where kept.
    let dev = device();
    let mut rng = SeededRng::new(1);
    let (net, _) = build(&[LayerSpec::Dropout { rate: 0.5 }], &[8], false, &dev, &mut rng).unwrap();
    let x = require_grad(input_act(&[4, 8], 3, Precision::F32));
    let out = net.forward_train(x.clone(), &mut rng).unwrap();
    let Act::F2(out_t) = out else { unreachable!() };
    let out_v = values(out_t.clone().inner());
    let grads = out_t.sum().backward();
    let g = input_grad(&x, &grads);
    let Act::F2(xt) = x else { unreachable!() };
    let xv = values(xt.inner());
    let mut dropped = 0;
    for i in 0..xv.len() {
        let expected = out_v[i] / xv[i];
        assert!((g[i] - expected).abs() < 1e-5, "dropout grad {} vs {expected}", g[i]);
        assert!(g[i] == 0.0 || (g[i] - 2.0).abs() < 1e-5);
        dropped += (g[i] == 0.0) as usize;
    }
    assert!(dropped > 0 && dropped < xv.len(), "rate 0.5 on 32 values drops some but not all ({dropped})");
}
