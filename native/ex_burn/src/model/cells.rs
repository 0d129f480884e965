//! Recurrent layers as differentiable tensor ops: an LSTM or GRU layer over a whole sequence is
//! one autodiff node whose backward pass runs the steps back in time (`steps`), and a step after
//! its products (the gates' activations, the state update, the output) is one kernel each way:
//! the CPU's (`kernels::cpu::cells`, flex f32) and the cube GPUs' (`gpu::cells`), behind a
//! backend extension; on flex the layer's loop is split by rows (`kernels::cpu::rnn_layers`).
//! Composed of Burn ops, a step is a dozen tensors forwards (column slices of
//! the gates, products, sums) and more backwards, each slice's gradient the size of all the gates,
//! and each step's input slice has a gradient the size of the whole sequence; on a GPU each op is
//! a kernel launch, and a small model's step is launch-bound. Other tensors (f64) take that
//! composition, which is also what the ops' values are held to.
//!
//! An LSTM step's state is one tensor `[h, c]` (`[batch, 2·hidden]`); a GRU's is `h` alone.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::Autodiff;
use burn::backend::tensor::FloatTensor;
use burn::backend::{backend_extension, Backend, BackendTypes, DType, Dispatch, DispatchTensorKind, Flex, FloatDType, TensorMetadata};
use burn::tensor::{Slice, Tensor};

use super::gates::{activate, f32_values, flex};
use crate::kernels::cpu::cells as cpu;
use crate::kernels::cpu::rnn_layers;

#[backend_extension(Flex, Cube: cfg(cube), Fusion: cfg(cube), Autodiff)]
pub trait Cells: Backend {
    /// `lstm`'s step: the new state and the values its backward pass reads
    /// (`kernels::cpu::cells::LSTM_SAVED` per hidden unit).
    #[fusion(meta = lstm_meta)]
    fn lstm_cell(pre: FloatTensor<Self>, state: FloatTensor<Self>) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// The gradients of an LSTM step's pre-activations and input cell state `c`, from the
    /// gradients of its new `h` and `c`.
    #[fusion(meta = lstm_backward_meta)]
    fn lstm_cell_backward(saved: FloatTensor<Self>, c: FloatTensor<Self>, dh: FloatTensor<Self>, dc: FloatTensor<Self>) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// `gru`'s step: the new state and the values its backward pass reads
    /// (`kernels::cpu::cells::GRU_SAVED` per hidden unit).
    #[fusion(meta = gru_meta)]
    fn gru_cell(xp: FloatTensor<Self>, hp: FloatTensor<Self>, hidden: FloatTensor<Self>) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// The gradients of a GRU step's two products and its input state.
    #[fusion(meta = gru_backward_meta)]
    fn gru_cell_backward(
        saved: FloatTensor<Self>,
        hp: FloatTensor<Self>,
        hidden: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);

    /// `steps::lstm`: every step's `h` and the steps' saved values.
    #[fusion(default)]
    fn lstm_layer(p: FloatTensor<Self>, w_h: FloatTensor<Self>) -> (FloatTensor<Self>, FloatTensor<Self>) {
        super::steps::lstm::<Self>(p, w_h, Self::lstm_cell)
    }

    /// `steps::lstm_backward`.
    #[fusion(default)]
    fn lstm_layer_backward(w_h: FloatTensor<Self>, hs: FloatTensor<Self>, saved: FloatTensor<Self>, grad: FloatTensor<Self>) -> (FloatTensor<Self>, FloatTensor<Self>) {
        super::steps::lstm_backward::<Self>(w_h, hs, saved, grad, Self::lstm_cell_backward)
    }

    /// `steps::gru`: every step's `h`, the steps' saved values and hidden products.
    #[fusion(default)]
    fn gru_layer(xp: FloatTensor<Self>, w_h: FloatTensor<Self>, b_h: FloatTensor<Self>) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        super::steps::gru::<Self>(xp, w_h, b_h, Self::gru_cell)
    }

    /// `steps::gru_backward`.
    #[fusion(default)]
    fn gru_layer_backward(
        w_h: FloatTensor<Self>,
        hs: FloatTensor<Self>,
        saved: FloatTensor<Self>,
        hps: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        super::steps::gru_backward::<Self>(w_h, hs, saved, hps, grad, Self::gru_cell_backward)
    }
}

