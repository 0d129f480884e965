//! Programs built by hand and run: lowering-independent checks of validation and execution.

use burn::backend::Scalar;

use super::{Branch, Instr, Op, Program};
use crate::dtype::NxType;
use crate::error::ExError;
use crate::ops::linalg::DotSpec;
use crate::ops::vocab::{BinaryOp, ReduceOp, UnaryOp};
use crate::tensor::Handle;
use crate::testing::{device, f32s, floats, ints};

fn ins(op: Op, args: &[usize], ty: NxType, shape: &[usize]) -> Instr {
    Instr { op, args: args.to_vec(), ty, shape: shape.to_vec() }
}

const F32: NxType = NxType::F(32);

fn bin(op: BinaryOp) -> Op {
    Op::Binary { op, compute: F32 }
}

/// max/min against a constant run as one clamp and still propagate NaN like Nx.
#[test]
fn max_and_min_with_a_constant_become_clamps() {
    let x = [f32::NAN, -2.0, 0.5, 3.0];
    for (op, want) in [(BinaryOp::Max, [0.0, 0.5, 1.0]), (BinaryOp::Min, [-2.0, 0.0, 0.0])] {
        // op(x, 0) with an s32 constant, then min(_, 1.0) with the constant second
        let prog = Program::new(
            vec![
                ins(Op::Input(0), &[], F32, &[4]),
                ins(Op::Full(Scalar::Int(0)), &[], NxType::S(32), &[]),
                ins(bin(op), &[1, 0], F32, &[4]),
                ins(Op::Full(Scalar::Float(1.0)), &[], F32, &[]),
                ins(bin(BinaryOp::Min), &[2, 3], F32, &[4]),
            ],
            vec![4],
            1,
            device(),
        )
        .unwrap();
        if device().kind == crate::device::DeviceKind::Cpu {
            assert!(matches!(prog.instrs[2].op, Op::ClampScalar { max, .. } if max == (op == BinaryOp::Max)));
            assert!(matches!(prog.instrs[4].op, Op::ClampScalar { max: false, .. }));
        } else {
            assert!(matches!(prog.instrs[2].op, Op::Binary { .. }));
        }
        let got = floats(&prog.run(&[f32s(&x, &[4])]).unwrap()[0]);
        assert!(got[0].is_nan(), "{op}: {got:?}");
        assert_eq!(&got[1..], &want[..], "{op}");
    }
}

#[test]
fn runs_a_dense_layer_with_relu_in_one_call() {
    // relu(x . w + b), then its sum: the shape of one MLP forward step.
    let prog = Program::new(
        vec![
            ins(Op::Input(0), &[], F32, &[2, 3]),
            ins(Op::Input(1), &[], F32, &[3, 2]),
            ins(Op::Input(2), &[], F32, &[2]),
            ins(Op::Dot { a: DotSpec { contract: vec![1], batch: vec![] }, b: DotSpec { contract: vec![0], batch: vec![] } }, &[0, 1], F32, &[2, 2]),
            ins(bin(BinaryOp::Add), &[3, 2], F32, &[2, 2]),
            ins(Op::Full(Scalar::Float(0.0)), &[], F32, &[]),
            ins(bin(BinaryOp::Max), &[4, 5], F32, &[2, 2]),
            ins(Op::Reduce { op: ReduceOp::Sum, axes: None, keep: false }, &[6], F32, &[]),
        ],
        vec![6, 7],
        3,
        device(),
    )
    .unwrap();
    let x = f32s(&[1.0, 2.0, 3.0, -1.0, -2.0, -3.0], &[2, 3]);
    let w = f32s(&[1.0, 0.0, 0.0, 1.0, 1.0, 1.0], &[3, 2]);
    let b = f32s(&[0.5, -0.5], &[2]);
    let out = prog.run(&[x, w, b]).unwrap();
    assert_eq!(out.len(), 2);
    assert_eq!(out[0].shape, vec![2, 2]);
    assert_eq!(floats(&out[0]), vec![4.5, 4.5, 0.0, 0.0]);
    assert_eq!(out[1].shape, Vec::<usize>::new());
    assert_eq!(floats(&out[1]), vec![9.0]);
    // what the NIF layer asks before running a program in place
    assert!(prog.same_work_each_run());
}

