//! Reduction NIFs.

use rustler::{Env, Term};

use super::resource::{arg, TensorOut};
use super::{guard, op_name, term};
use crate::error::ExError;
use crate::ops::reduce as r;

#[rustler::nif(schedule = "DirtyCpu")]
fn reduce<'a>(env: Env<'a>, op: Term<'a>, t: Term<'a>, axes: Term<'a>, keep: Term<'a>, out_type: Term<'a>) -> Term<'a> {
    guard(env, &op_name(op, "reduce"), || {
        let op = term::op(op)?;
        let (axes, keep) = (term::opt_axes(axes, "axes")?, term::boolean(keep, "keep_axes")?);
        Ok(TensorOut(r::reduce(op, &arg(t)?, axes, keep, term::decode_type(out_type)?)?))
    })
}

/// Which of tied extremes argmax/argmin return (Nx's `:tie_break`).
#[derive(rustler::NifUnitEnum, PartialEq)]
enum TieBreak {
    Low,
    High,
}

#[rustler::nif(schedule = "DirtyCpu")]
fn arg_reduce<'a>(env: Env<'a>, op: Term<'a>, t: Term<'a>, axis: Term<'a>, keep: Term<'a>, tie_break: Term<'a>, out_type: Term<'a>) -> Term<'a> {
    guard(env, &op_name(op, "arg_reduce"), || {
        let op = term::op(op)?;
        let (axis, keep) = (term::opt_usize(axis, "axis")?, term::boolean(keep, "keep_axis")?);
        let tie: TieBreak = tie_break.decode().map_err(|_| ExError::Arg { name: "tie_break", expected: ":low or :high" })?;
        Ok(TensorOut(r::arg_reduce(op, &arg(t)?, axis, keep, tie == TieBreak::High, term::decode_type(out_type)?)?))
    })
}
