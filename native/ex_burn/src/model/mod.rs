//! Native models: a layer list built into a Burn module at runtime, trained with Burn's autodiff
//! and optimizers.

pub mod cells;
pub mod fused_adam;
pub mod gates;
pub mod init;
pub mod loss;
pub mod net;
pub mod recurrent;
pub mod spec;
pub mod steps;
pub mod train;

#[cfg(test)]
mod gradcheck;
