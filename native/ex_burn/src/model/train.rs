//! Training with Burn's autodiff, optimizers, LR schedulers and gradient clipping. One call runs
//! a whole epoch in Rust; the model is replaced only when the epoch completes, so an error or a
//! cancellation mid-epoch leaves the last good state in place.

use std::sync::atomic::{AtomicBool, Ordering};

use burn::backend::ops::{FloatTensorOps, IntTensorOps};
use burn::backend::{DType, Dispatch, DispatchTensor, TensorData};
use burn::tensor::Slice;
use burn::grad_clipping::{GradientClipping, GradientClippingConfig};
use burn::lr_scheduler::cosine::CosineAnnealingLrSchedulerConfig;
use burn::lr_scheduler::exponential::ExponentialLrSchedulerConfig;
use burn::lr_scheduler::step::StepLrSchedulerConfig;
use burn::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::decay::WeightDecayConfig;
use burn::optim::momentum::MomentumConfig;
use burn::optim::{GradientsParams, ModuleOptimizer, RmsPropConfig, SgdConfig};
use burn::store::ModuleRecord;
use burn::tensor::{Int, Tensor};

use super::fused_adam::{FusedAdam, FusedAdamW};
use super::init::SeededRng;
use super::loss::{self, Target};
use super::net::{self, Act, LayerInfo, Net};
use super::spec::{LayerSpec, LossKind, OptimizerKind, Schedule, TrainConfig};
use crate::device::DeviceRef;
use crate::dispatch;
use crate::dtype::NxType;
use crate::error::{Detail, ExError, ExResult};
use crate::tensor::Handle;

pub struct Trainer {
    pub specs: Vec<LayerSpec>,
    pub input: Vec<usize>,
    pub int_input: bool,
    pub config: TrainConfig,
    pub device: DeviceRef,
    pub infos: Vec<LayerInfo>,
    pub epochs: usize,
    net: Net,
    optim: ModuleOptimizer,
    scheduler: Option<ModuleLrScheduler>,
    /// Drew the initial weights; draws the dropout masks and shuffles.
    rng: SeededRng,
}

fn optimizer(c: &TrainConfig) -> ModuleOptimizer {
    let decay = c.weight_decay.map(|w| WeightDecayConfig::new(w as f32));
    let (b1, b2, eps) = (c.beta1 as f32, c.beta2 as f32, c.epsilon as f32);
    let optim = match c.optimizer {
        // Burn's Adam and AdamW, their element-wise updates fused on the CPU (same bits; model/fused_adam.rs)
        OptimizerKind::Adam => ModuleOptimizer::from(FusedAdam::new(b1, b2, eps, decay)),
        OptimizerKind::Adamw => ModuleOptimizer::from(FusedAdamW::new(b1, b2, eps, c.weight_decay.unwrap_or(0.0) as f32)),
        OptimizerKind::Sgd => SgdConfig::new()
            .with_weight_decay(decay)
            .with_momentum(c.momentum.filter(|m| *m > 0.0).map(|m| MomentumConfig::new().with_momentum(m).with_dampening(0.0)))
            .init(),
        OptimizerKind::Rmsprop => RmsPropConfig::new()
            .with_alpha(b1)
            .with_epsilon(eps)
            .with_momentum(c.momentum.unwrap_or(0.0) as f32)
            .with_weight_decay(decay)
            .init(),
    };
    match c.clip_norm {
        Some(n) => optim.with_grad_clipping(GradientClippingConfig::Norm(n as f32).init()),
        None => optim,
    }
}

/// Burn's optimizers hold one clipping rule; when value clipping is asked for as well, it is
/// applied here, with Burn's own `GradientClipping`, before the optimizer's norm clipping.
struct ClipValues<'a> {
    grads: &'a mut GradientsParams,
    clip: GradientClipping,
}

impl ModuleVisitor for ClipValues<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(g) = self.grads.remove::<D>(param.id) {
            self.grads.register::<D>(param.id, self.clip.clip_gradient(g));
        }
    }
}

