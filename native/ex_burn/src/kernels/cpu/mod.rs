//! CPU kernels on Burn's flex storage: each reads contiguous flex tensors directly and returns
//! `None` for anything it does not cover (another device, a strided view, another dtype).

pub(crate) mod adam;
pub(crate) mod attention;
pub(crate) mod bf16_gemm;
pub(crate) mod cells;
pub(crate) mod conv;
pub(crate) mod fast_math;
pub(crate) mod gates;
pub(crate) mod gather;
pub(crate) mod layer_norm;
pub(crate) mod linear;
pub(crate) mod linear_packed;
pub mod quant;
pub(crate) mod rnn_layers;
pub(crate) mod row_split;
pub(crate) mod sort;
pub(crate) mod strided;
pub(crate) mod tanh;
pub(crate) mod vector;
pub(crate) mod winograd;
