//! Model NIFs: build, train one epoch, evaluate, predict, serialise.
//!
//! The layers, the training configuration, the schedule and the clipping arrive as typed terms
//! (`model::spec`'s types and the two below), decoded by rustler through `strict`; Elixir has
//! filled in every default.

use std::panic::{RefUnwindSafe, UnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use rustler::{Binary, Encoder, Env, NifMap, NifTaggedEnum, ResourceArc, Term};

use super::resource::{arg, BinaryOut, TensorOut};
use super::{atoms, guard, schedule, strict, term};
use crate::device::{DeviceKind, DeviceRef};
use crate::error::{Detail, ExError, ExResult};
use crate::model::spec::{LayerSpec, Schedule, TrainConfig};
use crate::model::net::LayerInfo;
use crate::model::train::Trainer;

pub struct ModelRes {
    /// `None` once freed.
    trainer: Mutex<Option<Trainer>>,
    cancel: AtomicBool,
    /// Kept outside the lock so `summary` never waits for a running epoch.
    layers: Vec<LayerInfo>,
    params: usize,
    epochs: AtomicUsize,
}

// The trainer is only replaced whole at the end of an epoch (see `Trainer::train_epoch`), so an
// unwind through the lock leaves the previous, consistent model behind.
impl UnwindSafe for ModelRes {}
impl RefUnwindSafe for ModelRes {}

#[rustler::resource_impl]
impl rustler::Resource for ModelRes {}

fn model(term: Term) -> ExResult<ResourceArc<ModelRes>> {
    term.decode().map_err(|_| ExError::Arg { name: "model", expected: "an ExBurn model reference" })
}

/// The error for any use of a freed model. `kind: :freed` lets `fit` tell a model freed under it
/// (which cancels the fit) from other failures without reading the message.
fn freed() -> ExError {
    ExError::invalid_with("model was freed", vec![("kind", Detail::Atom("freed"))])
}

/// Runs `f` on the model's trainer under its lock; a freed model is an error.
fn with_trainer<R>(m: &ModelRes, f: impl FnOnce(&mut Trainer) -> ExResult<R>) -> ExResult<R> {
    let mut guard: MutexGuard<'_, Option<Trainer>> = m.trainer.lock().unwrap_or_else(|e| e.into_inner());
    let trainer = guard.as_mut().ok_or_else(freed)?;
    let result = f(trainer);
    m.epochs.store(trainer.epochs, Ordering::Relaxed);
    result
}

/// `fit`'s `:lr_schedule` as `ExBurn.Model.Fit` sends it, the base rate first: `{:step, base,
/// step_epochs, gamma}`, `{:exponential, base, gamma}` or `{:cosine, base, min, epochs}`.
#[derive(NifTaggedEnum)]
enum LrSchedule {
    Step(f64, usize, f64),
    Exponential(f64, f64),
    Cosine(f64, f64, usize),
}

impl LrSchedule {
    fn schedule_and_base(self) -> (Schedule, f64) {
        match self {
            LrSchedule::Step(base, step, gamma) => (Schedule::Step { step: step.max(1), gamma }, base),
            LrSchedule::Exponential(base, gamma) => (Schedule::Exponential { gamma }, base),
            LrSchedule::Cosine(base, min, epochs) => (Schedule::Cosine { min, epochs: epochs.max(1) }, base),
        }
    }
}

/// Each layer decoded on its own, so that an error says which.
fn layer_specs(layers: Term) -> ExResult<Vec<LayerSpec>> {
    let items: Vec<Term> = layers.decode().map_err(|_| ExError::Arg { name: "layers", expected: "a list" })?;
    let at = |i: usize, e: ExError| match e {
        ExError::Invalid { reason, mut details } => {
            details.push(("index", Detail::Int(i as i128)));
            ExError::Invalid { reason, details }
        }
        other => other,
    };
    items.into_iter().enumerate().map(|(i, l)| strict::decode(l, "layer").map_err(|e| at(i, e))).collect()
}

/// The gradient clipping a fit asks for; `nil` removes one.
#[derive(NifMap)]
struct Clipping {
    clip_norm: Option<f64>,
    clip_value: Option<f64>,
}

fn summary<'a>(env: Env<'a>, m: &ModelRes) -> Term<'a> {
    let layers: Vec<Term> = m
        .layers
        .iter()
        .map(|i| (rustler::Atom::from_str(env, i.name).unwrap(), term::shape(env, &i.output), i.params as u64).encode(env))
        .collect();
    (layers, m.params as u64, m.epochs.load(Ordering::Relaxed) as u64).encode(env)
}

