//! Term conversions: Nx types, devices, shapes, axes, scalars and error details.

use burn::backend::Scalar;
use rustler::{Atom, Encoder, Env, Term};

use crate::device::{DeviceKind, DeviceRef};
use crate::dtype::NxType;
use crate::error::{Detail, ExError, ExResult};

pub fn nx_type<'a>(env: Env<'a>, t: NxType) -> Term<'a> {
    let (k, b) = t.parts();
    (Atom::from_str(env, k).unwrap(), b as u64).encode(env)
}

pub fn device<'a>(env: Env<'a>, d: DeviceRef) -> Term<'a> {
    (Atom::from_str(env, d.kind.name()).unwrap(), d.index as u64).encode(env)
}

pub fn shape<'a>(env: Env<'a>, dims: &[usize]) -> Term<'a> {
    let dims: Vec<Term> = dims.iter().map(|d| (*d as u64).encode(env)).collect();
    rustler::types::tuple::make_tuple(env, &dims)
}

pub fn detail<'a>(env: Env<'a>, d: &Detail) -> Term<'a> {
    match d {
        Detail::Dims(v) => v.encode(env),
        Detail::Int(i) => match i64::try_from(*i) {
            Ok(v) => v.encode(env),
            Err(_) => i.to_string().encode(env),
        },
        Detail::Text(s) => s.encode(env),
        Detail::Type(t) => nx_type(env, *t),
        Detail::Atom(a) => rustler::Atom::from_str(env, a).map(|a| a.encode(env)).unwrap_or_else(|_| a.encode(env)),
    }
}

pub fn decode_type(term: Term) -> ExResult<NxType> {
    let parts: Option<(Atom, u64)> = term.decode().ok();
    parts
        .and_then(|(kind, bits)| {
            let kind = kind.to_term(term.get_env()).atom_to_string().ok()?;
            NxType::from_parts(&kind, bits)
        })
        .ok_or_else(|| ExError::UnsupportedType { given: format!("{term:?}") })
}

pub fn decode_device(term: Term) -> ExResult<DeviceRef> {
    let bad = || ExError::Arg { name: "device", expected: ":cpu or {kind, index}" };
    let kind_of = |t: Term| -> ExResult<DeviceKind> {
        let name = t.atom_to_string().map_err(|_| bad())?;
        DeviceKind::from_name(&name).ok_or_else(bad)
    };
    if term.is_atom() {
        return Ok(DeviceRef { kind: kind_of(term)?, index: 0 });
    }
    let (kind, index): (Term, u64) = term.decode().map_err(|_| bad())?;
    Ok(DeviceRef { kind: kind_of(kind)?, index: usize::try_from(index).map_err(|_| bad())? })
}

/// A device inside a typed input (a `NifMap` field), read as `decode_device` reads it.
impl<'a> rustler::Decoder<'a> for DeviceRef {
    fn decode(term: Term<'a>) -> rustler::NifResult<Self> {
        decode_device(term).map_err(|e| rustler::Error::RaiseTerm(Box::new(e.to_string())))
    }
}

impl rustler::Encoder for DeviceRef {
    fn encode<'a>(&self, env: Env<'a>) -> Term<'a> {
        device(env, *self)
    }
}

pub fn usizes(term: Term, name: &'static str) -> ExResult<Vec<usize>> {
    let err = ExError::Arg { name, expected: "a list of non-negative integers" };
    let v: Vec<u64> = term.decode().map_err(|_| err)?;
    v.into_iter()
        .map(|x| usize::try_from(x).map_err(|_| ExError::Arg { name, expected: "a list of non-negative integers" }))
        .collect()
}

pub fn usize_arg(term: Term, name: &'static str) -> ExResult<usize> {
    let err = || ExError::Arg { name, expected: "a non-negative integer" };
    let v: u64 = term.decode().map_err(|_| err())?;
    usize::try_from(v).map_err(|_| err())
}

pub fn is_nil(term: Term) -> bool {
    term.atom_to_string().map(|s| s == "nil").unwrap_or(false)
}

/// `nil` or a non-negative integer.
pub fn opt_usize(term: Term, name: &'static str) -> ExResult<Option<usize>> {
    if is_nil(term) {
        return Ok(None);
    }
    usize_arg(term, name).map(Some)
}

