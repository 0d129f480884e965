//! LSTM and GRU layers' time loops on the CPU, split by rows: a batch's rows never meet inside a
//! layer, so each block of rows runs every time step on one thread (the hidden product with
//! `gemm` straight into the step's pre-activations, then each row's step), and the threads meet
//! once per layer instead of twice per step. Per step, a layer's products are a few million
//! multiply-adds, below what flex hands gemm's own threads, so the step-by-step loop ran them on
//! one thread while the other waited. The hidden weights' gradient is one product over all steps.
//!
//! Each row's arithmetic is `cells`' (the same roundings); the products sum over the hidden
//! units in gemm's order, as flex's products do.

use super::cells::{fast, gru_output, gru_row, gru_row_backward, lstm_row, lstm_row_backward, GRU_SAVED, LSTM_SAVED};
use super::vector::{par_tasks, SharedMut};

/// Rows below which a block is not worth a thread of its own.
const MIN_ROWS: usize = 8;

/// `task(r0, r1)` for the blocks rows `0..b` are cut into, one block a task on the pool.
fn by_blocks(b: usize, task: impl Fn(usize, usize) + Sync) {
    let n = rayon::current_num_threads().min(b.div_ceil(MIN_ROWS)).max(1);
    let per = b.div_ceil(n);
    par_tasks(n, &|i| {
        let (r0, r1) = (i * per, b.min((i + 1) * per));
        if r0 < r1 {
            task(r0, r1);
        }
    });
}

/// `dst = dst·alpha + lhs·rhs` on the calling thread for `[m, k]` and `[k, n]` operands given by
/// their pointers and strides (column stride, row stride), `dst` `[m, n]` with rows `n` apart.
///
/// # Safety
/// Every element the operands' shapes and strides reach is readable, and `dst`'s `m` rows of
/// `n` are writable and alias nothing read.
#[allow(clippy::too_many_arguments)]
unsafe fn product(dst: *mut f32, alpha: f32, [m, k, n]: [usize; 3], lhs: *const f32, [lcs, lrs]: [isize; 2], rhs: *const f32, [rcs, rrs]: [isize; 2]) {
    gemm::gemm(m, n, k, dst, 1, n as isize, alpha != 0.0, lhs, lcs, lrs, rhs, rcs, rrs, alpha, 1.0, false, false, false, gemm::Parallelism::None)
}

/// An LSTM layer over `p` (time-major `[t, b, 4h]`: the input's product with the gates' input
/// weights plus their biases) with hidden weights `w_h` (`[h, 4h]`), from zero states: every
/// step's `h` (`[t, b, h]`) and the steps' saved values (`[t · b, LSTM_SAVED · h]`).
pub fn lstm_forward(p: &[f32], w_h: &[f32], [t, b, h]: [usize; 3]) -> (Vec<f32>, Vec<f32>) {
    let (g, w) = (4 * h, LSTM_SAVED * h);
    assert!(p.len() == t * b * g && w_h.len() == h * g, "lstm layer: {} gate values for [{t}, {b}, {g}], {} hidden weights", p.len(), w_h.len());
    let (mut hs, mut saved) = (vec![0f32; t * b * h], vec![0f32; t * b * w]);
    let (hs_at, saved_at) = (SharedMut(hs.as_mut_ptr()), SharedMut(saved.as_mut_ptr()));
    let fast = fast();
    by_blocks(b, |r0, r1| {
        let rows = r1 - r0;
        let (mut pre, mut c, mut hidden) = (vec![0f32; rows * g], vec![0f32; rows * h], vec![0f32; rows * h]);
        for s in 0..t {
            pre.copy_from_slice(&p[(s * b + r0) * g..(s * b + r1) * g]);
            if s > 0 {
                // SAFETY: `hidden` is `[rows, h]` and `w_h` `[h, g]`, both row-major; `pre` is
                // this task's own `[rows, g]`.
                unsafe { product(pre.as_mut_ptr(), 1.0, [rows, h, g], hidden.as_ptr(), [1, h as isize], w_h.as_ptr(), [1, g as isize]) };
            }
            for r in 0..rows {
                let at = s * b + r0 + r;
                // SAFETY: row `at` of `saved` and of `hs` belongs to this task's rows alone, and
                // both outlive `par_tasks`.
                let (sv, out) = unsafe { (std::slice::from_raw_parts_mut(saved_at.get().add(at * w), w), std::slice::from_raw_parts_mut(hs_at.get().add(at * h), h)) };
                lstm_row(&pre[r * g..(r + 1) * g], &c[r * h..(r + 1) * h], sv, fast);
                for j in 0..h {
                    out[j] = sv[2 * h + j] * sv[5 * h + j];
                }
                c[r * h..(r + 1) * h].copy_from_slice(&sv[4 * h..5 * h]);
                hidden[r * h..(r + 1) * h].copy_from_slice(out);
            }
        }
    });
    (hs, saved)
}

