//! The instruction list and its interpreter.

use burn::backend::Scalar;

use crate::device::DeviceRef;
use crate::dtype::NxType;
use crate::error::{Detail, ExError, ExResult};
use crate::ops::conv::{self, ConvSpec};
use crate::ops::linalg::DotSpec;
use crate::ops::window::{self, WindowSpec};
use crate::ops::{create, elementwise as ew, indexing, linalg, reduce, shape as sh};
use crate::tensor::Handle;

/// One node of the expression. Operands are earlier instructions, named by position.
pub enum Op {
    /// The n-th run-time input (defn parameters first, then literal tensors of the graph).
    Input(usize),
    Full(Scalar),
    Iota(Option<usize>),
    Eye,
    Unary(String),
    /// `compute` is the type the op computes in (Nx's out type, or the merged operand type
    /// for comparisons and logical ops).
    Binary { op: String, compute: NxType },
    /// Float max/min against a non-NaN constant, rewritten from `Binary` by `Program::new`: one
    /// pass instead of a compare-and-select chain (ReLU is `max(x, 0)`).
    ClampScalar { max: bool, bound: f64, compute: NxType },
    Select,
    Clip,
    AsType,
    Reduce { op: String, axes: Option<Vec<usize>>, keep: bool },
    ArgReduce { op: String, axis: Option<usize>, keep: bool, high: bool },
    Dot { a: DotSpec, b: DotSpec },
    Reshape,
    Transpose(Vec<usize>),
    Broadcast(Vec<usize>),
    Slice { starts: Vec<usize>, lengths: Vec<usize>, strides: Vec<usize> },
    Concatenate(usize),
    Stack(usize),
    Reverse(Vec<usize>),
    /// The operand, unchanged (Nx `metadata` nodes such as `stop_grad`'s).
    Alias,
    /// The operand's bytes read as the result type (same bit width), as the backend does.
    Bitcast,
    Conv(ConvSpec),
    Window { op: String, spec: WindowSpec },
    /// Operand already in the result type (the lowering casts it, like the backend).
    Sort { axis: usize, desc: bool },
    ArgSort { axis: usize, desc: bool },
    /// Operands: tensor, one-element pad value, both in the result type.
    PadInterior(Vec<usize>),
    /// Operands: tensor, then one scalar start per axis, read at run time and clamped so the
    /// window fits (Nx's rule).
    DynSlice { lengths: Vec<usize>, strides: Vec<usize> },
    /// Operands: tensor (in the result type), update, then one scalar start per axis.
    PutSlice,
    /// Operands: tensor, source, init value; the tensor is compared in `select`.
    WindowScatter { max: bool, dims: Vec<usize>, strides: Vec<usize>, padding: Vec<(i64, i64)>, select: NxType },
    /// Operands: tensor, index tensor (last axis: one coordinate per entry of `axes`).
    Gather(Vec<usize>),
    /// Operands: tensor, index tensor, updates. `add` is indexed_add, else indexed_put.
    Indexed { op: indexing::IndexedOp, axes: Vec<usize> },
    /// Nx `cond`: runs the clauses' predicate ranges in order and the body range of the first
    /// one that holds (else `last`). Range instructions run only from here, so an untaken
    /// branch costs nothing and cannot fail. Produces no value: `Pick`s read the outputs.
    Cond { clauses: Vec<(Branch, Branch)>, last: Branch },
    /// Output `out` of the branch its `Cond` (an instruction index) took, or of the final
    /// state of its `While`.
    Pick { cond: usize, out: usize },
    /// A `While`'s loop state slot: the initial operand, then each body result.
    LoopVar,
    /// Nx `while`: operands are the initial state; `vars` the `LoopVar` slots; `cond` and
    /// `body` ranges read the slots and run (only from here) until the predicate is false.
    While { vars: Vec<usize>, cond: Branch, body: Branch },
}

/// Instructions `start..end` (contiguous, before their `Cond`) and the values they yield.
pub struct Branch {
    pub start: usize,
    pub end: usize,
    pub outs: Vec<usize>,
}

pub struct Instr {
    pub op: Op,
    pub args: Vec<usize>,
    pub ty: NxType,
    pub shape: Vec<usize>,
}