#[test]
fn results_take_the_declared_type_and_shape() {
    // greater gives u8; declaring s32 casts like the backend's put/2. Reshape to [2, 1] too.
    let prog = Program::new(
        vec![
            ins(Op::Input(0), &[], F32, &[2]),
            ins(Op::Full(Scalar::Float(1.5)), &[], F32, &[]),
            ins(bin(BinaryOp::Greater), &[0, 1], NxType::S(32), &[2]),
            ins(Op::Reshape, &[2], NxType::S(32), &[2, 1]),
            ins(Op::Iota(None), &[], NxType::S(64), &[3]),
            ins(Op::Reverse(vec![0]), &[4], NxType::S(64), &[3]),
        ],
        vec![3, 5],
        1,
        device(),
    )
    .unwrap();
    let out = prog.run(&[f32s(&[1.0, 2.0], &[2])]).unwrap();
    assert_eq!((out[0].ty, out[0].shape.clone()), (NxType::S(32), vec![2, 1]));
    assert_eq!(ints(&out[0]), vec![0, 1]);
    assert_eq!(ints(&out[1]), vec![2, 1, 0]);
}

#[test]
fn an_output_may_be_an_input_and_appear_twice() {
    let prog = Program::new(vec![ins(Op::Input(0), &[], F32, &[1]), ins(Op::Alias, &[0], F32, &[1])], vec![0, 1, 0], 1, device()).unwrap();
    let out = prog.run(&[f32s(&[3.0], &[1])]).unwrap();
    assert_eq!(out.iter().map(|h| floats(h)[0]).collect::<Vec<_>>(), vec![3.0, 3.0, 3.0]);
}

#[test]
fn malformed_programs_are_rejected_before_running() {
    let fwd = vec![ins(Op::Input(0), &[], F32, &[1]), ins(Op::Unary(UnaryOp::Exp), &[1], F32, &[1])];
    assert!(Program::new(fwd, vec![1], 1, device()).is_err());
    let arity = vec![ins(Op::Input(0), &[], F32, &[1]), ins(bin(BinaryOp::Add), &[0], F32, &[1])];
    assert!(Program::new(arity, vec![1], 1, device()).is_err());
    assert!(Program::new(vec![ins(Op::Input(1), &[], F32, &[1])], vec![0], 1, device()).is_err());
    assert!(Program::new(vec![ins(Op::Input(0), &[], F32, &[1])], vec![3], 1, device()).is_err());
    assert!(Program::new(vec![ins(Op::Concatenate(0), &[], F32, &[1])], vec![0], 0, device()).is_err());
}

#[test]
fn run_checks_inputs_against_their_templates() {
    let prog = Program::new(vec![ins(Op::Input(0), &[], F32, &[2])], vec![0], 1, device()).unwrap();
    assert!(prog.run(&[]).is_err());
    assert!(prog.run(&[f32s(&[1.0, 2.0, 3.0], &[3])]).is_err());
    assert!(prog.run(&[f32s(&[1.0, 2.0], &[2])]).is_ok());
}

#[test]
fn gather_and_dynamic_slice_read_their_indices_at_run_time() {
    let s64 = NxType::S(64);
    let prog = Program::new(
        vec![
            ins(Op::Input(0), &[], F32, &[2, 3]),
            ins(Op::Input(1), &[], s64, &[2, 2]),
            ins(Op::Gather(vec![0, 1]), &[0, 1], F32, &[2]),
            ins(Op::Input(2), &[], s64, &[]),
            ins(Op::Full(Scalar::Int(-4)), &[], s64, &[]),
            // start 5 on an axis of 2 is clamped to 1 (Nx's rule), -4 to 0
            ins(Op::DynSlice { lengths: vec![1, 2], strides: vec![1, 1] }, &[0, 3, 4], F32, &[1, 2]),
        ],
        vec![2, 5],
        3,
        device(),
    )
    .unwrap();
    let x = f32s(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0], &[2, 3]);
    let out = prog.run(&[x.clone(), crate::testing::i64s(&[1, 2, 0, 1], &[2, 2]), crate::testing::i64s(&[5], &[])]).unwrap();
    assert_eq!(floats(&out[0]), vec![5.0, 1.0]);
    assert_eq!(floats(&out[1]), vec![3.0, 4.0]);
    // out-of-range coordinates are an error, not a clamped read
    assert!(prog.run(&[x, crate::testing::i64s(&[1, 3, 0, 1], &[2, 2]), crate::testing::i64s(&[0], &[])]).is_err());
}

