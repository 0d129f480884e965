//! Shape NIFs.

use rustler::{Env, Term};

use super::resource::{arg, arg_list, TensorOut};
use super::{guard, term};
use crate::ops::shape as s;

#[rustler::nif(schedule = "DirtyCpu")]
fn reshape<'a>(env: Env<'a>, t: Term<'a>, shape: Term<'a>) -> Term<'a> {
    guard(env, "reshape", || Ok(TensorOut(s::reshape(&arg(t)?, term::usizes(shape, "shape")?)?)))
}

#[rustler::nif(schedule = "DirtyCpu")]
fn transpose<'a>(env: Env<'a>, t: Term<'a>, axes: Term<'a>) -> Term<'a> {
    guard(env, "transpose", || Ok(TensorOut(s::transpose(&arg(t)?, term::usizes(axes, "axes")?)?)))
}

#[rustler::nif(schedule = "DirtyCpu")]
fn broadcast<'a>(env: Env<'a>, t: Term<'a>, shape: Term<'a>, axes: Term<'a>, out_type: Term<'a>) -> Term<'a> {
    guard(env, "broadcast", || {
        let (shape, axes) = (term::usizes(shape, "shape")?, term::usizes(axes, "axes")?);
        Ok(TensorOut(s::broadcast(&arg(t)?, shape, axes, term::decode_type(out_type)?)?))
    })
}

#[rustler::nif(schedule = "DirtyCpu")]
fn slice<'a>(env: Env<'a>, t: Term<'a>, starts: Term<'a>, lengths: Term<'a>, strides: Term<'a>) -> Term<'a> {
    guard(env, "slice", || {
        let starts = super::indexing::starts(starts)?;
        let lengths = term::usizes(lengths, "lengths")?;
        let strides = term::usizes(strides, "strides")?;
        Ok(TensorOut(crate::ops::indexing::slice(&arg(t)?, &starts, lengths, strides)?))
    })
}

#[rustler::nif(schedule = "DirtyCpu")]
fn concatenate<'a>(env: Env<'a>, ts: Term<'a>, axis: Term<'a>, out_type: Term<'a>) -> Term<'a> {
    guard(env, "concatenate", || {
        let (axis, out) = (term::usize_arg(axis, "axis")?, term::decode_type(out_type)?);
        Ok(TensorOut(s::concatenate(&arg_list(ts)?, axis, out)?))
    })
}

#[rustler::nif(schedule = "DirtyCpu")]
fn stack<'a>(env: Env<'a>, ts: Term<'a>, axis: Term<'a>, out_type: Term<'a>) -> Term<'a> {
    guard(env, "stack", || {
        let (axis, out) = (term::usize_arg(axis, "axis")?, term::decode_type(out_type)?);
        Ok(TensorOut(s::stack(&arg_list(ts)?, axis, out)?))
    })
}
