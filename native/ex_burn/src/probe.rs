//! The automatic device choice: each compiled-in GPU kind in priority order, skipping software
//! adapters and devices that fail a test upload, else the CPU. It uploads tensors, so it sits
//! above `tensor` (which itself only needs `device`'s references).

use crate::device::{enumerate, is_software, DeviceKind, DeviceRef, AUTO_ORDER};
use crate::dtype::NxType;

/// Runs a one-element upload and read-back on a device, catching panics, so that a device whose
/// driver is present but broken is passed over instead of failing the first real op.
fn smoke_test(device: &DeviceRef) -> Result<(), String> {
    let attempt = crate::error::catch(|| {
        let h = crate::tensor::Handle::from_bytes(1.0f32.to_ne_bytes().to_vec(), vec![1], NxType::F(32), *device)?;
        h.to_bytes()
    });
    match attempt {
        Ok(bytes) if bytes == 1.0f32.to_ne_bytes() => Ok(()),
        Ok(_) => Err("read back a wrong value".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// The automatic device choice and the reason for it, one line per kind considered.
pub fn auto() -> (DeviceRef, String) {
    let compiled = DeviceKind::compiled();
    let mut notes = Vec::new();
    for kind in AUTO_ORDER {
        if kind == DeviceKind::Cpu {
            break;
        }
        if !compiled.contains(&kind) {
            notes.push(format!("{}: not compiled in", kind.name()));
            continue;
        }
        let found = enumerate(kind);
        if found.is_empty() {
            notes.push(format!("{}: no device found", kind.name()));
            continue;
        }
        for (index, d) in found.iter().enumerate() {
            let candidate = DeviceRef { kind, index };
            if is_software(d) {
                notes.push(format!("{candidate}: skipped, software adapter ({d:?})"));
                continue;
            }
            match smoke_test(&candidate) {
                Ok(()) => {
                    notes.push(format!("{candidate}: chosen ({d:?})"));
                    return (candidate, notes.join("; "));
                }
                Err(e) => notes.push(format!("{candidate}: skipped, failed a test upload ({e})")),
            }
        }
    }
    notes.push("cpu: chosen (no usable GPU)".into());
    (DeviceRef::CPU, notes.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_falls_back_to_the_cpu_with_a_reason_for_every_kind() {
        let (device, reason) = auto();
        let lines: Vec<&str> = reason.split("; ").collect();
        assert_eq!(lines.iter().filter(|l| l.contains("chosen")).count(), 1, "{reason}");
        if DeviceKind::compiled() == vec![DeviceKind::Cpu] {
            assert_eq!(device, DeviceRef::CPU);
            assert_eq!(
                lines,
                ["cuda: not compiled in", "rocm: not compiled in", "metal: not compiled in", "vulkan: not compiled in", "cpu: chosen (no usable GPU)"]
            );
        }
    }

    /// On a machine whose only Vulkan adapters are software ones (CI's lavapipe), `:auto` must
    /// fall back to the CPU and say why; where a hardware adapter exists it must pick that.
    #[cfg(feature = "vulkan")]
    #[test]
    fn auto_never_picks_a_software_adapter() {
        let found = enumerate(DeviceKind::Vulkan);
        let (device, reason) = auto();
        if !found.is_empty() && found.iter().all(is_software) {
            assert_eq!(device, DeviceRef::CPU, "{reason}");
            assert!(reason.contains("{:vulkan, 0}: skipped, software adapter"), "{reason}");
        }
        if found.iter().any(|d| !is_software(d)) {
            assert_eq!(device.kind, DeviceKind::Vulkan, "{reason}");
        }
    }
}
