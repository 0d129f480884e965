//! Reordering and indexing NIFs.

use rustler::{Env, Term};

use super::resource::{arg, TensorOut};
use super::{guard, op_name, term};
use crate::ops::indexing as ix;

#[rustler::nif(schedule = "DirtyCpu")]
fn reverse<'a>(env: Env<'a>, t: Term<'a>, axes: Term<'a>) -> Term<'a> {
    guard(env, "reverse", || Ok(TensorOut(ix::reverse(&arg(t)?, term::usizes(axes, "axes")?)?)))
}

#[rustler::nif(schedule = "DirtyCpu")]
fn sort<'a>(env: Env<'a>, t: Term<'a>, axis: Term<'a>, descending: Term<'a>) -> Term<'a> {
    guard(env, "sort", || {
        let (axis, desc) = (term::usize_arg(axis, "axis")?, term::boolean(descending, "descending")?);
        Ok(TensorOut(ix::sort(&arg(t)?, axis, desc)?))
    })
}

#[rustler::nif(schedule = "DirtyCpu")]
fn argsort<'a>(env: Env<'a>, t: Term<'a>, axis: Term<'a>, descending: Term<'a>, out_type: Term<'a>) -> Term<'a> {
    guard(env, "argsort", || {
        let (axis, desc) = (term::usize_arg(axis, "axis")?, term::boolean(descending, "descending")?);
        Ok(TensorOut(ix::argsort(&arg(t)?, axis, desc, term::decode_type(out_type)?)?))
    })
}

#[rustler::nif(schedule = "DirtyCpu")]
fn cumulative<'a>(env: Env<'a>, op: Term<'a>, t: Term<'a>, axis: Term<'a>, reverse: Term<'a>) -> Term<'a> {
    guard(env, &op_name(op, "cumulative"), || {
        let op = term::atom(op, "op")?;
        let (axis, rev) = (term::usize_arg(axis, "axis")?, term::boolean(reverse, "reverse")?);
        Ok(TensorOut(ix::cumulative(&op, &arg(t)?, axis, rev)?))
    })
}

#[rustler::nif(schedule = "DirtyCpu")]
fn put_slice<'a>(env: Env<'a>, t: Term<'a>, starts: Term<'a>, update: Term<'a>) -> Term<'a> {
    guard(env, "put_slice", || Ok(TensorOut(ix::put_slice(&arg(t)?, term::usizes(starts, "starts")?, &arg(update)?)?)))
}

#[rustler::nif(schedule = "DirtyCpu")]
fn take<'a>(env: Env<'a>, t: Term<'a>, indices: Term<'a>, axis: Term<'a>) -> Term<'a> {
    guard(env, "take", || Ok(TensorOut(ix::take(&arg(t)?, &arg(indices)?, term::usize_arg(axis, "axis")?)?)))
}

#[rustler::nif(schedule = "DirtyCpu")]
fn take_along_axis<'a>(env: Env<'a>, t: Term<'a>, indices: Term<'a>, axis: Term<'a>) -> Term<'a> {
    guard(env, "take_along_axis", || {
        Ok(TensorOut(ix::take_along_axis(&arg(t)?, &arg(indices)?, term::usize_arg(axis, "axis")?)?))
    })
}

#[rustler::nif(schedule = "DirtyCpu")]
fn index_update<'a>(env: Env<'a>, op: Term<'a>, t: Term<'a>, indices: Term<'a>, updates: Term<'a>, out_type: Term<'a>) -> Term<'a> {
    guard(env, &op_name(op, "index_update"), || {
        let op = term::atom(op, "op")?;
        let out = term::decode_type(out_type)?;
        Ok(TensorOut(ix::index_update(&op, &arg(t)?, &arg(indices)?, &arg(updates)?, out)?))
    })
}