#[cfg(cube)]
mod meta {
    use burn::backend::fusion::custom::TensorSpec;

    use crate::kernels::cpu::cells::{GRU_SAVED, LSTM_SAVED};

    /// `like` with `width` columns.
    fn cols(like: &TensorSpec, width: usize) -> TensorSpec {
        let mut shape = like.shape.clone();
        shape[1] = width;
        TensorSpec::new(shape, like.dtype)
    }

    pub fn lstm_meta(_pre: &TensorSpec, state: &TensorSpec) -> (TensorSpec, TensorSpec) {
        (state.clone(), cols(state, LSTM_SAVED * state.shape[1] / 2))
    }

    pub fn lstm_backward_meta(_saved: &TensorSpec, c: &TensorSpec, _dh: &TensorSpec, _dc: &TensorSpec) -> (TensorSpec, TensorSpec) {
        (cols(c, 4 * c.shape[1]), c.clone())
    }

    pub fn gru_meta(_xp: &TensorSpec, _hp: &TensorSpec, hidden: &TensorSpec) -> (TensorSpec, TensorSpec) {
        (hidden.clone(), cols(hidden, GRU_SAVED * hidden.shape[1]))
    }

    pub fn gru_backward_meta(_saved: &TensorSpec, hp: &TensorSpec, hidden: &TensorSpec, _grad: &TensorSpec) -> (TensorSpec, TensorSpec, TensorSpec) {
        (hp.clone(), hp.clone(), hidden.clone())
    }
}
#[cfg(cube)]
use meta::*;

/// `[rows, cols]` of a 2-d flex tensor.
fn dims(t: &burn::backend::flex::FlexTensor) -> [usize; 2] {
    let s = t.layout().shape();
    [s[0], s[1]]
}

impl Cells for Flex {
    fn lstm_cell(pre: FloatTensor<Self>, state: FloatTensor<Self>) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let [rows, h2] = dims(&state);
        let (out, saved) = cpu::lstm(&f32_values(&pre), &f32_values(&state), h2 / 2);
        (flex(out, [rows, h2]), flex(saved, [rows, cpu::LSTM_SAVED * h2 / 2]))
    }

    fn lstm_cell_backward(saved: FloatTensor<Self>, c: FloatTensor<Self>, dh: FloatTensor<Self>, dc: FloatTensor<Self>) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let [rows, h] = dims(&c);
        let (d_pre, d_c) = cpu::lstm_backward(&f32_values(&saved), &f32_values(&c), &f32_values(&dh), &f32_values(&dc), h);
        (flex(d_pre, [rows, 4 * h]), flex(d_c, [rows, h]))
    }

    fn gru_cell(xp: FloatTensor<Self>, hp: FloatTensor<Self>, hidden: FloatTensor<Self>) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let [rows, h] = dims(&hidden);
        let (out, saved) = cpu::gru(&f32_values(&xp), &f32_values(&hp), &f32_values(&hidden), h);
        (flex(out, [rows, h]), flex(saved, [rows, cpu::GRU_SAVED * h]))
    }

    fn gru_cell_backward(
        saved: FloatTensor<Self>,
        hp: FloatTensor<Self>,
        hidden: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let [rows, h] = dims(&hidden);
        let (dxp, dhp, dh) = cpu::gru_backward(&f32_values(&saved), &f32_values(&hp), &f32_values(&hidden), &f32_values(&grad), h);
        (flex(dxp, [rows, 3 * h]), flex(dhp, [rows, 3 * h]), flex(dh, [rows, h]))
    }

    fn lstm_layer(p: FloatTensor<Self>, w_h: FloatTensor<Self>) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let s = p.layout().shape();
        let [t, b, h] = [s[0], s[1], s[2] / 4];
        let (hs, saved) = rnn_layers::lstm_forward(&f32_values(&p), &f32_values(&w_h), [t, b, h]);
        (flex(hs, [t, b, h]), flex(saved, [t * b, cpu::LSTM_SAVED * h]))
    }

    fn lstm_layer_backward(w_h: FloatTensor<Self>, hs: FloatTensor<Self>, saved: FloatTensor<Self>, grad: FloatTensor<Self>) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let s = hs.layout().shape();
        let [t, b, h] = [s[0], s[1], s[2]];
        let (dp, dw) = rnn_layers::lstm_backward(&f32_values(&w_h), &f32_values(&hs), &f32_values(&saved), &f32_values(&grad), [t, b, h]);
        (flex(dp, [t, b, 4 * h]), flex(dw, [h, 4 * h]))
    }

    fn gru_layer(xp: FloatTensor<Self>, w_h: FloatTensor<Self>, b_h: FloatTensor<Self>) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let s = xp.layout().shape();
        let [t, b, h] = [s[0], s[1], s[2] / 3];
        let (hs, saved, hps) = rnn_layers::gru_forward(&f32_values(&xp), &f32_values(&w_h), &f32_values(&b_h), [t, b, h]);
        (flex(hs, [t, b, h]), flex(saved, [t * b, cpu::GRU_SAVED * h]), flex(hps, [t * b, 3 * h]))
    }

    fn gru_layer_backward(
        w_h: FloatTensor<Self>,
        hs: FloatTensor<Self>,
        saved: FloatTensor<Self>,
        hps: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let s = hs.layout().shape();
        let [t, b, h] = [s[0], s[1], s[2]];
        let (dxp, dw, db) = rnn_layers::gru_backward(&f32_values(&w_h), &f32_values(&hs), &f32_values(&saved), &f32_values(&hps), &f32_values(&grad), [t, b, h]);
        (flex(dxp, [t, b, 3 * h]), flex(dw, [h, 3 * h]), flex(db, [3 * h]))
    }
}

