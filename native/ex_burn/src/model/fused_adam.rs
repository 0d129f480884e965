//! Burn's Adam and AdamW with their per-element updates done in one parallel pass on the CPU.
//!
//! Why: Burn's Adam updates each parameter with nine tensor ops (two moments, the bias-corrected
//! step, the subtraction), and flex runs element-wise ops on one thread, each a pass over memory:
//! Adam's update weighed heavily on a small MLP's step (guides/training.md). Here the same
//! arithmetic, operation for operation in f32 (so the same bits: `tests` compares with Burn's
//! Adam), runs as one pass over each parameter (`kernels::cpu::adam`).
//!
//! Only contiguous f32 flex tensors with a state already (Burn's step makes the first one) take
//! it, for Adam only without weight decay (AdamW's decoupled decay is part of its pass; we never
//! configure AMSGrad); everything else goes to Burn's optimizer unchanged.

use burn::backend::TensorData;
use burn::optim::decay::WeightDecayConfig;
use burn::optim::{Adam, AdamConfig, AdamState, AdamW, AdamWConfig, AdamWState, AdaptiveMomentumState, Optimizer};
use burn::tensor::{Device, Tensor};

use crate::dispatch;
use crate::kernels::cpu::adam::adam_pass;
use crate::kernels::cpu::vector::flex_f32;

#[derive(Clone)]
pub struct FusedAdam {
    adam: Adam,
    beta_1: f32,
    beta_2: f32,
    epsilon: f32,
    /// Burn's Adam only: weight decay is configured (it changes the gradient before the moments).
    plain_only: bool,
}

impl FusedAdam {
    /// Adam with these settings (gradient clipping is the `ModuleOptimizer`'s, as with
    /// `AdamConfig::init`).
    pub fn new(beta_1: f32, beta_2: f32, epsilon: f32, weight_decay: Option<WeightDecayConfig>) -> Self {
        let plain_only = weight_decay.is_some();
        let config = AdamConfig::new().with_beta_1(beta_1).with_beta_2(beta_2).with_epsilon(epsilon).with_weight_decay(weight_decay);
        FusedAdam { adam: config.build(), beta_1, beta_2, epsilon, plain_only }
    }

    /// The fused step, or None where Burn's must run.
    fn fused<const D: usize>(&self, lr: f64, tensor: &Tensor<D>, grad: &Tensor<D>, state: Option<&AdamState<D>>) -> Option<(Tensor<D>, AdamState<D>)> {
        let s = state?;
        if self.plain_only || s.momentum.max_moment_2.is_some() {
            return None;
        }
        // the scalars exactly as Burn's AdaptiveMomentum::transform and Adam::step form them
        let time = s.momentum.time + 1;
        let (b1, b2) = (self.beta_1, self.beta_2);
        let bc2 = (1.0 - b2.powi(time as i32)).sqrt();
        let cf = bc2 / (1.0 - b1.powi(time as i32));
        let e2 = self.epsilon * bc2;
        let lr = lr as f32;
        // moment_1 · cf / (sqrt(moment_2) + eps · bc2), then tensor - step · lr
        let update = move |p: f32, m1: f32, m2: f32| p - ((m1 * cf) / (m2.sqrt() + e2)) * lr;
        let (t, momentum) = fused_pass(tensor, grad, &s.momentum, (b1, b2), update)?;
        Some((t, AdamState::new(momentum)))
    }
}

