//! Kernels of our own for the CPU (Burn's flex backend), where flex's generic path costs several
//! times what the work needs. Each reads a contiguous flex tensor's storage directly, splits the
//! work over rayon's pool (the one flex uses; the calling thread takes part, see `par_tasks`)
//! and returns `None` for anything it does not cover (another device, a strided view, another
//! dtype), so callers keep Burn's path as the fallback.
//! Written against Burn's public API so each could move upstream into burn-flex. Inner loops are
//! compiled for AVX-512, AVX2+FMA and baseline x86-64 and picked at run time (`wide!`).

use burn::backend::{BackendTensor, DType, DispatchTensorKind, TensorData};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::dispatch::{self, Prim};
use crate::ops::vocab::UnaryOp;

/// Below this many elements one thread does the work: splitting costs more than it saves.
pub(super) const PAR_MIN: usize = 1 << 15;

/// The contiguous f32 storage of a flex float tensor.
pub(crate) fn flex_f32(p: &Prim) -> Option<&[f32]> {
    match &p.kind {
        DispatchTensorKind::Flex(BackendTensor::Float(t)) if t.dtype() == DType::F32 => t.as_slice::<f32>(),
        _ => None,
    }
}

/// The contiguous f64 storage of a flex float tensor.
fn flex_f64(p: &Prim) -> Option<&[f64]> {
    match &p.kind {
        DispatchTensorKind::Flex(BackendTensor::Float(t)) if t.dtype() == DType::F64 => t.as_slice::<f64>(),
        _ => None,
    }
}

/// The contiguous i64 storage of a flex int tensor.
fn flex_i64(p: &Prim) -> Option<&[i64]> {
    match &p.kind {
        DispatchTensorKind::Flex(BackendTensor::Int(t)) if t.dtype() == DType::I64 => t.as_slice::<i64>(),
        _ => None,
    }
}

/// Whether every entry of a contiguous s64 flex tensor is in `0..bound`, in one pass over
/// memory (as an unsigned compare, which also catches negatives) split over the pool. Burn's
/// path builds two comparison masks, ors them and reduces: several passes and temporaries.
pub fn indices_in_bounds(p: &Prim, bound: usize) -> Option<bool> {
    let xs = flex_i64(p)?;
    let out = |c: &[i64]| c.iter().any(|&v| v as u64 >= bound as u64);
    if xs.len() < PAR_MIN {
        return Some(!out(xs));
    }
    let mut bad = vec![false; xs.len().div_ceil(PAR_MIN)];
    par_chunks_for(&mut bad, 1, xs.len(), |i, b| b[0] = out(&xs[i * PAR_MIN..xs.len().min((i + 1) * PAR_MIN)]));
    Some(!bad.contains(&true))
}

// ---------------------------------------------------------------------------------------------
// Runtime-dispatched SIMD. The crate is built for baseline x86-64 (SSE2: 2 f64 / 4 f32 lanes),
// but our loops are plain Rust that LLVM vectorises to whatever the function is compiled for. So
// each kernel body is written once as an `#[inline(always)]` generic function and `wide!`
// compiles it three times (AVX-512, AVX2+FMA, baseline), picking the widest one this CPU runs.
// ---------------------------------------------------------------------------------------------

/// The instruction-set levels `wide!` compiles for, narrowest first (so `min` caps a request).
/// Off x86-64 only `Base` exists in practice.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub(crate) enum Simd {
    Base,
    Avx2,
    Avx512,
}

/// The widest level this CPU runs, detected once.
pub(crate) fn simd() -> Simd {
    static LEVEL: OnceLock<Simd> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
            let avx512 = is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512dq")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512bw");
            if avx2 && avx512 {
                return Simd::Avx512;
            }
            if avx2 {
                return Simd::Avx2;
            }
        }
        Simd::Base
    })
}

/// What a kernel body may ask about the level it is being compiled for (the last type parameter
/// `wide!` passes): most bodies ignore it; `exp` needs FMA (mul_add is a slow libm call
/// without it) and uses AVX-512 permutes instead of a gather for its table.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) trait Isa {
    const FMA: bool;
    const AVX512: bool;
}
pub(super) struct IsaBase;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) struct IsaAvx2;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) struct IsaAvx512;
impl Isa for IsaBase {
    const FMA: bool = false;
    const AVX512: bool = false;
}
impl Isa for IsaAvx2 {
    const FMA: bool = true;
    const AVX512: bool = false;
}
impl Isa for IsaAvx512 {
    const FMA: bool = true;
    const AVX512: bool = true;
}

/// `wide!(fn name<G: Bound..>(args) -> R = body::<G..>;)` defines `fn name<G..>(level: Simd,
/// args) -> R` running `body::<G.., Isa>(args)` compiled for `level` (capped at what `simd()`
/// found, so any level is safe to ask for; tests ask for each). `body` must be
/// `#[inline(always)]`: it is inlined into each `#[target_feature]` copy and vectorised there. (A
/// closure handed to one generic target-feature function does not do: LLVM had already
/// vectorised the closure for SSE2 when it inlined it.)
macro_rules! wide {
    ($(#[$meta:meta])* $vis:vis fn $name:ident $(<$($gp:ident: $gb:path),*>)? ($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? = $body:ident;) => {
        $(#[$meta])*
        $vis fn $name$(<$($gp: $gb),*>)?(level: Simd, $($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx512dq,avx512vl,avx512bw,avx2,fma")]
            unsafe fn avx512$(<$($gp: $gb),*>)?($($arg: $ty),*) $(-> $ret)? {
                $body::<$($($gp,)*)? IsaAvx512>($($arg),*)
            }
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma")]
            unsafe fn avx2$(<$($gp: $gb),*>)?($($arg: $ty),*) $(-> $ret)? {
                $body::<$($($gp,)*)? IsaAvx2>($($arg),*)
            }
            match level.min(simd()) {
                // SAFETY: `simd()` found these features on this CPU.
                #[cfg(target_arch = "x86_64")]
                Simd::Avx512 => unsafe { avx512$(::<$($gp),*>)?($($arg),*) },
                #[cfg(target_arch = "x86_64")]
                Simd::Avx2 => unsafe { avx2$(::<$($gp),*>)?($($arg),*) },
                _ => $body::<$($($gp,)*)? IsaBase>($($arg),*),
            }
        }
    };
}
pub(super) use wide;

/// f32 and f64, the element types of our float kernels.
pub(super) trait Float:
    Copy
    + Default
    + PartialOrd
    + Send
    + Sync
    + Into<f64>
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + burn::tensor::Element
{
    const NEG_INFINITY: Self;
    fn is_nan(self) -> bool;
}
impl Float for f32 {
    const NEG_INFINITY: f32 = f32::NEG_INFINITY;
    fn is_nan(self) -> bool {
        self.is_nan()
    }
}
impl Float for f64 {
    const NEG_INFINITY: f64 = f64::NEG_INFINITY;
    fn is_nan(self) -> bool {
        self.is_nan()
    }
}

/// Independent f64 accumulators of a sum. 64 lets LLVM's loop vectoriser keep 8 AVX-512 (16 AVX2)
/// vectors of running sums in flight, where 8 accumulators get packed into 2-lane vectors by its
/// SLP vectoriser at every level. The summation order is the same at every level, so results do
/// not depend on the CPU.
const LANES: usize = 64;

/// Sum of a slice in f64 over `LANES` accumulators. The tail is padded with zeros rather than
/// added one by one (a 1000-long row would otherwise end on 40 serial adds); adding +0.0 changes
/// nothing, as the accumulators start at +0.0 and so are never -0.0.
#[inline(always)]
pub(super) fn sum_lanes<T: Copy + Default + Into<f64>, S: Isa>(xs: &[T]) -> f64 {
    let mut acc = [0.0f64; LANES];
    let chunks = xs.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += x.into();
        }
    }
    if !rest.is_empty() {
        let mut pad = [T::default(); LANES];
        pad[..rest.len()].copy_from_slice(rest);
        for (a, &x) in acc.iter_mut().zip(&pad) {
            *a += x.into();
        }
    }
    halve_lanes(acc, |a, b| a + b)
}

/// `acc[i] += row[i]` in f64 (one row of a column sum).
#[inline(always)]
fn add_row<T: Copy + Into<f64>, S: Isa>(acc: &mut [f64], row: &[T]) {
    for (a, &x) in acc.iter_mut().zip(row) {
        *a += x.into();
    }
}

wide!(fn sum_wide<T: Float>(xs: &[T]) -> f64 = sum_lanes;);
wide!(fn add_row_wide<T: Float>(acc: &mut [f64], row: &[T]) = add_row;);

/// Runs `task(i)` for every `i` in `0..n` on the calling thread, with rayon's workers joining in
/// as they come. Tasks are claimed from a counter, so a pool that is asleep or busy elsewhere
/// costs nothing but its share of the work: the caller runs whatever nobody else claimed. Rayon's
/// own fork-join, called from a thread outside its pool (the BEAM's dirty schedulers), queues the
/// job, waits for a worker to wake, then waits to be woken itself: a round trip that costs more
/// than a pass over 1M values. The caller being one of the workers, it asks for one helper fewer
/// than the pool has threads: as many as the pool was slower under load (guides/backend.md has
/// the timings). Helpers stay warm for the next call a while (`stay_warm`).
pub(crate) fn par_tasks(n: usize, task: &(dyn Fn(usize) + Sync)) {
    let helpers = (rayon::current_num_threads() - 1).min(n.saturating_sub(1));
    if helpers == 0 {
        (0..n).for_each(task);
        return;
    }
    // SAFETY: only the lifetime is erased; see `Tasks`.
    let task: *const (dyn Fn(usize) + Sync + 'static) = unsafe { std::mem::transmute(task as *const (dyn Fn(usize) + Sync + '_)) };
    let tasks = Arc::new(Tasks { next: AtomicUsize::new(0), done: AtomicUsize::new(0), panicked: Default::default(), n, task });
    *LATEST.lock().unwrap_or_else(|e| e.into_inner()) = Some(tasks.clone());
    // Helpers still warm from an earlier call see the new epoch; workers are woken for the rest.
    // Sequentially consistent with a leaving helper's two steps (`stay_warm`): either it is no
    // longer counted here, or it sees this epoch and stays.
    EPOCH.fetch_add(1, Ordering::SeqCst);
    for _ in WARM.load(Ordering::SeqCst).min(helpers)..helpers {
        let t = tasks.clone();
        rayon::spawn(move || stay_warm(t));
    }
    tasks.drain();
    // the tasks helpers claimed are running: short waits
    let mut spins = 0u32;
    while tasks.done.load(Ordering::Acquire) < n {
        if spins < 2000 {
            std::hint::spin_loop();
            spins += 1;
        } else {
            std::thread::yield_now();
        }
    }
    assert!(!tasks.panicked.load(Ordering::Relaxed), "a parallel CPU kernel task panicked");
}

/// One `par_tasks` call's tasks, claimed from a counter.
struct Tasks {
    next: AtomicUsize,
    done: AtomicUsize,
    panicked: AtomicBool,
    n: usize,
    task: *const (dyn Fn(usize) + Sync),
}

// SAFETY: `task` is Sync, and only called through a claimed index, which `par_tasks` waits for
// before its borrow ends; a helper that finds the tasks later (through `LATEST` or a late wake)
// has nothing left to claim and never touches it.
unsafe impl Send for Tasks {}
unsafe impl Sync for Tasks {}

impl Tasks {
    fn drain(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.n {
                return;
            }
            // SAFETY: see `Tasks`; i < n, so `par_tasks` is still waiting for this task.
            // A panic is caught and re-raised on the caller once every task is done: unwinding
            // here would leave the caller waiting (or, in a rayon job, abort the VM), and the
            // caller must not unwind while helpers still write into its buffers.
            let task = std::panic::AssertUnwindSafe(|| unsafe { (*self.task)(i) });
            if std::panic::catch_unwind(task).is_err() {
                self.panicked.store(true, Ordering::Relaxed);
            }
            self.done.fetch_add(1, Ordering::Release);
        }
    }
}

/// The latest `par_tasks` call's tasks, and a count of calls, for helpers that stay warm.
static LATEST: Mutex<Option<Arc<Tasks>>> = Mutex::new(None);
static EPOCH: AtomicU64 = AtomicU64::new(0);
/// Helpers between calls, watching `EPOCH`.
static WARM: AtomicUsize = AtomicUsize::new(0);
/// How long a helper watches for the next call before it hands its thread back to rayon. A
/// worker woken from sleep joins late (guides/backend.md, the task pool), so calls in quick
/// succession, as a model's ops come, would run mostly on the calling thread; OpenMP's workers
/// spin between parallel regions for the same reason.
const WARM_FOR: std::time::Duration = std::time::Duration::from_micros(500);

