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

#[rustler::nif(schedule = "DirtyCpu")]
fn arg_reduce<'a>(env: Env<'a>, op: Term<'a>, t: Term<'a>, axis: Term<'a>, keep: Term<'a>, tie_break: Term<'a>, out_type: Term<'a>) -> Term<'a> {
    guard(env, &op_name(op, "arg_reduce"), || {
        let op = term::op(op)?;
        let (axis, keep) = (term::opt_usize(axis, "axis")?, term::boolean(keep, "keep_axis")?);
        let high = match term::atom(tie_break, "tie_break")?.as_str() {
            "low" => false,
            "high" => true,
            _ => return Err(ExError::Arg { name: "tie_break", expected: ":low or :high" }),
        };
        Ok(TensorOut(r::arg_reduce(op, &arg(t)?, axis, keep, high, term::decode_type(out_type)?)?))
    })
}
