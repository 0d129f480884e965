//! Fusing Nx compositions that the CPU runs faster as one kernel, with the same bits.
//!
//! Softmax: Nx has no softmax op, so Axon (and users) compose it, and op by op it is five passes
//! over memory, each allocating a result: `reduce_max`, `subtract`, `exp`, `sum`, then `divide`
//! (or Axon's `multiply` by `1 / sum`). `Op::Softmax` does it row by row in one pass
//! (`kernels::cpu::vector::softmax_last`); the parts it replaces are marked dead, so they do not run.
//!
//! Layer norm: likewise composed (`Nx.mean`, `Nx.variance` or a mean of squares, `rsqrt`, and in
//! Axon a scale and shift), about ten ops of which four pass over the whole tensor;
//! `Op::LayerNorm` is one pass per row (`kernels::cpu::layer_norm`).

use burn::backend::Scalar;

use super::instr::{Instr, Op};
use crate::dtype::NxType;
use crate::ops::vocab::{BinaryOp, ReduceOp, UnaryOp};

const F32: NxType = NxType::F(32);

/// Every fusion below, in turn; returns which instructions are dead. Operands that do not precede
/// their use are left for `Program::new` to reject.
pub(super) fn fuse(instrs: &mut [Instr], outputs: &[usize], parent: &[Option<usize>]) -> Vec<bool> {
    let mut dead = vec![false; instrs.len()];
    softmax(instrs, outputs, parent, &mut dead);
    layer_norm(instrs, outputs, parent, &mut dead);
    dead
}

/// Rewrites each f32 softmax over the last axis into `Op::Softmax` where its parts are used by
/// nothing else (no other instruction, branch, loop or output) and sit in the same branch as the
/// result.
fn softmax(instrs: &mut [Instr], outputs: &[usize], parent: &[Option<usize>], dead: &mut [bool]) {
    let n = instrs.len();
    let uses = use_counts(instrs, outputs, dead);
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
}

struct Found {
    x: usize,
    recip: bool,
    /// The replaced instructions, each with the number of uses the composition itself makes.
    parts: Vec<(usize, usize)>,
}