/// A helper's job: `first`'s tasks, then those of calls that come within `WARM_FOR` of each
/// other, running rayon's other jobs meanwhile so the pool never waits on a watching helper.
/// Between checks it yields its core to any other thread that wants it: the BEAM's schedulers
/// (the dirty one that makes the next call, the one that hands it over) share these cores, and
/// a helper that only spun held the next call off a core for its whole watch.
fn stay_warm(first: Arc<Tasks>) {
    first.drain();
    drop(first);
    let mut seen = EPOCH.load(Ordering::SeqCst);
    WARM.fetch_add(1, Ordering::SeqCst);
    let mut since = std::time::Instant::now();
    loop {
        let epoch = EPOCH.load(Ordering::SeqCst);
        if epoch != seen {
            seen = epoch;
            let latest = LATEST.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if let Some(tasks) = latest {
                tasks.drain();
            }
            since = std::time::Instant::now();
        } else if since.elapsed() > WARM_FOR {
            WARM.fetch_sub(1, Ordering::SeqCst);
            if EPOCH.load(Ordering::SeqCst) == seen {
                return;
            }
            WARM.fetch_add(1, Ordering::SeqCst);
        } else if rayon::yield_now() != Some(rayon::Yield::Executed) {
            std::thread::yield_now();
        }
    }
}

/// A raw pointer parallel tasks share, each writing its own piece (`par_chunks_for`, the CPU
/// product kernels).
pub(crate) struct SharedMut<T>(pub(crate) *mut T);
// not derived: a derive would ask `T: Clone`, which a pointer's copy does not need
impl<T> Clone for SharedMut<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SharedMut<T> {}
unsafe impl<T: Send> Sync for SharedMut<T> {}
impl<T> SharedMut<T> {
    // a method, so closures capture the Sync wrapper rather than the raw pointer field
    pub(crate) fn get(&self) -> *mut T {
        self.0
    }
}

/// `f(i, piece)` for each `chunk`-long piece of `out` (the last may be shorter), through
/// `par_tasks`; one thread below `PAR_MIN` elements of work (`work`, in values read).
pub(crate) fn par_chunks_for<T: Send>(out: &mut [T], chunk: usize, work: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let (len, chunk) = (out.len(), chunk.max(1));
    if work < PAR_MIN {
        out.chunks_mut(chunk).enumerate().for_each(|(i, piece)| f(i, piece));
        return;
    }
    let base = SharedMut(out.as_mut_ptr());
    par_tasks(len.div_ceil(chunk), &|i| {
        let start = i * chunk;
        // SAFETY: each i is run once, so the pieces are disjoint, inside `out`, which stays
        // borrowed until par_tasks has seen every task finish.
        let piece = unsafe { std::slice::from_raw_parts_mut(base.get().add(start), chunk.min(len - start)) };
        f(i, piece)
    });
}

fn par_sum<T: Float>(level: Simd, xs: &[T]) -> f64 {
    if xs.len() < PAR_MIN {
        return sum_wide(level, xs);
    }
    // partial sums collected and added in order: rayon's own `sum` adds them in whatever order
    // its tasks finish, which would move the last bits of an f64 sum from run to run
    let mut parts = vec![0.0f64; xs.len().div_ceil(PAR_MIN)];
    par_chunks_for(&mut parts, 1, xs.len(), |i, p| p[0] = sum_wide(level, &xs[i * PAR_MIN..xs.len().min((i + 1) * PAR_MIN)]));
    parts.into_iter().sum()
}

/// Whether `row_sums` adds `total` values' rows of `cols` one row after another (each through
/// `par_sum`) rather than rows side by side (each through `sum_wide`): the choice fixes the
/// summation order, which `row_sum_as_sum` replays.
fn rows_in_turn(total: usize, cols: usize) -> bool {
    total < PAR_MIN || cols >= total / 2
}

/// x86's inf + -inf is a negative NaN; Nx gives the positive one.
fn positive_nan(s: f64) -> f64 {
    if s.is_nan() { f64::NAN } else { s }
}

/// `rows` sums of `cols` consecutive values (a reduction over trailing axes).
fn row_sums<T: Float>(level: Simd, xs: &[T], cols: usize) -> Vec<f64> {
    if rows_in_turn(xs.len(), cols) {
        return xs.chunks(cols).map(|r| par_sum(level, r)).collect();
    }
    // rows of a few thousand values each: tasks of at least PAR_MIN values, so a 1024-row
    // matrix is a handful of rayon tasks rather than 1024
    let per_task = (PAR_MIN / cols).max(1);
    let mut out = vec![0.0f64; xs.len() / cols];
    par_chunks_for(&mut out, per_task, xs.len(), |i, o| {
        for (o, r) in o.iter_mut().zip(xs[i * per_task * cols..].chunks(cols)) {
            *o = sum_wide(level, r);
        }
    });
    out
}

/// `cols` sums down `rows` rows (a reduction over leading axes): each task owns a band of columns
/// and adds the rows into it, so the inner loop runs along memory and vectorises.
fn col_sums<T: Float>(level: Simd, xs: &[T], cols: usize) -> Vec<f64> {
    let rows = xs.len() / cols;
    let band = if xs.len() < PAR_MIN { cols } else { (cols / rayon::current_num_threads().max(1)).max(256).min(cols) };
    let mut out = vec![0.0f64; cols];
    par_chunks_for(&mut out, band, xs.len(), |b, acc| {
        let start = b * band;
        for r in 0..rows {
            add_row_wide(level, acc, &xs[r * cols + start..r * cols + start + acc.len()]);
        }
    });
    out
}

/// A reduction over `axes` of `shape` as our kernels take it: `(kept, reduced, trailing)` where
/// the axes are a leading or a trailing block (all axes are both), `None` otherwise or when
/// nothing is reduced.
fn axis_block(shape: &[usize], axes: &[usize]) -> Option<(usize, usize, bool)> {
    let rank = shape.len();
    let mut sorted = axes.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let k = sorted.len();
    if rank == 0 || k == 0 {
        return None;
    }
    let leading = sorted.iter().enumerate().all(|(i, &a)| a == i);
    let trailing = sorted.iter().enumerate().all(|(i, &a)| a == rank - k + i);
    if !(leading || trailing) {
        return None;
    }
    let reduced: usize = sorted.iter().map(|&a| shape[a]).product();
    let n: usize = shape.iter().product();
    if reduced == 0 || n == 0 {
        return None;
    }
    Some((n / reduced, reduced, trailing))
}

/// Nx's sum (`mean`: divided by the count) of an f32 or f64 tensor on the CPU over a leading or
/// trailing block of its axes (all axes included), accumulated in f64 as Nx.BinaryBackend does
/// and rounded once to the input's type. The result is flat (`kept` elements).
pub fn sum(x: &Prim, shape: &[usize], axes: &[usize], mean: bool) -> Option<Prim> {
    let (kept, reduced, trailing) = axis_block(shape, axes)?;
    let run = |sums: Vec<f64>| -> Vec<f64> {
        sums.into_iter()
            .map(|s| {
                positive_nan(if mean { s / reduced as f64 } else { s })
            })
            .collect()
    };
    let level = simd();
    let sums = if let Some(xs) = flex_f32(x) {
        let s = if kept == 1 { vec![par_sum(level, xs)] } else if trailing { row_sums(level, xs, reduced) } else { col_sums(level, xs, kept) };
        let out: Vec<f32> = run(s).into_iter().map(|v| v as f32).collect();
        TensorData::new(out, [kept])
    } else if let Some(xs) = flex_f64(x) {
        let s = if kept == 1 { vec![par_sum(level, xs)] } else if trailing { row_sums(level, xs, reduced) } else { col_sums(level, xs, kept) };
        TensorData::new(run(s), [kept])
    } else {
        return None;
    };
    Some(dispatch::from_data(sums, &burn::tensor::Device::flex()))
}

/// The running maximum `acc` taking `x`: Nx's max, where NaN ranks above everything (BinaryBackend
/// compares with Erlang's term order, in which the atom :nan is above every number and
/// :infinity), so a NaN sticks: no `x > NaN`, and NaN is taken as soon as it is seen. Between
/// -0.0 and 0.0 the one met first stays, as in flex's loop (order-dependent in both).
#[inline(always)]
fn max_step<T: Float>(acc: T, x: T) -> T {
    if x > acc || x.is_nan() { x } else { acc }
}

/// The maximum of a slice (`-inf` for an empty one) over `LANES` running maxima, the tail padded
/// with -inf.
#[inline(always)]
fn max_lanes<T: Float, S: Isa>(xs: &[T]) -> T {
    let mut acc = [T::NEG_INFINITY; LANES];
    let chunks = xs.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = max_step(*a, x);
        }
    }
    if !rest.is_empty() {
        let mut pad = [T::NEG_INFINITY; LANES];
        pad[..rest.len()].copy_from_slice(rest);
        for (a, &x) in acc.iter_mut().zip(&pad) {
            *a = max_step(*a, x);
        }
    }
    // halving, like the sums: a fold over the 64 lanes would be a serial chain of compares,
    // 70 ns a row, as long as the vectorised pass over a 1024-long row
    halve_lanes(acc, max_step)
}

/// `acc[i] = op(acc[i], acc[i + w])` for w = 32, 16, .., 1, then `acc[0]`: the lanes' fixed
/// combining order. Fixed-size arrays keep the lanes in registers; with a loop over `w`, LLVM
/// left them on the stack, and its masked stores stalled the loads that followed.
#[inline(always)]
fn halve_lanes<T: Copy>(acc: [T; LANES], op: impl Fn(T, T) -> T) -> T {
    let a: [T; 32] = std::array::from_fn(|i| op(acc[i], acc[i + 32]));
    let a: [T; 16] = std::array::from_fn(|i| op(a[i], a[i + 16]));
    let a: [T; 8] = std::array::from_fn(|i| op(a[i], a[i + 8]));
    let a: [T; 4] = std::array::from_fn(|i| op(a[i], a[i + 4]));
    let a: [T; 2] = std::array::from_fn(|i| op(a[i], a[i + 2]));
    op(a[0], a[1])
}

/// `acc[i] = max(acc[i], row[i])` (one row of a maximum down the columns).
#[inline(always)]
fn max_row<T: Float, S: Isa>(acc: &mut [T], row: &[T]) {
    for (a, &x) in acc.iter_mut().zip(row) {
        *a = max_step(*a, x);
    }
}

wide!(pub(super) fn max_wide<T: Float>(xs: &[T]) -> T = max_lanes;);
wide!(fn max_row_wide<T: Float>(acc: &mut [T], row: &[T]) = max_row;);

/// Maxima over a leading or trailing block (or all) of the axes of contiguous values, on rayon's
/// pool as the sums are.
fn block_max<T: Float>(level: Simd, xs: &[T], kept: usize, reduced: usize, trailing: bool) -> Vec<T> {
    if kept == 1 {
        if xs.len() < PAR_MIN {
            return vec![max_wide(level, xs)];
        }
        let mut parts = vec![T::NEG_INFINITY; xs.len().div_ceil(PAR_MIN)];
        par_chunks_for(&mut parts, 1, xs.len(), |i, p| p[0] = max_wide(level, &xs[i * PAR_MIN..xs.len().min((i + 1) * PAR_MIN)]));
        return vec![parts.into_iter().fold(T::NEG_INFINITY, max_step)];
    }
    if trailing {
        if xs.len() < PAR_MIN || reduced >= xs.len() / 2 {
            return xs.chunks(reduced).map(|r| block_max(level, r, 1, r.len(), true)[0]).collect();
        }
        let per_task = (PAR_MIN / reduced).max(1);
        let mut out = vec![T::NEG_INFINITY; kept];
        par_chunks_for(&mut out, per_task, xs.len(), |i, o| {
            for (o, r) in o.iter_mut().zip(xs[i * per_task * reduced..].chunks(reduced)) {
                *o = max_wide(level, r);
            }
        });
        return out;
    }
    let cols = kept;
    let band = if xs.len() < PAR_MIN { cols } else { (cols / rayon::current_num_threads().max(1)).max(256).min(cols) };
    let mut out = vec![T::NEG_INFINITY; cols];
    par_chunks_for(&mut out, band, xs.len(), |b, acc| {
        let start = b * band;
        for r in 0..reduced {
            max_row_wide(level, acc, &xs[r * cols + start..r * cols + start + acc.len()]);
        }
    });
    out
}

