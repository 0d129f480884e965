//! The runtime-built Burn module: one enum variant per layer kind, a `Vec` of them, and a
//! forward pass over activations whose rank is only known at runtime.

use burn::module::Module;
use burn::nn::conv::{Conv1d, Conv1dConfig, Conv2d, Conv2dConfig};
use burn::nn::pool::{AvgPool1d, AvgPool1dConfig, AvgPool2d, AvgPool2dConfig, MaxPool1d, MaxPool1dConfig, MaxPool2d, MaxPool2dConfig};
use burn::nn::{
    BatchNorm, BatchNormConfig, Dropout, DropoutConfig, Embedding, EmbeddingConfig, Gru, GruConfig, LayerNorm, LayerNormConfig,
    Linear, LinearConfig, Lstm, LstmConfig, PaddingConfig1d, PaddingConfig2d,
};
use burn::tensor::activation as act;
use burn::tensor::{Device, Int, Tensor};

use super::init::SeededRng;
use super::recurrent::{self, Hidden};
use super::spec::{Activation, LayerSpec, Padding};
use crate::error::{ExError, ExResult};

#[derive(Module, Debug)]
pub struct ActivationLayer {
    /// Index into `Activation::NAMES`; plain numbers keep the module free of non-module fields.
    kind: usize,
    alpha: f64,
}

impl ActivationLayer {
    fn new(a: Activation) -> Self {
        let alpha = if let Activation::LeakyRelu(alpha) = a { alpha } else { 0.0 };
        ActivationLayer { kind: Activation::NAMES.iter().position(|n| *n == a.name()).unwrap(), alpha }
    }

    pub fn activation(&self) -> Activation {
        Activation::from_name(Activation::NAMES[self.kind], self.alpha).expect("NAMES and from_name agree")
    }

    fn apply<const D: usize>(&self, t: Tensor<D>) -> Tensor<D> {
        match self.activation() {
            Activation::Relu => act::relu(t),
            Activation::Gelu => act::gelu(t),
            Activation::Sigmoid => act::sigmoid(t),
            Activation::Tanh => act::tanh(t),
            Activation::Softmax => act::softmax(t, D - 1),
            Activation::LogSoftmax => act::log_softmax(t, D - 1),
            Activation::LeakyRelu(alpha) => act::leaky_relu(t, alpha),
            Activation::Silu => act::silu(t),
        }
    }
}

#[derive(Module, Debug)]
pub struct Recurrent<M> {
    cell: M,
    return_sequences: bool,
}

/// Marker modules for the stateless reshaping layers.
#[derive(Module, Debug)]
pub struct GlobalAvgPool;

#[derive(Module, Debug)]
pub struct Flatten;

// Layers are built once and live in a Vec; boxing the big variants would only add indirection to
// every forward pass and fight the Module derive.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum Layer {
    Dense(Linear),
    Conv1d(Conv1d),
    Conv2d(Conv2d),
    MaxPool1d(MaxPool1d),
    MaxPool2d(MaxPool2d),
    AvgPool1d(AvgPool1d),
    AvgPool2d(AvgPool2d),
    GlobalAvgPool(GlobalAvgPool),
    Flatten(Flatten),
    Dropout(Dropout),
    BatchNorm(BatchNorm),
    LayerNorm(LayerNorm),
    Embedding(Embedding),
    Lstm(Recurrent<Lstm>),
    Gru(Recurrent<Gru>),
    Activation(ActivationLayer),
}

#[derive(Module, Debug)]
pub struct Net {
    pub layers: Vec<Layer>,
}

/// An activation of runtime rank. Integer inputs exist only for embeddings.
#[derive(Debug, Clone)]
pub enum Act {
    F2(Tensor<2>),
    F3(Tensor<3>),
    F4(Tensor<4>),
    I2(Tensor<2, Int>),
}