/// How often each value is read: operands (of instructions not dead), branch and loop results,
/// loop slots, outputs.
fn use_counts(instrs: &[Instr], outputs: &[usize], dead: &[bool]) -> Vec<usize> {
    let mut uses = vec![0usize; instrs.len()];
    let mut count = |v: usize| {
        if let Some(u) = uses.get_mut(v) {
            *u += 1;
        }
    };
    for (ins, _) in instrs.iter().zip(dead).filter(|(_, &d)| !d) {
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

/// Rewrites each f32 layer norm over the last axis into `Op::LayerNorm` under `softmax`'s
/// conditions: every part used only by the composition, in the result's branch. Constants are
/// not parts (they may be shared; left alone they cost a scalar).
fn layer_norm(instrs: &mut [Instr], outputs: &[usize], parent: &[Option<usize>], dead: &mut [bool]) {
    let uses = use_counts(instrs, outputs, dead);
    for i in 0..instrs.len() {
        if dead[i] {
            continue;
        }
        let Some(found) = match_layer_norm(instrs, i) else { continue };
        let mut inside = std::collections::HashMap::<usize, usize>::new();
        for &k in found.parts.iter().chain([&i]) {
            for &a in &instrs[k].args {
                *inside.entry(a).or_default() += 1;
            }
        }
        let alone = found.parts.iter().all(|&p| uses[p] == inside.get(&p).copied().unwrap_or(0) && parent[p] == parent[i] && !dead[p]);
        if !alone {
            continue;
        }
        let Norm { x, affine, eps, mean_den, var_den, .. } = found;
        instrs[i].op = Op::LayerNorm { eps, mean_den, var_den, affine: affine.is_some() };
        instrs[i].args = match affine {
            Some((g, b)) => vec![x, g, b],
            None => vec![x],
        };
        for &p in &found.parts {
            dead[p] = true;
        }
    }
}

struct Norm {
    x: usize,
    /// gamma and beta
    affine: Option<(usize, usize)>,
    eps: f32,
    mean_den: f32,
    var_den: f32,
    /// The replaced instructions (not the result, nor constants).
    parts: Vec<usize>,
}

/// A one-element constant as the f32 an f32 op computes with: its value rounded once (an f16
/// or bf16 constant would be rounded twice, so those are not taken).
fn constant(instrs: &[Instr], k: usize) -> Option<f32> {
    let ins = &instrs[k];
    let exact_cast = matches!(ins.ty, NxType::F(32) | NxType::F(64) | NxType::S(_) | NxType::U(_));
    if !exact_cast || crate::tensor::numel(&ins.shape) != 1 {
        return None;
    }
    match ins.op {
        Op::Full(Scalar::Float(v)) => Some(v as f32),
        Op::Full(Scalar::Int(v)) => Some(v as f32),
        Op::Full(Scalar::UInt(v)) => Some(v as f32),
        _ => None,
    }
}

/// Operands `(0, 1)` and `(1, 0)` of binary instruction `k`, for matching either order.
fn both_orders(instrs: &[Instr], k: usize) -> Option<[(usize, usize); 2]> {
    let (a, b) = (arg(instrs, k, 0)?, arg(instrs, k, 1)?);
    Some([(a, b), (b, a)])
}

/// `sum(x, last axis, keep) / den`: `(x, den, [divide, sum])`.
fn mean_last(instrs: &[Instr], k: usize, rank: usize) -> Option<(usize, f32, Vec<usize>)> {
    if !is_binary(&instrs[k], BinaryOp::Divide) {
        return None;
    }
    let (s, d) = (arg(instrs, k, 0)?, arg(instrs, k, 1)?);
    let x = reduce_last(instrs, s, ReduceOp::Sum, rank)?;
    Some((x, constant(instrs, d)?, vec![k, s]))
}

/// `x - mean(x)`: `(x, den, parts)`.
fn centered(instrs: &[Instr], k: usize, rank: usize) -> Option<(usize, f32, Vec<usize>)> {
    if !is_binary(&instrs[k], BinaryOp::Subtract) || instrs[k].shape.len() != rank {
        return None;
    }
    let (x, m) = (arg(instrs, k, 0)?, arg(instrs, k, 1)?);
    let (of, den, mut parts) = mean_last(instrs, m, rank)?;
    (of == x && instrs[x].shape == instrs[k].shape && instrs[x].ty == F32).then(|| {
        parts.push(k);
        (x, den, parts)
    })
}

/// `rsqrt(sum(c * c or c ** 2) / var_den + eps)` with `c` centered: `(x, mean_den, var_den,
/// eps, parts)`.
fn inv_std(instrs: &[Instr], k: usize, rank: usize) -> Option<(usize, f32, f32, f32, Vec<usize>)> {
    if !matches!(instrs[k].op, Op::Unary(UnaryOp::Rsqrt)) || instrs[k].ty != F32 {
        return None;
    }
    let ve = arg(instrs, k, 0)?;
    if !is_binary(&instrs[ve], BinaryOp::Add) {
        return None;
    }
    let (var, eps) = both_orders(instrs, ve)?.into_iter().find_map(|(v, e)| Some((v, constant(instrs, e)?)))?;
    let (sq, var_den, var_parts) = mean_last(instrs, var, rank)?;
    let c = if is_binary(&instrs[sq], BinaryOp::Multiply) {
        let (a, b) = (arg(instrs, sq, 0)?, arg(instrs, sq, 1)?);
        (a == b).then_some(a)?
    } else if is_binary(&instrs[sq], BinaryOp::Pow) {
        (constant(instrs, arg(instrs, sq, 1)?)? == 2.0).then_some(arg(instrs, sq, 0)?)?
    } else {
        return None;
    };
    let (x, mean_den, mut parts) = centered(instrs, c, rank)?;
    if instrs[sq].shape != instrs[c].shape {
        return None;
    }
    parts.extend(var_parts);
    parts.extend([sq, ve, k]);
    Some((x, mean_den, var_den, eps, parts))
}

/// Whether `k` is an f32 gamma or beta of a last axis of `n`: n values, every other axis 1.
fn per_column(instrs: &[Instr], k: usize, n: usize) -> bool {
    let s = &instrs[k].shape;
    instrs[k].ty == F32 && s.last() == Some(&n) && s.iter().product::<usize>() == n
}

/// Whether instruction `i` ends an f32 layer norm over the last axis: `c * r` (either order), or
/// `(gamma * r) * c + beta` (any order of each product and sum), with `c = x - mean(x)` and `r`
/// the `inv_std` of the same x over the same mean.
fn match_layer_norm(instrs: &[Instr], i: usize) -> Option<Norm> {
    let out = &instrs[i];
    let rank = out.shape.len();
    let n = *out.shape.last()?;
    if n == 0 || out.ty != F32 {
        return None;
    }
    // the plain form, or the affine form's product and beta
    let (prod, beta) = if is_binary(out, BinaryOp::Add) {
        let (p, b) = both_orders(instrs, i)?.into_iter().find(|&(p, b)| is_binary(&instrs[p], BinaryOp::Multiply) && instrs[p].shape == out.shape && per_column(instrs, b, n))?;
        (p, Some(b))
    } else {
        (i, None)
    };
    if !is_binary(&instrs[prod], BinaryOp::Multiply) {
        return None;
    }
    both_orders(instrs, prod)?.into_iter().find_map(|(c, r)| {
        let (x, mean_den, mut parts) = centered(instrs, c, rank)?;
        if instrs[c].shape != out.shape {
            return None;
        }
        let (r, gamma) = match beta {
            None => (r, None),
            Some(_) => {
                if !is_binary(&instrs[r], BinaryOp::Multiply) || instrs[r].shape != out.shape {
                    return None;
                }
                let (inv, g) = both_orders(instrs, r)?.into_iter().find(|&(inv, g)| matches!(instrs[inv].op, Op::Unary(UnaryOp::Rsqrt)) && per_column(instrs, g, n))?;
                parts.push(r);
                (inv, Some(g))
            }
        };
        let (x2, mean_den2, var_den, eps, more) = inv_std(instrs, r, rank)?;
        // one mean serves both: the same tensor over the same count
        if x2 != x || mean_den2.to_bits() != mean_den.to_bits() || instrs[r].shape.last() != Some(&1) {
            return None;
        }
        parts.extend(more);
        if prod != i {
            parts.push(prod);
        }
        parts.sort_unstable();
        parts.dedup();
        Some(Norm { x, affine: gamma.zip(beta), eps, mean_den, var_den, parts })
    })
}