/// Nx's reduce_max of an f32 or f64 tensor on the CPU over a leading or trailing block of its
/// axes (all included), NaN where a NaN is reduced. The result is flat.
pub fn reduce_max(x: &Prim, shape: &[usize], axes: &[usize]) -> Option<Prim> {
    let (kept, reduced, trailing) = axis_block(shape, axes)?;
    let level = simd();
    let data = if let Some(xs) = flex_f32(x) {
        TensorData::new(block_max(level, xs, kept, reduced, trailing), [kept])
    } else {
        TensorData::new(block_max(level, flex_f64(x)?, kept, reduced, trailing), [kept])
    };
    Some(dispatch::from_data(data, &burn::tensor::Device::flex()))
}

/// Whether a contiguous f32 or f64 tensor on the CPU holds a NaN: one pass of the maxima above,
/// which propagate NaN.
pub fn has_nan(x: &Prim) -> Option<bool> {
    let level = simd();
    Some(match flex_f32(x) {
        Some(xs) => !xs.is_empty() && block_max(level, xs, 1, xs.len(), true)[0].is_nan(),
        None => {
            let xs = flex_f64(x)?;
            !xs.is_empty() && block_max(level, xs, 1, xs.len(), true)[0].is_nan()
        }
    })
}

/// The element-wise ops `arith` runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Arith {
    Add,
    Sub,
    Mul,
    Div,
    /// Nx's `max` and `min` of floats, as `ops::elementwise` composes them on other devices: `b`
    /// where it wins or is NaN, else `a` (NaN propagates either way; a tie keeps `a`).
    Max,
    Min,
}

trait ArithOp: Send + Sync {
    fn apply<T: Float>(a: T, b: T) -> T;
}
struct AddOp;
struct SubOp;
struct MulOp;
struct DivOp;
struct MaxOp;
struct MinOp;
impl ArithOp for AddOp {
    #[inline(always)]
    fn apply<T: Float>(a: T, b: T) -> T {
        a + b
    }
}
impl ArithOp for SubOp {
    #[inline(always)]
    fn apply<T: Float>(a: T, b: T) -> T {
        a - b
    }
}
impl ArithOp for MulOp {
    #[inline(always)]
    fn apply<T: Float>(a: T, b: T) -> T {
        a * b
    }
}
impl ArithOp for DivOp {
    #[inline(always)]
    fn apply<T: Float>(a: T, b: T) -> T {
        a / b
    }
}
impl ArithOp for MaxOp {
    #[inline(always)]
    fn apply<T: Float>(a: T, b: T) -> T {
        if a < b || b.is_nan() {
            b
        } else {
            a
        }
    }
}
impl ArithOp for MinOp {
    #[inline(always)]
    fn apply<T: Float>(a: T, b: T) -> T {
        if a > b || b.is_nan() {
            b
        } else {
            a
        }
    }
}

/// One operand over a run of the output: as many values, or one value for the whole run.
#[derive(Clone, Copy)]
enum Arg<'a, T> {
    Run(&'a [T]),
    One(T),
}

#[inline(always)]
fn arith_run<T: Float, O: ArithOp, S: Isa>(a: Arg<T>, b: Arg<T>, out: &mut [MaybeUninit<T>]) {
    match (a, b) {
        (Arg::Run(a), Arg::Run(b)) => {
            for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
                o.write(O::apply(x, y));
            }
        }
        (Arg::Run(a), Arg::One(y)) => {
            for (o, &x) in out.iter_mut().zip(a) {
                o.write(O::apply(x, y));
            }
        }
        (Arg::One(x), Arg::Run(b)) => {
            for (o, &y) in out.iter_mut().zip(b) {
                o.write(O::apply(x, y));
            }
        }
        (Arg::One(x), Arg::One(y)) => {
            let v = O::apply(x, y);
            for o in out.iter_mut() {
                o.write(v);
            }
        }
    }
}

wide!(fn arith_wide<T: Float, O: ArithOp>(a: Arg<T>, b: Arg<T>, out: &mut [MaybeUninit<T>]) = arith_run;);

/// How an operand of an elementwise op covers the output, seen as rows of `cols` values: every
/// value (`Full`), one value per row (`PerRow`: an {R, 1} operand), or one row for every row
/// (`Shared`: a {C} or {1, C} operand). A scalar is one value for one row of everything.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Cover {
    Full,
    PerRow(usize),
    Shared(usize),
}

/// `shape`'s cover of `out` under Nx broadcasting, `None` for other broadcasts (an outer
/// product's {R, 1} with {1, C}, middle axes).
fn cover(shape: &[usize], out: &[usize]) -> Option<Cover> {
    if shape.len() > out.len() {
        return None;
    }
    let mut s = vec![1; out.len() - shape.len()];
    s.extend_from_slice(shape);
    if s == out {
        return Some(Cover::Full);
    }
    let numel = |d: &[usize]| d.iter().product::<usize>();
    // the first axis where the operand stops matching the output
    let k = s.iter().zip(out).take_while(|(a, b)| a == b).count();
    if s[k..].iter().all(|&d| d == 1) {
        return Some(Cover::PerRow(numel(&out[k..])));
    }
    // the operand's leading ones, then the output's own trailing axes
    let j = s.iter().take_while(|&&d| d == 1).count();
    if s[j..] == out[j..] {
        return Some(Cover::Shared(numel(&out[j..])));
    }
    None
}

/// Below this many output elements arith leaves the op to flex (nothing to win).
const ARITH_MIN: usize = 1 << 12;
/// Rows shorter than this (a {N, 3} + {3}) would cost a dispatch per few values: flex's.
const ARITH_MIN_ROW: usize = 64;

/// An operand's values for output elements lo..hi, all in one row of `cols`.
fn arg_for<T: Float>(xs: &[T], c: Cover, cols: usize, lo: usize, hi: usize) -> Arg<'_, T> {
    let row = lo / cols;
    match c {
        Cover::Full => Arg::Run(&xs[lo..hi]),
        Cover::PerRow(_) => Arg::One(xs[row]),
        Cover::Shared(_) => Arg::Run(&xs[lo - row * cols..hi - row * cols]),
    }
}

fn arith_typed<T: Float, O: ArithOp>(level: Simd, a: &[T], ca: Cover, b: &[T], cb: Cover, n: usize) -> Option<Vec<T>> {
    let cols = match (ca, cb) {
        (Cover::Full, Cover::Full) => n,
        (Cover::Full, Cover::PerRow(c) | Cover::Shared(c)) | (Cover::PerRow(c) | Cover::Shared(c), Cover::Full) => c,
        _ => return None,
    };
    if cols < ARITH_MIN_ROW {
        return None;
    }
    // output elements start.. into `o`, a run per row piece
    let fill = |start: usize, o: &mut [MaybeUninit<T>]| {
        let end = start + o.len();
        let mut i = start;
        while i < end {
            let stop = end.min((i / cols + 1) * cols);
            arith_wide::<T, O>(level, arg_for(a, ca, cols, i, stop), arg_for(b, cb, cols, i, stop), &mut o[i - start..stop - start]);
            i = stop;
        }
    };
    let mut out: Vec<T> = Vec::with_capacity(n);
    let chunk = PAR_MIN / 4;
    par_chunks_for(&mut out.spare_capacity_mut()[..n], chunk, n, |c, o| fill(c * chunk, o));
    // SAFETY: the chunks cover 0..n and each run writes all of its output slice.
    unsafe { out.set_len(n) };
    Some(out)
}

/// `a op b` with Nx broadcasting of two contiguous f32 (or two f64) flex tensors into `out`, on
/// rayon's pool: same shapes, a per-row operand ({R, C} - {R, 1}: softmax's and layer norm's
/// subtract and divide) or a shared row ({R, C} * {C}), either side. Flex does these on one
/// thread (and broadcast division at a third of the speed). IEEE arithmetic rounds the same
/// anywhere, so the values are flex's. `None` for small outputs, short rows, other broadcasts.
pub fn arith(op: Arith, a: &Prim, a_shape: &[usize], b: &Prim, b_shape: &[usize], out: &[usize]) -> Option<Prim> {
    let n: usize = out.iter().product();
    if n < ARITH_MIN {
        return None;
    }
    let (ca, cb) = (cover(a_shape, out)?, cover(b_shape, out)?);
    fn go<T: Float>(op: Arith, a: &[T], ca: Cover, b: &[T], cb: Cover, n: usize) -> Option<Vec<T>> {
        match op {
            Arith::Add => arith_typed::<T, AddOp>(simd(), a, ca, b, cb, n),
            Arith::Sub => arith_typed::<T, SubOp>(simd(), a, ca, b, cb, n),
            Arith::Mul => arith_typed::<T, MulOp>(simd(), a, ca, b, cb, n),
            Arith::Div => arith_typed::<T, DivOp>(simd(), a, ca, b, cb, n),
            Arith::Max => arith_typed::<T, MaxOp>(simd(), a, ca, b, cb, n),
            Arith::Min => arith_typed::<T, MinOp>(simd(), a, ca, b, cb, n),
        }
    }
    let data = match (flex_f32(a), flex_f32(b)) {
        (Some(a), Some(b)) => TensorData::new(go(op, a, ca, b, cb, n)?, out.to_vec()),
        _ => TensorData::new(go(op, flex_f64(a)?, ca, flex_f64(b)?, cb, n)?, out.to_vec()),
    };
    Some(dispatch::from_data(data, &burn::tensor::Device::flex()))
}

/// Nx's `pow` of f32 or f64 values (`b` already in `a`'s type) on rayon's pool, where flex walks
/// one element at a time (Nx.variance's `pow(x - mean, 2)` is one such call): a one-element
/// exponent, or an exponent of the output's shape with `a` of it too. An exponent of exactly 2 is
/// `x * x`, the correctly rounded square (what Nx.BinaryBackend gives: f64 `pow` of an f32 is
/// exact there); any other is the `powf` flex calls, so the same bits. `None` elsewhere.
pub fn pow(a: &Prim, a_shape: &[usize], b: &Prim, out: &[usize]) -> Option<Prim> {
    let n: usize = out.iter().product();
    if a_shape != out || n < ARITH_MIN {
        return None;
    }
    fn go<T: Float>(a: &[T], b: &[T], shape: Vec<usize>, powf: fn(T, T) -> T) -> Option<Prim> {
        let out = match b {
            [e] if (*e).into() == 2.0 => par_map_slices(a, |x, o| {
                for (o, &x) in o.iter_mut().zip(x) {
                    o.write(x * x);
                }
            }),
            [e] => par_map_slices(a, |x, o| {
                for (o, &x) in o.iter_mut().zip(x) {
                    o.write(powf(x, *e));
                }
            }),
            _ if b.len() == a.len() => {
                let base = a.as_ptr() as usize;
                par_map_slices(a, |x, o| {
                    // this chunk's offset in `a`, for the matching exponents
                    let at = (x.as_ptr() as usize - base) / std::mem::size_of::<T>();
                    for ((o, &x), &e) in o.iter_mut().zip(x).zip(&b[at..]) {
                        o.write(powf(x, e));
                    }
                })
            }
            _ => return None,
        };
        Some(dispatch::from_data(TensorData::new(out, shape), &burn::tensor::Device::flex()))
    }
    match (flex_f32(a), flex_f32(b)) {
        (Some(a), Some(b)) => go(a, b, out.to_vec(), f32::powf),
        _ => go(flex_f64(a)?, flex_f64(b)?, out.to_vec(), f64::powf),
    }
}

/// The std function flex applies per element for `op`, for f32 and f64: the parallel map below
/// computes exactly what flex computes, on all cores instead of one.
fn std_unary(op: UnaryOp) -> Option<(fn(f32) -> f32, fn(f64) -> f64)> {
    Some(match op {
        UnaryOp::Exp => (f32::exp, f64::exp),
        UnaryOp::Log => (f32::ln, f64::ln),
        UnaryOp::Sin => (f32::sin, f64::sin),
        UnaryOp::Cos => (f32::cos, f64::cos),
        UnaryOp::Tan => (f32::tan, f64::tan),
        UnaryOp::Asin => (f32::asin, f64::asin),
        UnaryOp::Acos => (f32::acos, f64::acos),
        UnaryOp::Atan => (f32::atan, f64::atan),
        UnaryOp::Sinh => (f32::sinh, f64::sinh),
        UnaryOp::Cosh => (f32::cosh, f64::cosh),
        UnaryOp::Tanh => (f32::tanh, f64::tanh),
        // flex's erf is libm's (the same crate and version)
        UnaryOp::Erf => (libm::erff, libm::erf),
        _ => return None,
    })
}

fn par_map<T: Copy + Send + Sync + burn::tensor::Element>(xs: &[T], shape: Vec<usize>, f: impl Fn(T) -> T + Sync) -> Prim {
    let out = par_map_slices(xs, |x, o| {
        for (o, &x) in o.iter_mut().zip(x) {
            o.write(f(x));
        }
    });
    dispatch::from_data(TensorData::new(out, shape), &burn::tensor::Device::flex())
}