/// Registers each gradient with its parent, where the parent takes one (a macro: the parents'
/// node type is not exported by name).
macro_rules! register {
    ($B:ty, $grads:expr, $parents:expr, [$($g:expr),+]) => {
        for (node, g) in $parents.into_iter().zip([$($g),+]) {
            if let Some(node) = node {
                $grads.register::<$B>(node.id, g);
            }
        }
    };
}

/// An LSTM step's node: the saved values and the input state.
#[derive(Debug)]
struct LstmStep;

impl<B: Cells> Backward<B, 2> for LstmStep {
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (saved, state) = ops.state;
        let [rows, h2] = [state.shape()[0], state.shape()[1]];
        let h = h2 / 2;
        let cols = |t: FloatTensor<B>, from: usize| B::float_slice(t, &[Slice::new(0, Some(rows as isize), 1), Slice::new(from as isize, Some((from + h) as isize), 1)]);
        let (d_pre, d_c) = B::lstm_cell_backward(saved, cols(state, h), cols(grad.clone(), 0), cols(grad, h));
        // the input `h` reaches the step only through the gates' product
        let d_state = B::float_cat(vec![B::float_zeros([rows, h].into(), &d_c.device(), FloatDType::F32), d_c], 1);
        register!(B, grads, ops.parents, [d_pre, d_state]);
    }
}

/// A GRU step's node: the saved values, the hidden product and the input state.
#[derive(Debug)]
struct GruStep;

impl<B: Cells> Backward<B, 3> for GruStep {
    type State = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (saved, hp, hidden) = ops.state;
        let (dxp, dhp, dh) = B::gru_cell_backward(saved, hp, hidden, grad);
        register!(B, grads, ops.parents, [dxp, dhp, dh]);
    }
}

/// An LSTM layer's node: the hidden weights, every step's `h` and the saved values.
#[derive(Debug)]
struct LstmLayer;

impl<B: Cells> Backward<B, 2> for LstmLayer {
    type State = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (w_h, hs, saved) = ops.state;
        let (dp, dw) = B::lstm_layer_backward(w_h, hs, saved, grad);
        register!(B, grads, ops.parents, [dp, dw]);
    }
}

/// A GRU layer's node: the hidden weights, every step's `h`, the saved values and the hidden
/// products.
#[derive(Debug)]
struct GruLayer;

impl<B: Cells> Backward<B, 3> for GruLayer {
    type State = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (w_h, hs, saved, hps) = ops.state;
        let (dxp, dw, db) = B::gru_layer_backward(w_h, hs, saved, hps, grad);
        register!(B, grads, ops.parents, [dxp, dw, db]);
    }
}

/// A value no gradient flows into (the saved values the ops return beside their outputs, and the
/// backward ops' results).
fn constant<B: Backend, C: CheckpointStrategy>(t: FloatTensor<B>) -> FloatTensor<Autodiff<B, C>> {
    <Autodiff<B, C> as BackendTypes>::FloatTensorPrimitive::new(t)
}

