//! Devices as Elixir sees them (`{kind, index}`) and the Burn `Device` values behind them.
//!
//! Burn 0.22 picks the backend from a runtime `Device` value; `Device::default()` takes the first
//! compiled-in backend even when no such hardware exists, so devices here are always resolved by
//! enumeration and a missing one is an error, never a tensor on a phantom device.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use burn::tensor::Device;

use crate::dtype::{NxType, ALL_TYPES};
use crate::error::{ExError, ExResult};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    Cpu,
    Vulkan,
    Metal,
    Cuda,
    Rocm,
}

impl DeviceKind {
    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Vulkan => "vulkan",
            DeviceKind::Metal => "metal",
            DeviceKind::Cuda => "cuda",
            DeviceKind::Rocm => "rocm",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        [Self::Cpu, Self::Vulkan, Self::Metal, Self::Cuda, Self::Rocm]
            .into_iter()
            .find(|k| k.name() == name)
    }

    /// Kinds whose backend was compiled into this library.
    pub fn compiled() -> Vec<DeviceKind> {
        let mut kinds = vec![DeviceKind::Cpu];
        if cfg!(feature = "cuda") {
            kinds.push(DeviceKind::Cuda);
        }
        if cfg!(feature = "rocm") {
            kinds.push(DeviceKind::Rocm);
        }
        if cfg!(feature = "metal") {
            kinds.push(DeviceKind::Metal);
        }
        if cfg!(feature = "vulkan") {
            kinds.push(DeviceKind::Vulkan);
        }
        kinds
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceRef {
    pub kind: DeviceKind,
    pub index: usize,
}

impl DeviceRef {
    pub const CPU: DeviceRef = DeviceRef { kind: DeviceKind::Cpu, index: 0 };

    /// A device written `kind[:index]` (`cpu`, `vulkan:1`), as `EXBURN_DEVICE` and the benches
    /// take it; the index defaults to 0.
    pub fn parse(spec: &str) -> Result<DeviceRef, String> {
        let (kind, index) = spec.split_once(':').unwrap_or((spec, "0"));
        let kind = DeviceKind::from_name(kind).ok_or_else(|| format!("unknown device kind in {spec:?}"))?;
        let index = index.parse().map_err(|_| format!("bad device index in {spec:?}"))?;
        Ok(DeviceRef { kind, index })
    }

    /// The device a variable of kind device names (`process::env::device_spec`): the CPU when
    /// it names none.
    pub fn parse_or_cpu(spec: Option<&str>) -> Result<DeviceRef, String> {
        spec.map_or(Ok(DeviceRef::CPU), DeviceRef::parse)
    }

    /// The Burn device, enumerated once per process and cached.
    pub fn burn(&self) -> ExResult<Device> {
        static CACHE: OnceLock<Mutex<HashMap<DeviceRef, Device>>> = OnceLock::new();
        let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
        if let Some(d) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(self) {
            return Ok(d.clone());
        }
        let device = self.resolve()?;
        cache.lock().unwrap_or_else(|e| e.into_inner()).insert(*self, device.clone());
        Ok(device)
    }

    fn resolve(&self) -> ExResult<Device> {
        if self.kind == DeviceKind::Cpu {
            return if self.index == 0 {
                Ok(Device::flex())
            } else {
                Err(ExError::Device(format!("there is one cpu device; {self} does not exist")))
            };
        }
        #[cfg(feature = "cuda")]
        crate::gpu::kernel_cache::configure();
        enumerate(self.kind)
            .into_iter()
            .nth(self.index)
            .ok_or_else(|| ExError::Device(format!("device {self} is not available (not compiled in or not present)")))
    }

    pub fn supports(&self, ty: NxType) -> ExResult<bool> {
        Ok(self.burn()?.supports_dtype(ty.dtype()))
    }

    /// Whether f64 transcendental functions (exp, log, sin, pow, erf, ...) run here. SPIR-V's
    /// GLSL.std.450 defines them for 16/32-bit floats only, so a Vulkan device that stores and adds
    /// f64 still cannot compile an f64 `exp`; the NVIDIA driver then poisons the whole device.
    pub fn f64_math(&self) -> bool {
        self.kind != DeviceKind::Vulkan
    }

    /// Fails with an error naming both the device and the type when the device lacks `ty`.
    /// Uploading an unsupported dtype can poison a GPU device, so this runs before any upload.
    pub fn check_type(&self, ty: NxType) -> ExResult<()> {
        if self.supports(ty)? {
            Ok(())
        } else {
            Err(ExError::DeviceType { device: self.to_string(), ty })
        }
    }
}

impl std::fmt::Display for DeviceRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{{:{}, {}}}", self.kind.name(), self.index)
    }
}