/// `kernel(xs, out)` writing every element of `out`, over chunks of `xs` on rayon's pool (one
/// thread below `PAR_MIN`), into a fresh vector: no zero-filling pass before the kernel's own.
pub(super) fn par_map_slices<T: Copy + Send + Sync>(xs: &[T], kernel: impl Fn(&[T], &mut [MaybeUninit<T>]) + Sync) -> Vec<T> {
    let mut out = Vec::with_capacity(xs.len());
    let chunk = PAR_MIN / 4;
    par_chunks_for(&mut out.spare_capacity_mut()[..xs.len()], chunk, xs.len(), |i, o| kernel(&xs[i * chunk..i * chunk + o.len()], o));
    // SAFETY: the kernel wrote all xs.len() elements (each chunk's `out` is as long as its `xs`).
    unsafe { out.set_len(xs.len()) };
    out
}

// glibc's expf (sysdeps/ieee754/flt-32/e_expf.c, from ARM's optimized-routines; glibc 2.28 and
// later), which Rust's f32::exp calls on Linux: exp(x) = 2^(k/32) 2^(r/32) with k = round(32 x /
// ln 2), 2^(k/32) from a 32-entry table and 2^(r/32) a cubic in r, all in f64, rounded once. It
// is not correctly rounded (about 170 000 of the 2^32 inputs differ by 1 ulp from exp rounded
// from f64), so an accurate polynomial would not give flex's (and Nx's doctests') digits; this
// replica of its FMA build (`__expf_fma`, the one glibc picks on any CPU with FMA) gives them bit
// for bit on every input (the exhaustive test below), and is branch-free so LLVM vectorises it.
// `exp_replica_ok` checks that claim against this process's libm before the kernel is used.
const EXPF_TAB: [u64; 32] = [
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
    0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
    0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
    0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
    0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
    0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
];
/// 0x1.8p52: adding it rounds to an integer (ties to even) and leaves that integer in the low bits.
const EXPF_SHIFT: f64 = 6755399441055744.0;
/// 32 / ln 2
const EXPF_INVLN2N: f64 = f64::from_bits(0x40471547652b82fe);
const EXPF_C: [f64; 3] = [f64::from_bits(0x3ebc6af84b912394), f64::from_bits(0x3f2ebfce50fac4f3), f64::from_bits(0x3f962e42ff0c52d6)];
/// Above this exp overflows to +inf; below the other it underflows to +0 (glibc's bounds).
const EXPF_OVER: f32 = f32::from_bits(0x42b17217); // 0x1.62e42ep6 ~ 88.72
const EXPF_UNDER: f32 = f32::from_bits(0xc2cff1b4); // -0x1.9fe368p6 ~ -103.97

/// 2^(i/32) scaled as glibc's table holds it, for eight indices at once: AVX-512 looks the 32
/// entries up with two two-register permutes (the table lives in four registers); elsewhere a
/// plain index, which LLVM turns into a gather (AVX2) or scalar loads. The permutes halve the
/// kernel's time against AVX-512's gather.
#[inline(always)]
fn expf_table8<S: Isa>(k: &[u64; 8]) -> [u64; 8] {
    #[cfg(target_arch = "x86_64")]
    if S::AVX512 {
        use std::arch::x86_64::*;
        // SAFETY: S::AVX512 is only set in `wide!`'s AVX-512 copy, which runs only where
        // `simd()` found AVX-512F; the loads read 8 u64 inside EXPF_TAB or `k`.
        unsafe {
            let t = EXPF_TAB.as_ptr() as *const __m512i;
            let idx = _mm512_loadu_si512(k.as_ptr() as *const __m512i);
            let lo = _mm512_permutex2var_epi64(_mm512_loadu_si512(t), idx, _mm512_loadu_si512(t.add(1)));
            let hi = _mm512_permutex2var_epi64(_mm512_loadu_si512(t.add(2)), idx, _mm512_loadu_si512(t.add(3)));
            let v = _mm512_mask_blend_epi64(_mm512_test_epi64_mask(idx, _mm512_set1_epi64(16)), lo, hi);
            let mut out = [0u64; 8];
            _mm512_storeu_si512(out.as_mut_ptr() as *mut __m512i, v);
            return out;
        }
    }
    k.map(|i| EXPF_TAB[(i % 32) as usize])
}

/// glibc's expf of eight values; every operation (and which ones are fused multiply-adds) as in
/// `__expf_fma`, its special cases as selects. `SHIFTED`: softmax's first try, whose caller knows
/// every value to be at most 0 and does a row with a NaN again (its sum is NaN) through the
/// general copy, so the overflow and NaN selects are left out: a NaN gives some NaN.
#[inline(always)]
fn expf8<S: Isa, const SHIFTED: bool>(x: &[f32; 8]) -> [f32; 8] {
    #[cfg(target_arch = "x86_64")]
    if S::FMA && !S::AVX512 {
        // SAFETY: FMA without AVX-512 is `wide!`'s AVX2 copy, which runs only where `simd()`
        // found AVX2 and FMA.
        return unsafe { expf8_avx2::<SHIFTED>(x) };
    }
    let mut ki = [0u64; 8];
    let mut r = [0f64; 8];
    for i in 0..8 {
        let xd = x[i] as f64;
        // z = x 32/ln2, kd = round(z) via the shift, r = z - kd: GCC fuses both uses of z
        let kd = EXPF_INVLN2N.mul_add(xd, EXPF_SHIFT);
        ki[i] = kd.to_bits();
        r[i] = EXPF_INVLN2N.mul_add(xd, -(kd - EXPF_SHIFT));
    }
    let t = expf_table8::<S>(&ki.map(|k| k % 32));
    let mut out = [0f32; 8];
    for i in 0..8 {
        let r = r[i];
        // the table entry with k/32's integer part added to its exponent (wrapping, as in C)
        let s = f64::from_bits(t[i].wrapping_add(ki[i] << 47));
        let z = EXPF_C[0].mul_add(r, EXPF_C[1]);
        let r2 = r * r;
        let y = EXPF_C[2].mul_add(r, 1.0);
        let y = (z.mul_add(r2, y) * s) as f32;
        let x = x[i];
        let y = if !SHIFTED && x > EXPF_OVER { f32::INFINITY } else { y };
        // also -inf -> +0
        let y = if x < EXPF_UNDER { 0.0 } else { y };
        // NaN -> x + x: quiet, with x's sign and payload (glibc's `return x + x`)
        out[i] = if !SHIFTED && x.is_nan() { x + x } else { y };
    }
    out
}

/// `expf8` in AVX2 registers, the replica's operations one for one (so the same bits), the table
/// read by a gather. Left to LLVM's vectoriser, whether the eight lanes became vectors depended
/// on the function the replica was inlined into: the NIF build ran the fused softmax's copy a
/// lane at a time.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn expf8_avx2<const SHIFTED: bool>(x: &[f32; 8]) -> [f32; 8] {
    use std::arch::x86_64::*;
    /// Four lanes, in f64, up to the rounding to f32.
    #[inline(always)]
    unsafe fn four(xd: __m256d) -> __m128 {
        unsafe {
            let c = _mm256_set1_pd;
            let kd = _mm256_fmadd_pd(c(EXPF_INVLN2N), xd, c(EXPF_SHIFT));
            let minus = _mm256_xor_pd(_mm256_sub_pd(kd, c(EXPF_SHIFT)), c(-0.0));
            let r = _mm256_fmadd_pd(c(EXPF_INVLN2N), xd, minus);
            let ki = _mm256_castpd_si256(kd);
            let t = _mm256_i64gather_epi64::<8>(EXPF_TAB.as_ptr() as *const i64, _mm256_and_si256(ki, _mm256_set1_epi64x(31)));
            let s = _mm256_castsi256_pd(_mm256_add_epi64(t, _mm256_slli_epi64::<47>(ki)));
            let z = _mm256_fmadd_pd(c(EXPF_C[0]), r, c(EXPF_C[1]));
            let r2 = _mm256_mul_pd(r, r);
            let y = _mm256_fmadd_pd(c(EXPF_C[2]), r, c(1.0));
            _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_fmadd_pd(z, r2, y), s))
        }
    }
    unsafe {
        let xs = _mm256_loadu_ps(x.as_ptr());
        let lo = four(_mm256_cvtps_pd(_mm256_castps256_ps128(xs)));
        let hi = four(_mm256_cvtps_pd(_mm256_extractf128_ps::<1>(xs)));
        let y = _mm256_set_m128(hi, lo);
        let y = if SHIFTED { y } else { _mm256_blendv_ps(y, _mm256_set1_ps(f32::INFINITY), _mm256_cmp_ps::<_CMP_GT_OQ>(xs, _mm256_set1_ps(EXPF_OVER))) };
        let y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps::<_CMP_LT_OQ>(xs, _mm256_set1_ps(EXPF_UNDER)));
        let y = if SHIFTED { y } else { _mm256_blendv_ps(y, _mm256_add_ps(xs, xs), _mm256_cmp_ps::<_CMP_UNORD_Q>(xs, xs)) };
        let mut out = [0f32; 8];
        _mm256_storeu_ps(out.as_mut_ptr(), y);
        out
    }
}

/// exp over a slice: glibc's expf replica where the level has FMA, else std's f32::exp (without
/// FMA instructions mul_add is a libm call, and glibc runs its non-FMA build there anyway).
#[inline(always)]
fn exp_f32_slice<S: Isa>(xs: &[f32], out: &mut [MaybeUninit<f32>]) {
    exp_minus_slice::<S, false>(xs, 0.0, out)
}

/// `out = exp(xs - m)`, the f32 difference rounded as a pass of its own would round it (`x - 0`
/// is `x`, NaN payloads included), so softmax's shift costs no pass over memory. `SHIFTED`: as
/// `expf8`'s (`m` the maximum of the values that are not NaN).
#[inline(always)]
fn exp_minus_slice<S: Isa, const SHIFTED: bool>(xs: &[f32], m: f32, out: &mut [MaybeUninit<f32>]) {
    if !S::FMA {
        for (o, &x) in out.iter_mut().zip(xs) {
            o.write((x - m).exp());
        }
        return;
    }
    let mut outs = out.chunks_exact_mut(8);
    let mut ins = xs.chunks_exact(8);
    for (o, x) in (&mut outs).zip(&mut ins) {
        let x: &[f32; 8] = x.try_into().unwrap();
        let y = expf8::<S, SHIFTED>(&x.map(|x| x - m));
        for (o, y) in o.iter_mut().zip(y) {
            o.write(y);
        }
    }
    // the tail through the same code (padded), so every element gets the same bits
    let rest = ins.remainder();
    let mut pad = [0f32; 8];
    pad[..rest.len()].copy_from_slice(rest);
    let y = expf8::<S, SHIFTED>(&pad.map(|x| x - m));
    for (o, y) in outs.into_remainder().iter_mut().zip(y) {
        o.write(y);
    }
}

wide!(fn exp_f32_into(xs: &[f32], out: &mut [MaybeUninit<f32>]) = exp_f32_slice;);

/// exp of `xs` at `level`, on rayon's pool for long slices.
fn exp_f32(level: Simd, xs: &[f32]) -> Vec<f32> {
    par_map_slices(xs, |x, o| exp_f32_into(level, x, o))
}

/// Whether `exp_f32` gives this process's f32::exp bit for bit, checked once on a sweep of the
/// whole range plus inputs where glibc's expf is not correctly rounded (so a libm with another
/// algorithm, e.g. a correctly rounded one, shows up here and keeps std's exp).
fn exp_replica_ok() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        let mut xs: Vec<f32> = (0..4096u32).map(|i| -110.0 + 200.0 * i as f32 / 4096.0).collect();
        xs.extend([3.045751e-5f32, 8.2787425e-5, 0.00010996452, 0.00019375593, 0.00020948838, 0.00021926145]);
        xs.extend([0.0f32, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, EXPF_OVER, EXPF_UNDER, -87.5, -100.0, 1e-30]);
        let ours = exp_f32(simd(), &xs);
        xs.iter().zip(&ours).all(|(x, y)| x.exp().to_bits() == y.to_bits())
    })
}

/// `out` for the kernels that write uninitialised outputs.
pub(super) fn as_uninit(out: &mut [f32]) -> &mut [MaybeUninit<f32>] {
    // SAFETY: f32 and MaybeUninit<f32> share their layout, and the kernels write only f32 values.
    unsafe { &mut *(out as *mut [f32] as *mut [MaybeUninit<f32>]) }
}

