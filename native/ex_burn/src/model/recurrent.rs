//! LSTM and GRU forward passes over Burn's own modules (their parameters, names and records), with
//! the gates stacked: the input's product with every gate's input weights for every step at once
//! (one product), then the layer's time loop as one op (`cells`), which takes the hidden state's
//! product with the gates' stacked hidden weights at each step. Burn's `forward` runs two
//! products a gate a step and copies the whole output sequence at each step, which makes a
//! step's kernel count (and its backward graph) several times larger.
//!
//! The arithmetic is Burn's, with an LSTM gate's two biases added together first: layers are
//! built with Burn's defaults (batch first, forward order, no clipping, sigmoid gates, tanh cell).

use burn::nn::{GateController, Gru, Lstm};
use burn::tensor::Tensor;

use super::cells;

/// The gates' input weights side by side (`[d_input, n·h]`) and their hidden weights (`[h, n·h]`).
fn weights(gates: &[&GateController]) -> (Tensor<2>, Tensor<2>) {
    let side_by_side = |w: fn(&GateController) -> Tensor<2>| Tensor::cat(gates.iter().map(|g| w(g)).collect(), 1);
    (side_by_side(|g| g.input_transform.weight.val()), side_by_side(|g| g.hidden_transform.weight.val()))
}

/// The gates' input biases side by side (`[n·h]`) and their hidden biases; `None` without biases.
fn biases(gates: &[&GateController]) -> (Option<Tensor<1>>, Option<Tensor<1>>) {
    let side_by_side = |b: fn(&GateController) -> Option<Tensor<1>>| gates.iter().map(|g| b(g)).collect::<Option<Vec<_>>>().map(|b| Tensor::cat(b, 0));
    (side_by_side(|g| Some(g.input_transform.bias.as_ref()?.val())), side_by_side(|g| Some(g.hidden_transform.bias.as_ref()?.val())))
}

/// `x @ w + bias`.
fn affine(x: Tensor<2>, w: Tensor<2>, bias: &Option<Tensor<1>>) -> Tensor<2> {
    let p = x.matmul(w);
    match bias {
        Some(bias) => p + bias.clone().unsqueeze(),
        None => p,
    }
}

/// The input sequence `[batch, steps, features]`'s product with `w` plus `bias`, for every step
/// at once, time-major: `[steps, batch, w's columns]`.
fn projected(x: Tensor<3>, w: Tensor<2>, bias: &Option<Tensor<1>>) -> Tensor<3> {
    let [b, t, f] = x.dims();
    let n = w.dims()[1];
    affine(x.swap_dims(0, 1).reshape([t * b, f]), w, bias).reshape([t, b, n])
}

/// The hidden states: every step's (`[batch, steps, h]`) when `all`, else the last one's
/// (`[batch, h]`).
pub enum Hidden {
    All(Tensor<3>),
    Last(Tensor<2>),
}

/// `Hidden` from every step's state, time-major.
fn collect(hs: Tensor<3>, all: bool) -> Hidden {
    let [t, b, h] = hs.dims();
    if all {
        Hidden::All(hs.swap_dims(0, 1))
    } else {
        Hidden::Last(hs.slice([t - 1..t, 0..b, 0..h]).reshape([b, h]))
    }
}

/// Burn's `Lstm::forward` from zero states (gates in the order input, forget, output, cell).
pub fn lstm(cell: &Lstm, x: Tensor<3>, all: bool) -> Hidden {
    debug_assert!(cell.batch_first && !cell.reverse && cell.clip.is_none() && !cell.input_forget);
    let forget = cell.forget_gate.as_ref().expect("layers are built with a forget gate");
    let gates = [&cell.input_gate, forget, &cell.output_gate, &cell.cell_gate];
    let (w_in, w_h) = weights(&gates);
    let bias = match biases(&gates) {
        (Some(b_in), Some(b_h)) => Some(b_in + b_h),
        _ => None,
    };
    collect(cells::lstm_layer(projected(x, w_in, &bias), w_h), all)
}

/// Burn's `Gru::forward` (reset after the hidden product) from a zero state (gates in the order
/// update, reset, new).
pub fn gru(cell: &Gru, x: Tensor<3>, all: bool) -> Hidden {
    debug_assert!(cell.reset_after && cell.clip.is_none());
    let gates = [&cell.update_gate, &cell.reset_gate, &cell.new_gate];
    let (w_in, w_h) = weights(&gates);
    // the new gate's hidden bias is scaled by the reset values, so it stays with its product
    let (b_in, b_h) = biases(&gates);
    collect(cells::gru_layer(projected(x, w_in, &b_in), w_h, b_h), all)
}