/// One pass over a parameter: both moments updated as Burn's AdaptiveMomentum(W)::transform
/// does (`moment_1.mul_scalar(b1).add(grad.mul_scalar(1 - b1))`, likewise `moment_2` with
/// `grad.square()`), then `update(param, moment_1, moment_2)` for the new parameter. None unless
/// every tensor is a contiguous f32 flex tensor of one length.
fn fused_pass<const D: usize>(
    tensor: &Tensor<D>,
    grad: &Tensor<D>,
    state: &AdaptiveMomentumState<D>,
    (b1, b2): (f32, f32),
    update: impl Fn(f32, f32, f32) -> f32 + Sync,
) -> Option<(Tensor<D>, AdaptiveMomentumState<D>)> {
    let (pp, gp) = (tensor.clone().into_dispatch(), grad.clone().into_dispatch());
    let (mp, vp) = (state.moment_1.clone().into_dispatch(), state.moment_2.clone().into_dispatch());
    let (p, g, m, v) = (flex_f32(&pp)?, flex_f32(&gp)?, flex_f32(&mp)?, flex_f32(&vp)?);
    let n = p.len();
    if g.len() != n || m.len() != n || v.len() != n {
        return None;
    }
    let [np, nm, nv] = adam_pass(p, g, m, v, (b1, b2), update);
    let device = Device::flex();
    let shape = dispatch::dims(&pp);
    let make = |values: Vec<f32>| Tensor::<D>::from_dispatch(dispatch::from_data(TensorData::new(values, shape.clone()), &device));
    let mut momentum = state.clone();
    momentum.time += 1;
    momentum.moment_1 = make(nm);
    momentum.moment_2 = make(nv);
    Some((make(np), momentum))
}

impl Optimizer for FusedAdam {
    type State<const D: usize> = AdamState<D>;

    fn step<const D: usize>(&self, lr: f64, tensor: Tensor<D>, grad: Tensor<D>, state: Option<Self::State<D>>) -> (Tensor<D>, Option<Self::State<D>>) {
        if let Some((t, s)) = self.fused(lr, &tensor, &grad, state.as_ref()) {
            return (t, Some(s));
        }
        self.adam.step(lr, tensor, grad, state)
    }

    fn to_device<const D: usize>(state: Self::State<D>, device: &Device) -> Self::State<D> {
        Adam::to_device(state, device)
    }
}

/// Burn's AdamW (decoupled weight decay) fused the same way.
#[derive(Clone)]
pub struct FusedAdamW {
    adamw: AdamW,
    beta_1: f32,
    beta_2: f32,
    epsilon: f32,
    weight_decay: f32,
}

impl FusedAdamW {
    pub fn new(beta_1: f32, beta_2: f32, epsilon: f32, weight_decay: f32) -> Self {
        let config = AdamWConfig::new().with_beta_1(beta_1).with_beta_2(beta_2).with_epsilon(epsilon).with_weight_decay(weight_decay);
        FusedAdamW { adamw: config.build(), beta_1, beta_2, epsilon, weight_decay }
    }

    fn fused<const D: usize>(&self, lr: f64, tensor: &Tensor<D>, grad: &Tensor<D>, state: Option<&AdamWState<D>>) -> Option<(Tensor<D>, AdamWState<D>)> {
        let s = state?;
        if s.momentum.max_moment_2.is_some() {
            return None;
        }
        // the scalars as Burn's AdaptiveMomentumW::transform and AdamW::step form them
        let time = (s.momentum.time + 1) as i32;
        let (c1, c2) = (1f32 - self.beta_1.powi(time), 1f32 - self.beta_2.powi(time));
        let eps = self.epsilon;
        let decay_rate = lr * (self.weight_decay as f64);
        let keep = (1.0 - decay_rate) as f32;
        let lr = lr as f32;
        // (m / c1) / (sqrt(v / c2) + eps); the parameter decayed (unless the rate is 0), minus step · lr
        let update = move |p: f32, m1: f32, m2: f32| {
            let step = (m1 / c1) / ((m2 / c2).sqrt() + eps);
            let decayed = if decay_rate == 0.0 { p } else { p * keep };
            decayed - step * lr
        };
        let (t, momentum) = fused_pass(tensor, grad, &s.momentum, (self.beta_1, self.beta_2), update)?;
        Some((t, AdamWState::new(momentum)))
    }
}

impl Optimizer for FusedAdamW {
    type State<const D: usize> = AdamWState<D>;

    fn step<const D: usize>(&self, lr: f64, tensor: Tensor<D>, grad: Tensor<D>, state: Option<Self::State<D>>) -> (Tensor<D>, Option<Self::State<D>>) {
        if let Some((t, s)) = self.fused(lr, &tensor, &grad, state.as_ref()) {
            return (t, Some(s));
        }
        self.adamw.step(lr, tensor, grad, state)
    }