fn batch_rows(h: &Handle, idx: &[i64]) -> ExResult<DispatchTensor> {
    // rows in order (predict, evaluate, fit without shuffling) are a view, not a gathered copy
    // (a [1024, 784] f32 batch is 3.2 MB, a copy a large share of a small model's predict;
    // guides/training.md)
    if let Some(&first) = idx.first() {
        if idx.windows(2).all(|w| w[1] == w[0] + 1) && first >= 0 && (first as usize) + idx.len() <= h.shape.first().copied().unwrap_or(0) {
            let rows = Slice::new(first as isize, Some(first as isize + idx.len() as isize), 1);
            let rest = h.shape[1..].iter().map(|&d| Slice::new(0, Some(d as isize), 1));
            return Ok(dispatch::slice(h.prim.clone(), &std::iter::once(rows).chain(rest).collect::<Vec<_>>()));
        }
    }
    let ids = TensorData::new(idx.to_vec(), [idx.len()]);
    let ids = dispatch::from_data(ids, &h.device.burn()?);
    Ok(if h.ty.is_float() {
        Dispatch::float_select(h.prim.clone(), 0, ids)
    } else {
        Dispatch::int_select(h.prim.clone(), 0, ids)
    })
}

impl Trainer {
    pub fn new(specs: Vec<LayerSpec>, input: Vec<usize>, int_input: bool, config: TrainConfig, device: DeviceRef, seed: u64) -> ExResult<Self> {
        let mut rng = SeededRng::new(seed);
        let (net, infos) = net::build(&specs, &input, int_input, &device.burn()?.autodiff(), &mut rng)?;
        let optim = optimizer(&config);
        Ok(Trainer { specs, input, int_input, config, device, infos, epochs: 0, net, optim, scheduler: None, rng })
    }

    pub fn num_params(&self) -> usize {
        self.net.num_params()
    }

    /// Sets the clipping between fits. Norm clipping is added to (or changed on) the live
    /// optimizer, its moments kept; removing it rebuilds the optimizer, which resets them.
    pub fn set_clipping(&mut self, clip_norm: Option<f64>, clip_value: Option<f64>) {
        self.config.clip_value = clip_value;
        match clip_norm {
            Some(n) if self.config.clip_norm != Some(n) => {
                self.config.clip_norm = Some(n);
                self.optim = self.optim.clone().with_grad_clipping(GradientClippingConfig::Norm(n as f32).init());
            }
            None if self.config.clip_norm.is_some() => {
                self.config.clip_norm = None;
                self.optim = optimizer(&self.config);
            }
            _ => {}
        }
    }

    /// Installs a per-epoch schedule starting from `base` (`Constant` removes it).
    pub fn set_schedule(&mut self, schedule: Schedule, base: f64) -> ExResult<()> {
        let bad = |e: String| ExError::invalid(format!("invalid learning-rate schedule: {e}"));
        self.scheduler = match schedule {
            Schedule::Constant => None,
            Schedule::Step { step, gamma } => Some(StepLrSchedulerConfig::new(base, step).with_gamma(gamma).init().map_err(bad)?),
            Schedule::Exponential { gamma } => Some(ExponentialLrSchedulerConfig::new(base, gamma).init().map_err(bad)?),
            Schedule::Cosine { min, epochs } => {
                Some(CosineAnnealingLrSchedulerConfig::new(base, epochs.max(1)).with_min_lr(min).init().map_err(bad)?)
            }
        };
        Ok(())
    }

    fn check_data(&self, x: &Handle, y: Option<&Handle>) -> ExResult<usize> {
        let n = *x.shape.first().unwrap_or(&0);
        if x.shape.len() < 2 || x.shape[1..] != self.input[..] || x.ty.is_float() == self.int_input {
            let mut expected = vec![0];
            expected.extend(&self.input);
            return Err(ExError::invalid_with(
                "inputs do not match the model's input shape",
                vec![("expected", Detail::Dims(expected)), ("got", Detail::Dims(x.shape.clone())), ("type", Detail::Type(x.ty))],
            ));
        }
        if let Some(y) = y {
            if y.shape.first() != Some(&n) {
                return Err(ExError::invalid_with(
                    "inputs and targets have different numbers of samples",
                    vec![("inputs", Detail::Dims(x.shape.clone())), ("targets", Detail::Dims(y.shape.clone()))],
                ));
            }
        }
        if n == 0 {
            return Err(ExError::invalid("no samples"));
        }
        Ok(n)
    }

