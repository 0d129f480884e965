//! glibc malloc settings for tensor-sized blocks.
//!
//! Burn's CPU tensors are plain heap allocations. glibc serves blocks above its mmap threshold
//! (128 KiB at start, adjusted as blocks are freed) with fresh mappings, so a [128, 256] f32
//! result (128 KiB) is a new, zero-filled set of pages every time: in an MLP training step the
//! page faults cost more than the arithmetic (guides/backend.md). Raising the mmap and trim
//! thresholds lets freed blocks be reused from the heap. The price is up to `TRIM` bytes of
//! freed memory kept by the process.
//!
//! Skipped where the user set glibc's own `MALLOC_MMAP_THRESHOLD_`/`MALLOC_TRIM_THRESHOLD_`, or
//! `EXBURN_MALLOC_TUNE=0`; a no-op on other C libraries.

/// Blocks up to this size come from the heap (larger ones stay mmapped and are returned at once).
pub const MMAP: i32 = 32 << 20;
/// Free memory at the top of the heap beyond this is returned to the system.
pub const TRIM: i32 = 64 << 20;

#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn tune() -> bool {
    // glibc's malloc.h
    const M_TRIM_THRESHOLD: i32 = -1;
    const M_MMAP_THRESHOLD: i32 = -3;
    extern "C" {
        fn mallopt(param: i32, value: i32) -> i32;
    }
    let user_set = ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"].iter().any(|v| std::env::var_os(v).is_some());
    if user_set || !crate::process::env::malloc_tune() {
        return false;
    }
    // SAFETY: mallopt only changes allocator parameters; it is thread-safe in glibc.
    unsafe { mallopt(M_MMAP_THRESHOLD, MMAP) == 1 && mallopt(M_TRIM_THRESHOLD, TRIM) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn tune() -> bool {
    false
}

/// Returns the heap's free memory to the system (glibc's `malloc_trim`). For after a model load:
/// readers' transient buffers are freed by then, but with `TRIM` raised glibc would keep up to
/// 64 MiB of them resident (Candle's GGUF reader copies each tensor once on the way in, so a
/// small LLM's load would keep far more than its weights).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn trim() {
    extern "C" {
        fn malloc_trim(pad: usize) -> i32;
    }
    // SAFETY: malloc_trim only releases free memory; it is thread-safe in glibc.
    unsafe {
        malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn trim() {}