#[test]
fn cond_runs_only_the_chosen_branch() {
    // if x > 0 then x + 1 else quotient(x, 0): the untaken branch would fail
    let s32 = NxType::S(32);
    let br = |start, end, outs: &[usize]| Branch { start, end, outs: outs.to_vec() };
    let prog = Program::new(
        vec![
            ins(Op::Input(0), &[], s32, &[]),
            ins(Op::Full(Scalar::Int(0)), &[], s32, &[]),
            ins(Op::Binary { op: BinaryOp::Greater, compute: s32 }, &[0, 1], NxType::U(8), &[]),
            ins(Op::Full(Scalar::Int(1)), &[], s32, &[]),
            ins(Op::Binary { op: BinaryOp::Add, compute: s32 }, &[0, 3], s32, &[]),
            ins(Op::Binary { op: BinaryOp::Quotient, compute: s32 }, &[0, 1], s32, &[]),
            ins(Op::Cond { clauses: vec![(br(2, 3, &[2]), br(3, 5, &[4]))], last: br(5, 6, &[5]) }, &[], NxType::U(8), &[]),
            ins(Op::Pick { cond: 6, out: 0 }, &[], s32, &[]),
        ],
        vec![7],
        1,
        device(),
    )
    .unwrap();
    let one = Handle::from_bytes(4i32.to_ne_bytes().to_vec(), vec![], s32, device()).unwrap();
    assert_eq!(ints(&prog.run(&[one]).unwrap()[0]), vec![5]);
    let neg = Handle::from_bytes((-4i32).to_ne_bytes().to_vec(), vec![], s32, device()).unwrap();
    assert!(prog.run(&[neg]).is_err());
    assert!(!prog.same_work_each_run(), "a branch chosen by the input's value");
}

#[test]
fn while_repeats_its_body_until_the_predicate_fails() {
    // {i, acc} = while {0, x}, i < 3, do: {i + 1, acc * 2}
    let s32 = NxType::S(32);
    let br = |start, end, outs: &[usize]| Branch { start, end, outs: outs.to_vec() };
    let prog = Program::new(
        vec![
            ins(Op::Full(Scalar::Int(0)), &[], s32, &[]),
            ins(Op::Input(0), &[], F32, &[2]),
            ins(Op::LoopVar, &[], s32, &[]),
            ins(Op::LoopVar, &[], F32, &[2]),
            ins(Op::Full(Scalar::Int(3)), &[], s32, &[]),
            ins(Op::Binary { op: BinaryOp::Less, compute: s32 }, &[2, 4], NxType::U(8), &[]),
            ins(Op::Full(Scalar::Int(1)), &[], s32, &[]),
            ins(Op::Binary { op: BinaryOp::Add, compute: s32 }, &[2, 6], s32, &[]),
            ins(Op::Full(Scalar::Float(2.0)), &[], F32, &[]),
            ins(bin(BinaryOp::Multiply), &[3, 8], F32, &[2]),
            ins(Op::While { vars: vec![2, 3], cond: br(4, 6, &[5]), body: br(6, 10, &[7, 9]) }, &[0, 1], NxType::U(8), &[]),
            ins(Op::Pick { cond: 10, out: 0 }, &[], s32, &[]),
            ins(Op::Pick { cond: 10, out: 1 }, &[], F32, &[2]),
        ],
        vec![11, 12],
        1,
        device(),
    )
    .unwrap();
    let out = prog.run(&[f32s(&[1.0, -0.5], &[2])]).unwrap();
    assert_eq!(ints(&out[0]), vec![3]);
    assert_eq!(floats(&out[1]), vec![8.0, -4.0]);
    assert!(!prog.same_work_each_run(), "a loop whose trips its values may decide");
}

