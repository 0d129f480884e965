//! Model NIFs: build, train one epoch, evaluate, predict, serialise.
//!
//! Layers arrive as `{kind, opts}` with `opts` a keyword list whose defaults Elixir has already
//! filled in; the training configuration arrives as a map.

use std::panic::{RefUnwindSafe, UnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use rustler::{Binary, Encoder, Env, ResourceArc, Term};

use super::resource::{arg, BinaryOut, TensorOut};
use super::{atoms, guard, schedule, term};
use crate::device::{DeviceKind, DeviceRef};
use crate::error::{Detail, ExError, ExResult};
use crate::model::spec::{Activation, LayerSpec, LossKind, OptimizerKind, Padding, Schedule, TrainConfig};
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

/// A keyword list, decoded.
type Opts<'a> = [(Term<'a>, Term<'a>)];

/// Looks up `key` in a keyword list.
fn opt<'a>(opts: &Opts<'a>, key: &str) -> Option<Term<'a>> {
    opts.iter().find(|(k, _)| k.atom_to_string().map(|s| s == key).unwrap_or(false)).map(|(_, v)| *v)
}

fn req_usize<'a>(opts: &Opts<'a>, key: &'static str) -> ExResult<usize> {
    opt(opts, key).ok_or(ExError::Arg { name: key, expected: "a non-negative integer" }).and_then(|t| term::usize_arg(t, key))
}

fn num(t: Term, name: &'static str) -> ExResult<f64> {
    t.decode::<f64>()
        .or_else(|_| t.decode::<i64>().map(|i| i as f64))
        .map_err(|_| ExError::Arg { name, expected: "a number" })
}

fn opt_num<'a>(opts: &Opts<'a>, key: &'static str, default: f64) -> ExResult<f64> {
    match opt(opts, key) {
        Some(t) if !term::is_nil(t) => num(t, key),
        _ => Ok(default),
    }
}

fn opt_bool<'a>(opts: &Opts<'a>, key: &'static str, default: bool) -> ExResult<bool> {
    opt(opts, key).map_or(Ok(default), |t| term::boolean(t, key))
}

fn sizes<'a>(opts: &Opts<'a>, key: &'static str, default: Option<Vec<usize>>) -> ExResult<Vec<usize>> {
    match opt(opts, key) {
        Some(t) if t.decode::<u64>().is_ok() => Ok(vec![term::usize_arg(t, key)?]),
        Some(t) => term::usizes(t, key),
        None => default.ok_or(ExError::Arg { name: key, expected: "an integer or a list of integers" }),
    }
}

fn padding<'a>(opts: &Opts<'a>) -> ExResult<Padding> {
    match opt(opts, "padding").map(|t| term::atom(t, "padding")).transpose()?.as_deref() {
        None | Some("valid") => Ok(Padding::Valid),
        Some("same") => Ok(Padding::Same),
        Some(_) => Err(ExError::Arg { name: "padding", expected: ":valid or :same" }),
    }
}

fn activation<'a>(name: &str, opts: &Opts<'a>) -> ExResult<Option<Activation>> {
    Ok(Activation::from_name(name, opt_num(opts, "alpha", 0.01)?))
}

fn layer(t: Term) -> ExResult<LayerSpec> {
    let (kind, opts): (Term, Vec<(Term, Term)>) =
        t.decode().map_err(|_| ExError::Arg { name: "layers", expected: "a list of {kind, keyword_options}" })?;
    let kind = term::atom(kind, "layer kind")?;
    let o = &opts;
    Ok(match kind.as_str() {
        "dense" => LayerSpec::Dense { units: req_usize(o, "units")?, bias: opt_bool(o, "use_bias", true)? },
        "conv1d" => LayerSpec::Conv1d {
            filters: req_usize(o, "filters")?,
            kernel: sizes(o, "kernel_size", None)?[0],
            stride: sizes(o, "strides", Some(vec![1]))?[0],
            padding: padding(o)?,
        },
        "conv2d" => {
            let k = sizes(o, "kernel_size", None)?;
            let s = sizes(o, "strides", Some(vec![1]))?;
            let pair = |v: &[usize]| if v.len() == 1 { [v[0], v[0]] } else { [v[0], v[1]] };
            LayerSpec::Conv2d { filters: req_usize(o, "filters")?, kernel: pair(&k), stride: pair(&s), padding: padding(o)? }
        }
        "max_pool" | "avg_pool" => {
            let kernel = sizes(o, "kernel_size", Some(vec![2]))?;
            let stride = sizes(o, "strides", Some(kernel.clone()))?;
            if kind == "max_pool" { LayerSpec::MaxPool { kernel, stride } } else { LayerSpec::AvgPool { kernel, stride } }
        }
        "global_avg_pool" => LayerSpec::GlobalAvgPool,
        "flatten" => LayerSpec::Flatten,
        "dropout" => LayerSpec::Dropout { rate: opt_num(o, "rate", 0.5)? },
        "batch_norm" => LayerSpec::BatchNorm { epsilon: opt_num(o, "epsilon", 1e-5)?, momentum: opt_num(o, "momentum", 0.1)? },
        "layer_norm" => LayerSpec::LayerNorm { epsilon: opt_num(o, "epsilon", 1e-5)? },
        "embedding" => LayerSpec::Embedding { vocab: req_usize(o, "vocab_size")?, dim: req_usize(o, "embedding_size")? },
        "lstm" | "gru" => {
            let hidden = req_usize(o, "units")?;
            let return_sequences = opt_bool(o, "return_sequences", true)?;
            if kind == "lstm" { LayerSpec::Lstm { hidden, return_sequences } } else { LayerSpec::Gru { hidden, return_sequences } }
        }
        other => match activation(other, o)? {
            Some(a) => LayerSpec::Activation(a),
            None => {
                return Err(ExError::invalid_with(
                    "unsupported layer",
                    vec![("layer", Detail::Text(other.to_string()))],
                ))
            }
        },
    })
}