pub struct Program {
    instrs: Vec<Instr>,
    outputs: Vec<usize>,
    inputs: usize,
    device: DeviceRef,
    /// For each instruction, the instructions after which its value is no longer needed.
    frees: Vec<Vec<usize>>,
    /// Per instruction and operand: a scalar constant already broadcast to the op's shape and
    /// cast to its compute type, used in place of the operand. The core ops broadcast scalars
    /// as zero-stride views, which Burn's CPU kernels walk several times slower than contiguous
    /// operands (relu's `max(x, 0)` and its gradient's selects dominated an MLP step); the
    /// values are the same, built once per program instead of once per step.
    dense: Vec<Vec<Option<Handle>>>,
    /// The innermost `Cond` whose branches hold each instruction (`None`: top level).
    parent: Vec<Option<usize>>,
}

/// Largest constant `dense` materializes (elements), so it never holds much memory.
const DENSE_LIMIT: usize = 1 << 20;

fn arity(op: &Op) -> Option<usize> {
    Some(match op {
        Op::Input(_) | Op::Full(_) | Op::Iota(_) | Op::Eye | Op::Cond { .. } | Op::Pick { .. } => 0,
        Op::LoopVar => 0,
        Op::While { .. } => return None,
        Op::Unary(_) | Op::AsType | Op::Reduce { .. } | Op::ArgReduce { .. } | Op::Reshape | Op::ClampScalar { .. } => 1,
        Op::Transpose(_) | Op::Broadcast(_) | Op::Slice { .. } | Op::Reverse(_) | Op::Alias | Op::Bitcast => 1,
        Op::Binary { .. } | Op::Dot { .. } => 2,
        Op::Select | Op::Clip => 3,
        Op::Conv(_) | Op::PadInterior(_) | Op::Gather(_) => 2,
        Op::Window { .. } | Op::Sort { .. } | Op::ArgSort { .. } => 1,
        Op::Indexed { .. } | Op::WindowScatter { .. } => 3,
        Op::Concatenate(_) | Op::Stack(_) | Op::DynSlice { .. } | Op::PutSlice => return None,
    })
}

fn bad(i: usize, reason: &str) -> ExError {
    ExError::invalid_with(format!("invalid program: {reason}"), vec![("instruction", Detail::Int(i as i128))])
}

impl Program {
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
                mark(a, top(i), &mut last_use);
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
        Ok(Program { instrs, outputs, inputs, device, frees, dense, parent })
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

    /// Executes every instruction in order; values are dropped right after their last use so
    /// peak memory follows the graph's live set, not its size.
    pub fn run(&self, inputs: &[Handle]) -> ExResult<Vec<Handle>> {
        self.run_while(inputs, &|| true)
    }

    /// `run`, stopping with `ExError::Cancelled` as soon as `alive()` is false: it is asked
    /// before every top-level instruction and every loop iteration, so a caller that dies
    /// (the NIF asks the BEAM) does not leave a `while` spinning on a dirty scheduler.
    pub fn run_while(&self, inputs: &[Handle], alive: &dyn Fn() -> bool) -> ExResult<Vec<Handle>> {
        if inputs.len() != self.inputs {
            return Err(ExError::invalid_with(
                "wrong number of program inputs",
                vec![("expected", Detail::Int(self.inputs as i128)), ("given", Detail::Int(inputs.len() as i128))],
            ));
        }
        let mut values: Vec<Option<Handle>> = vec![None; self.instrs.len()];
        let mut chosen = vec![0usize; self.instrs.len()];
        for i in 0..self.instrs.len() {
            if self.parent[i].is_none() {
                if !alive() {
                    return Err(ExError::Cancelled);
                }
                self.exec(i, &mut values, &mut chosen, inputs, alive)?;
                for &v in &self.frees[i] {
                    values[v] = None;
                }
            }
        }
        Ok(self.outputs.iter().map(|&o| values[o].clone().expect("output kept alive")).collect())
    }

