//! Llama-family decoder on the Burn engine. Placeholder until issue #12's engine work lands.

use std::path::Path;

use super::CausalLm;
use crate::device::DeviceRef;
use crate::error::{ExError, ExResult};

/// Loads a Llama-architecture GGUF file.
pub fn load(_gguf: &Path, _device: &DeviceRef) -> ExResult<Box<dyn CausalLm>> {
    Err(ExError::invalid("the burn Llama engine is not built yet"))
}
