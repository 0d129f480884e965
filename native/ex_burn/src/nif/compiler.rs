//! NIFs of `ExBurn.Defn.Compiler`: build a program once, run it once per step.

use std::panic::{RefUnwindSafe, UnwindSafe};

use rustler::{Env, ResourceArc, Term};

use super::resource::{arg_list, TensorOut};
use super::{guard, schedule, term};
use crate::compiler::{Branch, Instr, Op, Program};
use crate::dtype::NxType;
use crate::error::{Detail, ExError, ExResult};
use crate::ops::conv::ConvSpec;
use crate::ops::linalg::DotSpec;
use crate::ops::vocab::{ArgReduceOp, BinaryOp, IndexedOp, ReduceOp, UnaryOp, WindowOp};
use crate::ops::window::WindowSpec;

pub struct ProgramRes {
    program: Program,
    last: schedule::LastRun,
}

// The program is immutable once built; running it only reads it.
impl UnwindSafe for ProgramRes {}
impl RefUnwindSafe for ProgramRes {}

#[rustler::resource_impl]
impl rustler::Resource for ProgramRes {}

/// An instruction's op as `ExBurn.Defn.Lower` emits it: unit ops are atoms (`:eye`), the others
/// tuples tagged with their name (`{:binary, :add, {:f, 32}}`). The one definition of the
/// program vocabulary's term shapes; `op` turns it into the core's `Op`.
#[derive(rustler::NifTaggedEnum)]
#[rustler(decode)]
enum Wire {
    /// The n-th run-time input.
    Input(usize),
    Full(term::Number),
    /// `nil` or the axis.
    Iota(Option<usize>),
    Eye,
    Unary(UnaryOp),
    /// The op and the type it computes in.
    Binary(BinaryOp, NxType),
    Select,
    Clip,
    AsType,
    Reshape,
    Alias,
    Bitcast,
    /// The op, `nil` or the axes, keep_axes.
    Reduce(ReduceOp, Option<Vec<usize>>, bool),
    /// The op, `nil` or the axis, keep_axis, whether ties take the last index.
    ArgReduce(ArgReduceOp, Option<usize>, bool, bool),
    /// Contract and batch axes of the left operand, then of the right one.
    Dot(Vec<usize>, Vec<usize>, Vec<usize>, Vec<usize>),
    Transpose(Vec<usize>),
    Broadcast(Vec<usize>),
    Reverse(Vec<usize>),
    /// Starts (clamped by the op as Nx does), lengths, strides.
    Slice(Vec<i64>, Vec<usize>, Vec<usize>),
    Concatenate(usize),
    Stack(usize),
    Conv(ConvSpec),
    Window(WindowOp, WindowSpec),
    /// Axis, descending.
    Sort(usize, bool),
    Argsort(usize, bool),
    /// `{lo, hi, interior}` per axis.
    Pad(Vec<(i64, i64, usize)>),
    /// Lengths, strides; the starts are operands.
    DynamicSlice(Vec<usize>, Vec<usize>),
    PutSlice,
    /// `[{predicate, body}]` branches and the last branch, each `{start, end, outputs}`.
    Cond(Vec<(Branch, Branch)>, Branch),
    LoopVar,
    /// Loop slots, condition and body branches.
    While(Vec<usize>, Branch, Branch),
    /// The cond or while instruction, and which of its outputs.
    Pick(usize, usize),
    /// Whether max, window dimensions, strides, padding, the type the tensor is compared in.
    WindowScatter(bool, Vec<usize>, Vec<usize>, Vec<(i64, i64)>, NxType),
    Gather(Vec<usize>),
    Indexed(IndexedOp, Vec<usize>),
}

impl<'a> rustler::Decoder<'a> for Branch {
    fn decode(term: Term<'a>) -> rustler::NifResult<Self> {
        let (start, end, outs): (usize, usize, Vec<usize>) = term.decode()?;
        Ok(Branch { start, end, outs })
    }
}