/// The gradients of `lstm_forward`'s `p` (`[t, b, 4h]`) and `w_h` (`[h, 4h]`) from its outputs and
/// the gradient of every step's `h` (`grad`, `[t, b, h]`).
pub fn lstm_backward(w_h: &[f32], hs: &[f32], saved: &[f32], grad: &[f32], [t, b, h]: [usize; 3]) -> (Vec<f32>, Vec<f32>) {
    let (g, w) = (4 * h, LSTM_SAVED * h);
    assert!(
        w_h.len() == h * g && hs.len() == t * b * h && saved.len() == t * b * w && grad.len() == hs.len(),
        "lstm layer backward: {} hidden weights, {} states, {} saved, {} gradient values for [{t}, {b}, {h}]",
        w_h.len(),
        hs.len(),
        saved.len(),
        grad.len()
    );
    let mut dp = vec![0f32; t * b * g];
    let dp_at = SharedMut(dp.as_mut_ptr());
    by_blocks(b, |r0, r1| {
        let rows = r1 - r0;
        let (mut dh_next, mut dh, mut dc, mut dc_prev) = (vec![0f32; rows * h], vec![0f32; rows * h], vec![0f32; rows * h], vec![0f32; rows * h]);
        let no_cell = vec![0f32; h];
        for s in (0..t).rev() {
            for r in 0..rows {
                let (at, u) = (s * b + r0 + r, r * h..(r + 1) * h);
                for (d, (gr, nx)) in dh[u.clone()].iter_mut().zip(grad[at * h..(at + 1) * h].iter().zip(&dh_next[u.clone()])) {
                    *d = gr + nx;
                }
                let c = if s == 0 { &no_cell[..] } else { &saved[(at - b) * w + 4 * h..(at - b) * w + 5 * h] };
                // SAFETY: row `at` of `dp` belongs to this task's rows alone and outlives `par_tasks`.
                let d_pre = unsafe { std::slice::from_raw_parts_mut(dp_at.get().add(at * g), g) };
                lstm_row_backward(&saved[at * w..(at + 1) * w], c, &dh[u.clone()], &dc[u.clone()], d_pre, &mut dc_prev[u]);
            }
            std::mem::swap(&mut dc, &mut dc_prev);
            if s > 0 {
                // `dh_next = d_pre · w_hᵀ` over this task's rows of the step
                // SAFETY: the step's rows r0..r1 of `dp` were written above by this task;
                // `w_h` is `[h, g]`, read as its transpose; `dh_next` is this task's own.
                unsafe {
                    product(dh_next.as_mut_ptr(), 0.0, [rows, g, h], dp_at.get().add((s * b + r0) * g), [1, g as isize], w_h.as_ptr(), [g as isize, 1]);
                }
            }
        }
    });
    let dw = hidden_weights_gradient(hs, &dp, [t, b, h], g);
    (dp, dw)
}

/// `Σ_s h_{s-1}ᵀ · d_s`, the hidden weights' gradient (`[h, g]`) from every step's state `hs`
/// (`[t, b, h]`) and the gradients `d` (`[t, b, g]`) of the hidden products: the states of
/// steps 0..t-1 against the gradients of steps 1..t (the first step's state is zero), split
/// by hidden units.
fn hidden_weights_gradient(hs: &[f32], d: &[f32], [t, b, h]: [usize; 3], g: usize) -> Vec<f32> {
    let mut dw = vec![0f32; h * g];
    let dw_at = SharedMut(dw.as_mut_ptr());
    let k = (t - 1) * b;
    if k > 0 {
        by_blocks(h, |u0, u1| {
            // SAFETY: rows u0..u1 of `dw` are this task's; `hs` read as `[h, k]` (unit `u`, row
            // `r` at `r·h + u`) and `d` from step 1 as `[k, g]`.
            unsafe { product(dw_at.get().add(u0 * g), 0.0, [u1 - u0, k, g], hs.as_ptr().add(u0), [h as isize, 1], d.as_ptr().add(b * g), [1, g as isize]) };
        });
    }
    dw
}