    fn to_device<const D: usize>(state: Self::State<D>, device: &Device) -> Self::State<D> {
        AdamW::to_device(state, device)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(values: &[f32], shape: [usize; 2]) -> Tensor<2> {
        Tensor::<2>::from_dispatch(crate::testing::flex_f32s(values.to_vec(), &shape))
    }

    fn bits(t: &Tensor<2>) -> Vec<u32> {
        crate::testing::prim_f32s(t.clone().into_dispatch()).iter().map(|x| x.to_bits()).collect()
    }

    /// Eight steps of Burn's optimizer and ours on the same parameters and gradients (sizes over
    /// several parallel chunks and not a multiple of one, gradients of mixed sign and scale with
    /// zeros, a NaN and infinities at step 5), the learning rate changing as a schedule would:
    /// the fused pass runs from the second step, and parameters and both moments equal Burn's
    /// bit for bit after every step.
    macro_rules! same_bits {
        ($burn:expr, $ours:expr) => {{
            let (burn_opt, ours) = ($burn, $ours);
            let (rows, cols) = (77, 701);
            let n = rows * cols;
            let mut seed = 0x2545f4914f6cdd1du64;
            let mut next = move || {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
            };
            let p0: Vec<f32> = (0..n).map(|_| next()).collect();
            let (mut pa, mut pb) = (tensor(&p0, [rows, cols]), tensor(&p0, [rows, cols]));
            let (mut sa, mut sb) = (None, None);
            for step in 0..8 {
                let scale = 10f32.powi(step % 4 - 2);
                let mut g: Vec<f32> = (0..n).map(|i| if i % 13 == 0 { 0.0 } else { next() * scale }).collect();
                if step == 5 {
                    (g[7], g[1000], g[n - 1]) = (f32::NAN, f32::INFINITY, f32::NEG_INFINITY);
                }
                let lr = 1e-3 * (1.0 + step as f64 / 3.0);
                assert_eq!(ours.fused(lr, &pb, &tensor(&g, [rows, cols]), sb.as_ref()).is_some(), step > 0, "step {step}");
                let (a, s1) = burn_opt.step(lr, pa, tensor(&g, [rows, cols]), sa);
                let (b, s2) = ours.step(lr, pb, tensor(&g, [rows, cols]), sb);
                assert_eq!(bits(&a), bits(&b), "parameters after step {step}");
                let (m1, m2) = (&s1.as_ref().unwrap().momentum, &s2.as_ref().unwrap().momentum);
                assert_eq!(m1.time, m2.time);
                assert_eq!(bits(&m1.moment_1), bits(&m2.moment_1), "first moment after step {step}");
                assert_eq!(bits(&m1.moment_2), bits(&m2.moment_2), "second moment after step {step}");
                (pa, pb, sa, sb) = (a, b, s1, s2);
            }
        }};
    }

    #[test]
    fn same_bits_as_burns_adam() {
        same_bits!(AdamConfig::new().with_beta_1(0.9).with_beta_2(0.999).with_epsilon(1e-7).build(), FusedAdam::new(0.9, 0.999, 1e-7, None));
    }

    #[test]
    fn same_bits_as_burns_adamw() {
        let config = AdamWConfig::new().with_beta_1(0.85).with_beta_2(0.995).with_epsilon(1e-6).with_weight_decay(0.02);
        same_bits!(config.build(), FusedAdamW::new(0.85, 0.995, 1e-6, 0.02));
        same_bits!(AdamWConfig::new().with_weight_decay(0.0).build(), FusedAdamW::new(0.9, 0.999, 1e-5, 0.0));
    }

    /// With weight decay configured, every step is Burn's.
    #[test]
    fn weight_decay_keeps_burns_adam() {
        assert!(FusedAdam::new(0.9, 0.999, 1e-5, Some(WeightDecayConfig::new(0.01))).plain_only);
    }
}
