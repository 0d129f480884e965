//! NIFs of `ExBurn.Defn.Compiler`: build a program once, run it once per step.

use std::panic::{RefUnwindSafe, UnwindSafe};

use rustler::{Env, ResourceArc, Term};

use super::resource::{arg_list, TensorOut};
use super::{guard, term};
use crate::compiler::{Branch, Instr, Op, Program};
use crate::error::{ExError, ExResult};
use crate::ops::linalg::DotSpec;

pub struct ProgramRes(pub Program);

// The program is immutable once built; running it only reads it.
impl UnwindSafe for ProgramRes {}
impl RefUnwindSafe for ProgramRes {}

#[rustler::resource_impl]
impl rustler::Resource for ProgramRes {}

fn attr_err(expected: &'static str) -> ExError {
    ExError::Arg { name: "instruction", expected }
}

fn decode_op(name: &str, attrs: Term, ty: crate::dtype::NxType) -> ExResult<Op> {
    Ok(match name {
        "input" => Op::Input(term::usize_arg(attrs, "input")?),
        "full" => Op::Full(term::scalar(attrs, ty)?),
        "iota" => Op::Iota(term::opt_usize(attrs, "axis")?),
        "eye" => Op::Eye,
        "unary" => Op::Unary(term::op(attrs)?),
        "binary" => {
            let (op, compute): (Term, Term) = attrs.decode().map_err(|_| attr_err("{op, compute_type}"))?;
            Op::Binary { op: term::op(op)?, compute: term::decode_type(compute)? }
        }
        "select" => Op::Select,
        "clip" => Op::Clip,
        "as_type" => Op::AsType,
        "reshape" => Op::Reshape,
        "alias" => Op::Alias,
        "bitcast" => Op::Bitcast,
        "reduce" => {
            let (op, axes, keep): (Term, Term, Term) = attrs.decode().map_err(|_| attr_err("{op, axes, keep}"))?;
            Op::Reduce { op: term::op(op)?, axes: term::opt_axes(axes, "axes")?, keep: term::boolean(keep, "keep")? }
        }
        "arg_reduce" => {
            let (op, axis, keep, high): (Term, Term, Term, Term) =
                attrs.decode().map_err(|_| attr_err("{op, axis, keep, high}"))?;
            Op::ArgReduce {
                op: term::op(op)?,
                axis: term::opt_usize(axis, "axis")?,
                keep: term::boolean(keep, "keep")?,
                high: term::boolean(high, "high")?,
            }
        }
        "dot" => {
            let (ca, ba, cb, bb): (Term, Term, Term, Term) =
                attrs.decode().map_err(|_| attr_err("{contract_a, batch_a, contract_b, batch_b}"))?;
            Op::Dot {
                a: DotSpec { contract: term::usizes(ca, "contract_axes")?, batch: term::usizes(ba, "batch_axes")? },
                b: DotSpec { contract: term::usizes(cb, "contract_axes")?, batch: term::usizes(bb, "batch_axes")? },
            }
        }
        "transpose" => Op::Transpose(term::usizes(attrs, "axes")?),
        "broadcast" => Op::Broadcast(term::usizes(attrs, "axes")?),
        "reverse" => Op::Reverse(term::usizes(attrs, "axes")?),
        "slice" => {
            let (s, l, st): (Term, Term, Term) = attrs.decode().map_err(|_| attr_err("{starts, lengths, strides}"))?;
            Op::Slice { starts: term::usizes(s, "starts")?, lengths: term::usizes(l, "lengths")?, strides: term::usizes(st, "strides")? }
        }
        "concatenate" => Op::Concatenate(term::usize_arg(attrs, "axis")?),
        "stack" => Op::Stack(term::usize_arg(attrs, "axis")?),
        "conv" => Op::Conv(super::conv::spec(attrs)?),
        "window" => {
            let (op, spec): (Term, Term) = attrs.decode().map_err(|_| attr_err("{op, spec}"))?;
            Op::Window { op: term::op(op)?, spec: super::window::spec(spec)? }
        }
        "sort" | "argsort" => {
            let (axis, desc): (Term, Term) = attrs.decode().map_err(|_| attr_err("{axis, descending}"))?;
            let (axis, desc) = (term::usize_arg(axis, "axis")?, term::boolean(desc, "descending")?);
            if name == "sort" {
                Op::Sort { axis, desc }
            } else {
                Op::ArgSort { axis, desc }
            }
        }
        "pad_interior" => Op::PadInterior(term::usizes(attrs, "interior")?),
        "dynamic_slice" => {
            let (l, st): (Term, Term) = attrs.decode().map_err(|_| attr_err("{lengths, strides}"))?;
            Op::DynSlice { lengths: term::usizes(l, "lengths")?, strides: term::usizes(st, "strides")? }
        }
        "put_slice" => Op::PutSlice,
        "cond" => {
            let (clauses, last): (Vec<(Term, Term)>, Term) = attrs.decode().map_err(|_| attr_err("{[{pred, body}], last}"))?;
            let clauses = clauses.into_iter().map(|(p, b)| Ok((branch(p)?, branch(b)?))).collect::<ExResult<Vec<_>>>()?;
            Op::Cond { clauses, last: branch(last)? }
        }
        "loop_var" => Op::LoopVar,
        "while" => {
            let (vars, cond, body): (Term, Term, Term) = attrs.decode().map_err(|_| attr_err("{vars, cond, body}"))?;
            Op::While { vars: term::usizes(vars, "vars")?, cond: branch(cond)?, body: branch(body)? }
        }
        "pick" => {
            let (cond, out): (Term, Term) = attrs.decode().map_err(|_| attr_err("{cond, output}"))?;
            Op::Pick { cond: term::usize_arg(cond, "cond")?, out: term::usize_arg(out, "output")? }
        }
        "window_scatter" => {
            let (max, dims, strides, padding, select): (Term, Term, Term, Term, Term) =
                attrs.decode().map_err(|_| attr_err("{max, window_dimensions, strides, padding, select_type}"))?;
            Op::WindowScatter {
                max: term::boolean(max, "max")?,
                dims: term::usizes(dims, "window_dimensions")?,
                strides: term::usizes(strides, "strides")?,
                padding: super::conv::pairs(padding, "padding")?,
                select: term::decode_type(select)?,
            }
        }
        "gather" => Op::Gather(term::usizes(attrs, "axes")?),
        "indexed" => {
            let (op, axes): (Term, Term) = attrs.decode().map_err(|_| attr_err("{:add | :put, axes}"))?;
            Op::Indexed { op: term::op(op)?, axes: term::usizes(axes, "axes")? }
        }
        _ => return Err(ExError::invalid(format!("unknown program op {name}"))),
    })
}

