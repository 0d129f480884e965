//! When queued GPU work reaches the device's thread.
//!
//! cubecl hands recorded ops to the device's thread in batches of 32 tasks and sends none until
//! a batch fills or someone waits for a result (cubecl-common's `custom_channel`): a loop that
//! issues a few large ops and reads later leaves the GPU idle until the 32nd task or the read,
//! where PyTorch starts each kernel as it is issued. So a result of at least
//! `EXBURN_FLUSH_ELEMS` elements (default 2^20; `0` turns it off) sends the pending batch at
//! once. The flush only pads the batch with no-op tasks and wakes the device's thread: the
//! caller does not wait, so it is safe wherever a NIF runs. Only large results flush: small ops
//! gain nothing from it (guides/devices.md has the measurements).

use crate::tensor::Handle;

/// Sends the device's pending batch when `h`, a result just made, is large (see the module doc).
/// A no-op for CPU tensors.
pub fn after_result(h: &Handle) {
    if !crate::process::env::flush_elems().is_some_and(|min| h.numel() >= min) {
        return;
    }
    #[cfg(cube)]
    {
        use burn::backend::{BackendTensor, DispatchTensorKind};
        // float, int and bool primitives of the cube backend are the same fusion tensor type
        if let DispatchTensorKind::Cube(BackendTensor::Float(f) | BackendTensor::Int(f) | BackendTensor::Bool(f)) =
            &h.prim.kind
        {
            f.client.flush_queue();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // on the CPU a no-op; under EXBURN_TEST_DEVICE=cuda/vulkan the flush runs on a real queue
    #[test]
    fn a_flushed_large_result_keeps_its_data() {
        // the default threshold (process::env::FLUSH_ELEMS)
        let n = 1 << 20;
        let bytes: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
        let h = Handle::from_bytes(bytes.clone(), vec![n], crate::dtype::NxType::U(8), crate::testing::device()).unwrap();
        after_result(&h);
        assert_eq!(h.to_bytes().unwrap(), bytes);
    }
}