    fn inputs(&self, x: &Handle, idx: &[i64], autodiff: bool) -> ExResult<Act> {
        let rows = batch_rows(x, idx)?;
        let rows = dispatch::cast(rows, if self.int_input { DType::I64 } else { DType::F32 });
        let rows = if autodiff { lift(rows) } else { rows };
        Act::from_dispatch(rows, x.shape.len(), self.int_input)
    }

    fn targets(&self, y: &Handle, idx: &[i64], autodiff: bool) -> ExResult<Target> {
        let rows = batch_rows(y, idx)?;
        if self.config.loss == LossKind::CrossEntropy && !y.ty.is_float() && y.shape.len() == 1 {
            return Ok(Target::Classes(Tensor::<1, Int>::from_dispatch(dispatch::cast(rows, DType::I64))));
        }
        let rows = dispatch::cast(rows, DType::F32);
        Ok(Target::Values(if autodiff { lift(rows) } else { rows }))
    }

    /// Runs one epoch and returns its mean training loss.
    pub fn train_epoch(&mut self, x: &Handle, y: &Handle, batch_size: usize, shuffle: bool, cancel: &AtomicBool) -> ExResult<f64> {
        let n = self.check_data(x, Some(y))?;
        let batch_size = batch_size.max(1);
        let mut order: Vec<i64> = (0..n as i64).collect();
        if shuffle {
            for i in (1..n).rev() {
                let j = (self.rng.next_u64() % (i as u64 + 1)) as usize;
                order.swap(i, j);
            }
        }
        let lr = match self.scheduler.as_mut() {
            Some(s) => s.step(),
            None => self.config.learning_rate.into(),
        };
        let (mut net, mut optim) = (self.net.clone(), self.optim.clone());
        let mut total: Option<Tensor<1>> = None;
        for chunk in order.chunks(batch_size) {
            if cancel.load(Ordering::Relaxed) {
                return Err(ExError::TrainingCancelled);
            }
            let out = net.forward_train(self.inputs(x, chunk, true)?, &mut self.rng)?;
            let loss = loss::compute(self.config.loss, out, &self.targets(y, chunk, true)?, net.last_activation())?;
            let weighted = loss.clone().detach().mul_scalar(chunk.len() as f64);
            total = Some(match total {
                Some(t) => t + weighted,
                None => weighted,
            });
            let mut grads = GradientsParams::from_grads(loss.backward(), &net);
            if let Some(v) = self.config.clip_value {
                net.visit(&mut ClipValues { grads: &mut grads, clip: GradientClippingConfig::Value(v as f32).init() });
            }
            net = optim.step(lr.clone(), net, grads);
        }
        let total = scalar(total.expect("n > 0 gives at least one batch"))?;
        if !total.is_finite() {
            return Err(ExError::invalid("training diverged: the loss is not finite (try a lower learning rate)"));
        }
        self.net = net;
        self.optim = optim;
        self.epochs += 1;
        Ok(total / n as f64)
    }

    /// Mean loss over the data, in inference mode (dropout off, batch norm on running stats).
    pub fn evaluate(&self, x: &Handle, y: &Handle, batch_size: usize) -> ExResult<f64> {
        let n = self.check_data(x, Some(y))?;
        let net = self.net.valid();
        let order: Vec<i64> = (0..n as i64).collect();
        let mut total = 0.0;
        for chunk in order.chunks(batch_size.max(1)) {
            let out = net.forward(self.inputs(x, chunk, false)?)?;
            let loss = loss::compute(self.config.loss, out, &self.targets(y, chunk, false)?, net.last_activation())?;
            total += scalar(loss)? * chunk.len() as f64;
        }
        Ok(total / n as f64)
    }

    /// About the multiply-adds of a forward pass over `rows` rows, where each layer costs its
    /// parameter count per row: a stack of dense layers and the per-element layers between them
    /// on rank-2 input. None where a layer's cost grows with the input's extent (convolutions,
    /// pooling, recurrent layers, embeddings), which the count cannot bound.
    pub fn dense_forward_macs(&self, rows: usize) -> Option<usize> {
        let dense = self.specs.iter().all(|s| {
            matches!(
                s,
                LayerSpec::Dense { .. }
                    | LayerSpec::Activation(_)
                    | LayerSpec::Dropout { .. }
                    | LayerSpec::LayerNorm { .. }
                    | LayerSpec::BatchNorm { .. }
                    | LayerSpec::Flatten
            )
        });
        (dense && self.input.len() == 1 && !self.int_input).then(|| self.net.num_params().saturating_mul(rows))
    }

