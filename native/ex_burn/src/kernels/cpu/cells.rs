//! LSTM and GRU cells on the CPU: a step's activations, state update and output in one pass over
//! its rows, and the backward pass in another, each split over the pool. In Burn ops a step is a
//! dozen tensors (column slices of the gates, products, sums), each slice's backward pass writing
//! a gradient the size of all the gates.
//!
//! The forward values are those of the composition in `model::cells` (the activations of
//! `gates`, then the products and sums in its order), so exact mode gives flex's bits. The
//! backward pass evaluates the chain rule per value: the same expressions as Burn's backward
//! ops, summed in one order where Burn's graph sums a value's gradients in its own.

use super::gates::{activate_row, by_rows};
use crate::ops::precision::MathMode;

pub(super) fn fast() -> bool {
    MathMode::global() == MathMode::Fast
}

/// The rows of `buf` (rows of `widths.iter().sum()` values) cut into one buffer per column block.
fn split_columns<const N: usize>(buf: &[f32], widths: [usize; N]) -> [Vec<f32>; N] {
    let cols: usize = widths.iter().sum();
    let rows = buf.len() / cols;
    let mut out = widths.map(|w| Vec::with_capacity(rows * w));
    for row in buf.chunks_exact(cols) {
        let mut at = 0;
        for (o, w) in out.iter_mut().zip(widths) {
            o.extend_from_slice(&row[at..at + w]);
            at += w;
        }
    }
    out
}

/// Values saved per row by `lstm` for `lstm_backward`, in units of the hidden size: the input,
/// forget and output gates, the candidate cell, the new cell and its tanh.
pub const LSTM_SAVED: usize = 6;

/// One LSTM step for `pre` (rows of `4h` pre-activations: input, forget, output gate, candidate
/// cell) and `state` (rows of `[h, c]`, `2h`): the new state `[h', c']` with `c' = f·c + i·g`
/// and `h' = o·tanh(c')`, and the values the backward pass reads (`LSTM_SAVED · h` a row).
pub fn lstm(pre: &[f32], state: &[f32], h: usize) -> (Vec<f32>, Vec<f32>) {
    let rows = pre.len() / (4 * h).max(1);
    assert!(h > 0 && pre.len() == rows * 4 * h && state.len() == rows * 2 * h, "lstm cell: {} gate values and {} state values for {h} units", pre.len(), state.len());
    let fast = fast();
    let w = LSTM_SAVED * h;
    let mut saved = vec![0f32; rows * w];
    by_rows(&mut saved, w, |start, run| {
        for (r, s) in run.chunks_exact_mut(w).enumerate() {
            let row = start / w + r;
            lstm_row(&pre[row * 4 * h..][..4 * h], &state[row * 2 * h + h..][..h], s, fast);
        }
    });
    let mut out = vec![0f32; rows * 2 * h];
    for (o, s) in out.chunks_exact_mut(2 * h).zip(saved.chunks_exact(w)) {
        for j in 0..h {
            o[j] = s[2 * h + j] * s[5 * h + j];
            o[h + j] = s[4 * h + j];
        }
    }
    (out, saved)
}

/// One row of `lstm`: the pre-activations `pre` (`4h`) and cell state `c` (`h`) to the row's
/// saved values (`LSTM_SAVED · h`), of which `h' = o·tanh(c')` is the product of blocks 2 and 5.
pub(super) fn lstm_row(pre: &[f32], c: &[f32], saved: &mut [f32], fast: bool) {
    let h = c.len();
    let (acts, rest) = saved.split_at_mut(4 * h);
    activate_row(pre, acts, 3 * h, fast);
    let (c_new, tc) = rest.split_at_mut(h);
    for j in 0..h {
        c_new[j] = acts[h + j] * c[j] + acts[j] * acts[3 * h + j];
    }
    activate_row(c_new, tc, 0, fast);
}

