//! The tensor resource handed to the BEAM, and the encodings of NIF results.

use std::cell::RefCell;
use std::panic::{RefUnwindSafe, UnwindSafe};

use rustler::{Encoder, Env, OwnedBinary, ResourceArc, Term};

use super::term;
use crate::error::{ExError, ExResult};
use crate::tensor::{Handle, TensorSlot};

pub struct TensorRes(pub TensorSlot);

// rustler's wrapper needs unwind safety; Burn's buffers do not declare it. The slot is only ever
// replaced whole under its lock, so an unwind cannot leave a half-updated tensor behind.
impl UnwindSafe for TensorRes {}
impl RefUnwindSafe for TensorRes {}

#[rustler::resource_impl]
impl rustler::Resource for TensorRes {}

pub type TensorRef = ResourceArc<TensorRes>;

pub fn tensor_ref(term: Term) -> ExResult<TensorRef> {
    term.decode().map_err(|_| ExError::Arg { name: "tensor", expected: "an ExBurn tensor reference" })
}

/// Decodes a tensor argument into its live handle.
pub fn arg(term: Term) -> ExResult<Handle> {
    tensor_ref(term)?.0.get()
}

/// Reads a tensor argument without cloning its handle (`TensorSlot::peek` says why): for NIFs
/// that only look at metadata.
pub fn peek<R>(term: Term, f: impl FnOnce(&Handle) -> R) -> ExResult<R> {
    tensor_ref(term)?.0.peek(f)
}

/// What scheduling needs of a tensor argument: its device kind and shape.
pub fn meta(term: Term) -> ExResult<super::schedule::Meta> {
    peek(term, |h| super::schedule::Meta { kind: h.device.kind, shape: h.shape.clone() })
}

pub fn arg_list(term: Term) -> ExResult<Vec<Handle>> {
    let refs: Vec<TensorRef> = term
        .decode()
        .map_err(|_| ExError::Arg { name: "tensors", expected: "a list of ExBurn tensor references" })?;
    refs.iter().map(|r| r.0.get()).collect()
}

/// What tensor-producing NIFs return: `{ref, shape, type, device}`, so Elixir can build its
/// struct without asking again.
pub struct TensorOut(pub Handle);

impl Encoder for TensorOut {
    fn encode<'a>(&self, env: Env<'a>) -> Term<'a> {
        let h = &self.0;
        // every tensor a NIF returns passes here: a large GPU result starts its work now
        crate::gpu::flush::after_result(h);
        let res = ResourceArc::new(TensorRes(TensorSlot::new(h.clone())));
        (res, term::shape(env, &h.shape), term::nx_type(env, h.ty), term::device(env, h.device)).encode(env)
    }
}

/// Host bytes handed to the VM as a binary.
pub struct BinaryOut(RefCell<Option<OwnedBinary>>);

impl BinaryOut {
    pub fn new(bytes: &[u8]) -> Self {
        let mut bin = OwnedBinary::new(bytes.len());
        bin.as_mut_slice().copy_from_slice(bytes);
        BinaryOut(RefCell::new(Some(bin)))
    }
}

impl Encoder for BinaryOut {
    fn encode<'a>(&self, env: Env<'a>) -> Term<'a> {
        match self.0.borrow_mut().take() {
            Some(bin) => bin.release(env).encode(env),
            None => rustler::types::atom::nil().encode(env),
        }
    }
}
