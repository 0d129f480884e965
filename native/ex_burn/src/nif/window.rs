//! Window reduction, window scatter and interior padding NIFs.

use rustler::{Env, Term};

use super::conv::pairs;
use super::resource::{arg, TensorOut};
use super::{guard, op_name, term};
use crate::error::{ExError, ExResult};
use crate::ops::window::{self, WindowSpec};

pub(super) fn spec(opts: Term) -> ExResult<WindowSpec> {
    let bad = || ExError::Arg { name: "opts", expected: "{window_dimensions, strides, padding, window_dilations}" };
    let t = rustler::types::tuple::get_tuple(opts).map_err(|_| bad())?;
    if t.len() != 4 {
        return Err(bad());
    }
    Ok(WindowSpec {
        dims: term::usizes(t[0], "window_dimensions")?,
        strides: term::usizes(t[1], "strides")?,
        padding: pairs(t[2], "padding")?,
        dilations: term::usizes(t[3], "window_dilations")?,
    })
}

impl<'a> rustler::Decoder<'a> for WindowSpec {
    fn decode(term: Term<'a>) -> rustler::NifResult<Self> {
        spec(term).map_err(|_| rustler::Error::BadArg)
    }
}

/// `op`: `:window_sum | :window_product | :window_max | :window_min`.
#[rustler::nif(schedule = "DirtyCpu")]
fn window_reduce<'a>(env: Env<'a>, op: Term<'a>, t: Term<'a>, opts: Term<'a>, out_type: Term<'a>) -> Term<'a> {
    guard(env, &op_name(op, "window_reduce"), || {
        Ok(TensorOut(window::window_reduce(term::op(op)?, &arg(t)?, &spec(opts)?, term::decode_type(out_type)?)?))
    })
}

#[derive(rustler::NifUnitEnum, PartialEq)]
enum ScatterOp {
    WindowScatterMax,
    WindowScatterMin,
}

/// `op`: `:window_scatter_max | :window_scatter_min`; `opts`: `{window_dimensions, strides,
/// padding}`; the tensor is compared in `select_type`.
#[rustler::nif(schedule = "DirtyCpu")]
#[allow(clippy::too_many_arguments)]
fn window_scatter<'a>(
    env: Env<'a>,
    op: Term<'a>,
    t: Term<'a>,
    source: Term<'a>,
    init: Term<'a>,
    opts: Term<'a>,
    select_type: Term<'a>,
    out_type: Term<'a>,
) -> Term<'a> {
    guard(env, &op_name(op, "window_scatter"), || {
        let op: ScatterOp = op.decode().map_err(|_| ExError::Arg { name: "op", expected: ":window_scatter_max or :window_scatter_min" })?;
        let max = op == ScatterOp::WindowScatterMax;
        let bad = || ExError::Arg { name: "opts", expected: "{window_dimensions, strides, padding}" };
        let o = rustler::types::tuple::get_tuple(opts).map_err(|_| bad())?;
        if o.len() != 3 {
            return Err(bad());
        }
        let (dims, strides, padding) = (term::usizes(o[0], "window_dimensions")?, term::usizes(o[1], "strides")?, pairs(o[2], "padding")?);
        let (sel, out) = (term::decode_type(select_type)?, term::decode_type(out_type)?);
        let r = window::window_scatter(max, &arg(t)?, &arg(source)?, &arg(init)?, dims, strides, padding, sel, out)?;
        Ok(TensorOut(r))
    })
}

/// `config`: `[{lo, hi, interior}, ...]`, one per axis (negative edges allowed).
pub(super) fn pad_config(config: Term) -> ExResult<Vec<(i64, i64, usize)>> {
    config.decode().map_err(|_| ExError::Arg { name: "config", expected: "a list of {lo, hi, interior} integers, interior >= 0" })
}

#[rustler::nif(schedule = "DirtyCpu")]
fn pad<'a>(env: Env<'a>, t: Term<'a>, value: Term<'a>, config: Term<'a>, out_type: Term<'a>) -> Term<'a> {
    guard(env, "pad", || Ok(TensorOut(window::pad(&arg(t)?, &arg(value)?, &pad_config(config)?, term::decode_type(out_type)?)?)))
}