/// The gradients of `lstm`'s pre-activations (rows of `4h`) and of its input cell state `c`
/// (rows of `h`) from its saved values, that input cell state, and the gradients of the new
/// state's `h'` and `c'` (`dh`, `dc`; rows of `h` each).
pub fn lstm_backward(saved: &[f32], c: &[f32], dh: &[f32], dc: &[f32], h: usize) -> (Vec<f32>, Vec<f32>) {
    let rows = c.len() / h.max(1);
    assert!(
        h > 0 && saved.len() == rows * LSTM_SAVED * h && dh.len() == c.len() && dc.len() == c.len(),
        "lstm cell backward: {} saved, {} cell, {} and {} gradient values for {h} units",
        saved.len(),
        c.len(),
        dh.len(),
        dc.len()
    );
    let mut both = vec![0f32; rows * 5 * h];
    by_rows(&mut both, 5 * h, |start, run| {
        for (r, o) in run.chunks_exact_mut(5 * h).enumerate() {
            let row = start / (5 * h) + r;
            let (d_pre, d_c) = o.split_at_mut(4 * h);
            let at = row * h..(row + 1) * h;
            lstm_row_backward(&saved[row * LSTM_SAVED * h..][..LSTM_SAVED * h], &c[at.clone()], &dh[at.clone()], &dc[at], d_pre, d_c);
        }
    });
    let [d_pre, d_c] = split_columns(&both, [4 * h, h]);
    (d_pre, d_c)
}

/// One row of `lstm_backward`: its saved values, input cell state `c` and the gradients `dh`, `dc`
/// of its new state to the gradients of its pre-activations (`4h`) and of `c` (`h`).
pub(super) fn lstm_row_backward(s: &[f32], c: &[f32], dh: &[f32], dc: &[f32], d_pre: &mut [f32], d_c: &mut [f32]) {
    let h = c.len();
    for j in 0..h {
        let (i, f, og, cand, tc) = (s[j], s[h + j], s[2 * h + j], s[3 * h + j], s[5 * h + j]);
        let dct = dc[j] + dh[j] * og * (-(tc * tc) + 1.0);
        d_pre[j] = dct * cand * i * (1.0 - i);
        d_pre[h + j] = dct * c[j] * f * (1.0 - f);
        d_pre[2 * h + j] = dh[j] * tc * og * (1.0 - og);
        d_pre[3 * h + j] = dct * i * (-(cand * cand) + 1.0);
        d_c[j] = dct * f;
    }
}

/// Values saved per row by `gru` for `gru_backward`, in units of the hidden size: the update
/// and reset gates and the candidate state.
pub const GRU_SAVED: usize = 3;

/// One GRU step (reset after the hidden product) for the input's and the hidden state's
/// products `xp` and `hp` (rows of `3h`: update, reset, new) and the state `hidden` (rows of
/// `h`): `h' = n·(1 − z) + z·h` with `[z, r] = σ(xp + hp)` and `n = tanh(xp_n + r·hp_n)`, and
/// the values the backward pass reads (`GRU_SAVED · h` a row).
pub fn gru(xp: &[f32], hp: &[f32], hidden: &[f32], h: usize) -> (Vec<f32>, Vec<f32>) {
    let rows = hidden.len() / h.max(1);
    assert!(h > 0 && xp.len() == rows * 3 * h && hp.len() == xp.len(), "gru cell: {} and {} gate values and {} state values for {h} units", xp.len(), hp.len(), hidden.len());
    let fast = fast();
    let w = GRU_SAVED * h;
    let mut saved = vec![0f32; rows * w];
    by_rows(&mut saved, w, |start, run| {
        let mut pre = vec![0f32; 2 * h];
        for (r, s) in run.chunks_exact_mut(w).enumerate() {
            let row = start / w + r;
            gru_row(&xp[row * 3 * h..][..3 * h], &hp[row * 3 * h..][..3 * h], s, &mut pre, fast);
        }
    });
    let mut out = vec![0f32; rows * h];
    for ((o, s), prev) in out.chunks_exact_mut(h).zip(saved.chunks_exact(w)).zip(hidden.chunks_exact(h)) {
        gru_output(s, prev, o);
    }
    (out, saved)
}