    pub fn predict(&self, x: &Handle, batch_size: usize) -> ExResult<Handle> {
        let n = self.check_data(x, None)?;
        let net = self.net.valid();
        let order: Vec<i64> = (0..n as i64).collect();
        let mut parts = Vec::new();
        let mut dims = Vec::new();
        for chunk in order.chunks(batch_size.max(1)) {
            let out = net.forward(self.inputs(x, chunk, false)?)?;
            dims = out.dims();
            parts.push(out.into_dispatch());
        }
        dims[0] = n;
        let prim = if parts.len() == 1 { parts.pop().unwrap() } else { dispatch::cat(parts, 0) };
        Ok(Handle::new(prim, NxType::F(32), dims, self.device))
    }

    /// Weights as Burn's burnpack record bytes.
    pub fn to_bytes(&self) -> ExResult<Vec<u8>> {
        let record = self.net.clone().into_record();
        let bytes = record.into_bytes().map_err(|e| ExError::invalid(format!("cannot serialise the model: {e:?}")))?;
        Ok(bytes.to_vec())
    }

    /// Loads weights saved by `to_bytes` from a model of the same architecture.
    pub fn load_bytes(&mut self, bytes: Vec<u8>) -> ExResult<()> {
        let bad = |e: String| ExError::invalid_with("cannot load the model weights", vec![("cause", Detail::Text(e))]);
        let record = ModuleRecord::from_bytes(burn::tensor::Bytes::from_bytes_vec(bytes)).map_err(|e| bad(format!("{e:?}")))?;
        let net = crate::error::catch(|| self.net.clone().try_load_record(record).map_err(|e| bad(format!("{e:?}"))))?;
        self.net = net;
        self.optim = optimizer(&self.config);
        Ok(())
    }

    pub fn net(&self) -> &Net {
        &self.net
    }
}

/// A plain tensor joined to the autodiff graph as a constant.
fn lift(t: DispatchTensor) -> DispatchTensor {
    if burn::backend::TensorMetadata::dtype(&t).is_float() {
        Tensor::<1>::from_dispatch(t).autodiff().into_dispatch()
    } else {
        t
    }
}

