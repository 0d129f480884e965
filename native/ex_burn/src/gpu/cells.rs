//! `model::cells`' LSTM and GRU steps on the cube GPU backends: one thread per hidden unit of a
//! row, forwards and backwards, with the arithmetic of `kernels::cpu::cells` (the saved values
//! in the same layout).

use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeBackend;
use cubecl::prelude::*;

use crate::kernels::cpu::cells::{GRU_SAVED, LSTM_SAVED};
use crate::model::cells::Cells;

/// Threads per workgroup.
const THREADS: u32 = 256;

fn count(total: usize) -> CubeCount {
    CubeCount::Static((total as u32).div_ceil(THREADS).max(1), 1, 1)
}

impl Cells for CubeBackend {
    fn lstm_cell(pre: CubeTensor, state: CubeTensor) -> (CubeTensor, CubeTensor) {
        let [pre, state] = [pre, state].map(super::contiguous);
        let (rows, h) = (state.meta.shape()[0], state.meta.shape()[1] / 2);
        let out = super::output(&state, [rows, 2 * h]);
        let saved = super::output(&state, [rows, LSTM_SAVED * h]);
        let total = rows * h;
        lstm_forward::launch(
            &state.client.clone(),
            count(total),
            CubeDim::new_1d(THREADS),
            pre.into_buffer_arg(),
            state.into_buffer_arg(),
            out.clone().into_buffer_arg(),
            saved.clone().into_buffer_arg(),
            total,
            h,
        );
        (out, saved)
    }

    fn lstm_cell_backward(saved: CubeTensor, c: CubeTensor, dh: CubeTensor, dc: CubeTensor) -> (CubeTensor, CubeTensor) {
        let [saved, c, dh, dc] = [saved, c, dh, dc].map(super::contiguous);
        let (rows, h) = (c.meta.shape()[0], c.meta.shape()[1]);
        let d_pre = super::output(&c, [rows, 4 * h]);
        let d_c = super::output(&c, [rows, h]);
        let total = rows * h;
        lstm_backward::launch(
            &c.client.clone(),
            count(total),
            CubeDim::new_1d(THREADS),
            saved.into_buffer_arg(),
            c.into_buffer_arg(),
            dh.into_buffer_arg(),
            dc.into_buffer_arg(),
            d_pre.clone().into_buffer_arg(),
            d_c.clone().into_buffer_arg(),
            total,
            h,
        );
        (d_pre, d_c)
    }

    fn gru_cell(xp: CubeTensor, hp: CubeTensor, hidden: CubeTensor) -> (CubeTensor, CubeTensor) {
        let [xp, hp, hidden] = [xp, hp, hidden].map(super::contiguous);
        let (rows, h) = (hidden.meta.shape()[0], hidden.meta.shape()[1]);
        let out = super::output(&hidden, [rows, h]);
        let saved = super::output(&hidden, [rows, GRU_SAVED * h]);
        let total = rows * h;
        gru_forward::launch(
            &hidden.client.clone(),
            count(total),
            CubeDim::new_1d(THREADS),
            xp.into_buffer_arg(),
            hp.into_buffer_arg(),
            hidden.into_buffer_arg(),
            out.clone().into_buffer_arg(),
            saved.clone().into_buffer_arg(),
            total,
            h,
        );
        (out, saved)
    }

    fn gru_cell_backward(saved: CubeTensor, hp: CubeTensor, hidden: CubeTensor, grad: CubeTensor) -> (CubeTensor, CubeTensor, CubeTensor) {
        let [saved, hp, hidden, grad] = [saved, hp, hidden, grad].map(super::contiguous);
        let (rows, h) = (hidden.meta.shape()[0], hidden.meta.shape()[1]);
        let dxp = super::output(&hidden, [rows, 3 * h]);
        let dhp = super::output(&hidden, [rows, 3 * h]);
        let dh = super::output(&hidden, [rows, h]);
        let total = rows * h;
        gru_backward::launch(
            &hidden.client.clone(),
            count(total),
            CubeDim::new_1d(THREADS),
            saved.into_buffer_arg(),
            hp.into_buffer_arg(),
            hidden.into_buffer_arg(),
            grad.into_buffer_arg(),
            dxp.clone().into_buffer_arg(),
            dhp.clone().into_buffer_arg(),
            dh.clone().into_buffer_arg(),
            total,
            h,
        );
        (dxp, dhp, dh)
    }
}