/// One row of `gru`: the products `x` and `p` (`3h` each) to the row's saved values (`[z, r, n]`),
/// with `pre` a scratch row of `2h`.
pub(super) fn gru_row(x: &[f32], p: &[f32], saved: &mut [f32], pre: &mut [f32], fast: bool) {
    let h = saved.len() / GRU_SAVED;
    for j in 0..2 * h {
        pre[j] = x[j] + p[j];
    }
    let (zr, n) = saved.split_at_mut(2 * h);
    activate_row(pre, zr, 2 * h, fast);
    for j in 0..h {
        pre[j] = x[2 * h + j] + zr[h + j] * p[2 * h + j];
    }
    activate_row(&pre[..h], n, 0, fast);
}

/// A row's new state `h' = n·(1 − z) + z·h` from its saved values and its state `prev`.
pub(super) fn gru_output(s: &[f32], prev: &[f32], out: &mut [f32]) {
    let h = prev.len();
    for j in 0..h {
        let (z, n) = (s[j], s[2 * h + j]);
        out[j] = n * (-z + 1.0) + z * prev[j];
    }
}

/// The gradients of `gru`'s products `xp` and `hp` (rows of `3h`) and its state (rows of `h`)
/// from its saved values, the hidden product `hp`, the state and the new state's gradient.
pub fn gru_backward(saved: &[f32], hp: &[f32], hidden: &[f32], grad: &[f32], h: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let rows = hidden.len() / h.max(1);
    assert!(
        h > 0 && saved.len() == rows * GRU_SAVED * h && hp.len() == rows * 3 * h && grad.len() == hidden.len(),
        "gru cell backward: {} saved, {} product, {} state, {} gradient values for {h} units",
        saved.len(),
        hp.len(),
        hidden.len(),
        grad.len()
    );
    let mut all = vec![0f32; rows * 7 * h];
    by_rows(&mut all, 7 * h, |start, run| {
        for (r, o) in run.chunks_exact_mut(7 * h).enumerate() {
            let row = start / (7 * h) + r;
            let (dxp, rest) = o.split_at_mut(3 * h);
            let (dhp, dh) = rest.split_at_mut(3 * h);
            let at = row * h..(row + 1) * h;
            gru_row_backward(&saved[row * GRU_SAVED * h..][..GRU_SAVED * h], &hp[row * 3 * h..][..3 * h], &hidden[at.clone()], &grad[at], dxp, dhp, dh);
        }
    });
    let [dxp, dhp, dh] = split_columns(&all, [3 * h, 3 * h, h]);
    (dxp, dhp, dh)
}

/// One row of `gru_backward`: its saved values, hidden product `p`, state `prev` and the new
/// state's gradient `g` to the gradients of its products (`3h` each) and of its state (`h`).
pub(super) fn gru_row_backward(s: &[f32], p: &[f32], prev: &[f32], g: &[f32], dxp: &mut [f32], dhp: &mut [f32], dh: &mut [f32]) {
    let h = prev.len();
    for j in 0..h {
        let (z, rs, n) = (s[j], s[h + j], s[2 * h + j]);
        let dn = g[j] * (-z + 1.0) * (-(n * n) + 1.0);
        let dz = g[j] * (prev[j] - n) * z * (1.0 - z);
        let dr = dn * p[2 * h + j] * rs * (1.0 - rs);
        // the update and reset gates take the same gradient through both products
        dxp[j] = dz;
        dxp[h + j] = dr;
        dxp[2 * h + j] = dn;
        dhp[j] = dz;
        dhp[h + j] = dr;
        dhp[2 * h + j] = dn * rs;
        dh[j] = g[j] * z;
    }
}
