//! BERT-family encoder on the Candle engine. Placeholder until issue #12's engine work lands.

use std::path::Path;

use super::Encoder;
use crate::device::DeviceRef;
use crate::error::{ExError, ExResult};

/// Loads `config.json` and `model.safetensors` from the model directory `dir`.
pub fn load(_dir: &Path, _device: &DeviceRef) -> ExResult<Box<dyn Encoder>> {
    Err(ExError::invalid("the candle BERT engine is not built yet"))
}
