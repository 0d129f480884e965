//! Seeded weight initialisation that gives the same weights for the same seed, whatever else the
//! process is doing.
//!
//! Burn's backends keep one process-wide random generator, and `Param`s initialise lazily, on
//! first use. Seeding and then building is therefore not enough: by the time a layer's weights
//! are drawn (the first forward pass, seconds later on a GPU that compiles kernels), another
//! thread may have re-seeded the generator or drawn from it, and two models compiled with the
//! same seed train differently (concurrent tests show it, most of all on a GPU). Here seeding,
//! building and drawing every parameter happen
//! under one lock. On GPUs Burn's fusion queues the random ops and takes their seeds only when
//! the queue runs, so the draw is complete only after a device sync, also under the lock.

use std::sync::Mutex;

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{Bool, Device, Int, Tensor};

use crate::error::{ExError, ExResult};

/// Held from seeding until every parameter has been drawn.
static SEEDED: Mutex<()> = Mutex::new(());

/// Builds a module with `build` on `device` after seeding the device's generator with `seed`,
/// and initialises all its parameters before another seeded build may start.
pub fn seeded<M: Module>(device: &Device, seed: u64, build: impl FnOnce() -> ExResult<M>) -> ExResult<M> {
    // a poisoned lock only means another build panicked (caught at the NIF boundary); the
    // generator is re-seeded below either way
    let _guard = SEEDED.lock().unwrap_or_else(|p| p.into_inner());
    device.seed(seed);
    let module = build()?;
    module.visit(&mut Materialize);
    device.sync().map_err(|e| ExError::Execution(format!("initialising the weights: {e:?}")))?;
    Ok(module)
}

/// Forces each lazy parameter's initialiser to run (`Param`'s deref does).
struct Materialize;

impl ModuleVisitor for Materialize {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let _ = &**param;
    }

    fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<D, Int>>) {
        let _ = &**param;
    }

    fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<D, Bool>>) {
        let _ = &**param;
    }
}