    fn exec(&self, i: usize, values: &mut [Option<Handle>], chosen: &mut [usize], inputs: &[Handle], alive: &dyn Fn() -> bool) -> ExResult<()> {
        let ins = &self.instrs[i];
        let value = |values: &[Option<Handle>], a: usize| -> Handle { values[a].clone().expect("value freed before its last use") };
        match &ins.op {
            Op::Cond { clauses, last } => {
                let mut pick = clauses.len();
                for (c, (pred, _)) in clauses.iter().enumerate() {
                    self.exec_range(i, pred, values, chosen, inputs, alive)?;
                    if indexing::read_ints(&value(values, pred.outs[0]))?.first().is_some_and(|&p| p != 0) {
                        pick = c;
                        break;
                    }
                }
                let body = clauses.get(pick).map(|(_, b)| b).unwrap_or(last);
                self.exec_range(i, body, values, chosen, inputs, alive)?;
                chosen[i] = pick;
            }
            Op::Pick { cond, out } => {
                let from = match &self.instrs[*cond].op {
                    Op::Cond { clauses, last } => clauses.get(chosen[*cond]).map(|(_, b)| b).unwrap_or(last).outs[*out],
                    Op::While { vars, .. } => vars[*out],
                    _ => unreachable!("checked in new"),
                };
                values[i] = Some(self.fix(value(values, from), ins)?);
            }
            // set by its While
            Op::LoopVar => {}
            Op::While { vars, cond, body } => {
                for (&v, &a) in vars.iter().zip(&ins.args) {
                    values[v] = Some(self.fix(value(values, a), &self.instrs[v])?);
                }
                loop {
                    if !alive() {
                        return Err(ExError::Cancelled);
                    }
                    self.exec_range(i, cond, values, chosen, inputs, alive)?;
                    if !indexing::read_ints(&value(values, cond.outs[0]))?.first().is_some_and(|&p| p != 0) {
                        break;
                    }
                    self.exec_range(i, body, values, chosen, inputs, alive)?;
                    let next: Vec<Handle> = body.outs.iter().map(|&o| value(values, o)).collect();
                    for (&v, h) in vars.iter().zip(next) {
                        values[v] = Some(self.fix(h, &self.instrs[v])?);
                    }
                }
            }
            _ => {
                let dense = &self.dense[i];
                let args: Vec<&Handle> = ins
                    .args
                    .iter()
                    .enumerate()
                    .map(|(k, &a)| match dense.get(k) {
                        Some(Some(h)) => h,
                        _ => values[a].as_ref().expect("value freed before its last use"),
                    })
                    .collect();
                let h = self.step(ins, &args, inputs)?;
                values[i] = Some(self.fix(h, ins)?);
            }
        }
        Ok(())
    }

    fn exec_range(&self, cond: usize, br: &Branch, values: &mut [Option<Handle>], chosen: &mut [usize], inputs: &[Handle], alive: &dyn Fn() -> bool) -> ExResult<()> {
        for j in br.start..br.end {
            if self.parent[j] == Some(cond) {
                self.exec(j, values, chosen, inputs, alive)?;
            }
        }
        Ok(())
    }

