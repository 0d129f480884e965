//! Losses over the network output. How the output is read depends on the last layer: after a
//! softmax/sigmoid it holds probabilities, after log_softmax log-probabilities, otherwise logits.

use burn::tensor::activation::{log_softmax, relu};
use burn::tensor::{Int, Tensor};

use super::net::Act;
use super::spec::{Activation, LossKind};
use crate::error::{ExError, ExResult};

/// Targets: class indices (`[batch]` integers) or values shaped like the output.
#[derive(Debug, Clone)]
pub enum Target {
    Classes(Tensor<1, Int>),
    Values(burn::backend::DispatchTensor),
}

const EPS: f64 = 1e-7;

fn output_f2(out: Act, what: &str) -> ExResult<Tensor<2>> {
    match out {
        Act::F2(t) => Ok(t),
        other => Err(ExError::invalid(format!("{what} needs a [batch, classes] output, got {:?}", other.dims()))),
    }
}

/// The target reshaped to the output's shape.
fn values_like<const D: usize>(target: &Target, like: &Tensor<D>) -> ExResult<Tensor<D>> {
    let dims = like.dims();
    let t = match target {
        Target::Values(v) => Tensor::<1>::from_dispatch(crate::dispatch::reshape(v.clone(), &[like.shape().num_elements().max(1)])),
        Target::Classes(c) => c.clone().float(),
    };
    if t.shape().num_elements() != like.shape().num_elements() {
        return Err(ExError::invalid_with(
            "targets do not match the model output",
            vec![("output", crate::error::Detail::Dims(dims.to_vec())), ("targets", crate::error::Detail::Dims(t.dims().to_vec()))],
        ));
    }
    Ok(t.reshape(dims).cast(like.dtype()))
}

fn mean_all<const D: usize>(t: Tensor<D>) -> Tensor<1> {
    let n = t.shape().num_elements();
    t.reshape([n]).mean()
}

macro_rules! on_rank {
    ($out:expr, |$t:ident| $body:expr) => {
        match $out {
            Act::F2($t) => $body,
            Act::F3($t) => $body,
            Act::F4($t) => $body,
            Act::I2(_) => return Err(ExError::invalid("model output must be floating point")),
        }
    };
}

pub fn compute(kind: LossKind, out: Act, target: &Target, last: Option<Activation>) -> ExResult<Tensor<1>> {
    match kind {
        LossKind::CrossEntropy => {
            let out = output_f2(out, "cross_entropy")?;
            let [b, _] = out.dims();
            let log_p = match last {
                Some(Activation::Softmax) => out.clamp(EPS, 1.0).log(),
                Some(Activation::LogSoftmax) => out,
                _ => log_softmax(out, 1),
            };
            match target {
                Target::Classes(c) => {
                    if c.dims()[0] != b {
                        return Err(ExError::invalid("one class index per sample is needed"));
                    }
                    Ok(log_p.gather(1, c.clone().reshape([b, 1])).mean().neg())
                }
                Target::Values(_) => {
                    let y = values_like(target, &log_p)?;
                    Ok((y * log_p).sum_dim(1).mean().neg())
                }
            }
        }
        LossKind::Mse => on_rank!(out, |t| {
            let y = values_like(target, &t)?;
            Ok(mean_all((t - y).powi_scalar(2)))
        }),
        LossKind::BinaryCrossEntropy => on_rank!(out, |t| {
            let y = values_like(target, &t)?;
            if matches!(last, Some(Activation::Sigmoid)) {
                let p = t.clamp(EPS, 1.0 - EPS);
                let one_minus_y = y.clone().neg().add_scalar(1.0);
                let one_minus_p = p.clone().neg().add_scalar(1.0);
                Ok(mean_all((y * p.log() + one_minus_y * one_minus_p.log()).neg()))
            } else {
                // Stable form on logits: max(x, 0) - x·y + log(1 + e^{-|x|}).
                let softplus = t.clone().abs().neg().exp().add_scalar(1.0).log();
                Ok(mean_all(relu(t.clone()) - t * y + softplus))
            }
        }),
    }
}
