//! Linear algebra NIFs.

use rustler::{Env, Term};

use super::resource::{arg, TensorOut};
use super::{guard, term};
use crate::ops::linalg::{self, DotSpec};
use crate::ops::precision::MatmulPrecision;

/// Nx.dot/6 at an f32 matmul precision: `:highest` | `:high`, or `nil` for the VM-wide level.
#[rustler::nif(schedule = "DirtyCpu")]
#[allow(clippy::too_many_arguments)]
fn dot<'a>(
    env: Env<'a>,
    a: Term<'a>,
    contract_a: Term<'a>,
    batch_a: Term<'a>,
    b: Term<'a>,
    contract_b: Term<'a>,
    batch_b: Term<'a>,
    out_type: Term<'a>,
    precision: Term<'a>,
) -> Term<'a> {
    guard(env, "dot", || {
        let precision = match term::atom(precision, "matmul_precision")?.as_str() {
            "nil" => None,
            name => Some(MatmulPrecision::parse(name)?),
        };
        let sa = DotSpec { contract: term::usizes(contract_a, "contract_axes")?, batch: term::usizes(batch_a, "batch_axes")? };
        let sb = DotSpec { contract: term::usizes(contract_b, "contract_axes")?, batch: term::usizes(batch_b, "batch_axes")? };
        let out = term::decode_type(out_type)?;
        Ok(TensorOut(linalg::dot_with(&arg(a)?, &sa, &arg(b)?, &sb, out, precision)?))
    })
}
/// Sets the process-wide f32 matmul precision; answers the previous one.
#[rustler::nif]
fn set_matmul_precision<'a>(env: Env<'a>, precision: Term<'a>) -> Term<'a> {
    guard(env, "configure", || {
        let new = MatmulPrecision::parse(&term::atom(precision, "matmul_precision")?)?;
        let old = MatmulPrecision::global();
        new.set_global();
        Ok(rustler::Atom::from_str(env, old.name()).map_err(|_| crate::error::ExError::invalid("atom"))?)
    })
}

/// The process-wide f32 matmul precision.
#[rustler::nif]
fn matmul_precision(env: Env) -> Term {
    guard(env, "matmul_precision", || {
        Ok(rustler::Atom::from_str(env, MatmulPrecision::global().name()).map_err(|_| crate::error::ExError::invalid("atom"))?)
    })
}