#[test]
fn errors_from_ops_surface_as_errors() {
    // integer division by zero is an error in the core, not a panic or a wrong answer
    let s32 = NxType::S(32);
    let prog = Program::new(
        vec![
            ins(Op::Iota(None), &[], s32, &[3]),
            ins(Op::Full(Scalar::Int(0)), &[], s32, &[]),
            ins(Op::Binary { op: BinaryOp::Quotient, compute: s32 }, &[0, 1], s32, &[3]),
        ],
        vec![2],
        0,
        device(),
    )
    .unwrap();
    assert!(prog.run(&[]).is_err());
}

/// A run whose caller has gone stops with `Cancelled`, even inside a loop that never ends.
#[test]
fn a_run_stops_when_its_caller_is_gone() {
    let checks = std::cell::Cell::new(0);
    let prog = Program::new(
        vec![
            ins(Op::Input(0), &[], F32, &[]),
            ins(Op::LoopVar, &[], F32, &[]),
            ins(Op::Full(Scalar::Int(1)), &[], NxType::U(8), &[]),
            ins(bin(BinaryOp::Add), &[1, 1], F32, &[]),
            ins(
                Op::While { vars: vec![1], cond: Branch { start: 2, end: 3, outs: vec![2] }, body: Branch { start: 3, end: 4, outs: vec![3] } },
                &[0],
                F32,
                &[],
            ),
            ins(Op::Pick { cond: 4, out: 0 }, &[], F32, &[]),
        ],
        vec![5],
        1,
        device(),
    )
    .unwrap();
    let alive = || {
        checks.set(checks.get() + 1);
        checks.get() < 50
    };
    assert!(matches!(prog.run_while(&[f32s(&[1.0], &[])], &alive), Err(ExError::Cancelled)));
    assert_eq!(checks.get(), 50);
}

/// Softmax over the last axis as Nx composes it: x, max, [alias], x - max, exp, sum, then
/// `e / s` or Axon's `(1 / s) * e`. `keep_e` also outputs `e`, which must keep the parts.
fn softmax_program(shape: &[usize], recip: bool, alias: bool, keep_e: bool) -> Program {
    let r = shape.len();
    let mut kept = shape.to_vec();
    kept[r - 1] = 1;
    let reduce = |op| Op::Reduce { op, axes: Some(vec![r - 1]), keep: true };
    let mut v = vec![ins(Op::Input(0), &[], F32, shape), ins(reduce(ReduceOp::ReduceMax), &[0], F32, &kept)];
    if alias {
        v.push(ins(Op::Alias, &[1], F32, &kept));
    }
    let m = v.len() - 1;
    v.push(ins(bin(BinaryOp::Subtract), &[0, m], F32, shape));
    v.push(ins(Op::Unary(UnaryOp::Exp), &[m + 1], F32, shape));
    let e = m + 2;
    v.push(ins(reduce(ReduceOp::Sum), &[e], F32, &kept));
    if recip {
        v.push(ins(Op::Full(Scalar::Float(1.0)), &[], F32, &[]));
        v.push(ins(bin(BinaryOp::Divide), &[e + 2, e + 1], F32, &kept));
        v.push(ins(bin(BinaryOp::Multiply), &[e + 3, e], F32, shape));
    } else {
        v.push(ins(bin(BinaryOp::Divide), &[e, e + 1], F32, shape));
    }
    let out = v.len() - 1;
    let outputs = if keep_e { vec![out, e] } else { vec![out] };
    Program::new(v, outputs, 1, device()).unwrap()
}

/// Values with every special case, varied magnitudes and whole rows of -inf and of -0.0.
fn softmax_inputs(shape: &[usize]) -> Vec<f32> {
    softmax_inputs_with(shape, &[0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e-40, 88.0, -104.0, 3e38, -3e38])
}

