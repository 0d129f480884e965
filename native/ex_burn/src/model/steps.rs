//! The time loops of `model::cells`' layer ops, on any backend, given its step ops: forwards
//! one product of the hidden state and one step kernel per time step; backwards one step kernel
//! and one product per step, then one product for the hidden weights' gradient over all steps.
//! Sequences are time-major (`[steps, batch, ·]`), so a step is a contiguous block.

use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, FloatDType, Shape, TensorMetadata};
use burn::tensor::Slice;

use crate::kernels::cpu::cells::{GRU_SAVED, LSTM_SAVED};

fn dims3<B: Backend>(t: &FloatTensor<B>) -> [usize; 3] {
    let s = t.shape();
    [s[0], s[1], s[2]]
}

fn zeros<B: Backend>(like: &FloatTensor<B>, shape: impl Into<Shape>) -> FloatTensor<B> {
    B::float_zeros(shape.into(), &like.device(), FloatDType::F32)
}

fn range(from: usize, to: usize) -> Slice {
    Slice::new(from as isize, Some(to as isize), 1)
}

/// Step `s` of a time-major sequence `[steps, batch, width]`: `[batch, width]`.
fn step<B: Backend>(seq: &FloatTensor<B>, s: usize) -> FloatTensor<B> {
    let [_, b, w] = dims3::<B>(seq);
    B::float_reshape(B::float_slice(seq.clone(), &[range(s, s + 1), range(0, b), range(0, w)]), [b, w].into())
}

/// Columns `from..to` of a `[rows, cols]` tensor.
fn columns<B: Backend>(t: FloatTensor<B>, from: usize, to: usize) -> FloatTensor<B> {
    let rows = t.shape()[0];
    B::float_slice(t, &[range(0, rows), range(from, to)])
}

/// `[batch, width]` steps one after another: `[steps, batch, width]`.
fn stack<B: Backend>(steps: Vec<FloatTensor<B>>) -> FloatTensor<B> {
    let steps = steps
        .into_iter()
        .map(|t| {
            let s = t.shape();
            B::float_reshape(t, [1, s[0], s[1]].into())
        })
        .collect();
    B::float_cat(steps, 0)
}

/// The states each step starts from, as rows: zeros, then every step's but the last
/// (`[steps · batch, hidden]`).
fn previous<B: Backend>(states: &FloatTensor<B>) -> FloatTensor<B> {
    let [t, b, h] = dims3::<B>(states);
    let earlier = B::float_slice(states.clone(), &[range(0, t - 1), range(0, b), range(0, h)]);
    B::float_reshape(B::float_cat(vec![zeros::<B>(states, [1, b, h]), earlier], 0), [t * b, h].into())
}

/// An LSTM layer from zero states over `p` (`[steps, batch, 4·hidden]`, the input's product with
/// the gates' input weights and their biases) with hidden weights `w_h` (`[hidden, 4·hidden]`):
/// every step's `h` (`[steps, batch, hidden]`) and the steps' saved values
/// (`[steps · batch, LSTM_SAVED · hidden]`).
pub fn lstm<B: Backend>(p: FloatTensor<B>, w_h: FloatTensor<B>, cell: impl Fn(FloatTensor<B>, FloatTensor<B>) -> (FloatTensor<B>, FloatTensor<B>)) -> (FloatTensor<B>, FloatTensor<B>) {
    let [t, b, g] = dims3::<B>(&p);
    let h = g / 4;
    let (mut state, mut hidden) = (zeros::<B>(&p, [b, 2 * h]), zeros::<B>(&p, [b, h]));
    let (mut hs, mut saved) = (Vec::with_capacity(t), Vec::with_capacity(t));
    for s in 0..t {
        let pre = B::float_add(step::<B>(&p, s), B::float_matmul(hidden, w_h.clone()));
        let (next, values) = cell(pre, state);
        hidden = columns::<B>(next.clone(), 0, h);
        hs.push(hidden.clone());
        saved.push(values);
        state = next;
    }
    (stack::<B>(hs), B::float_cat(saved, 0))
}