fn branch(t: Term) -> ExResult<Branch> {
    let (start, end, outs): (Term, Term, Term) = t.decode().map_err(|_| attr_err("{start, end, outputs}"))?;
    Ok(Branch { start: term::usize_arg(start, "start")?, end: term::usize_arg(end, "end")?, outs: term::usizes(outs, "outputs")? })
}

fn decode_instr(t: Term) -> ExResult<Instr> {
    let (op, args, attrs, ty, shape): (Term, Term, Term, Term, Term) =
        t.decode().map_err(|_| attr_err("{op, args, attrs, type, shape}"))?;
    let ty = term::decode_type(ty)?;
    let name = term::atom(op, "op")?;
    Ok(Instr { op: decode_op(&name, attrs, ty)?, args: term::usizes(args, "args")?, ty, shape: term::usizes(shape, "shape")? })
}

#[rustler::nif(schedule = "DirtyCpu")]
fn program_new<'a>(env: Env<'a>, instrs: Term<'a>, outputs: Term<'a>, inputs: Term<'a>, device: Term<'a>) -> Term<'a> {
    guard(env, "program_new", || {
        let list: Vec<Term> = instrs.decode().map_err(|_| ExError::Arg { name: "instructions", expected: "a list" })?;
        let instrs = list.into_iter().map(decode_instr).collect::<ExResult<Vec<_>>>()?;
        let program = Program::new(
            instrs,
            term::usizes(outputs, "outputs")?,
            term::usize_arg(inputs, "inputs")?,
            term::decode_device(device)?,
        )?;
        Ok(ResourceArc::new(ProgramRes(program)))
    })
}

#[rustler::nif(schedule = "DirtyCpu")]
fn program_run<'a>(env: Env<'a>, program: Term<'a>, inputs: Term<'a>) -> Term<'a> {
    guard(env, "program_run", || {
        let program: ResourceArc<ProgramRes> =
            program.decode().map_err(|_| ExError::Arg { name: "program", expected: "an ExBurn program reference" })?;
        // a dirty NIF keeps running after its caller is killed: stop the program then
        let alive = || unsafe { rustler::sys::enif_is_current_process_alive(env.as_c_arg()) != 0 };
        let outs = program.0.run_while(&arg_list(inputs)?, &alive)?;
        Ok(outs.into_iter().map(TensorOut).collect::<Vec<_>>())
    })
}