impl<B: Cells, C: CheckpointStrategy> Cells for Autodiff<B, C> {
    fn lstm_cell(pre: FloatTensor<Self>, state: FloatTensor<Self>) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (out, saved) = B::lstm_cell(pre.primitive().clone(), state.primitive().clone());
        let out = match LstmStep.prepare::<C>([pre.node(), state.node()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((saved.clone(), state.primitive().clone()), out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        };
        (out, constant::<B, C>(saved))
    }

    fn lstm_cell_backward(saved: FloatTensor<Self>, c: FloatTensor<Self>, dh: FloatTensor<Self>, dc: FloatTensor<Self>) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (d_pre, d_c) = B::lstm_cell_backward(saved.primitive().clone(), c.primitive().clone(), dh.primitive().clone(), dc.primitive().clone());
        (constant::<B, C>(d_pre), constant::<B, C>(d_c))
    }

    fn gru_cell(xp: FloatTensor<Self>, hp: FloatTensor<Self>, hidden: FloatTensor<Self>) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (out, saved) = B::gru_cell(xp.primitive().clone(), hp.primitive().clone(), hidden.primitive().clone());
        let out = match GruStep.prepare::<C>([xp.node(), hp.node(), hidden.node()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((saved.clone(), hp.primitive().clone(), hidden.primitive().clone()), out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        };
        (out, constant::<B, C>(saved))
    }

    fn gru_cell_backward(
        saved: FloatTensor<Self>,
        hp: FloatTensor<Self>,
        hidden: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let (dxp, dhp, dh) = B::gru_cell_backward(saved.primitive().clone(), hp.primitive().clone(), hidden.primitive().clone(), grad.primitive().clone());
        (constant::<B, C>(dxp), constant::<B, C>(dhp), constant::<B, C>(dh))
    }

    fn lstm_layer(p: FloatTensor<Self>, w_h: FloatTensor<Self>) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (hs, saved) = B::lstm_layer(p.primitive().clone(), w_h.primitive().clone());
        let out = match LstmLayer.prepare::<C>([p.node(), w_h.node()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((w_h.primitive().clone(), hs.clone(), saved.clone()), hs),
            OpsKind::UnTracked(prep) => prep.finish(hs),
        };
        (out, constant::<B, C>(saved))
    }

    fn lstm_layer_backward(w_h: FloatTensor<Self>, hs: FloatTensor<Self>, saved: FloatTensor<Self>, grad: FloatTensor<Self>) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (dp, dw) = B::lstm_layer_backward(w_h.primitive().clone(), hs.primitive().clone(), saved.primitive().clone(), grad.primitive().clone());
        (constant::<B, C>(dp), constant::<B, C>(dw))
    }

    fn gru_layer(xp: FloatTensor<Self>, w_h: FloatTensor<Self>, b_h: FloatTensor<Self>) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let (hs, saved, hps) = B::gru_layer(xp.primitive().clone(), w_h.primitive().clone(), b_h.primitive().clone());
        let out = match GruLayer.prepare::<C>([xp.node(), w_h.node(), b_h.node()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((w_h.primitive().clone(), hs.clone(), saved.clone(), hps.clone()), hs),
            OpsKind::UnTracked(prep) => prep.finish(hs),
        };
        (out, constant::<B, C>(saved), constant::<B, C>(hps))
    }

    fn gru_layer_backward(
        w_h: FloatTensor<Self>,
        hs: FloatTensor<Self>,
        saved: FloatTensor<Self>,
        hps: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let (dxp, dw, db) = B::gru_layer_backward(w_h.primitive().clone(), hs.primitive().clone(), saved.primitive().clone(), hps.primitive().clone(), grad.primitive().clone());
        (constant::<B, C>(dxp), constant::<B, C>(dw), constant::<B, C>(db))
    }
}

/// Whether the op runs for `t`: f32 on flex or on a cube GPU, tracked or not. Elsewhere the steps
/// are composed of Burn ops.
fn applies<const D: usize>(t: &Tensor<D>) -> bool {
    if t.dtype() != DType::F32 || !crate::process::env::cell_kernel() {
        return false;
    }
    let kind = t.clone().into_dispatch().kind;
    let kind = match kind {
        DispatchTensorKind::Autodiff(inner) => *inner,
        k => k,
    };
    match kind {
        DispatchTensorKind::Flex(_) => true,
        #[cfg(cube)]
        DispatchTensorKind::Cube(_) => true,
        _ => false,
    }
}