/// A GRU layer (reset after the hidden product) over `xp` (time-major `[t, b, 3h]`: the input's
/// product with the gates' input weights plus their input biases) with hidden weights `w_h`
/// (`[h, 3h]`) and biases `b_h` (`[3h]`), from a zero state: every step's `h` (`[t, b, h]`),
/// the steps' saved values (`[t · b, GRU_SAVED · h]`) and hidden products (`[t · b, 3h]`).
pub fn gru_forward(xp: &[f32], w_h: &[f32], b_h: &[f32], [t, b, h]: [usize; 3]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (g, w) = (3 * h, GRU_SAVED * h);
    assert!(xp.len() == t * b * g && w_h.len() == h * g && b_h.len() == g, "gru layer: {} gate values for [{t}, {b}, {g}], {} hidden weights, {} biases", xp.len(), w_h.len(), b_h.len());
    let (mut hs, mut saved, mut hps) = (vec![0f32; t * b * h], vec![0f32; t * b * w], vec![0f32; t * b * g]);
    let (hs_at, saved_at, hps_at) = (SharedMut(hs.as_mut_ptr()), SharedMut(saved.as_mut_ptr()), SharedMut(hps.as_mut_ptr()));
    let fast = fast();
    by_blocks(b, |r0, r1| {
        let rows = r1 - r0;
        let (mut hp, mut hidden, mut pre) = (vec![0f32; rows * g], vec![0f32; rows * h], vec![0f32; 2 * h]);
        for s in 0..t {
            hp.chunks_exact_mut(g).for_each(|row| row.copy_from_slice(b_h));
            if s > 0 {
                // SAFETY: `hidden` is `[rows, h]` and `w_h` `[h, g]`, both row-major; `hp` is
                // this task's own `[rows, g]`.
                unsafe { product(hp.as_mut_ptr(), 1.0, [rows, h, g], hidden.as_ptr(), [1, h as isize], w_h.as_ptr(), [1, g as isize]) };
            }
            for r in 0..rows {
                let at = s * b + r0 + r;
                // SAFETY: row `at` of `saved`, `hs` and `hps` belongs to this task's rows alone,
                // and all three outlive `par_tasks`.
                let (sv, out, hp_out) = unsafe {
                    (
                        std::slice::from_raw_parts_mut(saved_at.get().add(at * w), w),
                        std::slice::from_raw_parts_mut(hs_at.get().add(at * h), h),
                        std::slice::from_raw_parts_mut(hps_at.get().add(at * g), g),
                    )
                };
                let p = &hp[r * g..(r + 1) * g];
                gru_row(&xp[at * g..(at + 1) * g], p, sv, &mut pre, fast);
                gru_output(sv, &hidden[r * h..(r + 1) * h], out);
                hp_out.copy_from_slice(p);
                hidden[r * h..(r + 1) * h].copy_from_slice(out);
            }
        }
    });
    (hs, saved, hps)
}

/// The gradients of `gru_forward`'s `xp` (`[t, b, 3h]`), `w_h` (`[h, 3h]`) and `b_h` (`[3h]`)
/// from its outputs and the gradient of every step's `h` (`grad`, `[t, b, h]`).
pub fn gru_backward(w_h: &[f32], hs: &[f32], saved: &[f32], hps: &[f32], grad: &[f32], [t, b, h]: [usize; 3]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (g, w) = (3 * h, GRU_SAVED * h);
    assert!(
        w_h.len() == h * g && hs.len() == t * b * h && saved.len() == t * b * w && hps.len() == t * b * g && grad.len() == hs.len(),
        "gru layer backward: {} hidden weights, {} states, {} saved, {} products, {} gradient values for [{t}, {b}, {h}]",
        w_h.len(),
        hs.len(),
        saved.len(),
        hps.len(),
        grad.len()
    );
    let (mut dxp, mut dhp) = (vec![0f32; t * b * g], vec![0f32; t * b * g]);
    let (dxp_at, dhp_at) = (SharedMut(dxp.as_mut_ptr()), SharedMut(dhp.as_mut_ptr()));
    by_blocks(b, |r0, r1| {
        let rows = r1 - r0;
        let (mut dh_next, mut dh) = (vec![0f32; rows * h], vec![0f32; rows * h]);
        let no_state = vec![0f32; h];
        for s in (0..t).rev() {
            for r in 0..rows {
                let (at, u) = (s * b + r0 + r, r * h..(r + 1) * h);
                for (d, (gr, nx)) in dh[u.clone()].iter_mut().zip(grad[at * h..(at + 1) * h].iter().zip(&dh_next[u.clone()])) {
                    *d = gr + nx;
                }
                let prev = if s == 0 { &no_state[..] } else { &hs[(at - b) * h..(at - b + 1) * h] };
                // SAFETY: row `at` of `dxp` and `dhp` belongs to this task's rows alone, and both
                // outlive `par_tasks`.
                let (dx, dp) = unsafe { (std::slice::from_raw_parts_mut(dxp_at.get().add(at * g), g), std::slice::from_raw_parts_mut(dhp_at.get().add(at * g), g)) };
                gru_row_backward(&saved[at * w..(at + 1) * w], &hps[at * g..(at + 1) * g], prev, &dh[u.clone()], dx, dp, &mut dh_next[u]);
            }
            if s > 0 {
                // `dh_next += d_hp · w_hᵀ` over this task's rows of the step
                // SAFETY: the step's rows r0..r1 of `dhp` were written above by this task;
                // `w_h` is `[h, g]`, read as its transpose; `dh_next` is this task's own.
                unsafe {
                    product(dh_next.as_mut_ptr(), 1.0, [rows, g, h], dhp_at.get().add((s * b + r0) * g), [1, g as isize], w_h.as_ptr(), [g as isize, 1]);
                }
            }
        }
    });
    let dw = hidden_weights_gradient(hs, &dhp, [t, b, h], g);
    let mut db = vec![0f32; g];
    for row in dhp.chunks_exact(g) {
        for (d, v) in db.iter_mut().zip(row) {
            *d += v;
        }
    }
    (dxp, dw, db)
}
