//! Convolution NIF.

use rustler::{Env, Term};

use super::resource::{arg, TensorOut};
use super::{guard, term};
use crate::error::{ExError, ExResult};
use crate::ops::conv::{self, ConvSpec};

/// `[{lo, hi}, ...]`, negative sides allowed.
pub(super) fn pairs(term: Term, name: &'static str) -> ExResult<Vec<(i64, i64)>> {
    term.decode().map_err(|_| ExError::Arg { name, expected: "a list of {lo, hi} integer pairs" })
}

pub(super) fn spec(opts: Term) -> ExResult<ConvSpec> {
    let bad = || ExError::Arg { name: "opts", expected: "a 9-tuple of conv options" };
    let t = rustler::types::tuple::get_tuple(opts).map_err(|_| bad())?;
    if t.len() != 9 {
        return Err(bad());
    }
    Ok(ConvSpec {
        strides: term::usizes(t[0], "strides")?,
        padding: pairs(t[1], "padding")?,
        input_dilation: term::usizes(t[2], "input_dilation")?,
        kernel_dilation: term::usizes(t[3], "kernel_dilation")?,
        feature_groups: term::usize_arg(t[4], "feature_group_size")?,
        batch_groups: term::usize_arg(t[5], "batch_group_size")?,
        input_perm: term::usizes(t[6], "input_permutation")?,
        kernel_perm: term::usizes(t[7], "kernel_permutation")?,
        output_perm: term::usizes(t[8], "output_permutation")?,
    })
}

impl<'a> rustler::Decoder<'a> for ConvSpec {
    fn decode(term: Term<'a>) -> rustler::NifResult<Self> {
        spec(term).map_err(|_| rustler::Error::BadArg)
    }
}

/// `opts`: `{strides, padding, input_dilation, kernel_dilation, feature_group_size,
/// batch_group_size, input_permutation, kernel_permutation, output_permutation}`.
#[rustler::nif(schedule = "DirtyCpu")]
fn conv<'a>(env: Env<'a>, t: Term<'a>, kernel: Term<'a>, opts: Term<'a>, out_type: Term<'a>) -> Term<'a> {
    guard(env, "conv", || Ok(TensorOut(conv::conv(&arg(t)?, &arg(kernel)?, &spec(opts)?, term::decode_type(out_type)?)?)))
}