impl Act {
    pub fn dims(&self) -> Vec<usize> {
        match self {
            Act::F2(t) => t.dims().to_vec(),
            Act::F3(t) => t.dims().to_vec(),
            Act::F4(t) => t.dims().to_vec(),
            Act::I2(t) => t.dims().to_vec(),
        }
    }

    /// Wraps a Burn primitive of known rank; ranks outside 2..=4 (or int outside 2) are errors.
    pub fn from_dispatch(prim: burn::backend::DispatchTensor, rank: usize, int: bool) -> ExResult<Act> {
        Ok(match (rank, int) {
            (2, false) => Act::F2(Tensor::from_dispatch(prim)),
            (3, false) => Act::F3(Tensor::from_dispatch(prim)),
            (4, false) => Act::F4(Tensor::from_dispatch(prim)),
            (2, true) => Act::I2(Tensor::from_dispatch(prim)),
            _ => {
                return Err(ExError::invalid(format!(
                    "model inputs must be float tensors of rank 2 to 4 (or integer tokens of rank 2), got rank {rank}"
                )))
            }
        })
    }

    pub fn into_dispatch(self) -> burn::backend::DispatchTensor {
        match self {
            Act::F2(t) => t.into_dispatch(),
            Act::F3(t) => t.into_dispatch(),
            Act::F4(t) => t.into_dispatch(),
            Act::I2(t) => t.into_dispatch(),
        }
    }

    fn zeros(dims: &[usize], int: bool, device: &Device) -> ExResult<Act> {
        Ok(match (dims.len(), int) {
            (2, true) => Act::I2(Tensor::zeros([dims[0], dims[1]], device)),
            (2, false) => Act::F2(Tensor::zeros([dims[0], dims[1]], device)),
            (3, false) => Act::F3(Tensor::zeros([dims[0], dims[1], dims[2]], device)),
            (4, false) => Act::F4(Tensor::zeros([dims[0], dims[1], dims[2], dims[3]], device)),
            (r, _) => return Err(ExError::invalid(format!("unsupported input rank {r} (expected 2 to 4, batch included)"))),
        })
    }
}

fn rank_error(layer: &str, act: &Act) -> ExError {
    ExError::invalid_with(
        format!("layer {layer} cannot take an input of this shape"),
        vec![("layer", crate::error::Detail::Text(layer.to_string())), ("input", crate::error::Detail::Dims(act.dims()))],
    )
}

/// Applies an expression generic over the rank to any float activation.
macro_rules! any_float_rank {
    ($act:expr, $layer:expr, |$t:ident| $body:expr) => {
        match $act {
            Act::F2($t) => Act::F2($body),
            Act::F3($t) => Act::F3($body),
            Act::F4($t) => Act::F4($body),
            other => return Err(rank_error($layer, &other)),
        }
    };
}

/// Channels-last `[b, spatial.., c]` to Burn's channels-first and back.
fn to_cf3(t: Tensor<3>) -> Tensor<3> {
    t.swap_dims(1, 2)
}
fn to_cf4(t: Tensor<4>) -> Tensor<4> {
    t.permute([0, 3, 1, 2])
}
fn to_cl4(t: Tensor<4>) -> Tensor<4> {
    t.permute([0, 2, 3, 1])
}

/// Runs a channels-first Burn layer (conv or pool) on a channels-last `[b, t, c]` activation;
/// other ranks are an error naming the layer.
fn channels_first_1d(layer: &str, x: Act, f: impl FnOnce(Tensor<3>) -> Tensor<3>) -> ExResult<Act> {
    match x {
        Act::F3(t) => Ok(Act::F3(to_cf3(f(to_cf3(t))))),
        other => Err(rank_error(layer, &other)),
    }
}

/// As `channels_first_1d` for `[b, h, w, c]` activations.
fn channels_first_2d(layer: &str, x: Act, f: impl FnOnce(Tensor<4>) -> Tensor<4>) -> ExResult<Act> {
    match x {
        Act::F4(t) => Ok(Act::F4(to_cl4(f(to_cf4(t))))),
        other => Err(rank_error(layer, &other)),
    }
}

