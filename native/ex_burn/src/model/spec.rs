//! What a model is made of, independent of Burn: the layer list Elixir sends, and the training
//! configuration.
//!
//! With the `nif` feature these types are decoded by rustler from what `ExBurn.Model` sends
//! (`ExBurn.Model.Spec.native_layers/1`, `ExBurn.Model.config!/2`): field and variant names are
//! the Elixir option names, and no field has a default here, Elixir fills every one.

#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "nif", derive(rustler::NifTaggedEnum))]
pub enum Activation {
    Relu,
    Gelu,
    Sigmoid,
    Tanh,
    Softmax,
    LogSoftmax,
    LeakyRelu(f64),
    Silu,
}

impl Activation {
    pub const NAMES: [&'static str; 8] = ["relu", "gelu", "sigmoid", "tanh", "softmax", "log_softmax", "leaky_relu", "silu"];

    /// The activation called `name`; `alpha` is leaky_relu's negative slope.
    pub fn from_name(name: &str, alpha: f64) -> Option<Activation> {
        Some(match name {
            "relu" => Activation::Relu,
            "gelu" => Activation::Gelu,
            "sigmoid" => Activation::Sigmoid,
            "tanh" => Activation::Tanh,
            "softmax" => Activation::Softmax,
            "log_softmax" => Activation::LogSoftmax,
            "leaky_relu" => Activation::LeakyRelu(alpha),
            "silu" => Activation::Silu,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Activation::Relu => "relu",
            Activation::Gelu => "gelu",
            Activation::Sigmoid => "sigmoid",
            Activation::Tanh => "tanh",
            Activation::Softmax => "softmax",
            Activation::LogSoftmax => "log_softmax",
            Activation::LeakyRelu(_) => "leaky_relu",
            Activation::Silu => "silu",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "nif", derive(rustler::NifUnitEnum))]
pub enum Padding {
    Valid,
    Same,
}

/// One layer. Tensors are channels-last, as in Axon: images `[batch, h, w, c]`, sequences
/// `[batch, time, features]`.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "nif", derive(rustler::NifTaggedEnum))]
pub enum LayerSpec {
    Dense { units: usize, use_bias: bool },
    /// Convolution and pool sizes are per spatial axis; a single size is used for every axis.
    Conv1d { filters: usize, kernel_size: Vec<usize>, strides: Vec<usize>, padding: Padding },
    Conv2d { filters: usize, kernel_size: Vec<usize>, strides: Vec<usize>, padding: Padding },
    MaxPool { kernel_size: Vec<usize>, strides: Vec<usize> },
    AvgPool { kernel_size: Vec<usize>, strides: Vec<usize> },
    GlobalAvgPool,
    Flatten,
    Dropout { rate: f64 },
    BatchNorm { epsilon: f64, momentum: f64 },
    LayerNorm { epsilon: f64 },
    Embedding { vocab_size: usize, embedding_size: usize },
    Lstm { units: usize, return_sequences: bool },
    Gru { units: usize, return_sequences: bool },
    Activation(Activation),
}

impl LayerSpec {
    pub fn name(&self) -> &'static str {
        match self {
            LayerSpec::Dense { .. } => "dense",
            LayerSpec::Conv1d { .. } => "conv1d",
            LayerSpec::Conv2d { .. } => "conv2d",
            LayerSpec::MaxPool { .. } => "max_pool",
            LayerSpec::AvgPool { .. } => "avg_pool",
            LayerSpec::GlobalAvgPool => "global_avg_pool",
            LayerSpec::Flatten => "flatten",
            LayerSpec::Dropout { .. } => "dropout",
            LayerSpec::BatchNorm { .. } => "batch_norm",
            LayerSpec::LayerNorm { .. } => "layer_norm",
            LayerSpec::Embedding { .. } => "embedding",
            LayerSpec::Lstm { .. } => "lstm",
            LayerSpec::Gru { .. } => "gru",
            LayerSpec::Activation(a) => a.name(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "nif", derive(rustler::NifUnitEnum))]
pub enum LossKind {
    CrossEntropy,
    Mse,
    BinaryCrossEntropy,
}

/// Variants are spelt as the Elixir atoms they decode from (`:adamw`, `:rmsprop`).
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "nif", derive(rustler::NifUnitEnum))]
pub enum OptimizerKind {
    Adam,
    Adamw,
    Sgd,
    Rmsprop,
}

/// Learning-rate schedules, stepped once per epoch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Schedule {
    Constant,
    Step { step: usize, gamma: f64 },
    Exponential { gamma: f64 },
    Cosine { min: f64, epochs: usize },
}

/// `None` turns a setting off (no weight decay, momentum or clipping); it is not a default.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "nif", derive(rustler::NifMap))]
pub struct TrainConfig {
    pub loss: LossKind,
    pub optimizer: OptimizerKind,
    pub learning_rate: f64,
    pub weight_decay: Option<f64>,
    pub momentum: Option<f64>,
    pub beta1: f64,
    pub beta2: f64,
    pub epsilon: f64,
    pub clip_norm: Option<f64>,
    pub clip_value: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::Activation;

    #[test]
    fn activation_names_round_trip() {
        for name in Activation::NAMES {
            assert_eq!(Activation::from_name(name, 0.2).unwrap().name(), name);
        }
        assert_eq!(Activation::from_name("leaky_relu", 0.2), Some(Activation::LeakyRelu(0.2)));
        assert_eq!(Activation::from_name("swish", 0.0), None);
    }
}
