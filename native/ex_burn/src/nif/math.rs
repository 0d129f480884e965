//! The f32 math mode (`ops::precision::MathMode`), typed as the atoms `:exact` and `:fast`.

use rustler::{Env, Term};

use super::{guard, strict};
use crate::ops::precision::MathMode;

/// Sets the process-wide math mode; answers the previous one. Anything but `:exact` or `:fast`
/// is an error that changes nothing.
#[rustler::nif]
fn set_math_mode<'a>(env: Env<'a>, mode: Term<'a>) -> Term<'a> {
    guard(env, "configure", || Ok(strict::decode::<MathMode>(mode, "math")?.set_global()))
}

/// The process-wide math mode.
#[rustler::nif]
fn math_mode(env: Env) -> Term {
    guard(env, "math_mode", || Ok(MathMode::global()))
}