/// `softmax_inputs` with `specials` among the varied values.
fn softmax_inputs_with(shape: &[usize], specials: &[f32]) -> Vec<f32> {
    let n: usize = shape.iter().product();
    let cols = shape[shape.len() - 1];
    (0..n)
        .map(|i| match (i / cols, i % 13) {
            (1, _) => f32::NEG_INFINITY,
            (2, _) if cols > 1 => -0.0,
            (_, 0) => specials[(i / 13) % specials.len()],
            _ => ((i as f32) * 0.731).sin() * 30.0,
        })
        .collect()
}

/// The fused softmax gives the composition's bits (NaN where it has NaN) for both of Nx's forms,
/// every special value, rows short and long (both summation paths) and ranks 1-3; and its parts
/// stay when something else reads them.
#[test]
fn fused_softmax_equals_the_composition_bit_for_bit() {
    let cpu = device().kind == crate::device::DeviceKind::Cpu;
    let shapes = [vec![9], vec![3, 5], vec![1, 1], vec![7, 33], vec![4, 2, 17], vec![1024, 64], vec![2, 40_000], vec![5, 40_000], vec![6, 1000]];
    // finite rows (no NaN, no infinity) as well: the kernel's path for them is its own; and rows
    // spanning less than 41, whose quotients the kernel takes unchecked
    let finite = [0.0, -0.0, 1e-40, 88.0, -104.0, 3e38, -3e38, 1e-3];
    let narrow = |s: &[usize]| softmax_inputs_with(s, &[0.0, -0.0, 1e-40, 1e-3]).iter().map(|v| v * 0.6).collect::<Vec<f32>>();
    for (shape, values) in shapes.iter().flat_map(|s| [(s, softmax_inputs(s)), (s, softmax_inputs_with(s, &finite)), (s, narrow(s))]) {
        let x = f32s(&values, shape);
        for (recip, alias) in [(false, false), (true, true), (true, false)] {
            let fused = softmax_program(shape, recip, alias, false);
            let plain = softmax_program(shape, recip, alias, true);
            let last = fused.instrs.len() - 1;
            if cpu {
                assert!(matches!(fused.instrs[last].op, Op::Softmax { recip: r } if r == recip), "{shape:?}");
                assert_eq!(fused.dead.iter().filter(|&&d| d).count(), last - 1, "every part but the input is dead");
            }
            assert!(matches!(plain.instrs[plain.instrs.len() - 1].op, Op::Binary { .. }), "a part read elsewhere keeps the composition");
            let (a, b) = (floats(&fused.run(std::slice::from_ref(&x)).unwrap()[0]), floats(&plain.run(std::slice::from_ref(&x)).unwrap()[0]));
            assert_eq!(a.len(), b.len());
            for (k, (p, q)) in a.iter().zip(&b).enumerate() {
                assert!(p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan()), "{shape:?} recip {recip} at {k}: {p} vs {q}");
            }
        }
    }
}

/// Against an f64 softmax computed here: finite rows within 1e-6, a row of -inf is NaN
/// (-inf - -inf), as Nx.BinaryBackend gives.
#[test]
fn fused_softmax_matches_an_f64_reference() {
    let shape = [4, 300];
    let mut xs: Vec<f32> = (0..1200).map(|i| ((i as f32) * 0.37).sin() * 20.0).collect();
    xs[300..600].iter_mut().for_each(|v| *v = f32::NEG_INFINITY);
    xs[905] = f32::INFINITY;
    let got = floats(&softmax_program(&shape, false, true, false).run(&[f32s(&xs, &shape)]).unwrap()[0]);
    for (r, (row, out)) in xs.chunks(300).zip(got.chunks(300)).enumerate() {
        match r {
            1 => assert!(out.iter().all(|v| v.is_nan()), "row of -inf"),
            // +inf in the row: inf - inf is NaN there, exp(-inf) = 0 elsewhere, the sum NaN
            3 => assert!(out.iter().all(|v| v.is_nan()), "row with +inf"),
            _ => {
                let m = row.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
                let e: Vec<f64> = row.iter().map(|&v| (v as f64 - m).exp()).collect();
                let s: f64 = e.iter().sum();
                for (k, (&o, &ek)) in out.iter().zip(&e).enumerate() {
                    let want = ek / s;
                    assert!((o as f64 - want).abs() <= 1e-6 * want.max(1e-30) + 1e-12, "row {r} col {k}: {o} vs {want}");
                }
            }
        }
    }
}

