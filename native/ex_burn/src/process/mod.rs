//! Process-wide setup: the CPU features the build assumes (checked at load), glibc's allocator
//! settings, and the `EXBURN_*` environment variables (`env`).

pub mod alloc;
pub mod cpu_target;
pub mod env;
