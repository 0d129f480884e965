//! Whole-graph execution for `ExBurn.Defn.Compiler`: a defn expression lowered by Elixir into a
//! flat instruction list, validated once and then run in one NIF call per step.
//!
//! Each instruction reuses the same core op (`crate::ops::*`) the backend's per-op NIFs call, with
//! the same result-type and shape fix-ups the backend applies in Elixir, so a compiled program and
//! op-by-op evaluation agree bit for bit.

mod exec;
mod fuse;
mod instr;
mod program;
#[cfg(test)]
mod tests;

pub use instr::{Branch, Instr, Op};
pub use program::Program;
