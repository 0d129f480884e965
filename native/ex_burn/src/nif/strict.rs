//! Typed NIF inputs: values rustler decodes through their derives (`NifMap`, `NifTaggedEnum`,
//! `NifUnitEnum`), with no key the type lacks.
//!
//! rustler's derived decoders read the fields they know and skip any other key, so a misspelt
//! option would be dropped without a word. `decode` encodes the value back and requires every
//! key of the input to be in it, at any depth: an unknown key is an error that names it.

use rustler::types::map::MapIterator;
use rustler::types::tuple::get_tuple;
use rustler::{Decoder, Encoder, Term, TermType};

use crate::error::{Detail, ExError, ExResult};

/// `term` decoded as `T`, or an error naming `name` (the argument) and, where rustler tells or
/// the key is unknown, the key.
pub fn decode<'a, T: Decoder<'a> + Encoder>(term: Term<'a>, name: &'static str) -> ExResult<T> {
    let value: T = term.decode().map_err(|e| undecodable(term, name, e))?;
    match unknown_key(term, value.encode(term.get_env())) {
        None => Ok(value),
        Some(key) => Err(ExError::invalid_with(
            format!("unknown key {} in {name}", shown(key)),
            vec![("argument", Detail::Text(name.into())), ("key", Detail::Text(bare(key)))],
        )),
    }
}

/// The first key of `given` that its decoded-and-encoded-back form `known` lacks.
fn unknown_key<'a>(given: Term<'a>, known: Term<'a>) -> Option<Term<'a>> {
    match (given.get_type(), known.get_type()) {
        (TermType::Map, TermType::Map) => MapIterator::new(given)?.find_map(|(k, v)| match known.map_get(k) {
            Ok(kv) => unknown_key(v, kv),
            Err(_) => Some(k),
        }),
        (TermType::Tuple, TermType::Tuple) => {
            let (g, k) = (get_tuple(given).ok()?, get_tuple(known).ok()?);
            (g.len() == k.len()).then(|| g.into_iter().zip(k).find_map(|(g, k)| unknown_key(g, k))).flatten()
        }
        (TermType::List, TermType::List) => {
            let (g, k): (Vec<Term>, Vec<Term>) = (given.decode().ok()?, known.decode().ok()?);
            (g.len() == k.len()).then(|| g.into_iter().zip(k).find_map(|(g, k)| unknown_key(g, k))).flatten()
        }
        _ => None,
    }
}

/// rustler's reason (its derives name the field they could not decode), as an argument error;
/// an enum's unknown tag is named.
fn undecodable(term: Term, name: &'static str, e: rustler::Error) -> ExError {
    if let (rustler::Error::RaiseAtom("invalid_variant"), Some(tag)) = (&e, tag(term)) {
        return ExError::invalid_with(
            format!("unknown {name} {}", shown(tag)),
            vec![("argument", Detail::Text(name.into())), ("variant", Detail::Text(bare(tag)))],
        );
    }
    let why = match e {
        rustler::Error::RaiseTerm(t) | rustler::Error::Term(t) => t.encode(term.get_env()).decode::<String>().ok(),
        rustler::Error::RaiseAtom(a) | rustler::Error::Atom(a) => Some(a.replace('_', " ")),
        rustler::Error::BadArg => None,
    };
    let reason = match &why {
        Some(why) => format!("invalid {name}: {why}"),
        None => format!("invalid {name}: a missing key, or a term of the wrong kind"),
    };
    ExError::invalid_with(reason, vec![("argument", Detail::Text(name.into()))])
}

/// The tag of what may be an enum value: the atom itself, or a tuple's first element.
fn tag(term: Term) -> Option<Term> {
    match term.get_type() {
        TermType::Atom => Some(term),
        TermType::Tuple => get_tuple(term).ok()?.first().copied().filter(|t| t.is_atom()),
        _ => None,
    }
}

/// An atom as Elixir writes it (`:name`), any other term as the VM prints it.
fn shown(t: Term) -> String {
    match t.atom_to_string() {
        Ok(a) => format!(":{a}"),
        Err(_) => format!("{t:?}"),
    }
}

/// An atom's name, any other term as the VM prints it.
fn bare(t: Term) -> String {
    t.atom_to_string().unwrap_or_else(|_| format!("{t:?}"))
}
