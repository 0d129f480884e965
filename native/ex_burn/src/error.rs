//! Typed errors, and the panic catcher that turns Burn's precondition panics into them.
//!
//! Burn reports many precondition failures by panicking; `catch` keeps the panic message (rustler's
//! own catch would reduce it to `:nif_panicked`) and the hook keeps it off the VM's stderr.

use std::cell::RefCell;
use std::panic::{self, AssertUnwindSafe};

use crate::dtype::NxType;

/// One value of an error's `details` map.
#[derive(Debug, Clone)]
pub enum Detail {
    Dims(Vec<usize>),
    Int(i128),
    Text(String),
    Type(NxType),
    Atom(&'static str),
}

#[derive(Debug, thiserror::Error)]
pub enum ExError {
    #[error("invalid argument `{name}`: expected {expected}")]
    Arg { name: &'static str, expected: &'static str },
    #[error("unsupported type")]
    UnsupportedType { given: String },
    #[error("device does not support type")]
    DeviceType { device: String, ty: NxType },
    #[error("tensor was deallocated")]
    Deallocated,
    #[error("binary size does not match shape and type")]
    BinarySize { expected: usize, actual: usize, shape: Vec<usize>, ty: NxType },
    #[error("cannot broadcast shapes")]
    Broadcast { lhs: Vec<usize>, rhs: Vec<usize> },
    #[error("tensor is too large to allocate")]
    TooLarge { shape: Vec<usize>, bytes: u128, limit: u128 },
    #[error("{reason}")]
    Invalid { reason: String, details: Vec<(&'static str, Detail)> },
    #[error("{0}")]
    Device(String),
    #[error("execution failed on device: {0}")]
    Execution(String),
    #[error("backend panicked: {message}")]
    Panic { message: String, location: Option<String> },
    /// An error Nx itself specifies as `ArgumentError` with this exact message (out-of-bounds
    /// gather indices, negative shift amounts): its details carry `kind: :argument`, and
    /// `ExBurn.Error.unwrap!/1` raises it as Nx does, so backend and compiler agree with Nx.
    #[error("{0}")]
    NxArgument(String),
    /// A dirty NIF noticed that the process waiting for it has exited and stopped early.
    #[error("cancelled: the calling process exited")]
    Cancelled,
    /// A training epoch stopped because `ExBurn.Model.cancel/1` (or `free/1`) asked it to: the
    /// caller is alive and `fit` returns `halted: :cancelled`. Its details carry `kind: :cancelled`
    /// so Elixir recognises it without reading the message.
    #[error("training was cancelled")]
    TrainingCancelled,
}

pub type ExResult<T> = Result<T, ExError>;

impl ExError {
    pub fn invalid(reason: impl Into<String>) -> Self {
        ExError::Invalid { reason: reason.into(), details: Vec::new() }
    }

    pub fn invalid_with(reason: impl Into<String>, details: Vec<(&'static str, Detail)>) -> Self {
        ExError::Invalid { reason: reason.into(), details }
    }

    pub fn details(&self) -> Vec<(&'static str, Detail)> {
        use Detail::*;
        match self {
            ExError::Arg { name, expected } => {
                vec![("argument", Text(name.to_string())), ("expected", Text(expected.to_string()))]
            }
            ExError::UnsupportedType { given } => vec![("type", Text(given.clone()))],
            ExError::DeviceType { device, ty } => {
                vec![("device", Text(device.clone())), ("type", Type(*ty))]
            }
            ExError::Deallocated => vec![],
            ExError::BinarySize { expected, actual, shape, ty } => vec![
                ("expected_bytes", Int(*expected as i128)),
                ("actual_bytes", Int(*actual as i128)),
                ("shape", Dims(shape.clone())),
                ("type", Type(*ty)),
            ],
            ExError::Broadcast { lhs, rhs } => vec![("lhs", Dims(lhs.clone())), ("rhs", Dims(rhs.clone()))],
            ExError::TooLarge { shape, bytes, limit } => vec![
                ("shape", Dims(shape.clone())),
                ("bytes", Int(*bytes as i128)),
                ("limit", Int(*limit as i128)),
            ],
            ExError::Invalid { details, .. } => details.clone(),
            ExError::Device(_) | ExError::Execution(_) | ExError::Cancelled => vec![],
            ExError::NxArgument(_) => vec![("kind", Atom("argument"))],
            ExError::TrainingCancelled => vec![("kind", Atom("cancelled"))],
            ExError::Panic { location, .. } => match location {
                Some(l) => vec![("location", Text(l.clone()))],
                None => vec![],
            },
        }
    }
}

thread_local! {
    static PANIC_LOCATION: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Replaces the default hook so Burn's panics never print on the VM's stderr; the location is kept
/// for the error details of the guard that catches the unwind.
pub fn install_panic_hook() {
    panic::set_hook(Box::new(|info| {
        let location = info.location().map(|l| format!("{}:{}", l.file(), l.line()));
        PANIC_LOCATION.with(|slot| *slot.borrow_mut() = location);
    }));
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic payload".to_string()
    }
}

/// Runs `f`, catching panics, and returns `Ok(value)` or the typed error.
pub fn catch<R>(f: impl FnOnce() -> ExResult<R>) -> ExResult<R> {
    match panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(payload) => {
            let location = PANIC_LOCATION.with(|slot| slot.borrow_mut().take());
            Err(ExError::Panic { message: panic_message(payload), location })
        }
    }
}
