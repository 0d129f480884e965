//! Fusing Nx compositions that the CPU runs faster as one kernel, with the same bits.
//!
//! Softmax: Nx has no softmax op, so Axon (and users) compose it, and op by op it is five passes
//! over memory, each allocating a result: `reduce_max`, `subtract`, `exp`, `sum`, then `divide`
//! (or Axon's `multiply` by `1 / sum`). `Op::Softmax` does it row by row in one pass
//! (`kernels::cpu::vector::softmax_last`); the parts it replaces are marked dead, so they do not run.

use burn::backend::Scalar;

use super::instr::{Instr, Op};
use crate::dtype::NxType;
use crate::ops::vocab::{BinaryOp, ReduceOp, UnaryOp};

const F32: NxType = NxType::F(32);

/// Rewrites each f32 softmax over the last axis into `Op::Softmax` where its parts are used by
/// nothing else (no other instruction, branch, loop or output) and sit in the same branch as the
/// result. Returns which instructions are dead. Operands that do not precede their use are left
/// for `Program::new` to reject.
pub(super) fn softmax(instrs: &mut [Instr], outputs: &[usize], parent: &[Option<usize>]) -> Vec<bool> {
    let n = instrs.len();
    let mut dead = vec![false; n];
    let uses = use_counts(instrs, outputs);
    for i in 0..n {
        let Some(found) = match_softmax(instrs, i) else { continue };
        let alone = found.parts.iter().all(|&(p, want)| uses[p] == want && parent[p] == parent[i] && !dead[p]);
        if !alone {
            continue;
        }
        instrs[i].op = Op::Softmax { recip: found.recip };
        instrs[i].args = vec![found.x];
        for &(p, _) in &found.parts {
            dead[p] = true;
        }
    }
    dead
}

struct Found {
    x: usize,
    recip: bool,
    /// The replaced instructions, each with the number of uses the composition itself makes.
    parts: Vec<(usize, usize)>,
}

/// How often each value is read: operands, branch and loop results, loop slots, outputs.
fn use_counts(instrs: &[Instr], outputs: &[usize]) -> Vec<usize> {
    let mut uses = vec![0usize; instrs.len()];
    let mut count = |v: usize| {
        if let Some(u) = uses.get_mut(v) {
            *u += 1;
        }
    };
    for ins in instrs {
        ins.args.iter().for_each(|&a| count(a));
        match &ins.op {
            Op::Cond { clauses, last } => {
                for br in clauses.iter().flat_map(|(p, b)| [p, b]).chain(std::iter::once(last)) {
                    br.outs.iter().for_each(|&o| count(o));
                }
            }
            Op::While { vars, cond, body } => {
                vars.iter().chain(&cond.outs).chain(&body.outs).for_each(|&o| count(o));
            }
            _ => {}
        }
    }
    outputs.iter().for_each(|&o| count(o));
    uses
}

/// Operand `j` of instruction `k`, if it precedes `k`.
fn arg(instrs: &[Instr], k: usize, j: usize) -> Option<usize> {
    instrs[k].args.get(j).copied().filter(|&a| a < k)
}

fn is_binary(ins: &Instr, want: BinaryOp) -> bool {
    matches!(ins.op, Op::Binary { op, compute } if op == want && compute == F32) && ins.ty == F32
}

/// `1 / s` with a one-element constant 1: `(constant, s)`.
fn one_over(instrs: &[Instr], r: usize) -> Option<(usize, usize)> {
    if !is_binary(&instrs[r], BinaryOp::Divide) {
        return None;
    }
    let (c, s) = (arg(instrs, r, 0)?, arg(instrs, r, 1)?);
    let one = match instrs[c].op {
        Op::Full(Scalar::Float(v)) => v == 1.0,
        Op::Full(Scalar::Int(v)) => v == 1,
        _ => false,
    };
    (one && crate::tensor::numel(&instrs[c].shape) == 1).then_some((c, s))
}

/// `op` of `x` over the last of `rank` axes, kept: its operand.
fn reduce_last(instrs: &[Instr], k: usize, want: ReduceOp, rank: usize) -> Option<usize> {
    let last_only = match &instrs[k].op {
        Op::Reduce { op, axes, keep: true } if *op == want => match axes {
            Some(axes) => axes.as_slice() == [rank - 1],
            None => rank == 1,
        },
        _ => false,
    };
    (last_only && instrs[k].ty == F32).then(|| arg(instrs, k, 0)).flatten()
}

/// Whether instruction `i` ends an f32 softmax over the last axis.
fn match_softmax(instrs: &[Instr], i: usize) -> Option<Found> {
    let out = &instrs[i];
    let rank = out.shape.len();
    if rank == 0 || out.shape[rank - 1] == 0 || out.ty != F32 {
        return None;
    }
    let mut parts = Vec::new();
    let (e, s, recip) = if is_binary(out, BinaryOp::Divide) {
        (arg(instrs, i, 0)?, arg(instrs, i, 1)?, false)
    } else if is_binary(out, BinaryOp::Multiply) {
        let (a, b) = (arg(instrs, i, 0)?, arg(instrs, i, 1)?);
        let (r, e) = if one_over(instrs, a).is_some() { (a, b) } else { (b, a) };
        let (c, s) = one_over(instrs, r)?;
        parts.extend([(r, 1), (c, 1)]);
        (e, s, true)
    } else {
        return None;
    };
    if reduce_last(instrs, s, ReduceOp::Sum, rank)? != e || !matches!(instrs[e].op, Op::Unary(UnaryOp::Exp)) || instrs[e].ty != F32 {
        return None;
    }
    let d = arg(instrs, e, 0)?;
    if !is_binary(&instrs[d], BinaryOp::Subtract) {
        return None;
    }
    let (x, mut m) = (arg(instrs, d, 0)?, arg(instrs, d, 1)?);
    // stop_grad and other metadata between the maximum and its use
    while matches!(instrs[m].op, Op::Alias) {
        parts.push((m, 1));
        m = arg(instrs, m, 0)?;
    }
    if reduce_last(instrs, m, ReduceOp::ReduceMax, rank)? != x {
        return None;
    }
    let same = [x, d, e].iter().all(|&k| instrs[k].shape == out.shape) && instrs[x].ty == F32;
    if !same {
        return None;
    }
    // e feeds both the sum and the result
    parts.extend([(s, 1), (e, 2), (d, 1), (m, 1)]);
    Some(Found { x, recip, parts })
}
