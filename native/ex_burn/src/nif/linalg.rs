//! Linear algebra NIFs.

use rustler::{Env, Term};

use super::resource::{arg, TensorOut};
use super::{guard, term};
use crate::ops::linalg::{self, DotSpec};

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
) -> Term<'a> {
    guard(env, "dot", || {
        let sa = DotSpec { contract: term::usizes(contract_a, "contract_axes")?, batch: term::usizes(batch_a, "batch_axes")? };
        let sb = DotSpec { contract: term::usizes(contract_b, "contract_axes")?, batch: term::usizes(batch_b, "batch_axes")? };
        Ok(TensorOut(linalg::dot(&arg(a)?, &sa, &arg(b)?, &sb, term::decode_type(out_type)?)?))
    })
}
