//! Reordering and indexing NIFs.

use rustler::{Env, Term};

use super::resource::{arg, TensorOut};
use super::{guard, op_name, term};
use crate::ops::indexing::{self as ix, Start};
use crate::ops::vocab::IndexedOp;

/// Slice starts: integers, or scalar tensors read when the op runs (Nx's dynamic starts).
pub(super) fn starts(list: Term) -> crate::error::ExResult<Vec<Start>> {
    let items: Vec<Term> = list.decode().map_err(|_| crate::error::ExError::Arg { name: "starts", expected: "a list of integers or scalar tensors" })?;
    items
        .into_iter()
        .map(|t| match t.decode::<i64>() {
            Ok(v) => Ok(Start::Fixed(v)),
            Err(_) => Ok(Start::Dynamic(arg(t)?)),
        })
        .collect()
}

#[rustler::nif(schedule = "DirtyCpu")]
fn reverse<'a>(env: Env<'a>, t: Term<'a>, axes: Term<'a>, out_type: Term<'a>) -> Term<'a> {
    guard(env, "reverse", || Ok(TensorOut(ix::reverse(&arg(t)?, term::usizes(axes, "axes")?, term::decode_type(out_type)?)?)))
}

#[rustler::nif(schedule = "DirtyCpu")]
fn sort<'a>(env: Env<'a>, t: Term<'a>, axis: Term<'a>, descending: Term<'a>, out_type: Term<'a>) -> Term<'a> {
    guard(env, "sort", || {
        let (axis, desc) = (term::usize_arg(axis, "axis")?, term::boolean(descending, "descending")?);
        Ok(TensorOut(ix::sort(&arg(t)?, axis, desc, term::decode_type(out_type)?)?))
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
        let (axis, rev) = (term::usize_arg(axis, "axis")?, term::boolean(reverse, "reverse")?);
        Ok(TensorOut(ix::cumulative(term::op(op)?, &arg(t)?, axis, rev)?))
    })
}

#[rustler::nif(schedule = "DirtyCpu")]
fn put_slice<'a>(env: Env<'a>, t: Term<'a>, starts: Term<'a>, update: Term<'a>, out_type: Term<'a>) -> Term<'a> {
    guard(env, "put_slice", || {
        Ok(TensorOut(ix::put_slice_at(&arg(t)?, &self::starts(starts)?, &arg(update)?, term::decode_type(out_type)?)?))
    })
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

/// Nx.gather: `indices`' last dimension holds one coordinate per axis of `axes`.
#[rustler::nif(schedule = "DirtyCpu")]
fn gather<'a>(env: Env<'a>, t: Term<'a>, indices: Term<'a>, axes: Term<'a>) -> Term<'a> {
    guard(env, "gather", || Ok(TensorOut(ix::gather_axes(&arg(t)?, &arg(indices)?, &term::usizes(axes, "axes")?)?)))
}

/// Nx.indexed_add / Nx.indexed_put over `axes`, the result of type `out_type`.
#[rustler::nif(schedule = "DirtyCpu")]
fn indexed<'a>(env: Env<'a>, op: Term<'a>, t: Term<'a>, indices: Term<'a>, updates: Term<'a>, axes: Term<'a>, out_type: Term<'a>) -> Term<'a> {
    guard(env, &op_name(op, "indexed"), || {
        let op: IndexedOp = term::op(op)?;
        let (axes, out) = (term::usizes(axes, "axes")?, term::decode_type(out_type)?);
        Ok(TensorOut(ix::indexed_axes(op, &arg(t)?, &arg(indices)?, &arg(updates)?, &axes, out)?))
    })
}