fn scalar(t: Tensor<1>) -> ExResult<f64> {
    let data = t.inner().cast(DType::F64).try_into_data().map_err(|e| ExError::Execution(format!("{e:?}")))?;
    Ok(data.as_slice::<f64>().map_err(|e| ExError::Execution(format!("{e:?}")))?[0])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::spec::{Activation, Padding};
    use crate::testing::*;

    /// Rows in order come as a view, others gathered; both give exactly the rows asked for,
    /// at the start, middle and end, for floats and integers.
    #[test]
    fn batch_rows_in_and_out_of_order() {
        let vals: Vec<f32> = (0..18).map(|i| i as f32).collect();
        let x = f32s(&vals, &[6, 3]);
        let ints = i64s(&(0..6).collect::<Vec<_>>(), &[6]);
        for idx in [vec![0i64, 1], vec![2, 3, 4], vec![5], vec![0, 1, 2, 3, 4, 5], vec![4, 2], vec![5, 0, 1]] {
            let got = crate::dispatch::into_data(batch_rows(&x, &idx).unwrap()).unwrap().try_to_vec::<f32>().unwrap();
            let want: Vec<f32> = idx.iter().flat_map(|&r| (0..3).map(move |c| (r * 3 + c) as f32)).collect();
            assert_eq!(got, want, "rows {idx:?}");
            let got = crate::dispatch::into_data(batch_rows(&ints, &idx).unwrap()).unwrap().try_to_vec::<i64>().unwrap();
            assert_eq!(got, idx, "int rows {idx:?}");
        }
    }

    fn xor() -> (Handle, Handle) {
        (f32s(&[0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0], &[4, 2]), i64s(&[0, 1, 1, 0], &[4]))
    }

    /// Cross-entropy with Adam at `learning_rate`, nothing else set.
    fn cross_entropy(learning_rate: f64) -> TrainConfig {
        TrainConfig {
            loss: LossKind::CrossEntropy,
            optimizer: OptimizerKind::Adam,
            learning_rate,
            weight_decay: None,
            momentum: None,
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-8,
            clip_norm: None,
            clip_value: None,
        }
    }

    fn dense(units: usize) -> LayerSpec {
        LayerSpec::Dense { units, use_bias: true }
    }

    fn xor_trainer() -> Trainer {
        let specs = vec![dense(8), LayerSpec::Activation(Activation::Tanh), dense(2)];
        Trainer::new(specs, vec![2], false, cross_entropy(0.05), crate::testing::device(), 42).unwrap()
    }

    /// Dense stacks are costed at their parameter count per row (2·8+8 + 8·2+2 = 42 here);
    /// convolutions and multi-axis inputs are not costed at all.
    #[test]
    fn dense_forward_macs_counts_dense_stacks_only() {
        let t = xor_trainer();
        assert_eq!(t.dense_forward_macs(1), Some(42));
        assert_eq!(t.dense_forward_macs(1000), Some(42_000));
        let conv = LayerSpec::Conv1d { filters: 2, kernel_size: vec![3], strides: vec![1], padding: Padding::Same };
        let c = Trainer::new(vec![conv, LayerSpec::Flatten, dense(2)], vec![8, 1], false, cross_entropy(1e-3), crate::testing::device(), 1).unwrap();
        assert_eq!(c.dense_forward_macs(1), None);
    }

    fn argmax_rows(h: &Handle) -> Vec<i64> {
        ints(&crate::ops::reduce::arg_reduce(crate::ops::vocab::ArgReduceOp::Argmax, h, Some(1), false, false, NxType::S(64)).unwrap())
    }

    /// Every float parameter's bits in visiting order (records also hold random parameter ids,
    /// so they cannot be compared whole).
    struct Bits(Vec<Vec<u32>>);
    impl ModuleVisitor for Bits {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let values = param.val().inner().cast(DType::F32).into_data().try_to_vec::<f32>().unwrap();
            self.0.push(values.iter().map(|v| v.to_bits()).collect());
        }
    }

    fn weight_bits(t: &Trainer) -> Vec<Vec<u32>> {
        let mut bits = Bits(Vec::new());
        t.net.visit(&mut bits);
        bits.0
    }

    #[test]
    fn the_same_seed_gives_the_same_weights_and_training_while_other_threads_seed_and_draw() {
        let (x, y) = xor();
        let never = AtomicBool::new(false);
        let specs = vec![dense(16), LayerSpec::Activation(Activation::Tanh), LayerSpec::Dropout { rate: 0.5 }, dense(2)];
        // built weights, each epoch's loss and the trained weights
        let run = || {
            let mut t = Trainer::new(specs.clone(), vec![2], false, cross_entropy(0.05), crate::testing::device(), 42).unwrap();
            let built = weight_bits(&t);
            // the other thread seeds and draws in between (lazily drawn weights would take that state)
            std::thread::sleep(std::time::Duration::from_millis(2));
            let losses: Vec<f64> = (0..3).map(|_| t.train_epoch(&x, &y, 2, true, &never).unwrap()).collect();
            let trained: Vec<f64> = weight_bits(&t).concat().into_iter().map(|b| f32::from_bits(b) as f64).collect();
            (built, losses, trained)
        };
        // bit for bit on the CPU; a GPU's kernels may round differently from run to run (another
        // dropout mask or order would move the loss far more)
        let exact = crate::testing::device().kind == crate::device::DeviceKind::Cpu;
        let close = |a: &[f64], b: &[f64]| {
            a.len() == b.len()
                && a.iter().zip(b).all(|(a, b)| if exact { a.to_bits() == b.to_bits() } else { (a - b).abs() <= 1e-3 * a.abs().max(1.0) })
        };
        let want = run();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let noise = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let device = crate::testing::device().burn().unwrap();
                let autodiff = device.clone().autodiff();
                let dropout = burn::nn::DropoutConfig::new(0.5).init();
                let (x, y) = xor();
                let specs = vec![dense(8), LayerSpec::Dropout { rate: 0.3 }, dense(2)];
                let mut seed = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    seed += 1;
                    // Burn's process-wide generator: re-seeded, drawn from and used by Burn's dropout
                    device.seed(seed);
                    let r = Tensor::<2>::random([16, 16], burn::tensor::Distribution::Default, &autodiff);
                    dropout.forward(r).inner().into_data();
                    // and other models built and trained with dropout at the same time
                    let mut t = Trainer::new(specs.clone(), vec![2], false, cross_entropy(1e-3), crate::testing::device(), seed).unwrap();
                    t.train_epoch(&x, &y, 2, true, &AtomicBool::new(false)).unwrap();
                }
            })
        };
        let got: Vec<[bool; 3]> = (0..10)
            .map(|_| {
                let (built, losses, trained) = run();
                [built == want.0, close(&losses, &want.1), close(&trained, &want.2)]
            })
            .collect();
        stop.store(true, Ordering::Relaxed);
        noise.join().unwrap();
        assert!(got.iter().all(|same| same.iter().all(|&s| s)), "[built, losses, trained] the same: {got:?}");
    }

    #[test]
    fn xor_is_learned_and_survives_a_save_load_round_trip() {
        let (x, y) = xor();
        let mut t = xor_trainer();
        let never = AtomicBool::new(false);
        let first = t.train_epoch(&x, &y, 4, true, &never).unwrap();
        let mut last = first;
        for _ in 0..300 {
            last = t.train_epoch(&x, &y, 4, true, &never).unwrap();
        }
        assert!(last < first * 0.1, "loss {first} -> {last}");
        let pred = t.predict(&x, 2).unwrap();
        assert_eq!(pred.shape, vec![4, 2]);
        assert_eq!(argmax_rows(&pred), vec![0, 1, 1, 0]);
        assert!(t.evaluate(&x, &y, 4).unwrap() < 0.1);

        let bytes = t.to_bytes().unwrap();
        let mut fresh = xor_trainer();
        fresh.load_bytes(bytes).unwrap();
        assert_eq!(fresh.predict(&x, 4).unwrap().to_bytes().unwrap(), pred.to_bytes().unwrap());
        assert!(fresh.load_bytes(vec![1, 2, 3]).is_err(), "corrupt bytes are an error");
    }

    #[test]
    fn a_cancelled_epoch_leaves_the_model_unchanged() {
        let (x, y) = xor();
        let mut t = xor_trainer();
        // the weights themselves: predictions on a GPU may differ in the last bit between two
        // calls (autotuning can pick another kernel), so they cannot show "unchanged"
        let before = t.to_bytes().unwrap();
        let err = t.train_epoch(&x, &y, 1, false, &AtomicBool::new(true)).unwrap_err();
        assert!(matches!(err, ExError::TrainingCancelled), "{err:?}");
        assert!(matches!(err.details()[..], [("kind", Detail::Atom("cancelled"))]), "{:?}", err.details());
        assert_eq!(t.epochs, 0);
        assert_eq!(t.to_bytes().unwrap(), before);
    }

    #[test]
    fn schedules_and_clipping_train() {
        let (x, y) = xor();
        let base = cross_entropy(0.01);
        for (schedule, config) in [
            (Schedule::Step { step: 2, gamma: 0.5 }, TrainConfig { optimizer: OptimizerKind::Sgd, momentum: Some(0.9), clip_norm: Some(1.0), ..base.clone() }),
            (Schedule::Exponential { gamma: 0.9 }, TrainConfig { optimizer: OptimizerKind::Rmsprop, clip_value: Some(0.5), ..base.clone() }),
            (Schedule::Cosine { min: 1e-5, epochs: 5 }, TrainConfig { optimizer: OptimizerKind::Adamw, weight_decay: Some(0.01), clip_norm: Some(1.0), clip_value: Some(0.1), ..base.clone() }),
        ] {
            let mut t = Trainer::new(vec![dense(2)], vec![2], false, config, crate::testing::device(), 1).unwrap();
            t.set_schedule(schedule, 0.01).unwrap();
            for _ in 0..5 {
                assert!(t.train_epoch(&x, &y, 2, true, &AtomicBool::new(false)).unwrap().is_finite());
            }
            assert_eq!(t.epochs, 5);
        }
    }

    #[test]
    fn mismatched_data_is_an_error() {
        let mut t = xor_trainer();
        let never = AtomicBool::new(false);
        let err = t.train_epoch(&f32s(&[1.0, 2.0, 3.0], &[1, 3]), &i64s(&[0], &[1]), 1, false, &never).unwrap_err();
        assert!(err.to_string().contains("input shape"), "{err}");
        let (x, _) = xor();
        assert!(t.train_epoch(&x, &i64s(&[0, 1], &[2]), 1, false, &never).is_err());
    }
}