/// `out = exp(xs)` on the calling thread with f32::exp's bits: the vectorised replica where it
/// gives them (`exp_replica_ok`), else std's exp.
pub(crate) fn exp_slice(xs: &[f32], out: &mut [f32]) {
    assert_eq!(xs.len(), out.len(), "exp_slice: {} inputs, {} outputs", xs.len(), out.len());
    if !exp_replica_ok() {
        out.iter_mut().zip(xs).for_each(|(o, x)| *o = x.exp());
        return;
    }
    exp_f32_into(simd(), xs, as_uninit(out))
}

/// A float unary op of `std_unary`'s list (or f32 sigmoid, `sigmoid`) over a large contiguous
/// f32/f64 flex tensor, split over rayon's pool, with flex's bits. Small tensors stay on flex's
/// own (single-threaded) loop, but for f32 exp, whose vectorised kernel gives the same bits and
/// pays at any length (f32 tanh has its replica in `tanh`).
pub fn unary(op: UnaryOp, x: &Prim) -> Option<Prim> {
    if op == UnaryOp::Sigmoid {
        return sigmoid(x);
    }
    // passed as function items, not `std_unary`'s pointers, so the loop inlines them and becomes
    // vector square roots (the same correctly rounded values)
    if op == UnaryOp::Sqrt {
        return par_map_large(x, f32::sqrt, f64::sqrt);
    }
    let (f32_op, f64_op) = std_unary(op)?;
    if matches!(op, UnaryOp::Exp) && exp_replica_ok() {
        if let Some(xs) = flex_f32(x) {
            return Some(dispatch::from_data(TensorData::new(exp_f32(simd(), xs), dispatch::dims(x)), &burn::tensor::Device::flex()));
        }
    }
    par_map_large(x, f32_op, f64_op)
}

/// `f32_op` or `f64_op` over a contiguous f32/f64 flex tensor of at least `2 * PAR_MIN` values
/// on rayon's pool; `None` for other tensors.
fn par_map_large(x: &Prim, f32_op: impl Fn(f32) -> f32 + Sync, f64_op: impl Fn(f64) -> f64 + Sync) -> Option<Prim> {
    let shape = dispatch::dims(x);
    if let Some(xs) = flex_f32(x).filter(|xs| xs.len() >= 2 * PAR_MIN) {
        Some(par_map(xs, shape, f32_op))
    } else {
        flex_f64(x).filter(|xs| xs.len() >= 2 * PAR_MIN).map(|xs| par_map(xs, shape, f64_op))
    }
}

/// The sum `sum` gives one row of an f32 reduction over the last axis of `total` values, on the
/// calling thread: `row_sums` takes `par_sum` (`PAR_MIN`-long parts added in order) where it
/// runs row after row, else `sum_wide` over the whole row; NaN made positive as `sum` does.
#[inline(always)]
fn row_sum_lanes<S: Isa>(row: &[f32], total: usize) -> f64 {
    positive_nan(if rows_in_turn(total, row.len()) {
        row.chunks(PAR_MIN).map(sum_lanes::<f32, S>).sum()
    } else {
        sum_lanes::<f32, S>(row)
    })
}

wide!(pub(super) fn row_sum_as_sum(row: &[f32], total: usize) -> f64 = row_sum_lanes;);

/// The maximum and the minimum of the values of a row that are not NaN (`-inf` and `inf` for
/// none) in one pass, one `max` and one `min` instruction a vector, where `max_step`'s NaN rule
/// takes three. Without a NaN the maximum is `max_lanes`' value up to the sign of a zero.
#[inline(always)]
pub(super) fn max_min_blind<S: Isa>(xs: &[f32]) -> (f32, f32) {
    let (mut hi, mut lo) = ([f32::NEG_INFINITY; LANES], [f32::INFINITY; LANES]);
    let mut take = |c: &[f32; LANES]| {
        for ((h, l), &x) in hi.iter_mut().zip(lo.iter_mut()).zip(c) {
            *h = if x > *h { x } else { *h };
            *l = if x < *l { x } else { *l };
        }
    };
    let chunks = xs.chunks_exact(LANES);
    let rest = chunks.remainder();
    chunks.for_each(|c| take(c.try_into().unwrap()));
    if let Some(&first) = rest.first() {
        // padded with one of its own values, neutral to both
        let mut pad = [first; LANES];
        pad[..rest.len()].copy_from_slice(rest);
        take(&pad);
    }
    (halve_lanes(hi, f32::max), halve_lanes(lo, f32::min))
}

/// One row of `softmax_last`, every pass in `S`'s vector registers (baseline x86-64 code works
/// four lanes at a time).
#[inline(always)]
fn softmax_row<S: Isa>(row: &[f32], o: &mut [MaybeUninit<f32>], recip: bool, total: usize) {
    // The shift by the NaN-blind maximum gives the same `e` as by `reduce_max`'s: they differ only
    // in a zero's sign, and exp(x - 0) = exp(x + 0) (exp(±0) = 1). A NaN in the row (or an
    // infinite maximum, inf - inf) makes the sum NaN, and only then is the row done again with
    // the NaN rule and the general exp, whose NaNs carry the composition's bits.
    let (m, low) = max_min_blind::<S>(row);
    // every x - m in [-41, 0] puts every e in [exp(-41), 1], inside `divide_by`'s range
    let in_range = low - m >= -41.0;
    exp_minus_slice::<S, true>(row, m, o);
    // SAFETY: exp_minus_slice wrote every element of `o`.
    let mut e: &mut [f32] = unsafe { &mut *(o as *mut [MaybeUninit<f32>] as *mut [f32]) };
    let mut s = row_sum_lanes::<S>(e, total) as f32;
    if s.is_nan() {
        // SAFETY: as above, the same memory, `e`'s borrow ending here.
        let o = unsafe { &mut *(e as *mut [f32] as *mut [MaybeUninit<f32>]) };
        exp_minus_slice::<S, false>(row, max_lanes::<f32, S>(row), o);
        // SAFETY: exp_minus_slice wrote every element of `o`.
        e = unsafe { &mut *(o as *mut [MaybeUninit<f32>] as *mut [f32]) };
        s = row_sum_lanes::<S>(e, total) as f32;
    }
    if recip {
        let r = 1.0 / s;
        e.iter_mut().for_each(|v| *v *= r);
    } else {
        divide_by::<S>(e, s, in_range);
    }
}

/// The values whose quotients `divide_by` takes in multiplications: [2^-60, 2^60].
const DIVIDE_LO: f32 = 8.673_617e-19;
const DIVIDE_HI: f32 = 1.152_921_5e18;

/// `v / s` for every `v` with the division's bits, in multiplications where that is proven:
/// with `r` the rounded `1/s`, `q = v r` is within an ulp of `v / s`, the residual `v - q s` is
/// exact in a fused multiply-add, and `q + (v - q s) r` rounds to the rounded quotient
/// (Markstein's theorem), while no value nears the subnormal or overflow range. Values outside
/// `[2^-60, 2^60]` (zeros, NaN) divide; a row of in-range values, the common case, takes the
/// multiplications alone. `in_range` says the caller knows every value to be in that range, so
/// the row is not checked.
#[inline(always)]
fn divide_by<S: Isa>(e: &mut [f32], s: f32, in_range: bool) {
    if !S::FMA || !(9.536_743e-7..=1_048_576.0).contains(&s) {
        // outside [2^-20, 2^20]
        e.iter_mut().for_each(|v| *v /= s);
        return;
    }
    let r = 1.0 / s;
    let fast = |v: f32| {
        let q = v * r;
        (-q).mul_add(s, v).mul_add(r, q)
    };
    if in_range || e.iter().fold(true, |ok, &v| ok & (v >= DIVIDE_LO) & (v <= DIVIDE_HI)) {
        e.iter_mut().for_each(|v| *v = fast(*v));
    } else {
        e.iter_mut().for_each(|v| *v = if (DIVIDE_LO..=DIVIDE_HI).contains(v) { fast(*v) } else { *v / s });
    }
}