#[cube]
fn sigmoid(x: f32) -> f32 {
    f32::new(1.0) / (f32::new(1.0) + (-x).exp())
}

/// Unit `j` of row `row`: the gates, `c' = f·c + i·g`, `h' = o·tanh(c')`; saved as
/// `[i, f, o, g, c', tanh(c')]`.
#[cube(launch)]
fn lstm_forward(pre: &[f32], state: &[f32], out: &mut [f32], saved: &mut [f32], total: usize, h: usize) {
    let t = ABSOLUTE_POS as usize;
    if t < total {
        let (row, j) = (t / h, t % h);
        let p = row * 4 * h + j;
        let i = sigmoid(pre[p]);
        let f = sigmoid(pre[p + h]);
        let o = sigmoid(pre[p + 2 * h]);
        let g = pre[p + 3 * h].tanh();
        let c = f * state[row * 2 * h + h + j] + i * g;
        let tc = c.tanh();
        let s = row * 6 * h + j;
        saved[s] = i;
        saved[s + h] = f;
        saved[s + 2 * h] = o;
        saved[s + 3 * h] = g;
        saved[s + 4 * h] = c;
        saved[s + 5 * h] = tc;
        out[row * 2 * h + j] = o * tc;
        out[row * 2 * h + h + j] = c;
    }
}

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn lstm_backward(saved: &[f32], c: &[f32], dh: &[f32], dc: &[f32], d_pre: &mut [f32], d_c: &mut [f32], total: usize, h: usize) {
    let t = ABSOLUTE_POS as usize;
    if t < total {
        let (row, j) = (t / h, t % h);
        let s = row * 6 * h + j;
        let (i, f, o, g, tc) = (saved[s], saved[s + h], saved[s + 2 * h], saved[s + 3 * h], saved[s + 5 * h]);
        let one = f32::new(1.0);
        let dct = dc[t] + dh[t] * o * (one - tc * tc);
        let p = row * 4 * h + j;
        d_pre[p] = dct * g * i * (one - i);
        d_pre[p + h] = dct * c[t] * f * (one - f);
        d_pre[p + 2 * h] = dh[t] * tc * o * (one - o);
        d_pre[p + 3 * h] = dct * i * (one - g * g);
        d_c[t] = dct * f;
    }
}

/// Unit `j` of row `row`: `[z, r] = σ(xp + hp)`, `n = tanh(xp_n + r·hp_n)`,
/// `h' = n·(1 − z) + z·h`; saved as `[z, r, n]`.
#[cube(launch)]
fn gru_forward(xp: &[f32], hp: &[f32], hidden: &[f32], out: &mut [f32], saved: &mut [f32], total: usize, h: usize) {
    let t = ABSOLUTE_POS as usize;
    if t < total {
        let (row, j) = (t / h, t % h);
        let p = row * 3 * h + j;
        let z = sigmoid(xp[p] + hp[p]);
        let r = sigmoid(xp[p + h] + hp[p + h]);
        let n = (xp[p + 2 * h] + r * hp[p + 2 * h]).tanh();
        saved[p] = z;
        saved[p + h] = r;
        saved[p + 2 * h] = n;
        out[t] = n * (f32::new(1.0) - z) + z * hidden[t];
    }
}

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn gru_backward(saved: &[f32], hp: &[f32], hidden: &[f32], grad: &[f32], dxp: &mut [f32], dhp: &mut [f32], dh: &mut [f32], total: usize, h: usize) {
    let t = ABSOLUTE_POS as usize;
    if t < total {
        let (row, j) = (t / h, t % h);
        let p = row * 3 * h + j;
        let (z, r, n) = (saved[p], saved[p + h], saved[p + 2 * h]);
        let one = f32::new(1.0);
        let g = grad[t];
        let dn = g * (one - z) * (one - n * n);
        let dz = g * (hidden[t] - n) * z * (one - z);
        let dr = dn * hp[p + 2 * h] * r * (one - r);
        dxp[p] = dz;
        dxp[p + h] = dr;
        dxp[p + 2 * h] = dn;
        dhp[p] = dz;
        dhp[p + h] = dr;
        dhp[p + 2 * h] = dn * r;
        dh[t] = g * z;
    }
}
