//! A validated program: the instruction list checked once (operands refer backwards, inputs
//! and outputs in range), with its run-time plan (when values die, which branch holds each
//! instruction) and its per-program constant cache. Execution is in `exec.rs`.

use burn::backend::Scalar;

use super::instr::{arity, Branch, Instr, Op};
use crate::device::DeviceRef;
use crate::dtype::NxType;
use crate::error::{Detail, ExError, ExResult};
use crate::ops::vocab::BinaryOp;
use crate::ops::{create, elementwise as ew};
use crate::tensor::Handle;

pub struct Program {
    pub(super) instrs: Vec<Instr>,
    pub(super) outputs: Vec<usize>,
    pub(super) inputs: usize,
    pub(super) device: DeviceRef,
    /// For each instruction, the instructions after which its value is no longer needed.
    pub(super) frees: Vec<Vec<usize>>,
    /// Per instruction and operand: a scalar constant already broadcast to the op's shape and
    /// cast to its compute type, used in place of the operand. The core ops broadcast scalars
    /// as zero-stride views, which Burn's CPU kernels walk several times slower than contiguous
    /// operands (relu's `max(x, 0)` and its gradient's selects dominated an MLP step); the
    /// values are the same, built once per program instead of once per step.
    pub(super) dense: Vec<Vec<Option<Handle>>>,
    /// The innermost `Cond` whose branches hold each instruction (`None`: top level).
    pub(super) parent: Vec<Option<usize>>,
    /// Instructions replaced by a fused one (`fuse`): never run.
    pub(super) dead: Vec<bool>,
}

/// Largest constant `dense` materializes (elements), so it never holds much memory.
const DENSE_LIMIT: usize = 1 << 20;

fn bad(i: usize, reason: &str) -> ExError {
    ExError::invalid_with(format!("invalid program: {reason}"), vec![("instruction", Detail::Int(i as i128))])
}


impl Program {
    /// The device the program's values live on.
    pub fn device(&self) -> &DeviceRef {
        &self.device
    }

    /// Whether every run does the same work, whatever the inputs' values: no loop runs a
    /// data-dependent number of times, no branch is chosen by them.
    pub fn same_work_each_run(&self) -> bool {
        !self.instrs.iter().any(|i| matches!(i.op, Op::While { .. } | Op::Cond { .. }))
    }

    /// Validates the graph (operands refer backwards, inputs and outputs in range) so `run`
    /// never indexes out of bounds.
    pub fn new(mut instrs: Vec<Instr>, outputs: Vec<usize>, inputs: usize, device: DeviceRef) -> ExResult<Self> {
        // flex's clamps test is_nan; GPU kernels lower to min/max instructions whose NaN
        // behaviour the shading languages leave open
        if device.kind == crate::device::DeviceKind::Cpu {
            clamp_constants(&mut instrs);
        }
        let n = instrs.len();
        let mut parent: Vec<Option<usize>> = vec![None; n];
        for (k, ins) in instrs.iter().enumerate() {
            if let Op::Cond { clauses, last } = &ins.op {
                let ranges = clauses.iter().flat_map(|(p, b)| [p, b]).chain(std::iter::once(last));
                for br in ranges {
                    if br.start > br.end || br.end > k || br.outs.iter().any(|&o| o >= k) {
                        return Err(bad(k, "cond branch out of range"));
                    }
                    // conds come after their branches, so inner ones claim their ranges first
                    for slot in &mut parent[br.start..br.end] {
                        if slot.is_none() {
                            *slot = Some(k);
                        }
                    }
                }
                if clauses.iter().any(|(p, _)| p.outs.len() != 1) || clauses.iter().any(|(_, b)| b.outs.len() != last.outs.len()) {
                    return Err(bad(k, "cond branches disagree"));
                }
            }
            if let Op::While { vars, cond, body } = &ins.op {
                let in_range = |br: &Branch| br.start <= br.end && br.end <= k && br.outs.iter().all(|&o| o < k);
                let slots_ok = vars.iter().all(|&v| v < k && matches!(instrs[v].op, Op::LoopVar));
                if !in_range(cond) || !in_range(body) || !slots_ok || cond.outs.len() != 1 || body.outs.len() != vars.len() || ins.args.len() != vars.len() {
                    return Err(bad(k, "malformed while"));
                }
                for br in [cond, body] {
                    for slot in &mut parent[br.start..br.end] {
                        if slot.is_none() {
                            *slot = Some(k);
                        }
                    }
                }
                for &v in vars {
                    if parent[v].is_none() {
                        parent[v] = Some(k);
                    }
                }
            }
        }
        let dead = if device.kind == crate::device::DeviceKind::Cpu { super::fuse::fuse(&mut instrs, &outputs, &parent) } else { vec![false; n] };
        // Liveness counts a use inside a cond's branches at the outermost cond, the top-level
        // point where those branches run.
        let top = |mut i: usize| {
            while let Some(k) = parent[i] {
                i = k;
            }
            i
        };
        let mut last_use = vec![usize::MAX; n];
        let mut used = vec![false; n];
        let mut mark = |v: usize, at: usize, last_use: &mut Vec<usize>| {
            last_use[v] = if used[v] { last_use[v].max(at) } else { at };
            used[v] = true;
        };
        for (i, ins) in instrs.iter().enumerate() {
            match arity(&ins.op) {
                Some(n) if n != ins.args.len() => return Err(bad(i, "wrong operand count")),
                None if ins.args.is_empty() => return Err(bad(i, "list op without operands")),
                _ => {}
            }
            match &ins.op {
                Op::Input(n) if *n >= inputs => return Err(bad(i, "input index out of range")),
                Op::Cond { clauses, .. } => {
                    for (p, _) in clauses {
                        mark(p.outs[0], top(i), &mut last_use);
                    }
                }
                Op::Pick { cond, out } => match instrs.get(*cond).map(|c| &c.op) {
                    Some(Op::Cond { clauses, last }) if *cond < i && *out < last.outs.len() => {
                        for br in clauses.iter().map(|(_, b)| b).chain(std::iter::once(last)) {
                            mark(br.outs[*out], top(i), &mut last_use);
                        }
                    }
                    Some(Op::While { vars, .. }) if *cond < i && *out < vars.len() => mark(vars[*out], top(i), &mut last_use),
                    _ => return Err(bad(i, "pick of a missing cond output")),
                },
                Op::While { vars, cond, body } => {
                    for &o in cond.outs.iter().chain(&body.outs).chain(vars) {
                        mark(o, top(i), &mut last_use);
                    }
                }
                _ => {}
            }
            for &a in &ins.args {
                if a >= i {
                    return Err(bad(i, "operand does not precede its use"));
                }
                if !dead[i] {
                    mark(a, top(i), &mut last_use);
                }
            }
            if !matches!(ins.op, Op::Cond { .. } | Op::While { .. } | Op::LoopVar) {
                crate::ops::check_alloc(&ins.shape, ins.ty)?;
            }
        }
        for &o in &outputs {
            if o >= n || parent[o].is_some() {
                return Err(bad(o, "output out of range"));
            }
            // outputs live to the end
            last_use[o] = usize::MAX;
        }
        let mut frees = vec![Vec::new(); n];
        for (v, &at) in last_use.iter().enumerate() {
            if at != usize::MAX {
                frees[at].push(v);
            }
        }
        let dense = dense_constants(&instrs, device)?;
        Ok(Program { instrs, outputs, inputs, device, frees, dense, parent, dead })
    }