/// The gradients of `lstm`'s `p` and `w_h` from its outputs and the gradient of every step's `h`.
pub fn lstm_backward<B: Backend>(
    w_h: FloatTensor<B>,
    hs: FloatTensor<B>,
    saved: FloatTensor<B>,
    grad: FloatTensor<B>,
    cell_backward: impl Fn(FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) -> (FloatTensor<B>, FloatTensor<B>),
) -> (FloatTensor<B>, FloatTensor<B>) {
    let [t, b, h] = dims3::<B>(&hs);
    let saved = B::float_reshape(saved, [t, b, LSTM_SAVED * h].into());
    let w_t = B::float_transpose(w_h);
    let (mut dh_next, mut dc) = (zeros::<B>(&hs, [b, h]), zeros::<B>(&hs, [b, h]));
    let mut dp = Vec::with_capacity(t);
    for s in (0..t).rev() {
        // the cell state this step started from: the last step's new cell (column block 4)
        let c = match s {
            0 => zeros::<B>(&hs, [b, h]),
            s => columns::<B>(step::<B>(&saved, s - 1), 4 * h, 5 * h),
        };
        let dh = B::float_add(step::<B>(&grad, s), dh_next);
        let (d_pre, d_c) = cell_backward(step::<B>(&saved, s), c, dh, dc);
        dc = d_c;
        dh_next = match s {
            0 => zeros::<B>(&hs, [b, h]),
            _ => B::float_matmul(d_pre.clone(), w_t.clone()),
        };
        dp.push(d_pre);
    }
    dp.reverse();
    let dp = stack::<B>(dp);
    let dw = B::float_matmul(B::float_transpose(previous::<B>(&hs)), B::float_reshape(dp.clone(), [t * b, 4 * h].into()));
    (dp, dw)
}

/// A GRU layer (reset after the hidden product) from a zero state over `xp` (`[steps, batch,
/// 3·hidden]`, the input's product with the gates' input weights and their biases), with hidden
/// weights `w_h` (`[hidden, 3·hidden]`) and biases `b_h` (`[3·hidden]`): every step's `h`, the
/// steps' saved values (`[steps · batch, GRU_SAVED · hidden]`) and hidden products (`[steps ·
/// batch, 3·hidden]`).
pub fn gru<B: Backend>(
    xp: FloatTensor<B>,
    w_h: FloatTensor<B>,
    b_h: FloatTensor<B>,
    cell: impl Fn(FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) -> (FloatTensor<B>, FloatTensor<B>),
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let [t, b, g] = dims3::<B>(&xp);
    let h = g / 3;
    let b_h = B::float_reshape(b_h, [1, g].into());
    let mut hidden = zeros::<B>(&xp, [b, h]);
    let (mut hs, mut saved, mut hps) = (Vec::with_capacity(t), Vec::with_capacity(t), Vec::with_capacity(t));
    for s in 0..t {
        let hp = B::float_add(B::float_matmul(hidden.clone(), w_h.clone()), b_h.clone());
        let (next, values) = cell(step::<B>(&xp, s), hp.clone(), hidden);
        hidden = next;
        hs.push(hidden.clone());
        saved.push(values);
        hps.push(hp);
    }
    debug_assert!(saved.iter().all(|v| v.shape()[1] == GRU_SAVED * h));
    (stack::<B>(hs), B::float_cat(saved, 0), B::float_cat(hps, 0))
}

/// The gradients of `gru`'s `xp`, `w_h` and `b_h` from its outputs and the gradient of every
/// step's `h`.
pub fn gru_backward<B: Backend>(
    w_h: FloatTensor<B>,
    hs: FloatTensor<B>,
    saved: FloatTensor<B>,
    hps: FloatTensor<B>,
    grad: FloatTensor<B>,
    cell_backward: impl Fn(FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>),
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let [t, b, h] = dims3::<B>(&hs);
    let saved = B::float_reshape(saved, [t, b, GRU_SAVED * h].into());
    let hps = B::float_reshape(hps, [t, b, 3 * h].into());
    let prev = previous::<B>(&hs);
    let prev3 = B::float_reshape(prev.clone(), [t, b, h].into());
    let w_t = B::float_transpose(w_h);
    let mut dh_next = zeros::<B>(&hs, [b, h]);
    let (mut dxp, mut dhp) = (Vec::with_capacity(t), Vec::with_capacity(t));
    for s in (0..t).rev() {
        let dh = B::float_add(step::<B>(&grad, s), dh_next);
        let (dx, dp, d_direct) = cell_backward(step::<B>(&saved, s), step::<B>(&hps, s), step::<B>(&prev3, s), dh);
        dh_next = match s {
            0 => d_direct,
            _ => B::float_add(d_direct, B::float_matmul(dp.clone(), w_t.clone())),
        };
        dxp.push(dx);
        dhp.push(dp);
    }
    dxp.reverse();
    dhp.reverse();
    let dhp = B::float_reshape(stack::<B>(dhp), [t * b, 3 * h].into());
    let dw = B::float_matmul(B::float_transpose(prev), dhp.clone());
    let db = B::float_reshape(B::float_sum_dim(dhp, 0), [3 * h].into());
    (stack::<B>(dxp), dw, db)
}