impl Layer {
    pub fn name(&self) -> &'static str {
        match self {
            Layer::Dense(_) => "dense",
            Layer::Conv1d(_) => "conv1d",
            Layer::Conv2d(_) => "conv2d",
            Layer::MaxPool1d(_) | Layer::MaxPool2d(_) => "max_pool",
            Layer::AvgPool1d(_) | Layer::AvgPool2d(_) => "avg_pool",
            Layer::GlobalAvgPool(_) => "global_avg_pool",
            Layer::Flatten(_) => "flatten",
            Layer::Dropout(_) => "dropout",
            Layer::BatchNorm(_) => "batch_norm",
            Layer::LayerNorm(_) => "layer_norm",
            Layer::Embedding(_) => "embedding",
            Layer::Lstm(_) => "lstm",
            Layer::Gru(_) => "gru",
            Layer::Activation(a) => a.activation().name(),
        }
    }

    /// Dropout draws its masks from `rng` and is the identity without one (inference, shape probes).
    pub fn forward(&self, x: Act, rng: Option<&mut SeededRng>) -> ExResult<Act> {
        let name = self.name();
        Ok(match self {
            Layer::Dense(l) => any_float_rank!(x, name, |t| l.forward(t)),
            Layer::Dropout(l) => match rng {
                Some(rng) => any_float_rank!(x, name, |t| dropout(l, t, rng)),
                None => any_float_rank!(x, name, |t| t),
            },
            Layer::LayerNorm(l) => any_float_rank!(x, name, |t| l.forward(t)),
            Layer::Activation(l) => any_float_rank!(x, name, |t| l.apply(t)),
            Layer::Conv1d(l) => channels_first_1d(name, x, |t| l.forward(t))?,
            Layer::MaxPool1d(l) => channels_first_1d(name, x, |t| l.forward(t))?,
            Layer::AvgPool1d(l) => channels_first_1d(name, x, |t| l.forward(t))?,
            Layer::Conv2d(l) => channels_first_2d(name, x, |t| l.forward(t))?,
            Layer::MaxPool2d(l) => channels_first_2d(name, x, |t| l.forward(t))?,
            Layer::AvgPool2d(l) => channels_first_2d(name, x, |t| l.forward(t))?,
            Layer::GlobalAvgPool(_) => match x {
                Act::F3(t) => {
                    let [b, _, c] = t.dims();
                    Act::F2(t.mean_dim(1).reshape([b, c]))
                }
                Act::F4(t) => {
                    let [b, _, _, c] = t.dims();
                    Act::F2(t.mean_dim(1).mean_dim(2).reshape([b, c]))
                }
                other => return Err(rank_error(name, &other)),
            },
            Layer::Flatten(_) => match x {
                Act::F2(t) => Act::F2(t),
                Act::F3(t) => {
                    let [b, a, c] = t.dims();
                    Act::F2(t.reshape([b, a * c]))
                }
                Act::F4(t) => {
                    let [b, h, w, c] = t.dims();
                    Act::F2(t.reshape([b, h * w * c]))
                }
                other => return Err(rank_error(name, &other)),
            },
            Layer::BatchNorm(l) => match x {
                Act::F2(t) => Act::F2(l.forward(t)),
                Act::F3(t) => Act::F3(to_cf3(l.forward(to_cf3(t)))),
                Act::F4(t) => Act::F4(to_cl4(l.forward(to_cf4(t)))),
                other => return Err(rank_error(name, &other)),
            },
            Layer::Embedding(l) => match x {
                Act::I2(t) => Act::F3(l.forward(t)),
                other => return Err(rank_error(name, &other)),
            },
            Layer::Lstm(r) => match x {
                Act::F3(t) => hidden(recurrent::lstm(&r.cell, t, r.return_sequences)),
                other => return Err(rank_error(name, &other)),
            },
            Layer::Gru(r) => match x {
                Act::F3(t) => hidden(recurrent::gru(&r.cell, t, r.return_sequences)),
                other => return Err(rank_error(name, &other)),
            },
        })
    }
}

