//! Elementwise NIFs.

use rustler::{Env, Term};

use super::resource::{arg, meta, TensorOut};
use super::{guard, op_name, schedule, term};
use crate::ops::elementwise as ew;

// unary and binary run in place for small CPU tensors (nif::schedule).
#[rustler::nif]
fn unary<'a>(env: Env<'a>, op: Term<'a>, t: Term<'a>, out_type: Term<'a>) -> Term<'a> {
    let inline = meta(t).is_ok_and(|t| schedule::small_on_cpu(&[t]));
    schedule::run(env, &[op, t, out_type], inline, unary_body, c"unary", unary_dirty)
}
schedule::dirty_trampoline!(unary_dirty, unary_body);

fn unary_body<'a>(env: Env<'a>, args: &[Term<'a>]) -> Term<'a> {
    let &[op, t, out_type] = args else { unreachable!("unary/3") };
    guard(env, &op_name(op, "unary"), || {
        Ok(TensorOut(ew::unary(term::op(op)?, &arg(t)?, term::decode_type(out_type)?)?))
    })
}

#[rustler::nif]
fn binary<'a>(env: Env<'a>, op: Term<'a>, a: Term<'a>, b: Term<'a>, compute_type: Term<'a>) -> Term<'a> {
    let inline = match (meta(a), meta(b)) {
        (Ok(x), Ok(y)) => schedule::small_on_cpu(&[x, y]),
        _ => false,
    };
    schedule::run(env, &[op, a, b, compute_type], inline, binary_body, c"binary", binary_dirty)
}
schedule::dirty_trampoline!(binary_dirty, binary_body);

fn binary_body<'a>(env: Env<'a>, args: &[Term<'a>]) -> Term<'a> {
    let &[op, a, b, compute_type] = args else { unreachable!("binary/4") };
    guard(env, &op_name(op, "binary"), || {
        Ok(TensorOut(ew::binary(term::op(op)?, &arg(a)?, &arg(b)?, term::decode_type(compute_type)?)?))
    })
}

#[rustler::nif(schedule = "DirtyCpu")]
fn select<'a>(env: Env<'a>, pred: Term<'a>, on_true: Term<'a>, on_false: Term<'a>, out_type: Term<'a>) -> Term<'a> {
    guard(env, "select", || {
        let ty = term::decode_type(out_type)?;
        Ok(TensorOut(ew::select(&arg(pred)?, &arg(on_true)?, &arg(on_false)?, ty)?))
    })
}

#[rustler::nif(schedule = "DirtyCpu")]
fn clip<'a>(env: Env<'a>, t: Term<'a>, min: Term<'a>, max: Term<'a>, out_type: Term<'a>) -> Term<'a> {
    guard(env, "clip", || Ok(TensorOut(ew::clip(&arg(t)?, &arg(min)?, &arg(max)?, term::decode_type(out_type)?)?)))
}

#[rustler::nif(schedule = "DirtyCpu")]
fn as_type<'a>(env: Env<'a>, t: Term<'a>, ty: Term<'a>) -> Term<'a> {
    guard(env, "as_type", || Ok(TensorOut(ew::as_type(&arg(t)?, term::decode_type(ty)?)?)))
}