    pub fn len(&self) -> usize {
        self.instrs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.instrs.is_empty()
    }

    pub fn inputs(&self) -> usize {
        self.inputs
    }
}


/// See `Op::ClampScalar`: a float max/min whose other operand already has the result's shape and
/// whose constant is one element. Operands that do not precede the op are left for `new` to
/// reject.
fn clamp_constants(instrs: &mut [Instr]) {
    for i in 0..instrs.len() {
        let Op::Binary { op, compute } = &instrs[i].op else { continue };
        if !matches!(op, BinaryOp::Max | BinaryOp::Min) || !compute.is_float() || instrs[i].args.len() != 2 || instrs[i].args.iter().any(|&a| a >= i) {
            continue;
        }
        let (max, compute) = (*op == BinaryOp::Max, *compute);
        let found = [(0, 1), (1, 0)].into_iter().find_map(|(c, x)| {
            let (c, x) = (instrs[i].args[c], instrs[i].args[x]);
            match instrs[c].op {
                Op::Full(v) if crate::tensor::numel(&instrs[c].shape) == 1 && instrs[x].shape == instrs[i].shape => {
                    let bound = match v {
                        Scalar::Float(f) => f,
                        Scalar::Int(n) => n as f64,
                        Scalar::UInt(n) => n as f64,
                        Scalar::Bool(b) => b as u8 as f64,
                    };
                    (!bound.is_nan()).then_some((x, bound))
                }
                _ => None,
            }
        });
        if let Some((x, bound)) = found {
            instrs[i].op = Op::ClampScalar { max, bound, compute };
            instrs[i].args = vec![x];
        }
    }
}

/// See `Program::dense`. Only operands that the op broadcasts and casts and nothing else
/// (binary ops, select's two branches) are replaced, so the op sees exactly the values it would
/// have built itself.
fn dense_constants(instrs: &[Instr], device: DeviceRef) -> ExResult<Vec<Vec<Option<Handle>>>> {
    let mut memo: std::collections::HashMap<(usize, Vec<usize>, NxType), Handle> = std::collections::HashMap::new();
    let mut dense = Vec::with_capacity(instrs.len());
    for ins in instrs {
        let (shape, slots, to): (Vec<usize>, &[usize], NxType) = match &ins.op {
            Op::Binary { compute, op } => {
                let s = crate::ops::broadcast_shape(&instrs[ins.args[0]].shape, &instrs[ins.args[1]].shape)?;
                // a constant exponent stays one element: `pow`'s CPU kernel takes it as is
                // (x^2 becomes x * x there)
                (s, if *op == BinaryOp::Pow { &[0] } else { &[0, 1] }, *compute)
            }
            Op::Select => {
                let (p, t, f) = (&instrs[ins.args[0]].shape, &instrs[ins.args[1]].shape, &instrs[ins.args[2]].shape);
                let s = crate::ops::broadcast_shape(&crate::ops::broadcast_shape(p, t)?, f)?;
                (s, &[1, 2], ins.ty)
            }
            _ => {
                dense.push(Vec::new());
                continue;
            }
        };
        let size = crate::tensor::numel(&shape);
        let mut row = vec![None; ins.args.len()];
        for &k in slots {
            let a = ins.args[k];
            let src = &instrs[a];
            if let Op::Full(v) = src.op {
                if crate::tensor::numel(&src.shape) == 1 && src.shape != shape && size > 1 && size <= DENSE_LIMIT {
                    let key = (a, shape.clone(), to);
                    let h = match memo.get(&key) {
                        Some(h) => h.clone(),
                        None => {
                            let h = ew::as_type(&create::full(v, shape.clone(), src.ty, device)?, to)?;
                            memo.insert(key, h.clone());
                            h
                        }
                    };
                    row[k] = Some(h);
                }
            }
        }
        dense.push(row);
    }
    Ok(dense)
}