/// Burn's `Dropout::forward` with the mask drawn from the model's generator.
fn dropout<const D: usize>(l: &Dropout, t: Tensor<D>, rng: &mut SeededRng) -> Tensor<D> {
    if !l.training.is_enabled() || !t.device().is_autodiff() || l.prob == 0.0 {
        return t;
    }
    let keep = 1.0 - l.prob;
    let mask = rng.keep_mask(&t, keep);
    t * mask * (1.0 / keep)
}

fn hidden(h: Hidden) -> Act {
    match h {
        Hidden::All(seq) => Act::F3(seq),
        Hidden::Last(last) => Act::F2(last),
    }
}

impl Net {
    /// The forward pass without dropout.
    pub fn forward(&self, x: Act) -> ExResult<Act> {
        self.layers.iter().try_fold(x, |acc, layer| layer.forward(acc, None))
    }

    /// The training forward pass: dropout (on an autodiff device) draws its masks from `rng`.
    pub fn forward_train(&self, x: Act, rng: &mut SeededRng) -> ExResult<Act> {
        self.layers.iter().try_fold(x, |acc, layer| layer.forward(acc, Some(&mut *rng)))
    }

    /// The activation of the last layer, which decides how losses read the output.
    pub fn last_activation(&self) -> Option<Activation> {
        match self.layers.last() {
            Some(Layer::Activation(a)) => Some(a.activation()),
            _ => None,
        }
    }
}

/// One row of the summary: layer name, output shape (batch excluded) and parameter count.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerInfo {
    pub name: &'static str,
    pub output: Vec<usize>,
    pub params: usize,
}

/// A kernel or stride size per spatial axis (`n` of them): one entry serves every axis.
fn per_axis(v: &[usize], n: usize) -> ExResult<Vec<usize>> {
    match v.len() {
        1 => Ok(vec![v[0]; n]),
        l if l == n => Ok(v.to_vec()),
        _ => Err(ExError::invalid(format!("kernel and stride sizes must have 1 or {n} entries, got {}", v.len()))),
    }
}

