//! Compiled kernels and autotune results kept on disk, so a new OS process on the same GPU starts
//! warm: cubecl's own persistence (its `persistence` feature), switched on for compilation and
//! placed in `EXBURN_KERNEL_CACHE`. cubecl keys each entry by architecture, compiler options and
//! the kernel's id, so a cache shared by several cards or builds holds each one's entries apart.

use std::sync::Once;

use cubecl_runtime::config::cache::CacheConfig;
use cubecl_runtime::config::{CubeClRuntimeConfig, RuntimeConfig};

/// Sets cubecl's configuration once, before any GPU device starts: what a `cubecl.toml` (or
/// `CUBECL_*` variable) says, with compiled kernels cached in `EXBURN_KERNEL_CACHE`. Where the
/// configuration was already read or set, it is left as it is.
pub fn configure() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
        config.compilation.cache = true;
        config.environment.path = CacheConfig::Directory(crate::process::env::kernel_cache());
        CubeClRuntimeConfig::try_set(config);
    });
}