/// `nil` or a list of axes.
pub fn opt_axes(term: Term, name: &'static str) -> ExResult<Option<Vec<usize>>> {
    if is_nil(term) {
        return Ok(None);
    }
    usizes(term, name).map(Some)
}

pub fn boolean(term: Term, name: &'static str) -> ExResult<bool> {
    term.decode().map_err(|_| ExError::Arg { name, expected: "a boolean" })
}

pub fn atom(term: Term, name: &'static str) -> ExResult<String> {
    term.atom_to_string().map_err(|_| ExError::Arg { name, expected: "an atom" })
}

/// An op of family `V`, named by Nx's atom: the one place op names are read.
pub fn op<V: crate::ops::vocab::Vocabulary>(term: Term) -> ExResult<V> {
    let name = atom(term, "op")?;
    V::from_name(&name).ok_or_else(|| {
        ExError::invalid_with(format!("unknown {}", V::FAMILY), vec![("op", crate::error::Detail::Text(name))])
    })
}

/// A number as Nx hands it over: an integer, a float, or `:infinity`/`:neg_infinity`/`:nan`.
#[derive(Clone, Copy, Debug)]
pub enum Number {
    Int(i64),
    UInt(u64),
    Float(f64),
    NonFinite(&'static str, f64),
}

impl<'a> rustler::Decoder<'a> for Number {
    fn decode(term: Term<'a>) -> rustler::NifResult<Self> {
        if let Ok(name) = term.atom_to_string() {
            return match name.as_str() {
                "infinity" => Ok(Number::NonFinite("infinity", f64::INFINITY)),
                "neg_infinity" => Ok(Number::NonFinite("neg_infinity", f64::NEG_INFINITY)),
                "nan" => Ok(Number::NonFinite("nan", f64::NAN)),
                _ => Err(rustler::Error::BadArg),
            };
        }
        term.decode::<i64>()
            .map(Number::Int)
            .or_else(|_| term.decode::<u64>().map(Number::UInt))
            .or_else(|_| term.decode::<f64>().map(Number::Float))
    }
}

impl Number {
    /// The fill value for a tensor of type `ty` (floats become integers by truncation).
    pub fn scalar(self, ty: NxType) -> ExResult<Scalar> {
        Ok(match self {
            Number::NonFinite(name, _) if !ty.is_float() => {
                return Err(ExError::invalid(format!("{name} is not representable in {ty}")))
            }
            Number::NonFinite(_, v) | Number::Float(v) if ty.is_float() => Scalar::Float(v),
            Number::Int(i) if ty.is_float() => Scalar::Float(i as f64),
            Number::UInt(u) if ty.is_float() => Scalar::Float(u as f64),
            Number::Int(i) if ty.is_unsigned() => Scalar::UInt(i as u64),
            Number::Int(i) => Scalar::Int(i),
            Number::UInt(u) => Scalar::UInt(u),
            Number::Float(f) | Number::NonFinite(_, f) => Scalar::Int(f.trunc() as i64),
        })
    }
}

/// A fill value for a tensor of type `ty`: a number, or `:infinity`/`:neg_infinity`/`:nan`.
pub fn scalar(term: Term, ty: NxType) -> ExResult<Scalar> {
    let bad = ExError::Arg { name: "value", expected: "a number, :infinity, :neg_infinity or :nan" };
    term.decode::<Number>().map_err(|_| bad)?.scalar(ty)
}

impl<'a> rustler::Decoder<'a> for NxType {
    fn decode(term: Term<'a>) -> rustler::NifResult<Self> {
        decode_type(term).map_err(|_| rustler::Error::BadArg)
    }
}

macro_rules! vocabulary_decoders {
    ($($vocabulary:ty),*) => {$(
        impl<'a> rustler::Decoder<'a> for $vocabulary {
            fn decode(term: Term<'a>) -> rustler::NifResult<Self> {
                op(term).map_err(|_| rustler::Error::BadArg)
            }
        }
    )*};
}
vocabulary_decoders!(
    crate::ops::vocab::UnaryOp,
    crate::ops::vocab::BinaryOp,
    crate::ops::vocab::ReduceOp,
    crate::ops::vocab::ArgReduceOp,
    crate::ops::vocab::WindowOp,
    crate::ops::vocab::IndexedOp
);