#[rustler::nif(schedule = "DirtyCpu")]
fn model_new<'a>(env: Env<'a>, layers: Term<'a>, input: Term<'a>, int_input: Term<'a>, cfg: Term<'a>, device: Term<'a>, seed: Term<'a>) -> Term<'a> {
    guard(env, "compile", || {
        let specs = layer_specs(layers)?;
        let config: TrainConfig = strict::decode(cfg, "config")?;
        let input = term::usizes(input, "input_shape")?;
        let int_input = term::boolean(int_input, "integer_input")?;
        let seed: u64 = seed.decode().map_err(|_| ExError::Arg { name: "seed", expected: "a non-negative integer" })?;
        let trainer = Trainer::new(specs, input, int_input, config, term::decode_device(device)?, seed)?;
        let res = ResourceArc::new(ModelRes {
            layers: trainer.infos.clone(),
            params: trainer.num_params(),
            epochs: AtomicUsize::new(0),
            trainer: Mutex::new(Some(trainer)),
            cancel: AtomicBool::new(false),
        });
        let info = summary(env, &res);
        Ok((res, info).encode(env))
    })
}

#[rustler::nif]
fn model_summary<'a>(env: Env<'a>, m: Term<'a>) -> Term<'a> {
    guard(env, "summary", || Ok(summary(env, &*model(m)?)))
}

#[rustler::nif(schedule = "DirtyCpu")]
fn model_set_schedule<'a>(env: Env<'a>, m: Term<'a>, schedule: Term<'a>) -> Term<'a> {
    guard(env, "fit", || {
        let m = model(m)?;
        // nil (no schedule) is checked first: `Option`'s decoder would hide why a schedule is refused
        let schedule: Option<LrSchedule> = if term::is_nil(schedule) { None } else { Some(strict::decode(schedule, "lr_schedule")?) };
        with_trainer(&m, |t| match schedule {
            Some(s) => {
                let (schedule, base) = s.schedule_and_base();
                t.set_schedule(schedule, base)
            }
            None => {
                let base = t.config.learning_rate;
                t.set_schedule(Schedule::Constant, base)
            }
        })?;
        Ok(atoms::ok())
    })
}

/// `f` run on a worker of rayon's pool, the caller (a dirty scheduler) waiting. The parallel
/// parts inside (gemm's products, our kernels) then fork from inside the pool, where a join
/// is a queue push, instead of from outside it, where each parks the caller and wakes a
/// worker, context switches that weigh on every mid-size product (guides/training.md). Only for
/// calls that run long: getting into the pool costs one such round trip, more than a one-row
/// predict's work, so not for `predict`. Only for CPU models: a GPU
/// model's epoch has nothing to fork on the host and spends its time waiting on the device, which
/// inside the pool would hold one of the workers that CPU work elsewhere in the VM needs.
fn in_pool<R: Send>(device: DeviceRef, f: impl FnOnce() -> R + Send) -> R {
    if device.kind == DeviceKind::Cpu {
        rayon::scope(|_| f())
    } else {
        f()
    }
}

#[rustler::nif(schedule = "DirtyCpu")]
fn model_train_epoch<'a>(env: Env<'a>, m: Term<'a>, x: Term<'a>, y: Term<'a>, batch_size: Term<'a>, shuffle: Term<'a>) -> Term<'a> {
    guard(env, "fit", || {
        let m = model(m)?;
        let (x, y) = (arg(x)?, arg(y)?);
        let (bs, shuffle) = (term::usize_arg(batch_size, "batch_size")?, term::boolean(shuffle, "shuffle")?);
        with_trainer(&m, |t| in_pool(t.device, || t.train_epoch(&x, &y, bs, shuffle, &m.cancel)))
    })
}

#[rustler::nif]
fn model_cancel<'a>(env: Env<'a>, m: Term<'a>, flag: Term<'a>) -> Term<'a> {
    guard(env, "cancel", || {
        model(m)?.cancel.store(term::boolean(flag, "flag")?, Ordering::Relaxed);
        Ok(atoms::ok())
    })
}

#[rustler::nif(schedule = "DirtyCpu")]
fn model_evaluate<'a>(env: Env<'a>, m: Term<'a>, x: Term<'a>, y: Term<'a>, batch_size: Term<'a>) -> Term<'a> {
    guard(env, "evaluate", || {
        let m = model(m)?;
        let bs = term::usize_arg(batch_size, "batch_size")?;
        let (x, y) = (arg(x)?, arg(y)?);
        with_trainer(&m, |t| in_pool(t.device, || t.evaluate(&x, &y, bs)))
    })
}