#[cfg(test)]
mod tests {
    use burn::module::{Module, ModuleVisitor, Param};
    use burn::nn::{GruConfig, LstmConfig};
    use burn::tensor::{Device, Distribution, Tensor};

    use super::*;

    fn device() -> Device {
        crate::testing::device().burn().unwrap().autodiff()
    }

    fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        t.into_data().try_to_vec::<f32>().unwrap()
    }

    fn assert_near(got: &[f32], want: &[f32], tol: f32, what: &str) {
        assert_eq!(got.len(), want.len(), "{what}: lengths");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{what}[{i}]: {g} against Burn's {w}");
        }
    }

    /// Every float parameter's gradient, in visiting order.
    struct Grads<'a>(&'a burn::tensor::Gradients, Vec<Vec<f32>>);
    impl ModuleVisitor for Grads<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.1.push(param.val().grad(self.0).map(values).expect("every parameter takes part"));
        }
    }

    fn grads<M: Module>(m: &M, loss: Tensor<1>) -> (Vec<Vec<f32>>, burn::tensor::Gradients) {
        let g = loss.backward();
        let mut v = Grads(&g, Vec::new());
        m.visit(&mut v);
        (v.1, g)
    }

    /// Output, input gradient and parameter gradients of `ours` and Burn's `reference` forward,
    /// under the loss `sum(out · r)`.
    fn compare<M: Module>(m: &M, ours: impl Fn(Tensor<3>) -> Tensor<3>, reference: impl Fn(Tensor<3>) -> Tensor<3>, what: &str) {
        let d = device();
        let x = Tensor::<3>::random([3, 5, 4], Distribution::Normal(0.0, 1.5), &d).require_grad();
        let r = Tensor::<3>::random([3, 5, 6], Distribution::Uniform(-1.0, 1.0), &d);
        let run = |f: &dyn Fn(Tensor<3>) -> Tensor<3>| {
            let out = f(x.clone());
            let (params, g) = grads(m, (out.clone() * r.clone()).sum());
            (values(out), values(x.grad(&g).unwrap()), params)
        };
        let (out, dx, dp) = run(&ours);
        let (want, want_dx, want_dp) = run(&reference);
        // Burn's f32 products round their inputs to TF32 on tensor-core GPUs, in another order
        // of products here than in Burn's forward
        let (out_tol, grad_tol) = if crate::testing::device().kind == crate::device::DeviceKind::Cpu { (1e-6, 1e-5) } else { (1e-4, 2e-3) };
        assert_near(&out, &want, out_tol, &format!("{what} output"));
        assert_near(&dx, &want_dx, grad_tol, &format!("{what} input gradient"));
        assert_eq!(dp.len(), want_dp.len());
        for (k, (g, w)) in dp.iter().zip(&want_dp).enumerate() {
            assert_near(g, w, grad_tol, &format!("{what} parameter {k} gradient"));
        }
    }

    fn all(h: Hidden) -> Tensor<3> {
        match h {
            Hidden::All(t) => t,
            Hidden::Last(_) => unreachable!("asked for every step"),
        }
    }

    fn last(h: Hidden) -> Tensor<2> {
        match h {
            Hidden::Last(t) => t,
            Hidden::All(_) => unreachable!("asked for the last step"),
        }
    }

    #[test]
    fn lstm_matches_burns_forward_and_gradients() {
        for bias in [true, false] {
            let cell = LstmConfig::new(4, 6, bias).init(&device());
            compare(&cell, |x| all(lstm(&cell, x, true)), |x| cell.forward(x, None).0, &format!("lstm bias {bias}"));
        }
    }

    #[test]
    fn gru_matches_burns_forward_and_gradients() {
        for bias in [true, false] {
            let cell = GruConfig::new(4, 6, bias).init(&device());
            compare(&cell, |x| all(gru(&cell, x, true)), |x| cell.forward(x, None), &format!("gru bias {bias}"));
        }
    }

    #[test]
    fn the_last_state_is_the_last_step_of_the_sequence() {
        let d = device();
        let x = Tensor::<3>::random([2, 7, 4], Distribution::Normal(0.0, 1.0), &d);
        let l = LstmConfig::new(4, 3, true).init(&d);
        let g = GruConfig::new(4, 3, true).init(&d);
        for (seq, end) in [
            (all(lstm(&l, x.clone(), true)), last(lstm(&l, x.clone(), false))),
            (all(gru(&g, x.clone(), true)), last(gru(&g, x.clone(), false))),
        ] {
            assert_eq!(end.dims(), [2, 3]);
            assert_eq!(values(seq.slice([0..2, 6..7, 0..3]).reshape([2, 3])), values(end));
        }
    }
}