    fn step(&self, ins: &Instr, a: &[&Handle], inputs: &[Handle]) -> ExResult<Handle> {
        let (ty, shape) = (ins.ty, ins.shape.clone());
        match &ins.op {
            Op::Input(n) => {
                let h = &inputs[*n];
                if h.shape != ins.shape || h.ty != ins.ty {
                    return Err(ExError::invalid_with(
                        "program input does not match its template",
                        vec![("input", Detail::Int(*n as i128)), crate::ops::dims_detail("shape", &h.shape)],
                    ));
                }
                Ok(h.clone())
            }
            Op::Full(v) => create::full(*v, shape, ty, self.device),
            Op::Iota(axis) => create::iota(shape, ty, *axis, self.device),
            Op::Eye => create::eye(shape, ty, self.device),
            Op::Unary(op) => ew::unary(op, a[0], ty),
            Op::Binary { op, compute } => ew::binary(op, a[0], a[1], *compute),
            Op::ClampScalar { max, bound, compute } => ew::clamp_scalar(&ew::as_type(a[0], *compute)?, *max, *bound),
            Op::Select => ew::select(a[0], a[1], a[2], ty),
            Op::Clip => {
                let (x, lo, hi) = (ew::as_type(a[0], ty)?, ew::as_type(a[1], ty)?, ew::as_type(a[2], ty)?);
                ew::clip(&x, &lo, &hi)
            }
            Op::AsType => ew::as_type(a[0], ty),
            Op::Reduce { op, axes, keep } => reduce::reduce(op, a[0], axes.clone(), *keep, ty),
            Op::ArgReduce { op, axis, keep, high } => reduce::arg_reduce(op, a[0], *axis, *keep, *high, ty),
            Op::Dot { a: sa, b: sb } => linalg::dot(a[0], sa, a[1], sb, ty),
            Op::Reshape => sh::reshape(a[0], shape),
            Op::Transpose(axes) => sh::transpose(a[0], axes.clone()),
            Op::Broadcast(axes) => sh::broadcast(&ew::as_type(a[0], ty)?, shape, axes.clone()),
            Op::Slice { starts, lengths, strides } => sh::slice(a[0], starts.clone(), lengths.clone(), strides.clone()),
            Op::Concatenate(axis) => sh::concatenate(&owned(a), *axis, ty),
            Op::Stack(axis) => sh::stack(&owned(a), *axis, ty),
            Op::Reverse(axes) => indexing::reverse(&ew::as_type(a[0], ty)?, axes.clone()),
            Op::Alias => Ok(a[0].clone()),
            Op::Bitcast => {
                if a[0].ty.bytes() != ty.bytes() {
                    return Err(ExError::invalid("bitcast between types of different widths"));
                }
                Handle::from_bytes(a[0].to_bytes()?, shape, ty, self.device)
            }
            Op::Conv(spec) => conv::conv(a[0], a[1], spec, ty),
            Op::Window { op, spec } => window::window_reduce(op, a[0], spec, ty),
            Op::Sort { axis, desc } => indexing::sort(a[0], *axis, *desc),
            Op::ArgSort { axis, desc } => indexing::argsort(a[0], *axis, *desc, ty),
            Op::PadInterior(interior) => window::pad_interior(a[0], a[1], interior.clone()),
            Op::DynSlice { lengths, strides } => indexing::slice(a[0], &starts(&a[1..]), lengths.clone(), strides.clone()),
            Op::PutSlice => indexing::put_slice_at(a[0], &starts(&a[2..]), a[1]),
            Op::Gather(axes) => indexing::gather_axes(a[0], a[1], axes),
            Op::Indexed { op, axes } => indexing::indexed_axes(*op, a[0], a[1], a[2], axes, ty),
            Op::Cond { .. } | Op::Pick { .. } | Op::LoopVar | Op::While { .. } => unreachable!("run by exec"),
            Op::WindowScatter { max, dims, strides, padding, select } => {
                window::window_scatter(*max, a[0], a[1], a[2], dims.clone(), strides.clone(), padding.clone(), *select, ty)
            }
        }
    }

    /// The backend's `put/2`: the value takes exactly the type and shape Nx computed.
    fn fix(&self, h: Handle, ins: &Instr) -> ExResult<Handle> {
        let h = if h.ty == ins.ty { h } else { ew::as_type(&h, ins.ty)? };
        if h.shape == ins.shape {
            Ok(h)
        } else {
            sh::reshape(&h, ins.shape.clone())
        }
    }
}