wide!(#[cfg(test)] fn divide_by_wide(e: &mut [f32], s: f32, in_range: bool) = divide_by;);

wide!(fn softmax_row_wide(row: &[f32], o: &mut [MaybeUninit<f32>], recip: bool, total: usize) = softmax_row;);

/// Softmax over the last axis of a contiguous f32 flex tensor in one pass per row, the same bits
/// as the composition `Program` fuses into it (`compiler::fuse`): `e = exp(x - reduce_max(x))`
/// with `unary`'s exp, `s` = `sum`'s f64 row sum rounded to f32, then `e / s`, or with `recip`
/// `e * (1 / s)` (Axon's form). Five passes over memory become one. `None` off f32/flex, for an
/// empty tensor, or where the exp kernel is not this libm's.
pub fn softmax_last(x: &Prim, recip: bool) -> Option<Prim> {
    if !exp_replica_ok() {
        return None;
    }
    let (level, total) = (simd(), flex_f32(x)?.len());
    map_last_rows(x, |row, o, _| softmax_row_wide(level, row, o, recip, total))
}

/// A contiguous f32 flex tensor of `x`'s shape whose every last-axis row `row_kernel(row, out,
/// scratch)` writes, in parallel tasks of about `PAR_MIN` values, `scratch` a row-long buffer of
/// the task's. `row_kernel` must write every element of `out`. `None` off f32/flex and for an
/// empty tensor: the fused row kernels (softmax, layer norm) share this driver.
pub(crate) fn map_last_rows(x: &Prim, row_kernel: impl Fn(&[f32], &mut [MaybeUninit<f32>], &mut [f32]) + Sync) -> Option<Prim> {
    let xs = flex_f32(x)?;
    let shape = dispatch::dims(x);
    let cols = *shape.last()?;
    if xs.is_empty() || cols == 0 {
        return None;
    }
    let per_task = (PAR_MIN / cols).max(1);
    let mut out: Vec<f32> = Vec::with_capacity(xs.len());
    par_chunks_for(&mut out.spare_capacity_mut()[..xs.len()], per_task * cols, xs.len(), |t, o| {
        let mut scratch = vec![0f32; cols];
        for (row, o) in xs[t * per_task * cols..].chunks(cols).zip(o.chunks_mut(cols)) {
            row_kernel(row, o, &mut scratch);
        }
    });
    // SAFETY: the tasks wrote all xs.len() elements (each row of each chunk, `row_kernel`'s duty).
    unsafe { out.set_len(xs.len()) };
    Some(dispatch::from_data(TensorData::new(out, shape), &burn::tensor::Device::flex()))
}

/// The exact (erf) GELU, `x/2 (1 + erf(x/√2))`, of a contiguous f32 flex tensor in one pass on
/// rayon's pool: Burn composes it from five tensor ops, each a single-threaded pass over memory
/// (a quarter of a BERT forward on the CPU). Written as `x/2 erfc(-x/√2)`, which keeps full
/// precision for negative x where `1 + erf` cancels.
pub fn gelu(x: &Prim) -> Option<Prim> {
    let xs = flex_f32(x)?;
    let out = par_map_slices(xs, |x, o| gelu_f32_into(simd(), x, o));
    Some(dispatch::from_data(TensorData::new(out, dispatch::dims(x)), &burn::tensor::Device::flex()))
}

/// Numerical Recipes' `erfcc` (Chebyshev fit, §6.2): `erfc(a) = t exp(-a² + P(t))`, `t = 1/(1 +
/// a/2)`, relative error below 1.05e-7 for every a ≥ 0 (checked in f64 on [0, 10]); `P`'s
/// coefficients from the constant term up.
const ERFC_P: [f32; 10] =
    [-1.265_512_2, 1.000_023_7, 0.374_091_96, 0.096_784_18, -0.186_288_06, 0.278_868_07, -1.135_203_98, 1.488_515_87, -0.822_152_23, 0.170_872_77];

/// GELU over a slice through `erfc` above, in chunks of three straight-line passes the
/// compiler vectorises: `t` and the exponent, then `exp_f32_slice`, then the product (libm's
/// `erfcf` branches per value, a large share of a BERT layer's time; calling `expf8` inside one
/// fused loop was also much slower than these passes). `-a²` is split into its
/// rounded value and the rounding error (`fma`), the error applied as `exp(-lo) ≈ 1 - lo`.
/// Without FMA, libm's `erfcf` per value.
#[inline(always)]
fn gelu_f32_slice<S: Isa>(xs: &[f32], out: &mut [MaybeUninit<f32>]) {
    if !S::FMA {
        for (o, &x) in out.iter_mut().zip(xs) {
            o.write(0.5 * x * libm::erfcf(-x * std::f32::consts::FRAC_1_SQRT_2));
        }
        return;
    }
    const CHUNK: usize = 256;
    let (mut a, mut t, mut lo, mut arg) = ([0f32; CHUNK], [0f32; CHUNK], [0f32; CHUNK], [0f32; CHUNK]);
    let mut e = [MaybeUninit::<f32>::uninit(); CHUNK];
    for (x, o) in xs.chunks(CHUNK).zip(out.chunks_mut(CHUNK)) {
        let n = x.len();
        for i in 0..n {
            a[i] = x[i].abs() * std::f32::consts::FRAC_1_SQRT_2;
            t[i] = 1.0 / a[i].mul_add(0.5, 1.0);
            let mut p = 0f32;
            for c in ERFC_P.iter().rev() {
                p = p.mul_add(t[i], *c);
            }
            let hi = a[i] * a[i];
            lo[i] = a[i].mul_add(a[i], -hi);
            arg[i] = p - hi;
        }
        exp_f32_slice::<S>(&arg[..n], &mut e[..n]);
        for i in 0..n {
            // SAFETY: exp_f32_slice wrote e[..n]
            let e = unsafe { e[i].assume_init() };
            // erfc(|x|/√2); 0 where it underflows (also keeps ±Inf from 0 · Inf)
            let c = if a[i] > 10.5 { 0.0 } else { t[i] * e * (1.0 - lo[i]) };
            // Φ(x) = erfc(-x/√2)/2: 1 - c/2 for x ≥ 0, c/2 below
            let phi = if x[i] >= 0.0 { c.mul_add(-0.5, 1.0) } else { 0.5 * c };
            o[i].write(x[i] * phi);
        }
    }
}

wide!(fn gelu_f32_into(xs: &[f32], out: &mut [MaybeUninit<f32>]) = gelu_f32_slice;);

/// flex's f32 sigmoid, `1 / (1 + exp(-x))` from 0 up and `e / (1 + e)` with `e = exp(x)` below,
/// with the exps in `exp_f32_slice`'s passes: flex's bits where that replica gives f32::exp's
/// (`sigmoid` checks), and flex runs one value at a time on one thread.
#[inline(always)]
fn sigmoid_f32_slice<S: Isa>(xs: &[f32], out: &mut [MaybeUninit<f32>]) {
    const CHUNK: usize = 256;
    let mut arg = [0f32; CHUNK];
    let mut e = [MaybeUninit::<f32>::uninit(); CHUNK];
    for (x, o) in xs.chunks(CHUNK).zip(out.chunks_mut(CHUNK)) {
        let n = x.len();
        for i in 0..n {
            arg[i] = if x[i] >= 0.0 { -x[i] } else { x[i] };
        }
        exp_f32_slice::<S>(&arg[..n], &mut e[..n]);
        for i in 0..n {
            // SAFETY: exp_f32_slice wrote e[..n]
            let e = unsafe { e[i].assume_init() };
            o[i].write(if x[i] >= 0.0 { 1.0 / (1.0 + e) } else { e / (1.0 + e) });
        }
    }
}

wide!(fn sigmoid_f32_into(xs: &[f32], out: &mut [MaybeUninit<f32>]) = sigmoid_f32_slice;);

/// `out = sigmoid(xs)` on the calling thread with flex's f32 bits: the vectorised replica where
/// the exp replica holds (`exp_replica_ok`), else flex's formula on std's exp.
pub(crate) fn sigmoid_slice(xs: &[f32], out: &mut [f32]) {
    assert_eq!(xs.len(), out.len(), "sigmoid_slice: {} inputs, {} outputs", xs.len(), out.len());
    if !exp_replica_ok() {
        let flex = |x: f32| {
            let e = if x >= 0.0 { (-x).exp() } else { x.exp() };
            if x >= 0.0 { 1.0 / (1.0 + e) } else { e / (1.0 + e) }
        };
        out.iter_mut().zip(xs).for_each(|(o, &x)| *o = flex(x));
        return;
    }
    sigmoid_f32_into(simd(), xs, as_uninit(out))
}

/// `sigmoid_f32_slice` over a contiguous f32 flex tensor on rayon's pool; `None` for other
/// tensors, small ones, or where the exp replica is not this process's f32::exp.
fn sigmoid(x: &Prim) -> Option<Prim> {
    let xs = flex_f32(x).filter(|xs| xs.len() >= 2 * PAR_MIN && exp_replica_ok())?;
    let out = par_map_slices(xs, |x, o| sigmoid_f32_into(simd(), x, o));
    Some(dispatch::from_data(TensorData::new(out, dispatch::dims(x)), &burn::tensor::Device::flex()))
}

/// `gelu` on a Burn tensor, falling back to Burn's composition off the CPU or for other dtypes.
pub fn gelu_tensor<const D: usize>(t: burn::tensor::Tensor<D>) -> burn::tensor::Tensor<D> {
    let p = t.into_dispatch();
    match gelu(&p) {
        Some(out) => burn::tensor::Tensor::from_dispatch(out),
        None => burn::tensor::activation::gelu(burn::tensor::Tensor::from_dispatch(p)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{flex_f32s as flex, prim_f32s as values};
    use rayon::prelude::*;
    use burn::backend::ops::{ActivationOps, FloatTensorOps};
    use burn::backend::Dispatch;

    /// Inputs with every special value, long enough for the parallel paths.
    fn specials(n: usize) -> Vec<f32> {
        let special = [0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, f32::MIN_POSITIVE, 1e-45, 88.7, -103.0, 1e30];
        (0..n).map(|i| if i % 97 == 0 { special[(i / 97) % special.len()] } else { ((i as f32) * 1.7e-3).sin() * 20.0 }).collect()
    }

    /// Run through scripts/without_avx512.sh (which says so in EXBURN_CPUID_MASK), the process sees no
    /// AVX-512, so every kernel takes its AVX2 path: the `rust_avx2` stage tests what it claims.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn hidden_avx512_leaves_the_avx2_kernels() {
        if crate::process::env::avx512_hidden() {
            assert!(!is_x86_feature_detected!("avx512f"), "AVX-512 is still visible");
            assert_eq!(simd(), Simd::Avx2);
        }
    }

    /// A NaN anywhere, at either end of a pooled scan, is found; f64 too; integers are not ours.
    #[test]
    fn has_nan_scans_every_element() {
        let n = 3 * PAR_MIN + 5;
        for at in [None, Some(0), Some(n - 1), Some(PAR_MIN + 7)] {
            let mut v = vec![1.0f32; n];
            if let Some(i) = at {
                v[i] = f32::NAN;
            }
            assert_eq!(has_nan(&flex(v, &[n])), Some(at.is_some()), "{at:?}");
        }
        let d = crate::dispatch::from_data(TensorData::new(vec![1.0f64, f64::NAN], [2]), &burn::tensor::Device::flex());
        assert_eq!(has_nan(&d), Some(true));
        let i = crate::dispatch::from_data(TensorData::new(vec![1i32, 2], [2]), &burn::tensor::Device::flex());
        assert_eq!(has_nan(&i), None);
    }

    #[test]
    fn parallel_unary_maps_equal_flex_bit_for_bit() {
        let xs = specials(3 * PAR_MIN + 5);
        let x = flex(xs, &[3 * PAR_MIN + 5]);
        for (op, flex_op) in [
            (UnaryOp::Exp, Dispatch::float_exp as fn(Prim) -> Prim),
            (UnaryOp::Tanh, Dispatch::float_tanh),
            (UnaryOp::Log, Dispatch::float_log),
            (UnaryOp::Sin, Dispatch::float_sin),
            (UnaryOp::Sqrt, Dispatch::float_sqrt),
            (UnaryOp::Erf, Dispatch::float_erf),
            (UnaryOp::Sigmoid, Dispatch::sigmoid),
        ] {
            let ours = values(unary(op, &x).expect("large contiguous f32 takes the kernel"));
            let theirs = values(flex_op(x.clone()));
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&ours), bits(&theirs), "{op:?}");
        }
        // small tensors (but exp's) and unlisted ops stay on flex
        assert!(unary(UnaryOp::Tanh, &flex(vec![1.0; 10], &[10])).is_none());
        assert!(unary(UnaryOp::Abs, &x).is_none());
        // f64 too, sigmoid's f64 excepted
        let x64 = crate::dispatch::cast(x.clone(), burn::backend::DType::F64);
        for (op, flex_op) in [(UnaryOp::Sqrt, Dispatch::float_sqrt as fn(Prim) -> Prim), (UnaryOp::Erf, Dispatch::float_erf)] {
            let ours = crate::dispatch::into_data(unary(op, &x64).expect("large contiguous f64 takes the kernel")).unwrap().try_to_vec::<f64>().unwrap();
            let theirs = crate::dispatch::into_data(flex_op(x64.clone())).unwrap().try_to_vec::<f64>().unwrap();
            assert_eq!(ours.iter().map(|f| f.to_bits()).collect::<Vec<_>>(), theirs.iter().map(|f| f.to_bits()).collect::<Vec<_>>(), "{op:?}");
        }
        assert!(unary(UnaryOp::Sigmoid, &x64).is_none());
    }

    /// pow: any exponent but 2 gives flex's powf bits (one-element and full-shape exponents);
    /// exponent 2 gives the f64 square rounded once (Nx.BinaryBackend's value), NaN/Inf/±0 included.
    #[test]
    fn parallel_pow_equals_flex_and_squares_exactly() {
        let n = 3 * PAR_MIN + 5;
        let xs = specials(n);
        let x = flex(xs.clone(), &[n]);
        let bits = |v: &[f32]| v.iter().map(|f| if f.is_nan() { u32::MAX } else { f.to_bits() }).collect::<Vec<_>>();
        for e in [0.5f32, 3.0, -1.5, 2.5, 0.0] {
            let ours = values(pow(&x, &[n], &flex(vec![e], &[1]), &[n]).expect("one-element exponent"));
            let theirs = values(Dispatch::float_powf(x.clone(), flex(vec![e; n], &[n])));
            assert_eq!(bits(&ours), bits(&theirs), "exponent {e}");
        }
        let es: Vec<f32> = (0..n).map(|i| (i % 7) as f32 * 0.75 - 2.0).collect();
        let ours = values(pow(&x, &[n], &flex(es.clone(), &[n]), &[n]).expect("full-shape exponent"));
        let theirs = values(Dispatch::float_powf(x.clone(), flex(es, &[n])));
        assert_eq!(bits(&ours), bits(&theirs));
        let squares = values(pow(&x, &[n], &flex(vec![2.0], &[1]), &[n]).unwrap());
        let want: Vec<f32> = xs.iter().map(|&v| ((v as f64) * (v as f64)) as f32).collect();
        assert_eq!(bits(&squares), bits(&want));
        // broadcast bases and small tensors stay on flex
        assert!(pow(&flex(vec![1.0; 4], &[4]), &[4], &flex(vec![2.0], &[1]), &[4]).is_none());
        assert!(pow(&flex(vec![1.0; n], &[n]), &[1, n], &flex(vec![2.0], &[1]), &[2, n]).is_none());
    }

    #[test]
    fn index_bounds_are_checked_in_one_pass_with_negatives_out() {
        let ints = |v: Vec<i64>| dispatch::from_data(TensorData::new(v.clone(), [v.len()]), &burn::tensor::Device::flex());
        let n = 3 * PAR_MIN + 7;
        let mut xs: Vec<i64> = (0..n as i64).map(|i| i % 10).collect();
        assert_eq!(indices_in_bounds(&ints(xs.clone()), 10), Some(true));
        assert_eq!(indices_in_bounds(&ints(xs.clone()), 9), Some(false));
        xs[n - 1] = -1; // in the tail chunk
        assert_eq!(indices_in_bounds(&ints(xs.clone()), 10), Some(false));
        xs[n - 1] = i64::MIN;
        assert_eq!(indices_in_bounds(&ints(xs), 10), Some(false));
        assert_eq!(indices_in_bounds(&ints(vec![0, 1, 2]), 3), Some(true));
        assert_eq!(indices_in_bounds(&ints(vec![0, 3]), 3), Some(false));
        assert_eq!(indices_in_bounds(&ints(vec![]), 0), Some(true));
        assert_eq!(indices_in_bounds(&ints(vec![0]), 0), Some(false));
        // not an s64 flex tensor: the caller keeps Burn's path
        assert_eq!(indices_in_bounds(&flex(vec![0.0], &[1]), 1), None);
    }

    #[test]
    fn sums_over_leading_and_trailing_blocks_accumulate_in_f64() {
        let (r, c) = (300, 257);
        let xs: Vec<f32> = (0..r * c).map(|i| ((i as f32) * 0.37).sin() * 1000.0 + 0.1).collect();
        let x = flex(xs.clone(), &[r, c]);
        let want_rows: Vec<f32> = xs.chunks(c).map(|row| row.iter().map(|&v| v as f64).sum::<f64>() as f32).collect();
        let want_cols: Vec<f32> = (0..c).map(|j| (0..r).map(|i| xs[i * c + j] as f64).sum::<f64>() as f32).collect();
        let want_all = xs.iter().map(|&v| v as f64).sum::<f64>();
        assert_eq!(values(sum(&x, &[r, c], &[1], false).unwrap()), want_rows);
        assert_eq!(values(sum(&x, &[r, c], &[0], false).unwrap()), want_cols);
        assert_eq!(values(sum(&x, &[r, c], &[0, 1], false).unwrap()), vec![want_all as f32]);
        assert_eq!(values(sum(&x, &[r, c], &[1, 0], true).unwrap()), vec![(want_all / (r * c) as f64) as f32]);
        // a middle axis is not a block: Burn's path takes it
        assert!(sum(&flex(vec![0.0; 8], &[2, 2, 2]), &[2, 2, 2], &[1], false).is_none());
    }

    #[test]
    fn fused_gelu_is_accurate_to_an_f64_reference_and_agrees_with_burns_composition() {
        let n = 3 * PAR_MIN + 11;
        let xs: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.013).sin() * 8.0).chain([0.0, -0.0, 40.0, -40.0, f32::INFINITY, f32::NEG_INFINITY]).collect();
        let shape = [xs.len()];
        let t = burn::tensor::Tensor::<1>::from_dispatch(flex(xs.clone(), &shape));
        let ours = values(gelu_tensor(t.clone()).into_dispatch());
        let burns = values(burn::tensor::activation::gelu(t).into_dispatch());
        for (i, &x) in xs[..n].iter().enumerate() {
            let want = 0.5 * x as f64 * libm::erfc(-(x as f64) / std::f64::consts::SQRT_2);
            // erfc(z)'s condition number is ~2z², so rounding z = -x/√2 to f32 alone costs ~z² ulps:
            // allow that plus 8 ulps for erfcf itself. Burn's 1 + erf loses far more for negative x.
            let z2 = (x as f64) * (x as f64) / 2.0;
            let tol = (8.0 + 2.0 * z2) * f32::EPSILON as f64;
            assert!((ours[i] as f64 - want).abs() <= tol * want.abs() + 1e-30, "x = {x}: {} vs {want}", ours[i]);
            assert!((ours[i] - burns[i]).abs() <= 1e-4 * burns[i].abs().max(1e-3), "x = {x}");
        }
        assert_eq!(&ours[n..n + 4], &[0.0, -0.0, 40.0, -0.0]);
        assert_eq!(ours[n + 4], f32::INFINITY);
    }

    #[test]
    fn sums_keep_nx_special_values() {
        let x = flex(vec![1.0, f32::INFINITY, f32::NEG_INFINITY, 2.0, f32::NAN, 3.0, f32::INFINITY, 1.0, -0.0, -0.0, 0.0, 0.0], &[4, 3]);
        let got = values(sum(&x, &[4, 3], &[1], false).unwrap());
        // inf + -inf is the positive NaN Nx gives, not x86's negative one
        assert!(got[0].is_nan() && got[0].is_sign_positive());
        assert!(got[1].is_nan());
        assert_eq!(got[2], f32::INFINITY);
        assert_eq!(got[3], 0.0);
    }

    /// Every level `wide!` can run on this CPU, so each compiled copy is tested.
    fn levels() -> Vec<Simd> {
        [Simd::Base, Simd::Avx2, Simd::Avx512].into_iter().filter(|&l| l <= simd()).collect()
    }

    /// Distance in ulps between two finite-or-infinite f32 of the same sign convention.
    fn ulps(a: f32, b: f32) -> u64 {
        let key = |f: f32| {
            let b = f.to_bits() as i64;
            if b & 0x8000_0000 != 0 { -(b & 0x7fff_ffff) } else { b }
        };
        (key(a) - key(b)).unsigned_abs()
    }

    #[test]
    fn divide_by_gives_the_division_bits() {
        // a 64-bit LCG's high bits: values spread over the whole f32 range by their bit patterns
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (state >> 32) as u32
        };
        let specials = [0.0f32, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -f32::NAN, 1e-45, 1e-40, 1e-30, f32::MAX];
        let mut divisors: Vec<f32> = vec![1.0, 3.0, 7.0, 1024.0, 1023.999_94, 2.0f32.powi(-20), 2.0f32.powi(20), 1e-7, 1e7, 0.0, f32::INFINITY, f32::NAN];
        divisors.extend((0..40).map(|_| 1.0 + (next() % 2048) as f32 * 0.999_7));
        divisors.extend((0..20).map(|_| f32::from_bits(0x3000_0000 + next() % 0x1800_0000)));
        // all of [0.5, 1) in a release build (softmax's values are in (0, 1]), a stride otherwise
        let stride = if cfg!(debug_assertions) { 997 } else { 1 };
        let mut values: Vec<f32> = (0x3f00_0000u32..0x3f80_0000).step_by(stride).map(f32::from_bits).collect();
        values.extend((0..200_000).map(|_| f32::from_bits(next())));
        // rows of 64 as softmax passes them: every third row holds specials (the mixed path),
        // the others only values (most of them in range: the multiplications alone)
        for i in (0..values.len()).step_by(37).filter(|i| i / 64 % 3 == 0) {
            values[i] = specials[i % specials.len()];
        }
        for level in levels() {
            for &d in &divisors {
                let mut got = values.clone();
                // rows wholly in range also go unchecked, every other one of them
                for (i, row) in got.chunks_mut(64).enumerate() {
                    let in_range = i % 2 == 0 && row.iter().all(|v| (DIVIDE_LO..=DIVIDE_HI).contains(v));
                    divide_by_wide(level, row, d, in_range);
                }
                for (v, g) in values.iter().zip(&got) {
                    let want = v / d;
                    assert!(g.to_bits() == want.to_bits(), "{level:?}: {v:e} / {d:e} = {want:e}, got {g:e}");
                }
            }
        }
    }

    #[test]
    fn exp_replica_equals_f32_exp_on_every_f32() {
        assert!(exp_replica_ok(), "this libm's expf is not glibc's: the kernel is off, the rest of this test is moot");
        // every bit pattern in a release build; a sample (stride 101) in a debug one
        let stride: u64 = if cfg!(debug_assertions) { 101 } else { 1 };
        let chunk = 1u64 << 20;
        // the FMA levels (the baseline copy calls f32::exp itself; the other test covers it)
        let tested: Vec<Simd> = levels().into_iter().filter(|&l| l > Simd::Base).collect();
        let (mismatch, off_f64, worst) = (0..(1u64 << 32) / chunk)
            .into_par_iter()
            .map(|c| {
                let xs: Vec<f32> = (c * chunk..(c + 1) * chunk).step_by(stride as usize).map(|b| f32::from_bits(b as u32)).collect();
                let want: Vec<f32> = xs.iter().map(|x| x.exp()).collect();
                let mut mismatch = 0u64;
                for &level in &tested {
                    let ours = exp_f32(level, &xs);
                    mismatch += ours.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count() as u64;
                }
                // the correctly rounded value, as nearly as f64's exp gives it
                let (mut off, mut worst) = (0u64, 0u64);
                for (x, w) in xs.iter().zip(&want) {
                    let r = (*x as f64).exp() as f32;
                    if r.is_nan() {
                        assert!(w.is_nan());
                    } else if r.to_bits() != w.to_bits() {
                        off += 1;
                        worst = worst.max(ulps(r, *w));
                    }
                }
                (mismatch, off, worst)
            })
            .reduce(|| (0, 0, 0), |a, b| (a.0 + b.0, a.1 + b.1, a.2.max(b.2)));
        eprintln!("expf replica: {mismatch} mismatches vs f32::exp at levels {tested:?}; f32::exp (and so the replica) differs from (x as f64).exp() as f32 on {off_f64} inputs, by at most {worst} ulp");
        assert_eq!(mismatch, 0);
        assert!(worst <= 1);
    }

    #[test]
    fn exp_kernel_covers_tails_specials_and_both_thread_paths() {
        let special = [0.0f32, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -f32::NAN, f32::MIN_POSITIVE, 1e-45, -1e-45];
        let edges = [EXPF_OVER, f32::from_bits(EXPF_OVER.to_bits() + 1), EXPF_UNDER, f32::from_bits(EXPF_UNDER.to_bits() + 1), -87.3, -88.0, -103.3, -149.0, 88.0, 89.0, f32::MAX, f32::MIN];
        for level in levels() {
            for n in (0..=40).chain([PAR_MIN - 1, 2 * PAR_MIN + 3]) {
                let xs: Vec<f32> = (0..n).map(|i| special.iter().chain(&edges).copied().cycle().nth(i).filter(|_| i < 50).unwrap_or(((i as f32) * 0.731).sin() * 100.0)).collect();
                let ours = exp_f32(level, &xs);
                assert_eq!(ours.len(), n);
                for (x, y) in xs.iter().zip(&ours) {
                    assert_eq!(y.to_bits(), x.exp().to_bits(), "{level:?} n = {n}: exp({x:e})");
                }
            }
        }
        // through the op: small tensors too, and NaN keeps its sign
        let got = values(unary(UnaryOp::Exp, &flex(vec![0.0, -f32::NAN, 1.0], &[3])).unwrap());
        assert_eq!(got[0], 1.0);
        assert!(got[1].is_nan() && got[1].is_sign_negative());
        assert_eq!(got[2], 1f32.exp());
    }

    #[test]
    fn wide_sums_agree_across_levels_and_with_an_f64_reference() {
        for n in (0..=200).chain([1000, 4099, PAR_MIN + 7]) {
            let xs: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.37).sin() * 1000.0 + 0.25).collect();
            let xd: Vec<f64> = xs.iter().map(|&x| x as f64 * 1.000001).collect();
            let want = xs.iter().map(|&x| x as f64).sum::<f64>();
            let want_d = xd.iter().sum::<f64>();
            let bound = xs.iter().map(|&x| (x as f64).abs()).sum::<f64>() * 1e-15;
            for level in levels() {
                // one summation order whatever the level: bit-identical results
                assert_eq!(sum_wide(level, &xs).to_bits(), sum_wide(Simd::Base, &xs).to_bits(), "{level:?} n = {n}");
                assert_eq!(sum_wide(level, &xd).to_bits(), sum_wide(Simd::Base, &xd).to_bits(), "{level:?} n = {n}");
                assert!((sum_wide(level, &xs) - want).abs() <= bound, "{level:?} n = {n}");
                assert!((sum_wide(level, &xd) - want_d).abs() <= bound * 1.01, "{level:?} n = {n}");
                assert!((par_sum(level, &xs) - want).abs() <= bound, "{level:?} n = {n}");
            }
        }
        for level in levels() {
            let s = |v: &[f32]| sum_wide(level, v);
            let mut v = vec![1.0f32; 131];
            v[77] = f32::INFINITY;
            assert_eq!(s(&v), f64::INFINITY);
            v[130] = f32::NEG_INFINITY;
            assert!(s(&v).is_nan());
            v[130] = f32::NAN;
            assert!(s(&v).is_nan());
            assert_eq!(s(&[-0.0; 67]).to_bits(), 0.0f64.to_bits());
            assert_eq!(s(&[]), 0.0);
        }
    }

    #[test]
    fn row_and_column_sums_match_f64_sums_at_every_level_and_size() {
        for (r, c) in [(1, 1), (3, 5), (7, 63), (9, 65), (1000, 1000), (64, 1025), (2 * PAR_MIN / 3, 3), (5, 3 * PAR_MIN + 1)] {
            let xs: Vec<f32> = (0..r * c).map(|i| ((i as f32) * 0.113).cos() * 50.0).collect();
            let rows: Vec<f64> = xs.chunks(c).map(|row| row.iter().map(|&v| v as f64).sum()).collect();
            let cols: Vec<f64> = (0..c).map(|j| (0..r).map(|i| xs[i * c + j] as f64).sum()).collect();
            for level in levels() {
                let close = |a: &[f64], b: &[f64], n: usize| a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-13 * 50.0 * n as f64);
                assert!(close(&row_sums(level, &xs, c), &rows, c), "{level:?} rows of {r}x{c}");
                assert!(close(&col_sums(level, &xs, c), &cols, r), "{level:?} cols of {r}x{c}");
                assert_eq!(row_sums(level, &xs, c), row_sums(Simd::Base, &xs, c));
            }
        }
    }

    /// Nx's max over a slice, one value at a time: NaN if any, else the largest.
    fn max_ref(xs: &[f32]) -> f32 {
        if xs.iter().any(|x| x.is_nan()) {
            f32::NAN
        } else {
            xs.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x))
        }
    }

    fn same_float(a: f32, b: f32) -> bool {
        (a.is_nan() && b.is_nan()) || a == b
    }

    #[test]
    fn maxima_propagate_nan_and_match_a_scalar_fold_at_every_level_and_size() {
        for n in (0..=150).chain([1000, PAR_MIN + 5, 2 * PAR_MIN + 77]) {
            let mut xs: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.59).sin() * 100.0 - 50.0).collect();
            for level in levels() {
                assert!(same_float(max_wide(level, &xs), max_ref(&xs)), "{level:?} n = {n}");
                assert!(same_float(block_max(level, &xs, 1, n.max(1), true).first().copied().unwrap_or(f32::NEG_INFINITY), max_ref(&xs)), "{level:?} n = {n}");
            }
            if n > 3 {
                // a NaN anywhere (here in the tail, then in the body) wins; -inf everywhere stays -inf
                xs[n - 1] = f32::NAN;
                xs[n / 2] = f32::INFINITY;
                for level in levels() {
                    assert!(max_wide(level, &xs).is_nan(), "{level:?} n = {n}");
                }
                xs[n - 1] = 0.0;
                xs[1] = f32::NAN;
                for level in levels() {
                    assert!(max_wide(level, &xs).is_nan(), "{level:?} n = {n}");
                    assert_eq!(max_wide(level, &vec![f32::NEG_INFINITY; n]), f32::NEG_INFINITY);
                }
            }
        }
    }

    #[test]
    fn reduce_max_over_blocks_matches_flex_and_nx_nan() {
        for (r, c) in [(1, 1), (3, 7), (1024, 1024), (5, 3 * PAR_MIN + 1), (2 * PAR_MIN + 1, 3), (70, 65)] {
            let mut xs: Vec<f32> = (0..r * c).map(|i| ((i as f32) * 0.211).cos() * 9.0).collect();
            let x = flex(xs.clone(), &[r, c]);
            let flex_rows = values(Dispatch::float_max_dim(x.clone(), 1));
            let flex_cols = values(Dispatch::float_max_dim(x.clone(), 0));
            assert_eq!(values(reduce_max(&x, &[r, c], &[1]).unwrap()), flex_rows, "rows of {r}x{c}");
            assert_eq!(values(reduce_max(&x, &[r, c], &[0]).unwrap()), flex_cols, "cols of {r}x{c}");
            assert_eq!(values(reduce_max(&x, &[r, c], &[0, 1]).unwrap()), vec![max_ref(&xs)]);
            for level in levels() {
                assert_eq!(block_max(level, &xs, r, c, true), flex_rows);
                assert_eq!(block_max(level, &xs, c, r, false), flex_cols);
            }
            // NaN in row r-1, column c-1
            xs[r * c - 1] = f32::NAN;
            let x = flex(xs.clone(), &[r, c]);
            let rows = values(reduce_max(&x, &[r, c], &[1]).unwrap());
            let cols = values(reduce_max(&x, &[r, c], &[0]).unwrap());
            assert!(rows[r - 1].is_nan() && rows[..r - 1] == flex_rows[..r - 1]);
            assert!(cols[c - 1].is_nan() && cols[..c - 1] == flex_cols[..c - 1]);
            assert!(values(reduce_max(&x, &[r, c], &[0, 1]).unwrap())[0].is_nan());
        }
        assert!(reduce_max(&flex(vec![0.0; 8], &[2, 2, 2]), &[2, 2, 2], &[1]).is_none());
    }

    #[test]
    fn arith_broadcasts_rows_and_equals_flex_bit_for_bit() {
        let special = [0.0f32, -0.0, 1.0, -1.0, f32::INFINITY, f32::NEG_INFINITY, 1e-40, 3.0e38, f32::MIN_POSITIVE];
        let data = |n: usize, seed: f32| -> Vec<f32> { (0..n).map(|i| if i % 13 == 5 { special[(i / 13) % special.len()] } else { ((i as f32) * seed).sin() * 7.0 }).collect() };
        let cases: &[(&[usize], &[usize])] = &[
            (&[64, 100], &[64, 100]),
            (&[1024, 1024], &[1024, 1]),
            (&[1024, 1], &[1024, 1024]),
            (&[300, 257], &[257]),
            (&[257], &[300, 257]),
            (&[40, 1, 300], &[1, 300]),
            (&[2, 3, 700], &[2, 1, 1]),
            (&[2, 3, 700], &[3, 700]),
            (&[5000], &[]),
            (&[], &[77, 100]),
            (&[1, 1], &[1, 9000]),
            (&[PAR_MIN + 3], &[PAR_MIN + 3]),
        ];
        let ops: [(Arith, fn(Prim, Prim) -> Prim); 4] = [(Arith::Add, Dispatch::float_add), (Arith::Sub, Dispatch::float_sub), (Arith::Mul, Dispatch::float_mul), (Arith::Div, Dispatch::float_div)];
        for (sa, sb) in cases {
            let out = crate::ops::broadcast_shape(sa, sb).unwrap();
            let (va, vb) = (data(sa.iter().product(), 0.37), data(sb.iter().product(), 0.113));
            let (a, b) = (flex(va.clone(), sa), flex(vb.clone(), sb));
            let expand = |p: Prim, s: &[usize]| {
                let mut padded = vec![1; out.len() - s.len()];
                padded.extend_from_slice(s);
                dispatch::expand(dispatch::reshape(p, &padded), &out)
            };
            for (op, flex_op) in ops {
                let ours = values(arith(op, &a, sa, &b, sb, &out).unwrap_or_else(|| panic!("{op:?} {sa:?} {sb:?} takes the kernel")));
                let theirs = values(flex_op(expand(a.clone(), sa), expand(b.clone(), sb)));
                assert_eq!(ours.len(), theirs.len());
                for (i, (x, y)) in ours.iter().zip(&theirs).enumerate() {
                    assert!(x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()), "{op:?} {sa:?} {sb:?} at {i}: {x} vs {y}");
                }
            }
        }
        // every level through the typed kernel, against scalar arithmetic
        let (r, c) = (97, 131);
        let (va, vb) = (data(r * c, 0.37), data(r, 0.71));
        for level in levels() {
            let got = arith_typed::<f32, DivOp>(level, &va, Cover::Full, &vb, Cover::PerRow(c), r * c).unwrap();
            let want: Vec<f32> = va.iter().enumerate().map(|(i, &x)| x / vb[i / c]).collect();
            assert!(got.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())), "{level:?}");
            let got = arith_typed::<f32, SubOp>(level, &vb[..c.min(r)], Cover::Shared(c.min(r)), &va, Cover::Full, r * c);
            assert!(got.is_some());
        }
        // f64 too
        let x = dispatch::from_data(TensorData::new((0..8192).map(|i| i as f64 * 0.5).collect::<Vec<_>>(), [64, 128]), &burn::tensor::Device::flex());
        let y = dispatch::from_data(TensorData::new((0..64).map(|i| i as f64 + 1.0).collect::<Vec<_>>(), [64, 1]), &burn::tensor::Device::flex());
        let got = dispatch::into_data(arith(Arith::Div, &x, &[64, 128], &y, &[64, 1], &[64, 128]).unwrap()).unwrap().try_to_vec::<f64>().unwrap();
        assert!(got.iter().enumerate().all(|(i, &v)| v == (i as f64 * 0.5) / ((i / 128) as f64 + 1.0)));
        // small outputs, short rows, outer products and mixed dtypes stay on flex
        assert!(arith(Arith::Add, &flex(vec![1.0; 10], &[10]), &[10], &flex(vec![1.0; 10], &[10]), &[10], &[10]).is_none());
        assert!(arith(Arith::Add, &flex(vec![1.0; 3000 * 3], &[3000, 3]), &[3000, 3], &flex(vec![1.0; 3], &[3]), &[3], &[3000, 3]).is_none());
        assert!(arith(Arith::Mul, &flex(vec![1.0; 100], &[100, 1]), &[100, 1], &flex(vec![1.0; 100], &[1, 100]), &[1, 100], &[100, 100]).is_none());
        assert!(arith(Arith::Mul, &flex(vec![1.0; 8192], &[8192]), &[8192], &y, &[64, 1], &[64, 8192]).is_none());
    }

    #[test]
    fn par_tasks_runs_every_task_once_from_outside_and_inside_the_pool() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let check = |n: usize| {
            let counts: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            par_tasks(n, &|i| {
                counts[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1), "n = {n}");
        };
        for n in [0, 1, 2, 3, 7, 64, 1000] {
            check(n);
        }
        // from rayon's own workers (nested in a parallel loop): no deadlock, same coverage
        (0..8).into_par_iter().for_each(|k| check(100 + k));
        // several callers at once, calls close together and around `WARM_FOR` apart, so warm
        // helpers take tasks of whichever call is the latest and leave between calls
        std::thread::scope(|s| {
            for t in 0..4u64 {
                s.spawn(move || {
                    for k in 0..40u64 {
                        check(2 + ((t * 40 + k) % 97) as usize);
                        if k % 8 == 7 {
                            std::thread::sleep(WARM_FOR.mul_f64(0.5 + (t as f64) * 0.4));
                        }
                    }
                });
            }
        });
        // chunked writes: every element written once by its own chunk, short last chunk included
        for (len, chunk, work) in [(10, 3, 0), (1000, 7, PAR_MIN), (PAR_MIN + 5, 1024, PAR_MIN + 5)] {
            let mut out = vec![usize::MAX; len];
            par_chunks_for(&mut out, chunk, work, |i, piece| piece.iter_mut().for_each(|v| *v = i));
            assert!(out.iter().enumerate().all(|(j, &v)| v == j / chunk), "{len} {chunk}");
        }
        // a panicking task (on whichever thread) panics the caller, after every task is done
        let ran = AtomicUsize::new(0);
        let r = std::panic::catch_unwind(|| {
            par_tasks(64, &|i| {
                ran.fetch_add(1, Ordering::Relaxed);
                assert!(i != 40, "task 40");
            })
        });
        assert!(r.is_err());
        assert_eq!(ran.load(Ordering::Relaxed), 64);
    }

    /// The exact softmax over {1024, 1024} f32 and its pieces at this CPU's level (run under
    /// `scripts/without_avx512.sh` for AVX2): whole kernels on the pool (min, median µs), then
    /// one thread over 1024 rows of 1024.
    #[test]
    #[ignore]
    fn softmax_timing() {
        let n = 1024;
        let xs: Vec<f32> = (0..n * n).map(|i| ((i * 7919) % 1000) as f32 / 100.0 - 5.0).collect();
        let x = crate::testing::flex_f32s(xs.clone(), &[n, n]);
        let pool = |f: &dyn Fn()| {
            let mut t: Vec<u128> = (0..100).map(|_| (std::time::Instant::now(), f()).0.elapsed().as_micros()).collect();
            t.sort();
            (t[0], t[50])
        };
        let alone = |f: &mut dyn FnMut()| {
            let t = std::time::Instant::now();
            (0..n).for_each(|_| f());
            t.elapsed().as_micros()
        };
        println!("level {:?}, {} threads, load {}", simd(), rayon::current_num_threads(), std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim());
        println!("softmax_last {:?} µs, exp {:?} µs", pool(&|| drop(softmax_last(&x, false).expect("fused"))), pool(&|| drop(exp_f32(simd(), &xs))));
        // after a pause, as calls through the NIF come: helpers that went to sleep join late
        let after = |pause: u64| {
            let mut t: Vec<u128> = (0..100)
                .map(|_| {
                    std::thread::sleep(std::time::Duration::from_micros(pause));
                    let t = std::time::Instant::now();
                    drop(softmax_last(&x, false).expect("fused"));
                    t.elapsed().as_micros()
                })
                .collect();
            t.sort();
            (t[0], t[50])
        };
        println!("softmax_last after a pause of 50 µs {:?}, 300 µs {:?}, 5 ms {:?}", after(50), after(300), after(5000));
        let (row, mut o, mut e) = (&xs[..n], vec![MaybeUninit::<f32>::uninit(); n], vec![0.5f32; n]);
        let softmax = alone(&mut || softmax_row_wide(simd(), row, &mut o, false, n * n));
        let exp = alone(&mut || exp_f32_into(simd(), row, &mut o));
        // by 1, so the values stay in the range of the multiplications
        let divide = alone(&mut || divide_by_wide(simd(), &mut e, 1.0, false));
        let max = alone(&mut || {
            std::hint::black_box(max_wide(simd(), row));
        });
        let sum = alone(&mut || {
            std::hint::black_box(row_sum_as_sum(simd(), row, n * n));
        });
        println!("one thread, 1024 rows: softmax {softmax} µs: exp {exp}, divide {divide}, sum {sum}, max {max}");
    }
}