fn make_layer(spec: &LayerSpec, input: &[usize], device: &Device, rng: &mut SeededRng) -> ExResult<Layer> {
    let last = *input.last().unwrap_or(&0);
    let spatial = input.len().saturating_sub(2);
    let wrong_input = || {
        ExError::invalid_with(
            format!("layer {} cannot take an input of this shape", spec.name()),
            vec![("layer", crate::error::Detail::Text(spec.name().into())), ("input", crate::error::Detail::Dims(input.to_vec()))],
        )
    };
    Ok(match spec {
        LayerSpec::Dense { units, use_bias } => Layer::Dense(rng.linear(&LinearConfig::new(last, *units).with_bias(*use_bias), device)?),
        LayerSpec::Conv1d { filters, kernel_size, strides, padding } => {
            let pad = match padding {
                Padding::Valid => PaddingConfig1d::Valid,
                Padding::Same => PaddingConfig1d::Same,
            };
            let (k, s) = (per_axis(kernel_size, 1)?[0], per_axis(strides, 1)?[0]);
            Layer::Conv1d(rng.conv1d(&Conv1dConfig::new(last, *filters, k).with_stride(s).with_padding(pad), device)?)
        }
        LayerSpec::Conv2d { filters, kernel_size, strides, padding } => {
            let pad = match padding {
                Padding::Valid => PaddingConfig2d::Valid,
                Padding::Same => PaddingConfig2d::Same,
            };
            let (k, s) = (per_axis(kernel_size, 2)?, per_axis(strides, 2)?);
            Layer::Conv2d(rng.conv2d(&Conv2dConfig::new([last, *filters], [k[0], k[1]]).with_stride([s[0], s[1]]).with_padding(pad), device)?)
        }
        LayerSpec::MaxPool { kernel_size: kernel, strides: stride } | LayerSpec::AvgPool { kernel_size: kernel, strides: stride } => {
            let max = matches!(spec, LayerSpec::MaxPool { .. });
            match spatial {
                1 => {
                    let (k, s) = (per_axis(kernel, 1)?[0], per_axis(stride, 1)?[0]);
                    if max {
                        Layer::MaxPool1d(MaxPool1dConfig::new(k).with_stride(s).init())
                    } else {
                        Layer::AvgPool1d(AvgPool1dConfig::new(k).with_stride(s).init())
                    }
                }
                2 => {
                    let (k, s) = (per_axis(kernel, 2)?, per_axis(stride, 2)?);
                    let (k, s) = ([k[0], k[1]], [s[0], s[1]]);
                    if max {
                        Layer::MaxPool2d(MaxPool2dConfig::new(k).with_strides(s).init())
                    } else {
                        Layer::AvgPool2d(AvgPool2dConfig::new(k).with_strides(s).init())
                    }
                }
                _ => return Err(wrong_input()),
            }
        }
        LayerSpec::GlobalAvgPool => Layer::GlobalAvgPool(GlobalAvgPool),
        LayerSpec::Flatten => Layer::Flatten(Flatten),
        LayerSpec::Dropout { rate } => {
            if !(0.0..1.0).contains(rate) {
                return Err(ExError::invalid(format!("dropout rate must be in [0, 1), got {rate}")));
            }
            Layer::Dropout(DropoutConfig::new(*rate).init())
        }
        LayerSpec::BatchNorm { epsilon, momentum } => {
            Layer::BatchNorm(BatchNormConfig::new(last).with_epsilon(*epsilon).with_momentum(*momentum).init(device))
        }
        LayerSpec::LayerNorm { epsilon } => Layer::LayerNorm(LayerNormConfig::new(last).with_epsilon(*epsilon).init(device)),
        LayerSpec::Embedding { vocab_size, embedding_size } => {
            Layer::Embedding(rng.embedding(&EmbeddingConfig::new(*vocab_size, *embedding_size), device)?)
        }
        LayerSpec::Lstm { units, return_sequences } => Layer::Lstm(Recurrent {
            cell: rng.lstm(&LstmConfig::new(last, *units, true), device)?,
            return_sequences: *return_sequences,
        }),
        LayerSpec::Gru { units, return_sequences } => Layer::Gru(Recurrent {
            cell: rng.gru(&GruConfig::new(last, *units, true), device)?,
            return_sequences: *return_sequences,
        }),
        LayerSpec::Activation(a) => Layer::Activation(ActivationLayer::new(*a)),
    })
}

/// Builds the network for inputs of `input` shape (batch excluded), its weights drawn from `rng`.
/// Each layer's input size is read off a probe forward pass of one zero sample, so shape rules
/// live in Burn alone.
pub fn build(specs: &[LayerSpec], input: &[usize], int_input: bool, device: &Device, rng: &mut SeededRng) -> ExResult<(Net, Vec<LayerInfo>)> {
    if specs.is_empty() {
        return Err(ExError::invalid("a model needs at least one layer"));
    }
    let mut dims = vec![1];
    dims.extend_from_slice(input);
    let mut probe = Act::zeros(&dims, int_input, device)?;
    let mut layers = Vec::with_capacity(specs.len());
    let mut infos = Vec::with_capacity(specs.len());
    for spec in specs {
        let layer = make_layer(spec, &probe.dims(), device, rng)?;
        probe = crate::error::catch(|| layer.forward(probe.clone(), None)).map_err(|e| match e {
            ExError::Panic { message, .. } => ExError::invalid_with(
                format!("layer {} does not fit its input: {message}", spec.name()),
                vec![("layer", crate::error::Detail::Text(spec.name().into())), ("input", crate::error::Detail::Dims(probe.dims()))],
            ),
            other => other,
        })?;
        infos.push(LayerInfo { name: spec.name(), output: probe.dims()[1..].to_vec(), params: layer.num_params() });
        layers.push(layer);
    }
    Ok((Net { layers }, infos))
}
