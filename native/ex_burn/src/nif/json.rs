//! JSON through serde_json, so the core (mix tasks, the HTTP server, test data) reads and writes
//! JSON without a Hex package. Objects decode to maps with binary keys, `null` to `nil`, integers
//! to integers and other numbers to floats; encoding takes maps with atom, binary or integer keys,
//! lists, binaries (UTF-8), numbers, booleans, `nil` and other atoms (as strings).

use rustler::types::map::MapIterator;
use rustler::{Encoder, Env, Term, TermType};
use serde_json::{Map, Number, Value};

use super::guard;
use crate::error::{ExError, ExResult};

/// Deeper nesting is refused both ways (serde_json's own decode limit), so neither side recurses
/// without bound on hostile input.
const MAX_DEPTH: usize = 128;

fn invalid(reason: String) -> ExError {
    ExError::invalid_with(reason, vec![])
}

fn to_term<'a>(env: Env<'a>, v: &Value) -> Term<'a> {
    match v {
        Value::Null => rustler::types::atom::nil().encode(env),
        Value::Bool(b) => b.encode(env),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => i.encode(env),
            (None, Some(u)) => u.encode(env),
            _ => n.as_f64().unwrap_or(f64::NAN).encode(env),
        },
        Value::String(s) => s.encode(env),
        Value::Array(items) => items.iter().map(|x| to_term(env, x)).collect::<Vec<_>>().encode(env),
        Value::Object(map) => {
            let keys: Vec<Term> = map.keys().map(|k| k.encode(env)).collect();
            let values: Vec<Term> = map.values().map(|x| to_term(env, x)).collect();
            Term::map_from_term_arrays(env, &keys, &values).unwrap_or_else(|_| Term::map_new(env))
        }
    }
}

fn key(t: Term) -> ExResult<String> {
    match t.get_type() {
        TermType::Atom => t.atom_to_string().map_err(|_| invalid("unreadable atom key".into())),
        TermType::Integer => Ok(t.decode::<i64>().map_err(|_| invalid("integer key out of range".into()))?.to_string()),
        TermType::Binary => t.decode::<String>().map_err(|_| invalid("a map key is not valid UTF-8".into())),
        _ => Err(invalid(format!("a map key must be an atom, a string or an integer, got {t:?}"))),
    }
}

fn from_term(t: Term, depth: usize) -> ExResult<Value> {
    if depth > MAX_DEPTH {
        return Err(invalid(format!("nested deeper than {MAX_DEPTH} levels")));
    }
    Ok(match t.get_type() {
        TermType::Atom => match t.atom_to_string().map_err(|_| invalid("unreadable atom".into()))?.as_str() {
            "nil" => Value::Null,
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            other => Value::String(other.to_string()),
        },
        TermType::Integer => match t.decode::<i64>() {
            Ok(i) => Value::from(i),
            Err(_) => Value::from(t.decode::<u64>().map_err(|_| invalid("an integer does not fit in 64 bits".into()))?),
        },
        TermType::Float => {
            let f: f64 = t.decode().map_err(|_| invalid("unreadable float".into()))?;
            Value::Number(Number::from_f64(f).ok_or_else(|| invalid("NaN and infinities have no JSON form".into()))?)
        }
        TermType::Binary => Value::String(t.decode::<String>().map_err(|_| invalid("a binary is not valid UTF-8".into()))?),
        TermType::List => {
            let items: Vec<Term> = t.decode().map_err(|_| invalid("an improper list".into()))?;
            Value::Array(items.into_iter().map(|x| from_term(x, depth + 1)).collect::<ExResult<_>>()?)
        }
        TermType::Map => {
            let mut map = Map::new();
            for (k, v) in MapIterator::new(t).ok_or_else(|| invalid("unreadable map".into()))? {
                map.insert(key(k)?, from_term(v, depth + 1)?);
            }
            Value::Object(map)
        }
        other => return Err(invalid(format!("{other:?} has no JSON form"))),
    })
}

#[rustler::nif(schedule = "DirtyCpu")]
fn json_decode<'a>(env: Env<'a>, text: Term<'a>) -> Term<'a> {
    guard(env, "json_decode", || {
        let bin = text.decode::<rustler::Binary>().map_err(|_| ExError::Arg { name: "json", expected: "a binary" })?;
        let value: Value = serde_json::from_slice(bin.as_slice()).map_err(|e| {
            ExError::invalid_with(
                format!("invalid JSON: {e}"),
                vec![("line", crate::error::Detail::Int(e.line() as i128)), ("column", crate::error::Detail::Int(e.column() as i128))],
            )
        })?;
        Ok(to_term(env, &value))
    })
}

#[rustler::nif(schedule = "DirtyCpu")]
fn json_encode<'a>(env: Env<'a>, value: Term<'a>, pretty: Term<'a>) -> Term<'a> {
    guard(env, "json_encode", || {
        let value = from_term(value, 0)?;
        let text = if super::term::boolean(pretty, "pretty")? { serde_json::to_vec_pretty(&value) } else { serde_json::to_vec(&value) };
        let text = text.map_err(|e| invalid(e.to_string()))?;
        Ok(super::resource::BinaryOut::new(&text))
    })
}