fn op(wire: Wire, ty: NxType) -> ExResult<Op> {
    Ok(match wire {
        Wire::Input(n) => Op::Input(n),
        Wire::Full(v) => Op::Full(v.scalar(ty)?),
        Wire::Iota(axis) => Op::Iota(axis),
        Wire::Eye => Op::Eye,
        Wire::Unary(op) => Op::Unary(op),
        Wire::Binary(op, compute) => Op::Binary { op, compute },
        Wire::Select => Op::Select,
        Wire::Clip => Op::Clip,
        Wire::AsType => Op::AsType,
        Wire::Reshape => Op::Reshape,
        Wire::Alias => Op::Alias,
        Wire::Bitcast => Op::Bitcast,
        Wire::Reduce(op, axes, keep) => Op::Reduce { op, axes, keep },
        Wire::ArgReduce(op, axis, keep, high) => Op::ArgReduce { op, axis, keep, high },
        Wire::Dot(ca, ba, cb, bb) => Op::Dot { a: DotSpec { contract: ca, batch: ba }, b: DotSpec { contract: cb, batch: bb } },
        Wire::Transpose(axes) => Op::Transpose(axes),
        Wire::Broadcast(axes) => Op::Broadcast(axes),
        Wire::Reverse(axes) => Op::Reverse(axes),
        Wire::Slice(starts, lengths, strides) => Op::Slice { starts, lengths, strides },
        Wire::Concatenate(axis) => Op::Concatenate(axis),
        Wire::Stack(axis) => Op::Stack(axis),
        Wire::Conv(spec) => Op::Conv(spec),
        Wire::Window(op, spec) => Op::Window { op, spec },
        Wire::Sort(axis, desc) => Op::Sort { axis, desc },
        Wire::Argsort(axis, desc) => Op::ArgSort { axis, desc },
        Wire::Pad(config) => Op::Pad(config),
        Wire::DynamicSlice(lengths, strides) => Op::DynSlice { lengths, strides },
        Wire::PutSlice => Op::PutSlice,
        Wire::Cond(clauses, last) => Op::Cond { clauses, last },
        Wire::LoopVar => Op::LoopVar,
        Wire::While(vars, cond, body) => Op::While { vars, cond, body },
        Wire::Pick(cond, out) => Op::Pick { cond, out },
        Wire::WindowScatter(max, dims, strides, padding, select) => Op::WindowScatter { max, dims, strides, padding, select },
        Wire::Gather(axes) => Op::Gather(axes),
        Wire::Indexed(op, axes) => Op::Indexed { op, axes },
    })
}

/// `{op, args, type, shape}`; a malformed one is named by its position and its term.
fn decode_instr(index: usize, t: Term) -> ExResult<Instr> {
    let bad = || {
        ExError::invalid_with(
            "malformed program instruction",
            vec![("index", Detail::Int(index as i128)), ("instruction", Detail::Text(format!("{t:?}")))],
        )
    };
    let (wire, args, ty, shape): (Wire, Vec<usize>, NxType, Vec<usize>) = t.decode().map_err(|_| bad())?;
    Ok(Instr { op: op(wire, ty)?, args, ty, shape })
}

#[rustler::nif(schedule = "DirtyCpu")]
fn program_new<'a>(env: Env<'a>, instrs: Term<'a>, outputs: Term<'a>, inputs: Term<'a>, device: Term<'a>) -> Term<'a> {
    guard(env, "program_new", || {
        let list: Vec<Term> = instrs.decode().map_err(|_| ExError::Arg { name: "instructions", expected: "a list" })?;
        let instrs = list.into_iter().enumerate().map(|(i, t)| decode_instr(i, t)).collect::<ExResult<Vec<_>>>()?;
        let program = Program::new(
            instrs,
            term::usizes(outputs, "outputs")?,
            term::usize_arg(inputs, "inputs")?,
            term::decode_device(device)?,
        )?;
        Ok(ResourceArc::new(ProgramRes { program, last: schedule::LastRun::default() }))
    })
}

// A CPU program that does the same work each run, and whose last run was short, runs in place
// (nif::schedule); the others dirty.
#[rustler::nif]
fn program_run<'a>(env: Env<'a>, program: Term<'a>, inputs: Term<'a>) -> Term<'a> {
    let inline = program.decode::<ResourceArc<ProgramRes>>().is_ok_and(|p| {
        p.program.device().kind == crate::device::DeviceKind::Cpu && p.program.same_work_each_run() && p.last.short()
    });
    schedule::run(env, &[program, inputs], inline, program_run_body, c"program_run", program_run_dirty)
}
schedule::dirty_trampoline!(program_run_dirty, program_run_body);

fn program_run_body<'a>(env: Env<'a>, args: &[Term<'a>]) -> Term<'a> {
    let &[program, inputs] = args else { unreachable!("program_run/2") };
    guard(env, "program_run", || {
        let program: ResourceArc<ProgramRes> =
            program.decode().map_err(|_| ExError::Arg { name: "program", expected: "an ExBurn program reference" })?;
        // a dirty NIF keeps running after its caller is killed: stop the program then
        let alive = || unsafe { rustler::sys::enif_is_current_process_alive(env.as_c_arg()) != 0 };
        let outs = program.last.time(|| program.program.run_while(&arg_list(inputs)?, &alive))?;
        Ok(outs.into_iter().map(TensorOut).collect::<Vec<_>>())
    })
}