/// Hardware devices of one kind, in Burn's enumeration order. Software adapters (lavapipe and
/// friends enumerate as `DeviceKind::Cpu` wgpu adapters) are listed too; choosing them is left to
/// the caller, and the automatic choice skips them.
#[allow(unused_variables)]
pub fn enumerate(kind: DeviceKind) -> Vec<Device> {
    #[allow(unused_imports)]
    use burn::tensor::DeviceType;
    match kind {
        DeviceKind::Cpu => vec![Device::flex()],
        #[cfg(feature = "vulkan")]
        DeviceKind::Vulkan => Device::enumerate(DeviceType::Vulkan).into_iter().collect(),
        #[cfg(feature = "metal")]
        DeviceKind::Metal => Device::enumerate(DeviceType::Metal).into_iter().collect(),
        #[cfg(feature = "cuda")]
        DeviceKind::Cuda => Device::enumerate(DeviceType::Cuda).into_iter().collect(),
        #[cfg(feature = "rocm")]
        DeviceKind::Rocm => Device::enumerate(DeviceType::Rocm).into_iter().collect(),
        #[allow(unreachable_patterns)]
        _ => Vec::new(),
    }
}

/// Software rasterizers (lavapipe, llvmpipe, WARP) enumerate as wgpu devices of kind `Cpu`.
/// Burn keeps that kind behind feature-gated enums, so it is read off the device's Debug form.
pub fn is_software(device: &Device) -> bool {
    format!("{device:?}").contains("kind: Cpu")
}

/// Priority of the automatic choice: the fastest kinds first, the CPU last.
pub const AUTO_ORDER: [DeviceKind; 5] =
    [DeviceKind::Cuda, DeviceKind::Rocm, DeviceKind::Metal, DeviceKind::Vulkan, DeviceKind::Cpu];

/// Every usable device with the Nx types it supports.
pub fn list() -> Vec<(DeviceRef, String, Vec<NxType>)> {
    let mut out = Vec::new();
    for kind in DeviceKind::compiled() {
        for (index, device) in enumerate(kind).into_iter().enumerate() {
            let types = ALL_TYPES.iter().copied().filter(|t| device.supports_dtype(t.dtype())).collect();
            out.push((DeviceRef { kind, index }, format!("{device:?}"), types));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse() {
        assert_eq!(DeviceRef::parse("cpu"), Ok(DeviceRef::CPU));
        assert_eq!(DeviceRef::parse("vulkan:1"), Ok(DeviceRef { kind: DeviceKind::Vulkan, index: 1 }));
        assert_eq!(DeviceRef::parse("cuda"), Ok(DeviceRef { kind: DeviceKind::Cuda, index: 0 }));
        assert!(DeviceRef::parse("tpu").is_err());
        assert!(DeviceRef::parse("cuda:x").is_err());
        assert_eq!(DeviceRef::parse_or_cpu(None), Ok(DeviceRef::CPU));
        assert_eq!(DeviceRef::parse_or_cpu(Some("vulkan:1")), Ok(DeviceRef { kind: DeviceKind::Vulkan, index: 1 }));
    }

    #[test]
    fn missing_devices_are_errors_not_panics() {
        let err = DeviceRef { kind: DeviceKind::Cpu, index: 3 }.burn().unwrap_err();
        assert!(err.to_string().contains("one cpu device"), "{err}");
        #[cfg(not(feature = "cuda"))]
        assert!(DeviceRef { kind: DeviceKind::Cuda, index: 0 }.burn().is_err());
    }

    #[test]
    fn the_cpu_supports_every_type() {
        for t in ALL_TYPES {
            assert!(DeviceRef::CPU.supports(t).unwrap(), "{t}");
        }
    }
}