/// The most multiply-adds a predict runs on the calling (normal) scheduler: 2^20 stay well under
/// the BEAM's 1 ms budget for a regular NIF.
const INLINE_PREDICT_MACS: usize = 1 << 20;

// Small predicts on the CPU run in place (`nif::schedule`): the hand-over to a dirty scheduler
// and back can cost a one-row predict more than its work.
#[rustler::nif]
fn model_predict<'a>(env: Env<'a>, m: Term<'a>, x: Term<'a>, batch_size: Term<'a>) -> Term<'a> {
    if let Some(out) = predict_in_place(env, m, x, batch_size) {
        return out;
    }
    schedule::run(env, &[m, x, batch_size], false, predict_body, c"model_predict", predict_dirty)
}
schedule::dirty_trampoline!(predict_dirty, predict_body);

fn predict_body<'a>(env: Env<'a>, args: &[Term<'a>]) -> Term<'a> {
    let &[m, x, batch_size] = args else { unreachable!("model_predict/3") };
    guard(env, "predict", || {
        let m = model(m)?;
        let bs = term::usize_arg(batch_size, "batch_size")?;
        let x = arg(x)?;
        Ok(TensorOut(with_trainer(&m, |t| t.predict(&x, bs))?))
    })
}

/// The predict run here when it is certainly short: a CPU model of dense layers
/// (`Trainer::dense_forward_macs`) within `INLINE_PREDICT_MACS`, on CPU input, and the model not
/// in use elsewhere (`try_lock`: a normal scheduler must never wait for a running fit). None
/// sends the call to a dirty scheduler, which also reports every error.
fn predict_in_place<'a>(env: Env<'a>, m: Term<'a>, x: Term<'a>, batch_size: Term<'a>) -> Option<Term<'a>> {
    let (res, xh) = (model(m).ok()?, arg(x).ok()?);
    let rows = *xh.shape.first()?;
    let mut lock = res.trainer.try_lock().ok()?;
    let t = lock.as_mut()?;
    let small = t.device.kind == DeviceKind::Cpu && xh.device.kind == DeviceKind::Cpu;
    if !small || t.dense_forward_macs(rows)? > INLINE_PREDICT_MACS {
        return None;
    }
    Some(guard(env, "predict", || {
        let bs = term::usize_arg(batch_size, "batch_size")?;
        Ok(TensorOut(t.predict(&xh, bs)?))
    }))
}

#[rustler::nif(schedule = "DirtyCpu")]
fn model_to_bytes<'a>(env: Env<'a>, m: Term<'a>) -> Term<'a> {
    guard(env, "save", || Ok(BinaryOut::new(&with_trainer(&*model(m)?, |t| t.to_bytes())?)))
}

#[rustler::nif(schedule = "DirtyCpu")]
fn model_load_bytes<'a>(env: Env<'a>, m: Term<'a>, bytes: Term<'a>) -> Term<'a> {
    guard(env, "load", || {
        let m = model(m)?;
        let bin: Binary = bytes.decode().map_err(|_| ExError::Arg { name: "bytes", expected: "a binary" })?;
        let bytes = bin.as_slice().to_vec();
        with_trainer(&m, |t| t.load_bytes(bytes))?;
        Ok(atoms::ok())
    })
}

/// Sets the gradient clipping between fits (`%{clip_norm: _, clip_value: _}`).
#[rustler::nif(schedule = "DirtyCpu")]
fn model_configure<'a>(env: Env<'a>, m: Term<'a>, clipping: Term<'a>) -> Term<'a> {
    guard(env, "fit", || {
        let m = model(m)?;
        let Clipping { clip_norm, clip_value } = strict::decode(clipping, "clipping")?;
        with_trainer(&m, |t| {
            t.set_clipping(clip_norm, clip_value);
            Ok(())
        })?;
        Ok(atoms::ok())
    })
}

/// Frees the model's weights and optimizer state now instead of at garbage collection: `:ok`, or
/// `:already_deallocated` when it was already freed (the answers of `deallocate` and of Nx's
/// `backend_deallocate`). A running epoch is cancelled first; the lock waits for its batch.
#[rustler::nif(schedule = "DirtyCpu")]
fn model_free<'a>(env: Env<'a>, m: Term<'a>) -> Term<'a> {
    guard(env, "free", || {
        let m = model(m)?;
        m.cancel.store(true, Ordering::Relaxed);
        let freed = m.trainer.lock().unwrap_or_else(|e| e.into_inner()).take().is_some();
        Ok(if freed { atoms::ok() } else { atoms::already_deallocated() })
    })
}