fn config(t: Term) -> ExResult<TrainConfig> {
    let map: Vec<(Term, Term)> = rustler::types::map::MapIterator::new(t)
        .ok_or(ExError::Arg { name: "config", expected: "a map" })?
        .collect();
    let d = TrainConfig::default();
    let choice = |key: &'static str| -> ExResult<Option<String>> { opt(&map, key).map(|v| term::atom(v, key)).transpose() };
    let loss = match choice("loss")?.as_deref() {
        None | Some("mse") => LossKind::Mse,
        Some("cross_entropy") | Some("categorical_cross_entropy") => LossKind::CrossEntropy,
        Some("binary_cross_entropy") => LossKind::BinaryCrossEntropy,
        Some(_) => return Err(ExError::Arg { name: "loss", expected: ":cross_entropy, :mse or :binary_cross_entropy" }),
    };
    let optimizer = match choice("optimizer")?.as_deref() {
        None | Some("adam") => OptimizerKind::Adam,
        Some("adamw") => OptimizerKind::AdamW,
        Some("sgd") => OptimizerKind::Sgd,
        Some("rmsprop") => OptimizerKind::RmsProp,
        Some(_) => return Err(ExError::Arg { name: "optimizer", expected: ":adam, :adamw, :sgd or :rmsprop" }),
    };
    let maybe = |key: &'static str| -> ExResult<Option<f64>> {
        match opt(&map, key) {
            Some(v) if !term::is_nil(v) => num(v, key).map(Some),
            _ => Ok(None),
        }
    };
    Ok(TrainConfig {
        loss,
        optimizer,
        learning_rate: maybe("learning_rate")?.unwrap_or(d.learning_rate),
        weight_decay: maybe("weight_decay")?,
        momentum: maybe("momentum")?,
        beta1: maybe("beta1")?.unwrap_or(d.beta1),
        beta2: maybe("beta2")?.unwrap_or(d.beta2),
        epsilon: maybe("epsilon")?.unwrap_or(d.epsilon),
        clip_norm: maybe("clip_norm")?,
        clip_value: maybe("clip_value")?,
    })
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
        let specs: Vec<Term> = layers.decode().map_err(|_| ExError::Arg { name: "layers", expected: "a list" })?;
        let specs = specs.into_iter().map(layer).collect::<ExResult<Vec<_>>>()?;
        let input = term::usizes(input, "input_shape")?;
        let int_input = term::boolean(int_input, "integer_input")?;
        let seed: u64 = seed.decode().map_err(|_| ExError::Arg { name: "seed", expected: "a non-negative integer" })?;
        let trainer = Trainer::new(specs, input, int_input, config(cfg)?, term::decode_device(device)?, seed)?;
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
        let bad = || ExError::Arg {
            name: "lr_schedule",
            expected: "nil, {:step, base, step, gamma}, {:exponential, base, gamma} or {:cosine, base, min}",
        };
        if term::is_nil(schedule) {
            with_trainer(&m, |t| {
                let base = t.config.learning_rate;
                t.set_schedule(Schedule::Constant, base)
            })?;
            return Ok(atoms::ok());
        }
        let parts = rustler::types::tuple::get_tuple(schedule).map_err(|_| bad())?;
        let kind = parts.first().map(|k| term::atom(*k, "lr_schedule")).transpose()?.ok_or_else(bad)?;
        let f = |i: usize| parts.get(i).ok_or_else(bad).and_then(|t| num(*t, "lr_schedule"));
        let (schedule, base) = match (kind.as_str(), parts.len()) {
            ("step", 4) => (Schedule::Step { step: f(2)?.max(1.0) as usize, gamma: f(3)? }, f(1)?),
            ("exponential", 3) => (Schedule::Exponential { gamma: f(2)? }, f(1)?),
            ("cosine", 4) => (Schedule::Cosine { min: f(2)?, epochs: f(3)?.max(1.0) as usize }, f(1)?),
            _ => return Err(bad()),
        };
        with_trainer(&m, |t| t.set_schedule(schedule, base))?;
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

/// Changes learning rate and clipping between fits: a map with any of `learning_rate`,
/// `clip_norm`, `clip_value` (nil removes a clipping).
#[rustler::nif(schedule = "DirtyCpu")]
fn model_configure<'a>(env: Env<'a>, m: Term<'a>, changes: Term<'a>) -> Term<'a> {
    guard(env, "fit", || {
        let m = model(m)?;
        let map: Vec<(Term, Term)> = rustler::types::map::MapIterator::new(changes)
            .ok_or(ExError::Arg { name: "changes", expected: "a map" })?
            .collect();
        let clip = |key: &'static str| -> ExResult<Option<Option<f64>>> {
            match opt(&map, key) {
                None => Ok(None),
                Some(v) if term::is_nil(v) => Ok(Some(None)),
                Some(v) => num(v, key).map(|n| Some(Some(n))),
            }
        };
        let lr = opt(&map, "learning_rate").map(|v| num(v, "learning_rate")).transpose()?;
        let (norm, value) = (clip("clip_norm")?, clip("clip_value")?);
        with_trainer(&m, |t| {
            t.configure(lr, norm, value);
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
