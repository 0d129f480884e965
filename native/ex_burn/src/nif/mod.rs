//! The Erlang NIF layer: argument decoding, result encoding and the guard every NIF runs in.
//!
//! Each NIF returns `{:ok, value}` or `{:error, {op, reason, details}}`, which Elixir turns into
//! `ExBurn.Error`. Arguments are decoded by hand (`term`), or by rustler's derives through
//! `strict` for typed inputs, so a malformed one is such an error too, naming the argument,
//! rather than rustler's bare `ArgumentError`. Everything that computes runs
//! on a dirty CPU scheduler, except element-wise ops and reads on small CPU tensors, which
//! `schedule` runs in place.

mod compiler;
mod conv;
mod create;
mod elementwise;
mod indexing;
mod json;
mod linalg;
mod math;
mod model;
mod pretrained;
mod reduce;
mod resource;
mod schedule;
mod shape;
mod strict;
mod term;
mod window;

use rustler::{Encoder, Env, Term};

use crate::error::{catch, ExError, ExResult};

pub mod atoms {
    rustler::atoms! { ok, error, already_deallocated }
}

/// Encodes an error as `{:error, {op, reason, details}}`.
pub(crate) fn error_term<'a>(env: Env<'a>, op: &str, err: &ExError) -> Term<'a> {
    let op = rustler::Atom::from_str(env, op).unwrap_or_else(|_| atoms::error());
    let details = err.details();
    let keys: Vec<Term> = details.iter().map(|(k, _)| rustler::Atom::from_str(env, k).unwrap().encode(env)).collect();
    let values: Vec<Term> = details.iter().map(|(_, v)| term::detail(env, v)).collect();
    let details = Term::map_from_term_arrays(env, &keys, &values).unwrap_or_else(|_| Term::map_new(env));
    (atoms::error(), (op, err.to_string(), details)).encode(env)
}

/// The body of every NIF: runs `f` with panics caught and encodes the result.
fn guard<'a, R, F>(env: Env<'a>, op: &str, f: F) -> Term<'a>
where
    R: Encoder,
    F: FnOnce() -> ExResult<R>,
{
    match catch(f) {
        Ok(value) => (atoms::ok(), value).encode(env),
        Err(err) => error_term(env, op, &err),
    }
}

/// The op name for errors of NIFs that take the op as an atom argument.
fn op_name(op: Term, fallback: &str) -> String {
    op.atom_to_string().unwrap_or_else(|_| fallback.to_string())
}

fn load(_env: Env, _info: Term) -> bool {
    let missing = crate::process::cpu_target::missing_here();
    if !missing.is_empty() {
        eprintln!(
            "ExBurn: this native library was built for x86-64-v3 but the CPU lacks {}; rebuild it with \
             RUSTFLAGS=\"-C target-cpu=x86-64\" mix compile",
            missing.join(", ")
        );
        return false;
    }
    crate::error::install_panic_hook();
    crate::process::alloc::tune();
    true
}

rustler::init!("Elixir.ExBurn.Native", load = load);