/// Layer norm over the last axis as Nx composes it. `axon`: Axon's form (two means of x, the
/// variance through `pow(c, 2)`, then `(gamma * rsqrt(var + eps)) * c + beta` with gamma and beta
/// reshaped to {1, n}); otherwise a mean, `c * c`, and `c * rsqrt(eps + var)`. `keep` also outputs
/// the variance, which must keep the parts.
fn layer_norm_program(shape: &[usize], axon: bool, keep: bool) -> Program {
    let r = shape.len();
    let n = shape[r - 1];
    let mut kept = shape.to_vec();
    kept[r - 1] = 1;
    let sum = || Op::Reduce { op: ReduceOp::Sum, axes: Some(vec![r - 1]), keep: true };
    let s32 = NxType::S(32);
    let mut v = vec![
        ins(Op::Input(0), &[], F32, shape),
        ins(Op::Full(Scalar::Int(n as i64)), &[], s32, &[]),
        ins(Op::Full(Scalar::Float(1e-5)), &[], F32, &[]),
    ];
    let push = |v: &mut Vec<Instr>, op: Op, args: &[usize], s: &[usize]| {
        v.push(ins(op, args, F32, s));
        v.len() - 1
    };
    let s1 = push(&mut v, sum(), &[0], &kept);
    let mean = push(&mut v, bin(BinaryOp::Divide), &[s1, 1], &kept);
    let c = push(&mut v, bin(BinaryOp::Subtract), &[0, mean], shape);
    let sq = if axon {
        v.push(ins(Op::Full(Scalar::Int(2)), &[], s32, &[]));
        let two = v.len() - 1;
        push(&mut v, bin(BinaryOp::Pow), &[c, two], shape)
    } else {
        push(&mut v, bin(BinaryOp::Multiply), &[c, c], shape)
    };
    let s2 = push(&mut v, sum(), &[sq], &kept);
    let var = push(&mut v, bin(BinaryOp::Divide), &[s2, 1], &kept);
    let ve = push(&mut v, bin(BinaryOp::Add), &[2, var], &kept);
    let inv = push(&mut v, Op::Unary(UnaryOp::Rsqrt), &[ve], &kept);
    let out = if axon {
        let row: Vec<usize> = (0..r).map(|k| if k == r - 1 { n } else { 1 }).collect();
        v.push(ins(Op::Input(1), &[], F32, &[n]));
        let g = v.len() - 1;
        let g = push(&mut v, Op::Reshape, &[g], &row);
        let scale = push(&mut v, bin(BinaryOp::Multiply), &[g, inv], shape);
        // the normalisation's own mean of x
        let s3 = push(&mut v, sum(), &[0], &kept);
        let mean2 = push(&mut v, bin(BinaryOp::Divide), &[s3, 1], &kept);
        let c2 = push(&mut v, bin(BinaryOp::Subtract), &[0, mean2], shape);
        let p = push(&mut v, bin(BinaryOp::Multiply), &[scale, c2], shape);
        v.push(ins(Op::Input(2), &[], F32, &[n]));
        let b = v.len() - 1;
        let b = push(&mut v, Op::Reshape, &[b], &row);
        push(&mut v, bin(BinaryOp::Add), &[p, b], shape)
    } else {
        push(&mut v, bin(BinaryOp::Multiply), &[c, inv], shape)
    };
    let outputs = if keep { vec![out, var] } else { vec![out] };
    Program::new(v, outputs, if axon { 3 } else { 1 }, device()).unwrap()
}