/// See `Op::ClampScalar`: a float max/min whose other operand already has the result's shape and
/// whose constant is one element. Operands that do not precede the op are left for `new` to
/// reject.
fn clamp_constants(instrs: &mut [Instr]) {
    for i in 0..instrs.len() {
        let Op::Binary { op, compute } = &instrs[i].op else { continue };
        if !(op == "max" || op == "min") || !compute.is_float() || instrs[i].args.len() != 2 || instrs[i].args.iter().any(|&a| a >= i) {
            continue;
        }
        let (max, compute) = (op == "max", *compute);
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
            Op::Binary { compute, .. } => {
                let s = crate::ops::broadcast_shape(&instrs[ins.args[0]].shape, &instrs[ins.args[1]].shape)?;
                (s, &[0, 1], *compute)
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

/// Start operands, read when the slice runs.
fn starts(a: &[&Handle]) -> Vec<indexing::Start> {
    a.iter().map(|h| indexing::Start::Dynamic((*h).clone())).collect()
}

fn owned(a: &[&Handle]) -> Vec<Handle> {
    a.iter().map(|h| (*h).clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{device, f32s, floats, ints};

    fn ins(op: Op, args: &[usize], ty: NxType, shape: &[usize]) -> Instr {
        Instr { op, args: args.to_vec(), ty, shape: shape.to_vec() }
    }

    const F32: NxType = NxType::F(32);

    fn bin(op: &str) -> Op {
        Op::Binary { op: op.into(), compute: F32 }
    }

    /// max/min against a constant run as one clamp and still propagate NaN like Nx.
    #[test]
    fn max_and_min_with_a_constant_become_clamps() {
        let x = [f32::NAN, -2.0, 0.5, 3.0];
        for (op, want) in [("max", [0.0, 0.5, 1.0]), ("min", [-2.0, 0.0, 0.0])] {
            // op(x, 0) with an s32 constant, then min(_, 1.0) with the constant second
            let prog = Program::new(
                vec![
                    ins(Op::Input(0), &[], F32, &[4]),
                    ins(Op::Full(Scalar::Int(0)), &[], NxType::S(32), &[]),
                    ins(bin(op), &[1, 0], F32, &[4]),
                    ins(Op::Full(Scalar::Float(1.0)), &[], F32, &[]),
                    ins(bin("min"), &[2, 3], F32, &[4]),
                ],
                vec![4],
                1,
                device(),
            )
            .unwrap();
            if device().kind == crate::device::DeviceKind::Cpu {
                assert!(matches!(prog.instrs[2].op, Op::ClampScalar { max, .. } if max == (op == "max")));
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
                ins(bin("add"), &[3, 2], F32, &[2, 2]),
                ins(Op::Full(Scalar::Float(0.0)), &[], F32, &[]),
                ins(bin("max"), &[4, 5], F32, &[2, 2]),
                ins(Op::Reduce { op: "sum".into(), axes: None, keep: false }, &[6], F32, &[]),
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
    }

    #[test]
    fn results_take_the_declared_type_and_shape() {
        // greater gives u8; declaring s32 casts like the backend's put/2. Reshape to [2, 1] too.
        let prog = Program::new(
            vec![
                ins(Op::Input(0), &[], F32, &[2]),
                ins(Op::Full(Scalar::Float(1.5)), &[], F32, &[]),
                ins(bin("greater"), &[0, 1], NxType::S(32), &[2]),
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
        let fwd = vec![ins(Op::Input(0), &[], F32, &[1]), ins(Op::Unary("exp".into()), &[1], F32, &[1])];
        assert!(Program::new(fwd, vec![1], 1, device()).is_err());
        let arity = vec![ins(Op::Input(0), &[], F32, &[1]), ins(bin("add"), &[0], F32, &[1])];
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
                ins(Op::Binary { op: "greater".into(), compute: s32 }, &[0, 1], NxType::U(8), &[]),
                ins(Op::Full(Scalar::Int(1)), &[], s32, &[]),
                ins(Op::Binary { op: "add".into(), compute: s32 }, &[0, 3], s32, &[]),
                ins(Op::Binary { op: "quotient".into(), compute: s32 }, &[0, 1], s32, &[]),
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
                ins(Op::Binary { op: "less".into(), compute: s32 }, &[2, 4], NxType::U(8), &[]),
                ins(Op::Full(Scalar::Int(1)), &[], s32, &[]),
                ins(Op::Binary { op: "add".into(), compute: s32 }, &[2, 6], s32, &[]),
                ins(Op::Full(Scalar::Float(2.0)), &[], F32, &[]),
                ins(bin("multiply"), &[3, 8], F32, &[2]),
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
    }

    #[test]
    fn errors_from_ops_surface_as_errors() {
        // integer division by zero is an error in the core, not a panic or a wrong answer
        let s32 = NxType::S(32);
        let prog = Program::new(
            vec![
                ins(Op::Iota(None), &[], s32, &[3]),
                ins(Op::Full(Scalar::Int(0)), &[], s32, &[]),
                ins(Op::Binary { op: "quotient".into(), compute: s32 }, &[0, 1], s32, &[3]),
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
                ins(bin("add"), &[1, 1], F32, &[]),
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
}
