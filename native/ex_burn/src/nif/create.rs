//! Creation, host transfer, metadata, memory and device NIFs.

use rustler::{Binary, Encoder, Env, Term};

use super::resource::{self, BinaryOut, TensorOut};
use super::{atoms, guard, schedule, term};
use crate::error::ExError;
use crate::ops::create;
use crate::tensor::Handle;

#[rustler::nif(schedule = "DirtyCpu")]
fn from_binary<'a>(env: Env<'a>, data: Term<'a>, shape: Term<'a>, ty: Term<'a>, device: Term<'a>) -> Term<'a> {
    guard(env, "from_binary", || {
        let bin: Binary = data.decode().map_err(|_| ExError::Arg { name: "data", expected: "a binary" })?;
        let (shape, ty) = (term::usizes(shape, "shape")?, term::decode_type(ty)?);
        let device = term::decode_device(device)?;
        crate::ops::check_alloc(&shape, ty)?;
        Ok(TensorOut(Handle::from_bytes(bin.as_slice().to_vec(), shape, ty, device)?))
    })
}

/// In place when it reads at most `INLINE_MAX` elements of a CPU tensor (nif::schedule).
#[rustler::nif]
fn to_binary<'a>(env: Env<'a>, t: Term<'a>, limit: Term<'a>) -> Term<'a> {
    let limit_n = term::opt_usize(limit, "limit").ok().flatten();
    let inline = resource::meta(t).is_ok_and(|m| {
        let n = crate::tensor::numel(&m.shape);
        m.kind == crate::device::DeviceKind::Cpu && limit_n.unwrap_or(n).min(n) <= schedule::INLINE_MAX
    });
    schedule::run(env, &[t, limit], inline, to_binary_body, c"to_binary", to_binary_dirty)
}
schedule::dirty_trampoline!(to_binary_dirty, to_binary_body);

fn to_binary_body<'a>(env: Env<'a>, args: &[Term<'a>]) -> Term<'a> {
    let &[t, limit] = args else { unreachable!("to_binary/2") };
    guard(env, "to_binary", || {
        let h = resource::arg(t)?;
        Ok(BinaryOut::new(&create::read(&h, term::opt_usize(limit, "limit")?)?))
    })
}

#[rustler::nif(schedule = "DirtyCpu")]
fn full<'a>(env: Env<'a>, value: Term<'a>, shape: Term<'a>, ty: Term<'a>, device: Term<'a>) -> Term<'a> {
    guard(env, "full", || {
        let (shape, ty) = (term::usizes(shape, "shape")?, term::decode_type(ty)?);
        let value = term::scalar(value, ty)?;
        Ok(TensorOut(create::full(value, shape, ty, term::decode_device(device)?)?))
    })
}

#[rustler::nif(schedule = "DirtyCpu")]
fn iota<'a>(env: Env<'a>, shape: Term<'a>, ty: Term<'a>, axis: Term<'a>, device: Term<'a>) -> Term<'a> {
    guard(env, "iota", || {
        let (shape, ty) = (term::usizes(shape, "shape")?, term::decode_type(ty)?);
        let axis = term::opt_usize(axis, "axis")?;
        Ok(TensorOut(create::iota(shape, ty, axis, term::decode_device(device)?)?))
    })
}

#[rustler::nif(schedule = "DirtyCpu")]
fn eye<'a>(env: Env<'a>, shape: Term<'a>, ty: Term<'a>, device: Term<'a>) -> Term<'a> {
    guard(env, "eye", || {
        let (shape, ty) = (term::usizes(shape, "shape")?, term::decode_type(ty)?);
        Ok(TensorOut(create::eye(shape, ty, term::decode_device(device)?)?))
    })
}

#[rustler::nif(schedule = "DirtyCpu")]
fn to_device<'a>(env: Env<'a>, t: Term<'a>, device: Term<'a>) -> Term<'a> {
    guard(env, "to_device", || {
        Ok(TensorOut(create::to_device(resource::arg(t)?, term::decode_device(device)?)?))
    })
}

#[rustler::nif]
fn deallocate<'a>(env: Env<'a>, t: Term<'a>) -> Term<'a> {
    guard(env, "deallocate", || {
        let freed = resource::tensor_ref(t)?.0.deallocate();
        Ok(if freed { atoms::ok() } else { atoms::already_deallocated() })
    })
}

#[rustler::nif]
fn shape<'a>(env: Env<'a>, t: Term<'a>) -> Term<'a> {
    guard(env, "shape", || resource::peek(t, |h| term::shape(env, &h.shape)))
}

#[rustler::nif(name = "type")]
fn type_of<'a>(env: Env<'a>, t: Term<'a>) -> Term<'a> {
    guard(env, "type", || resource::peek(t, |h| term::nx_type(env, h.ty)))
}

#[rustler::nif(name = "device")]
fn device_of<'a>(env: Env<'a>, t: Term<'a>) -> Term<'a> {
    guard(env, "device", || resource::peek(t, |h| term::device(env, h.device)))
}

#[rustler::nif(schedule = "DirtyCpu")]
fn devices(env: Env) -> Term {
    guard(env, "devices", || {
        let keys = ["kind", "index", "name", "dtypes"].map(|k| rustler::Atom::from_str(env, k).unwrap().encode(env));
        let list: Vec<Term> = crate::device::list()
            .into_iter()
            .map(|(d, name, types)| {
                let types: Vec<Term> = types.into_iter().map(|t| term::nx_type(env, t)).collect();
                let values = [
                    rustler::Atom::from_str(env, d.kind.name()).unwrap().encode(env),
                    (d.index as u64).encode(env),
                    name.encode(env),
                    types.encode(env),
                ];
                Term::map_from_term_arrays(env, &keys, &values).unwrap()
            })
            .collect();
        Ok(list)
    })
}

/// `{device, reason}`: what `:auto` picks on this machine, and why.
#[rustler::nif(schedule = "DirtyCpu")]
fn auto_device(env: Env) -> Term {
    guard(env, "auto_device", || {
        let (device, reason) = crate::probe::auto();
        Ok((term::device(env, device), reason).encode(env))
    })
}

/// The device kinds compiled into this library (`:cpu` always).
#[rustler::nif]
fn compiled_kinds(env: Env) -> Term {
    guard(env, "compiled_kinds", || {
        let kinds: Vec<Term> = crate::device::DeviceKind::compiled()
            .into_iter()
            .map(|k| rustler::Atom::from_str(env, k.name()).unwrap().encode(env))
            .collect();
        Ok(kinds)
    })
}

#[rustler::nif(schedule = "DirtyCpu")]
fn supports_type<'a>(env: Env<'a>, device: Term<'a>, ty: Term<'a>) -> Term<'a> {
    guard(env, "supports_type", || term::decode_device(device)?.supports(term::decode_type(ty)?))
}