/// The fused layer norm gives the composition's bits in both forms, for rows short and long (both
/// summation paths), ranks 1-3, special values (a row of NaN and one with an infinity are NaN
/// throughout, a constant row is 0 or beta), and its parts stay when something else reads them.
/// On a GPU both run the same ops, within two ulps: the device's fusion may contract a product
/// and a sum into one fused multiply-add in one program and not in the other.
#[test]
fn fused_layer_norm_equals_the_composition_bit_for_bit() {
    let cpu = device().kind == crate::device::DeviceKind::Cpu;
    for shape in [vec![9], vec![3, 5], vec![1, 1], vec![7, 33], vec![4, 2, 17], vec![1024, 64], vec![2, 40_000], vec![5, 40_000]] {
        let n = shape[shape.len() - 1];
        let count: usize = shape.iter().product();
        let xs: Vec<f32> = (0..count)
            .map(|i| match (i / n, i % 11) {
                (1, _) if count > n => 2.5,
                (2, 3) => f32::NAN,
                (3, 4) => f32::INFINITY,
                (_, 5) => 1e30,
                _ => ((i as f32) * 0.731).sin() * 30.0 + 7.0,
            })
            .collect();
        let gamma: Vec<f32> = (0..n).map(|j| 1.0 + (j as f32 * 0.3).cos()).collect();
        let beta: Vec<f32> = (0..n).map(|j| (j as f32 * 0.7).sin()).collect();
        for axon in [false, true] {
            let fused = layer_norm_program(&shape, axon, false);
            let plain = layer_norm_program(&shape, axon, true);
            let last = fused.instrs.len() - 1;
            if cpu {
                assert!(matches!(fused.instrs[last].op, Op::LayerNorm { affine, .. } if affine == axon), "{shape:?} axon {axon}");
                let alive = (0..=last).filter(|&k| !fused.dead[k]).count();
                // x, the constants (n, eps; Axon's 2), Axon's gamma and beta with their reshapes, the result
                assert_eq!(alive, if axon { 9 } else { 4 }, "{shape:?} axon {axon}");
            }
            assert!(!plain.instrs.iter().any(|i| matches!(i.op, Op::LayerNorm { .. })), "a part read elsewhere keeps the composition");
            let inputs = if axon { vec![f32s(&xs, &shape), f32s(&gamma, &[n]), f32s(&beta, &[n])] } else { vec![f32s(&xs, &shape)] };
            let (a, b) = (floats(&fused.run(&inputs).unwrap()[0]), floats(&plain.run(&inputs).unwrap()[0]));
            assert_eq!(a.len(), b.len());
            for (k, (p, q)) in a.iter().zip(&b).enumerate() {
                let ulps = ((*p as f32).to_bits() as i64 - (*q as f32).to_bits() as i64).abs();
                let same = p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan()) || (!cpu && p.signum() == q.signum() && ulps <= 2);
                assert!(same, "{shape:?} axon {axon} at {k}: {p} vs {q}");
            }
            if count > 3 * n {
                assert!(a[2 * n..4 * n].iter().all(|v| v.is_nan()), "rows with NaN or inf");
                let want: Vec<f64> = if axon { beta.iter().map(|&b| b as f64).collect() } else { vec![0.0; n] };
                assert_eq!(&a[n..2 * n], &want[..], "a constant row");
            }
        }
    }
}

/// Against an f64 layer norm computed here: within a few f32 ulps of the row's scale.
#[test]
fn fused_layer_norm_matches_an_f64_reference() {
    let (rows, n) = (8, 300);
    let xs: Vec<f32> = (0..rows * n).map(|i| ((i as f32) * 0.37).sin() * 20.0 + (i / n) as f32).collect();
    let got = floats(&layer_norm_program(&[rows, n], false, false).run(&[f32s(&xs, &[rows, n])]).unwrap()[0]);
    for (row, out) in xs.chunks(n).zip(got.chunks(n)) {
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
        let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64;
        for (&x, &o) in row.iter().zip(out) {
            let want = (x as f64 - mean) / (var + 1e-5f32 as f64).sqrt();
            assert!((o as f64 - want).abs() <= 1e-5, "{o} vs {want}");
        }
    }
}