/// Columns `from..to` of `t`.
fn columns(t: &Tensor<2>, from: usize, to: usize) -> Tensor<2> {
    let b = t.dims()[0];
    t.clone().slice([0..b, from..to])
}

/// One LSTM step in Burn ops: `pre` holds the gates' pre-activations (`[batch, 4·hidden]`:
/// input, forget, output, candidate cell), `state` is `[h, c]`; returns the new `[h', c']` with
/// `c' = f·c + i·g`, `h' = o·tanh(c')`. `Cells::lstm_cell` is this step as one op.
fn composed_lstm(pre: Tensor<2>, state: Tensor<2>) -> Tensor<2> {
    let h2 = state.dims()[1];
    let h = h2 / 2;
    let g = activate(pre, 3 * h);
    let c = columns(&g, h, 2 * h) * columns(&state, h, h2) + columns(&g, 0, h) * columns(&g, 3 * h, 4 * h);
    let hidden = columns(&g, 2 * h, 3 * h) * activate(c.clone(), 0);
    Tensor::cat(vec![hidden, c], 1)
}

/// One GRU step (reset after the hidden product) in Burn ops: `xp` and `hp` are the input's and
/// the state's products (`[batch, 3·hidden]`: update, reset, new), `hidden` the state; returns
/// `h' = n·(1 − z) + z·h` with `[z, r] = σ(xp + hp)` and `n = tanh(xp_n + r·hp_n)`.
/// `Cells::gru_cell` is this step as one op.
fn composed_gru(xp: Tensor<2>, hp: Tensor<2>, hidden: Tensor<2>) -> Tensor<2> {
    let h = hidden.dims()[1];
    let zr = activate(columns(&xp, 0, 2 * h) + columns(&hp, 0, 2 * h), 2 * h);
    let (z, r) = (columns(&zr, 0, h), columns(&zr, h, 2 * h));
    let n = activate(columns(&xp, 2 * h, 3 * h) + r * columns(&hp, 2 * h, 3 * h), 0);
    n * z.clone().neg().add_scalar(1.0) + z * hidden
}

/// Step `s` of a time-major sequence: `[batch, width]`.
fn step(seq: &Tensor<3>, s: usize) -> Tensor<2> {
    let [_, b, w] = seq.dims();
    seq.clone().slice([s..s + 1, 0..b, 0..w]).reshape([b, w])
}

/// An LSTM layer from zero states (gates in the order input, forget, output, candidate cell):
/// `p` is the input's product with the gates' input weights plus their biases, time-major
/// (`[steps, batch, 4·hidden]`), and `w_h` the hidden weights (`[hidden, 4·hidden]`). Returns
/// every step's `h` (`[steps, batch, hidden]`).
pub fn lstm_layer(p: Tensor<3>, w_h: Tensor<2>) -> Tensor<3> {
    let g = p.dims()[2];
    let h = g / 4;
    assert_eq!(w_h.dims(), [h, g], "lstm layer: hidden weights {:?} for gates {g} wide", w_h.dims());
    if applies(&p) {
        let (hs, _) = Dispatch::lstm_layer(p.into_dispatch(), w_h.into_dispatch());
        return Tensor::from_dispatch(hs);
    }
    composed_lstm_layer(p, w_h)
}

/// `lstm_layer` in Burn ops.
fn composed_lstm_layer(p: Tensor<3>, w_h: Tensor<2>) -> Tensor<3> {
    let [t, b, g] = p.dims();
    let h = g / 4;
    let device = p.device();
    // zero states of the sequence's dtype (the device's default may be another)
    let zeros = |n: usize| Tensor::<2>::zeros([b, n], &device).cast(p.dtype());
    let (mut state, mut hidden) = (zeros(2 * h), zeros(h));
    let mut hs = Vec::with_capacity(t);
    for s in 0..t {
        state = composed_lstm(step(&p, s) + hidden.matmul(w_h.clone()), state);
        hidden = columns(&state, 0, h);
        hs.push(hidden.clone());
    }
    Tensor::stack(hs, 0)
}

