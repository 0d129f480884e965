//! Recurrent gate activations as one tensor op: the logistic function on the leading `split`
//! columns of a `[rows, cols]` tensor, tanh on the rest. On the CPU (flex f32, with or without
//! autodiff) it is `kernels::cpu::gates`, one node in the autodiff graph whose backward pass
//! reads the saved output; elsewhere it is Burn's two activations on the two column blocks.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{unary, Backward, Ops, OpsKind};
use burn::backend::autodiff::Autodiff;
use burn::backend::flex::FlexTensor;
use burn::backend::{
    BackendTensor, BackendTypes, DType, DispatchAutodiffContext, DispatchTensor, DispatchTensorKind, Flex, GradientCheckpointingStrategy,
    TensorData,
};
use burn::tensor::activation::{sigmoid, tanh};
use burn::tensor::Tensor;

use crate::kernels::cpu::gates;

/// A tracked flex float (`AutodiffTensor<Flex>`, which Burn does not export by name).
type Tracked = <Autodiff<Flex> as BackendTypes>::FloatTensorPrimitive;

/// Logistic on columns `..split` of `x` (`[rows, cols]`), tanh on columns `split..`.
pub fn activate(x: Tensor<2>, split: usize) -> Tensor<2> {
    let [rows, cols] = x.dims();
    let p = x.into_dispatch();
    match p {
        DispatchTensor { kind: DispatchTensorKind::Flex(BackendTensor::Float(t)), autodiff } if t.dtype() == DType::F32 => {
            let out = forward(&t, cols, split);
            Tensor::from_dispatch(DispatchTensor { kind: DispatchTensorKind::Flex(BackendTensor::Float(out)), autodiff })
        }
        DispatchTensor { kind: DispatchTensorKind::Autodiff(inner), autodiff: DispatchAutodiffContext::Enabled(GradientCheckpointingStrategy::Disabled) }
            if matches!(&*inner, DispatchTensorKind::Flex(BackendTensor::Autodiff(t)) if t.primitive().dtype() == DType::F32) =>
        {
            let DispatchTensorKind::Flex(BackendTensor::Autodiff(t)) = *inner else { unreachable!("matched above") };
            let out = tracked(t, cols, split);
            Tensor::from_dispatch(DispatchTensor {
                kind: DispatchTensorKind::Autodiff(Box::new(DispatchTensorKind::Flex(BackendTensor::Autodiff(out)))),
                autodiff: DispatchAutodiffContext::Enabled(GradientCheckpointingStrategy::Disabled),
            })
        }
        other => {
            let x = Tensor::<2>::from_dispatch(other);
            match split {
                0 => tanh(x),
                s if s == cols => sigmoid(x),
                s => Tensor::cat(vec![sigmoid(x.clone().slice([0..rows, 0..s])), tanh(x.slice([0..rows, s..cols]))], 1),
            }
        }
    }
}

pub(super) fn f32_values(t: &FlexTensor) -> std::borrow::Cow<'_, [f32]> {
    match t.as_slice::<f32>() {
        Some(v) => v.into(),
        None => t.to_contiguous().into_data().try_to_vec::<f32>().expect("an f32 tensor").into(),
    }
}

/// A flex tensor of `values` in `shape`.
pub(super) fn flex(values: Vec<f32>, shape: impl Into<burn::tensor::Shape>) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(values, shape.into()))
}

fn forward(t: &FlexTensor, cols: usize, split: usize) -> FlexTensor {
    flex(gates::activate(&f32_values(t), cols, split), t.layout().shape().clone())
}

#[derive(Debug)]
struct Gates {
    cols: usize,
    split: usize,
}

impl Backward<Flex, 1> for Gates {
    /// The op's output.
    type State = FlexTensor;

    fn backward(self, ops: Ops<FlexTensor, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (cols, split) = (self.cols, self.split);
        let out = ops.state.clone();
        unary::<Flex, _>(ops.parents, ops.node, grads, |grad| flex(gates::backward(&f32_values(&out), &f32_values(&grad), cols, split), out.layout().shape().clone()));
    }
}

/// The op on a tracked flex tensor: one graph node that keeps its output for the backward pass.
fn tracked(t: Tracked, cols: usize, split: usize) -> Tracked {
    let out = forward(t.primitive(), cols, split);
    let op = Gates { cols, split };
    match op.prepare::<NoCheckpointing>([t.node()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(out.clone(), out),
        OpsKind::UnTracked(prep) => prep.finish(out),
    }
}
