//! Where a NIF runs: small CPU work on the calling scheduler, everything else on a dirty one.
//!
//! A dirty NIF costs two thread hand-overs per call (to a dirty scheduler and back), about as
//! much as an element-wise op on a few thousand CPU elements, and most of a tiny op's time. So
//! the NIFs listed here are regular NIFs that run the work in place when it is
//! certainly short (CPU tensors of at most `INLINE_MAX` elements: well under the BEAM's 1 ms
//! budget for a regular NIF even for f64 transcendental functions) and otherwise hand the same
//! call to a dirty CPU scheduler with `enif_schedule_nif`.
//!
//! Work that repeats (a compiled program, run once per step) is judged by its own last run
//! instead (`LastRun`): a CPU program that took well under the budget stays in place, so a
//! softmax over a million values does not pay the hand-overs on every call.

use std::ffi::CStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rustler::sys::{ErlNifEnv, ErlNifTerm, ERL_NIF_DIRTY_JOB_CPU_BOUND};
use rustler::{Env, Term};

use crate::device::DeviceKind;

/// A tensor argument as scheduling sees it (`resource::meta`).
pub struct Meta {
    pub kind: DeviceKind,
    pub shape: Vec<usize>,
}

/// The most elements a NIF works on in place (inputs and result).
pub const INLINE_MAX: usize = 4096;

/// Whether an op over `inputs` (broadcast together) is short enough to run in place.
pub fn small_on_cpu(inputs: &[Meta]) -> bool {
    let numel = |m: &Meta| crate::tensor::numel(&m.shape);
    if inputs.iter().any(|m| m.kind != DeviceKind::Cpu || numel(m) > INLINE_MAX) {
        return false;
    }
    // the broadcast result: each trailing-aligned axis takes its largest extent
    let rank = inputs.iter().map(|m| m.shape.len()).max().unwrap_or(0);
    let out: usize = (0..rank)
        .map(|i| {
            inputs.iter().map(|m| if i < m.shape.len() { m.shape[m.shape.len() - 1 - i] } else { 1 }).max().unwrap_or(1)
        })
        .product();
    out <= INLINE_MAX
}

/// The longest last run after which repeated work runs in place: half the BEAM's 1 ms budget for
/// a regular NIF, so a run that takes twice as long (a loaded machine) still keeps to it.
pub const SHORT_RUN: Duration = Duration::from_micros(500);

/// How long the last run of a repeated piece of work took; none is known before its first run,
/// which goes to a dirty scheduler like any other.
#[derive(Default)]
pub struct LastRun(AtomicU64);

impl LastRun {
    /// Whether the last run was short enough to run the next in place.
    pub fn short(&self) -> bool {
        // microseconds plus one; 0 before the first run
        matches!(self.0.load(Ordering::Relaxed), t if t > 0 && t - 1 <= SHORT_RUN.as_micros() as u64)
    }

    /// Runs `f`, keeping how long it took.
    pub fn time<R>(&self, f: impl FnOnce() -> R) -> R {
        let start = Instant::now();
        let r = f();
        self.0.store(start.elapsed().as_micros() as u64 + 1, Ordering::Relaxed);
        r
    }
}

/// The body of a NIF that may run on either scheduler.
pub type Body = for<'a> fn(Env<'a>, &[Term<'a>]) -> Term<'a>;

/// Runs `body` here when `inline`, else reschedules the call as `name` on a dirty CPU
/// scheduler, where `trampoline` (made by `dirty_trampoline!` for the same body) runs it.
pub fn run<'a>(
    env: Env<'a>,
    args: &[Term<'a>],
    inline: bool,
    body: Body,
    name: &'static CStr,
    trampoline: unsafe extern "C" fn(*mut ErlNifEnv, i32, *const ErlNifTerm) -> ErlNifTerm,
) -> Term<'a> {
    if inline {
        let start = Instant::now();
        let term = body(env, args);
        // tell the scheduler what share of its 1 ms slice the call used, as the NIF guide asks
        let percent = start.elapsed().as_micros() / 10;
        if percent > 0 {
            rustler::schedule::consume_timeslice(env, percent.min(100) as i32);
        }
        return term;
    }
    let argv: Vec<ErlNifTerm> = args.iter().map(|t| t.as_c_arg()).collect();
    // SAFETY: the terms belong to this call's environment; enif_schedule_nif copies them and
    // the value it returns must be this NIF's return value, which it is.
    unsafe {
        let raw = rustler::sys::enif_schedule_nif(
            env.as_c_arg(),
            name.as_ptr(),
            ERL_NIF_DIRTY_JOB_CPU_BOUND as i32,
            trampoline,
            argv.len() as i32,
            argv.as_ptr(),
        );
        Term::new(env, raw)
    }
}

/// An `extern "C"` NIF function running `$body` (a `Body`), for `run` to reschedule to.
/// Panics are caught inside the body (`guard`), so none crosses the C boundary; the catch
/// here is a last resort that answers `badarg` rather than aborting the VM.
macro_rules! dirty_trampoline {
    ($name:ident, $body:path) => {
        unsafe extern "C" fn $name(
            env: *mut rustler::sys::ErlNifEnv,
            argc: i32,
            argv: *const rustler::sys::ErlNifTerm,
        ) -> rustler::sys::ErlNifTerm {
            let lifetime = ();
            let env = rustler::Env::new(&lifetime, env);
            let args: Vec<rustler::Term> =
                std::slice::from_raw_parts(argv, argc as usize).iter().map(|t| rustler::Term::new(env, *t)).collect();
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| $body(env, &args))) {
                Ok(term) => term.as_c_arg(),
                Err(_) => rustler::sys::enif_make_badarg(env.as_c_arg()),
            }
        }
    };
}
pub(crate) use dirty_trampoline;
