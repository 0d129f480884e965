//! Running a program: every instruction in order, cond/while ranges only from their own
//! instruction, each op through the same core op (`crate::ops::*`) the backend's NIFs call.

use super::instr::{Branch, Instr, Op};
use super::program::Program;
use crate::error::{Detail, ExError, ExResult};
use crate::ops::{conv, create, elementwise as ew, indexing, linalg, reduce, shape as sh, window};
use crate::tensor::Handle;

impl Program {
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
            if self.parent[i].is_none() && !self.dead[i] {
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
                    if ew::read_ints(&value(values, pred.outs[0]))?.first().is_some_and(|&p| p != 0) {
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
                    if !ew::read_ints(&value(values, cond.outs[0]))?.first().is_some_and(|&p| p != 0) {
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
            if self.parent[j] == Some(cond) && !self.dead[j] {
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
            Op::Unary(op) => ew::unary(*op, a[0], ty),
            Op::Binary { op, compute } => ew::binary(*op, a[0], a[1], *compute),
            Op::ClampScalar { max, bound, compute } => ew::clamp_scalar(&ew::as_type(a[0], *compute)?, *max, *bound),
            Op::Select => ew::select(a[0], a[1], a[2], ty),
            Op::Clip => ew::clip(a[0], a[1], a[2], ty),
            Op::AsType => ew::as_type(a[0], ty),
            Op::Reduce { op, axes, keep } => reduce::reduce(*op, a[0], axes.clone(), *keep, ty),
            Op::Softmax { recip } => reduce::softmax_last(a[0], *recip, ty),
            Op::LayerNorm { eps, mean_den, var_den, .. } => {
                reduce::layer_norm_last(a[0], a.get(1).zip(a.get(2)).map(|(g, b)| (*g, *b)), *eps, (*mean_den, *var_den), ty)
            }
            Op::ArgReduce { op, axis, keep, high } => reduce::arg_reduce(*op, a[0], *axis, *keep, *high, ty),
            Op::Dot { a: sa, b: sb } => linalg::dot(a[0], sa, a[1], sb, ty),
            Op::Reshape => sh::reshape(a[0], shape),
            Op::Transpose(axes) => sh::transpose(a[0], axes.clone()),
            Op::Broadcast(axes) => sh::broadcast(a[0], shape, axes.clone(), ty),
            Op::Slice { starts, lengths, strides } => {
                let starts: Vec<_> = starts.iter().map(|&s| indexing::Start::Fixed(s)).collect();
                indexing::slice(a[0], &starts, lengths.clone(), strides.clone())
            }
            Op::Concatenate(axis) => sh::concatenate(&owned(a), *axis, ty),
            Op::Stack(axis) => sh::stack(&owned(a), *axis, ty),
            Op::Reverse(axes) => indexing::reverse(a[0], axes.clone(), ty),
            Op::Alias => Ok(a[0].clone()),
            Op::Bitcast => {
                if a[0].ty.bytes() != ty.bytes() {
                    return Err(ExError::invalid("bitcast between types of different widths"));
                }
                Handle::from_bytes(a[0].to_bytes()?, shape, ty, self.device)
            }
            Op::Conv(spec) => conv::conv(a[0], a[1], spec, ty),
            Op::Window { op, spec } => window::window_reduce(*op, a[0], spec, ty),
            Op::Sort { axis, desc } => indexing::sort(a[0], *axis, *desc, ty),
            Op::ArgSort { axis, desc } => indexing::argsort(a[0], *axis, *desc, ty),
            Op::Pad(config) => window::pad(a[0], a[1], config, ty),
            Op::DynSlice { lengths, strides } => indexing::slice(a[0], &starts(&a[1..]), lengths.clone(), strides.clone()),
            Op::PutSlice => indexing::put_slice_at(a[0], &starts(&a[2..]), a[1], ty),
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

/// Start operands, read when the slice runs.
fn starts(a: &[&Handle]) -> Vec<indexing::Start> {
    a.iter().map(|h| indexing::Start::Dynamic((*h).clone())).collect()
}

fn owned(a: &[&Handle]) -> Vec<Handle> {
    a.iter().map(|h| (*h).clone()).collect()
}
