//! Recurrent gates on the CPU: the logistic function on the leading columns of each row and tanh on
//! the rest (an LSTM's input, forget and output gates beside its candidate cell; a GRU's update
//! and reset gates, or its candidate state alone), forwards and backwards, each one pass split
//! over the pool. flex computes each activation on one thread a value at a time, and Burn's
//! autodiff computes it again for the backward pass; here the backward pass reads the output.
//!
//! The values follow the math mode (`MathMode`): exact gives flex's bits (the vectorised
//! replicas of its logistic function and of std's tanh), fast gives `fast_math`'s lanes (within
//! 2 ulps). The gradients are the expressions Burn's backward passes evaluate, in the same order.

use super::{fast_math, tanh};
use super::vector::{par_chunks_for, sigmoid_slice};
use crate::ops::precision::MathMode;

/// Values of work per pool task: rows are handed out whole, at least this many values at a time.
const TASK: usize = 4096;

/// `out` (rows of `cols` values) split over the pool, `f(start, run)` per run of whole rows that
/// starts at value `start`.
pub(super) fn by_rows(out: &mut [f32], cols: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    assert!(cols > 0 && out.len() % cols == 0, "gates: {} values in rows of {cols}", out.len());
    let chunk = TASK.div_ceil(cols) * cols;
    // a transcendental costs several passes over memory
    let work = 8 * out.len();
    par_chunks_for(out, chunk, work, |i, run| f(i * chunk, run));
}

/// The logistic function on columns `..split` of each row of `cols` values of `xs`, tanh on
/// columns `split..`.
pub fn activate(xs: &[f32], cols: usize, split: usize) -> Vec<f32> {
    assert!(split <= cols, "gates: split {split} past {cols} columns");
    let fast = MathMode::global() == MathMode::Fast;
    let mut out = vec![0f32; xs.len()];
    by_rows(&mut out, cols, |start, run| {
        let x = &xs[start..start + run.len()];
        for (x, o) in x.chunks_exact(cols).zip(run.chunks_exact_mut(cols)) {
            activate_row(x, o, split, fast);
        }
    });
    out
}

/// `activate` on one row `x` into `o`, in the fast mode's lanes when `fast`.
pub(super) fn activate_row(x: &[f32], o: &mut [f32], split: usize, fast: bool) {
    let ((xs, xt), (os, ot)) = (x.split_at(split), o.split_at_mut(split));
    if fast {
        fast_math::sigmoid_slice(xs, os);
        fast_math::tanh_slice(xt, ot);
    } else {
        sigmoid_slice(xs, os);
        tanh::exact_slice(xt, ot);
    }
}

/// The gradient of `activate`'s input from its output `a` and the output's gradient `g`:
/// `g·a·(1 − a)` on the logistic columns, `g·(1 − a²)` on the tanh ones.
pub fn backward(a: &[f32], g: &[f32], cols: usize, split: usize) -> Vec<f32> {
    assert!(split <= cols && g.len() == a.len(), "gates: split {split} of {cols} columns, {} values, {} gradients", a.len(), g.len());
    let mut out = vec![0f32; a.len()];
    by_rows(&mut out, cols, |start, run| {
        let (a, g) = (&a[start..start + run.len()], &g[start..start + run.len()]);
        for ((a, g), o) in a.chunks_exact(cols).zip(g.chunks_exact(cols)).zip(run.chunks_exact_mut(cols)) {
            for j in 0..cols {
                o[j] = if j < split { g[j] * a[j] * (1.0 - a[j]) } else { g[j] * (-(a[j] * a[j]) + 1.0) };
            }
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(n: usize) -> Vec<f32> {
        let mut v: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.377).sin() * (1.0 + (i % 13) as f32)).collect();
        v[..8].copy_from_slice(&[0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e-30, -90.0, 90.0]);
        v
    }

    fn flex_sigmoid(x: f32) -> f32 {
        if x >= 0.0 {
            1.0 / (1.0 + (-x).exp())
        } else {
            x.exp() / (1.0 + x.exp())
        }
    }

    #[test]
    fn exact_gates_are_flexs_bits_on_and_off_the_pool() {
        // 3 rows of 40 stay on one thread; 900 rows of 40 are split over the pool
        for rows in [3, 900] {
            let (cols, split) = (40, 30);
            let xs = inputs(rows * cols);
            let got = activate(&xs, cols, split);
            for (i, (x, y)) in xs.iter().zip(&got).enumerate() {
                let want = if i % cols < split { flex_sigmoid(*x) } else { x.tanh() };
                assert_eq!(y.to_bits(), want.to_bits(), "x = {x} at column {}: {y} against {want}", i % cols);
            }
        }
    }

    #[test]
    fn the_split_takes_whole_rows_to_either_function() {
        let xs = inputs(64);
        let (all_sigmoid, all_tanh) = (activate(&xs, 8, 8), activate(&xs, 8, 0));
        for (i, x) in xs.iter().enumerate() {
            assert_eq!(all_sigmoid[i].to_bits(), flex_sigmoid(*x).to_bits());
            assert_eq!(all_tanh[i].to_bits(), x.tanh().to_bits());
        }
    }

    #[test]
    fn backward_is_burns_expressions() {
        for rows in [2, 700] {
            let (cols, split) = (48, 36);
            let a = activate(&inputs(rows * cols), cols, split);
            let g: Vec<f32> = (0..a.len()).map(|i| ((i as f32) * 0.91).cos() * 3.0).collect();
            let got = backward(&a, &g, cols, split);
            for i in 0..a.len() {
                let want = if i % cols < split { g[i] * a[i] * (1.0 - a[i]) } else { g[i] * (1.0 - a[i].powi(2)) };
                assert_eq!(got[i].to_bits(), want.to_bits(), "at {i}");
            }
        }
    }
}