/// A GRU layer (reset after the hidden product) from a zero state (gates in the order update,
/// reset, new): `xp` is the input's product with the gates' input weights plus their input
/// biases, time-major (`[steps, batch, 3·hidden]`), `w_h` the hidden weights (`[hidden,
/// 3·hidden]`) and `b_h` their biases. Returns every step's `h` (`[steps, batch, hidden]`).
pub fn gru_layer(xp: Tensor<3>, w_h: Tensor<2>, b_h: Option<Tensor<1>>) -> Tensor<3> {
    let g = xp.dims()[2];
    let h = g / 3;
    assert_eq!(w_h.dims(), [h, g], "gru layer: hidden weights {:?} for gates {g} wide", w_h.dims());
    let device = xp.device();
    if applies(&xp) {
        let b_h = b_h.unwrap_or_else(|| Tensor::zeros([g], &device));
        let (hs, _, _) = Dispatch::gru_layer(xp.into_dispatch(), w_h.into_dispatch(), b_h.into_dispatch());
        return Tensor::from_dispatch(hs);
    }
    composed_gru_layer(xp, w_h, b_h)
}

/// `gru_layer` in Burn ops.
fn composed_gru_layer(xp: Tensor<3>, w_h: Tensor<2>, b_h: Option<Tensor<1>>) -> Tensor<3> {
    let [t, b, g] = xp.dims();
    let h = g / 3;
    let mut hidden = Tensor::<2>::zeros([b, h], &xp.device()).cast(xp.dtype());
    let mut hs = Vec::with_capacity(t);
    for s in 0..t {
        let hp = hidden.clone().matmul(w_h.clone());
        let hp = match &b_h {
            Some(bias) => hp + bias.clone().unsqueeze(),
            None => hp,
        };
        hidden = composed_gru(step(&xp, s), hp, hidden);
        hs.push(hidden.clone());
    }
    Tensor::stack(hs, 0)
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, Distribution};

    use super::*;
    use crate::device::DeviceKind;

    /// `Cells::lstm_cell` on tensors: the step op itself, which the layers run on the inner
    /// backend and which is held to `composed_lstm` here.
    fn lstm(pre: Tensor<2>, state: Tensor<2>) -> Tensor<2> {
        let (out, _) = Dispatch::lstm_cell(pre.into_dispatch(), state.into_dispatch());
        Tensor::from_dispatch(out)
    }

    /// `Cells::gru_cell` on tensors, held to `composed_gru`.
    fn gru(xp: Tensor<2>, hp: Tensor<2>, hidden: Tensor<2>) -> Tensor<2> {
        let (out, _) = Dispatch::gru_cell(xp.into_dispatch(), hp.into_dispatch(), hidden.into_dispatch());
        Tensor::from_dispatch(out)
    }

    fn device() -> Device {
        crate::testing::device().burn().unwrap()
    }

    fn on_cpu() -> bool {
        crate::testing::device().kind == DeviceKind::Cpu
    }

    fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        t.into_data().try_to_vec::<f32>().unwrap()
    }

    /// Pre-activations over the functions' whole range: spread values, then the saturated and
    /// signed-zero ones.
    fn spread(rows: usize, cols: usize, salt: usize, d: &Device) -> Tensor<2> {
        let mut v: Vec<f32> = (0..rows * cols).map(|i| (crate::gpu::test_support::value(i, salt) * 6.0) as f32).collect();
        let edges = [0.0, -0.0, 20.0, -20.0, 90.0, -90.0, 1e-30, -1e-7];
        let n = edges.len().min(v.len());
        v[..n].copy_from_slice(&edges[..n]);
        Tensor::from_data(burn::tensor::TensorData::new(v, [rows, cols]), d)
    }

    fn assert_near(got: &[f32], want: &[f32], tol: f32, what: &str) {
        assert_eq!(got.len(), want.len(), "{what}: lengths");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{what}[{i}]: {g} against the composition's {w}");
        }
    }

    /// The step's output and each input's gradient under the loss `sum(out · r)`, through `f`.
    fn run(inputs: &[Tensor<2>], r: &Tensor<2>, f: impl Fn(Vec<Tensor<2>>) -> Tensor<2>) -> (Vec<f32>, Vec<Vec<f32>>) {
        let tracked: Vec<Tensor<2>> = inputs.iter().map(|t| t.clone().autodiff().require_grad()).collect();
        let out = f(tracked.clone());
        let g = (out.clone() * r.clone().autodiff()).sum().backward();
        (values(out), tracked.iter().map(|t| values(t.grad(&g).expect("every input takes part"))).collect())
    }

    /// The op against the composition: the same forward bits on the CPU (exact mode), within
    /// rounding on a GPU; gradients within rounding everywhere.
    fn compare(inputs: &[Tensor<2>], r: &Tensor<2>, op: impl Fn(Vec<Tensor<2>>) -> Tensor<2>, composed: impl Fn(Vec<Tensor<2>>) -> Tensor<2>, what: &str) {
        assert!(applies(&inputs[0]), "{what}: the op runs on {:?}", inputs[0].device());
        let (out, grads) = run(inputs, r, &op);
        let (want, want_grads) = run(inputs, r, &composed);
        if on_cpu() {
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&out), bits(&want), "{what}: forward bits");
        } else {
            assert_near(&out, &want, 1e-6, &format!("{what} output"));
        }
        for (k, (g, w)) in grads.iter().zip(&want_grads).enumerate() {
            assert_near(g, w, 1e-5, &format!("{what} gradient of input {k}"));
        }
        // untracked, the op gives the tracked values
        let plain = values(op(inputs.to_vec()));
        if on_cpu() {
            assert_eq!(plain, out, "{what}: untracked forward");
        } else {
            // a GPU may pick other product kernels (autotuning) for another graph
            assert_near(&plain, &out, 1e-4, &format!("{what} untracked forward"));
        }
    }

    #[test]
    fn lstm_step_is_the_composition_forwards_and_backwards() {
        let d = device();
        // one unit; odd widths; rows enough to split over the pool
        for (rows, h) in [(3, 1), (4, 7), (300, 37)] {
            let inputs = [spread(rows, 4 * h, 1, &d), spread(rows, 2 * h, 2, &d)];
            let r = Tensor::<2>::random([rows, 2 * h], Distribution::Uniform(-1.0, 1.0), &d);
            compare(&inputs, &r, |v| lstm(v[0].clone(), v[1].clone()), |v| composed_lstm(v[0].clone(), v[1].clone()), &format!("lstm {rows}x{h}"));
        }
    }

    #[test]
    fn gru_step_is_the_composition_forwards_and_backwards() {
        let d = device();
        for (rows, h) in [(3, 1), (4, 7), (300, 37)] {
            let inputs = [spread(rows, 3 * h, 3, &d), spread(rows, 3 * h, 4, &d), spread(rows, h, 5, &d)];
            let r = Tensor::<2>::random([rows, h], Distribution::Uniform(-1.0, 1.0), &d);
            compare(
                &inputs,
                &r,
                |v| gru(v[0].clone(), v[1].clone(), v[2].clone()),
                |v| composed_gru(v[0].clone(), v[1].clone(), v[2].clone()),
                &format!("gru {rows}x{h}"),
            );
        }
    }

    #[test]
    fn f64_layers_take_the_composition() {
        let d = device();
        let f64s = |t: Tensor<3>| t.cast(DType::F64);
        let p = f64s(sequence(3, 2, 8, 13, &d));
        assert!(!applies(&p));
        let hs = lstm_layer(p, weights(2, 8, 14, &d).cast(DType::F64));
        assert_eq!((hs.dims(), hs.dtype()), ([3, 2, 2], DType::F64));
        let hs = gru_layer(f64s(sequence(3, 2, 6, 15, &d)), weights(2, 6, 16, &d).cast(DType::F64), None);
        assert_eq!((hs.dims(), hs.dtype()), ([3, 2, 2], DType::F64));
    }

    /// Pre-activations of a time-major sequence over the functions' range.
    fn sequence(t: usize, b: usize, w: usize, salt: usize, d: &Device) -> Tensor<3> {
        spread(t * b, w, salt, d).reshape([t, b, w])
    }

    /// Small weights, a different spread per `salt`.
    fn weights(rows: usize, cols: usize, salt: usize, d: &Device) -> Tensor<2> {
        spread(rows, cols, salt, d) / 10.0
    }

    /// A layer's every-step output and the gradients of its inputs under `sum(hs · r)`.
    fn run_layer(inputs: (Tensor<3>, Vec<Tensor<2>>, Vec<Tensor<1>>), r: &Tensor<3>, f: &dyn Fn(Tensor<3>, Vec<Tensor<2>>, Vec<Tensor<1>>) -> Tensor<3>) -> (Vec<f32>, Vec<Vec<f32>>) {
        let (x, m, v) = inputs;
        let x = x.autodiff().require_grad();
        let m: Vec<Tensor<2>> = m.into_iter().map(|t| t.autodiff().require_grad()).collect();
        let v: Vec<Tensor<1>> = v.into_iter().map(|t| t.autodiff().require_grad()).collect();
        let out = f(x.clone(), m.clone(), v.clone());
        let g = (out.clone() * r.clone().autodiff()).sum().backward();
        let mut grads = vec![values(x.grad(&g).unwrap())];
        grads.extend(m.iter().map(|t| values(t.grad(&g).unwrap())));
        grads.extend(v.iter().map(|t| values(t.grad(&g).unwrap())));
        (values(out), grads)
    }

    fn compare_layers(
        inputs: (Tensor<3>, Vec<Tensor<2>>, Vec<Tensor<1>>),
        r: &Tensor<3>,
        op: &dyn Fn(Tensor<3>, Vec<Tensor<2>>, Vec<Tensor<1>>) -> Tensor<3>,
        composed: &dyn Fn(Tensor<3>, Vec<Tensor<2>>, Vec<Tensor<1>>) -> Tensor<3>,
        what: &str,
    ) {
        assert!(applies(&inputs.0), "{what}: the op runs");
        let (out, grads) = run_layer(inputs.clone(), r, op);
        let (want, want_grads) = run_layer(inputs.clone(), r, composed);
        // Burn's f32 products round their inputs to TF32 on tensor-core GPUs, and the op sums the
        // hidden weights' gradient in one product where the composition adds one per step
        let (out_tol, grad_tol) = if on_cpu() { (1e-6, 1e-5) } else { (1e-4, 2e-3) };
        assert_near(&out, &want, out_tol, &format!("{what} output"));
        for (k, (g, w)) in grads.iter().zip(&want_grads).enumerate() {
            assert_near(g, w, grad_tol, &format!("{what} gradient of input {k}"));
        }
        let (x, m, v) = inputs;
        let plain = values(op(x, m, v));
        if on_cpu() {
            assert_eq!(plain, out, "{what}: untracked forward");
        } else {
            assert_near(&plain, &out, out_tol, &format!("{what} untracked forward"));
        }
    }

    #[test]
    fn lstm_layer_is_the_composition_forwards_and_backwards() {
        let d = device();
        for (t, b, h) in [(1, 2, 3), (6, 3, 5), (9, 70, 24)] {
            let inputs = (sequence(t, b, 4 * h, 6, &d), vec![weights(h, 4 * h, 7, &d)], vec![]);
            let r = Tensor::<3>::random([t, b, h], Distribution::Uniform(-1.0, 1.0), &d);
            compare_layers(inputs, &r, &|p, w, _| lstm_layer(p, w[0].clone()), &|p, w, _| composed_lstm_layer(p, w[0].clone()), &format!("lstm layer {t}x{b}x{h}"));
        }
    }

    #[test]
    fn gru_layer_is_the_composition_forwards_and_backwards() {
        let d = device();
        for (t, b, h) in [(1, 2, 3), (6, 3, 5), (9, 70, 24)] {
            let inputs = (sequence(t, b, 3 * h, 8, &d), vec![weights(h, 3 * h, 9, &d)], vec![spread(1, 3 * h, 10, &d).reshape([3 * h])]);
            let r = Tensor::<3>::random([t, b, h], Distribution::Uniform(-1.0, 1.0), &d);
            let what = format!("gru layer {t}x{b}x{h}");
            compare_layers(inputs, &r, &|x, w, v| gru_layer(x, w[0].clone(), Some(v[0].clone())), &|x, w, v| composed_gru_layer(x, w[0].clone(), Some(v[0].clone())), &what);
            // without hidden biases
            let inputs = (sequence(t, b, 3 * h, 11, &d), vec![weights(h, 3 * h, 12, &d)], vec![]);
            compare_layers(inputs, &r, &|x, w, _| gru_layer(x, w[0].clone(), None), &|x, w, _| composed_gru_layer(x, w[0].clone(), None), &format!("{what} without biases"));
        }
    }
}
