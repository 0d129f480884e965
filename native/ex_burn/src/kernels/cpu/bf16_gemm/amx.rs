//! The bf16 product's inner tile on Intel AMX (`tdpbf16ps`), where the CPU and the kernel allow
//! it: 32 x 32 of the result from two 16-row tiles of A and two 16-column tiles of B per 16
//! pairs of k, four f32 accumulator tiles. One `tdpbf16ps` is 16·16·32 multiply-adds, where
//! Intel's `vdpbf16ps` issues once a cycle, no faster than its f32 FMAs: on those CPUs only AMX
//! reaches oneDNN's speed (guides/backend.md has the timings).
//!
//! It reads what the `vdpbf16ps` path already lays out: A's rows of pairs in place (or packed),
//! a tile being 16 rows of 16 pairs at the rows' stride; B's packed panels, whose rows of 64
//! columns are 64 pairs, so a 16-column tile is 16 pair rows at the panel's row stride. Same
//! arithmetic as `vdpbf16ps` (Intel's pseudocode for both: denormal inputs as zero, each pair's
//! two products added to the f32 accumulator, round to nearest even, denormal results flushed),
//! so the module's semantics note holds unchanged; only the order of the f32 additions differs.
//!
//! Linux grants AMX's 8 KiB of tile state per process on request (`arch_prctl`); without it the
//! first tile instruction is SIGILL, so `ready` asks once and the kernel runs only if granted.
//! The instructions are written as inline assembly: Rust's AMX intrinsics are unstable.

use std::arch::asm;
use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::{store_bf16, Sink};

/// Whether the product `a` of shape [bsz, m, k] runs its whole 32-row groups here: AMX is
/// ready, k pairs come in whole tiles (k a multiple of 32, so every k block of `AMX_KC` pairs is too)
/// and there is at least one group.
pub(super) fn usable([_, m, k]: [usize; 3]) -> bool {
    #[cfg(test)]
    if tests::OFF.with(|off| off.get()) {
        return false;
    }
    k % 32 == 0 && m >= 32 && ready()
}

/// The CPU has AMX-TILE and AMX-BF16 (CPUID leaf 7), the kernel granted this process the tile
/// data state, and `EXBURN_BF16_AMX` is not `0`; asked once.
pub(super) fn ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| cpu_has_amx() && crate::process::env::bf16_amx() && granted())
}

/// CPUID leaf 7 lists AMX-BF16 (EDX bit 22) and AMX-TILE (bit 24). The leaf exists on every
/// x86-64 CPU that has AVX-512, which callers have checked.
fn cpu_has_amx() -> bool {
    let edx = __cpuid_count(7, 0).edx;
    edx >> 22 & 1 == 1 && edx >> 24 & 1 == 1
}

/// Asks Linux for AMX's tile data (ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, as the kernel's
/// Documentation/arch/x86/xstate.rst describes); false on an older kernel or a refusal.
fn granted() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with these arguments only changes the process's xstate permissions
    unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
}

/// Palette 1: tiles 0-3 the accumulators (16 rows of 16 f32), 4-5 A (16 rows of 16 pairs), 6-7
/// B (16 pair rows of 16 columns); every tile 16 rows of 64 bytes.
#[repr(C, align(64))]
struct Config([u8; 64]);

const CONFIG: Config = {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut t = 0;
    while t < 8 {
        c[16 + 2 * t] = 64;
        c[48 + t] = 16;
        t += 1;
    }
    Config(c)
};

/// Loads the tile configuration on this thread (tile state is per thread). Call before `tile`.
///
/// # Safety
/// `ready()` returned true.
pub(super) unsafe fn configure() {
    asm!("ldtilecfg [{}]", in(reg) &CONFIG, options(nostack, readonly));
}

/// Returns this thread's tile state to its initial state, so context switches stop saving it.
///
/// # Safety
/// `ready()` returned true.
pub(super) unsafe fn release() {
    asm!("tilerelease", options(nostack, nomem));
}

/// Loads tile `$t` with 16 rows of 64 bytes from `$at`, rows `$stride` bytes apart.
macro_rules! load {
    ($t:literal, $at:expr, $stride:expr) => {
        asm!(concat!("tileloadd tmm", $t, ", [{p} + {s}*1]"), p = in(reg) $at, s = in(reg) $stride, options(nostack, readonly))
    };
}

/// Stores tile `$t`'s 16 rows of 64 bytes to `$at`, rows `$stride` bytes apart.
macro_rules! store {
    ($t:literal, $at:expr, $stride:expr) => {
        asm!(concat!("tilestored [{p} + {s}*1], tmm", $t), p = in(reg) $at, s = in(reg) $stride, options(nostack))
    };
}

/// Copies the `kp` pairs (a multiple of 16) of 32 rows, the first at `first`, rows `stride`
/// bytes apart, to `out` as `tile` reads them: for each 16 pairs, the first 16 rows' 64-byte
/// runs, then the other 16 rows'. A tile is then 1 KiB in one piece (strided tile loads from A
/// in place were two thirds of the kernel's time). Byte copies: A's rows in place need only be
/// 2-byte aligned.
///
/// # Safety
/// The 32 rows' `kp` pairs lie inside A; `out` has room for 32·kp pairs.
pub(super) unsafe fn pack_a(kp: usize, first: *const u8, stride: isize, out: *mut u32) {
    debug_assert!(kp % 16 == 0);
    let (kc, to) = (kp, out as *mut u8);
    for r in 0..32 {
        let row = first.offset(r as isize * stride);
        for s in 0..kc / 16 {
            std::ptr::copy_nonoverlapping(row.add(64 * s), to.add((s * 32 + r) * 64), 64);
        }
    }
}

/// A 32 x 32 tile of the result over `kc` pairs (a multiple of 16): A's 32 rows as `pack_a`
/// laid them out at `a`; B's 32 columns as two packed 16-column panels at `b.0` and `b.1` (each
/// at its first pair row of the block: 64-byte pair rows, so a tile is 1 KiB in one piece).
/// Starts from `init` (f32, rows `ld` apart) or zero and ends in `sink` as `tile` does.
///
/// # Safety
/// `configure()` ran on this thread; the CPU has avx512f/bw/vl and avx512bf16; `a` holds 32·kc
/// pairs; both panels `kc` pair rows; `init` and the sink's 32 x 32 (`Sink::F32`) or
/// rows x cols (`Sink::Bf16`) lie inside their buffers.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(super) unsafe fn tile(kc: usize, a: *const u32, b: (*const u8, *const u8), init: Option<(*const f32, usize)>, sink: Sink) {
    match init {
        Some((at, ld)) => {
            let s = ld * 4;
            load!("0", at, s);
            load!("1", at.add(16), s);
            load!("2", at.add(16 * ld), s);
            load!("3", at.add(16 * ld + 16), s);
        }
        None => asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem)),
    }
    let (b0, b1) = b;
    for p in (0..kc).step_by(16) {
        // two 1 KiB tiles of A per 16 pairs
        let at = a.add(32 * p);
        load!("4", at, 64usize);
        load!("5", at.add(256), 64usize);
        load!("6", b0.add(64 * p), 64usize);
        load!("7", b1.add(64 * p), 64usize);
        asm!(
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            options(nostack, nomem)
        );
    }
    match sink {
        Sink::F32 { at, ld } => {
            let s = ld * 4;
            store!("0", at, s);
            store!("1", at.add(16), s);
            store!("2", at.add(16 * ld), s);
            store!("3", at.add(16 * ld + 16), s);
        }
        Sink::Bf16 { at, ld, rows, cols } => {
            if rows == 0 || cols == 0 {
                return;
            }
            // through a 32 x 32 f32 buffer, then rounded row by row into the result
            // every element is stored by the four tiles before it is read
            let mut c = std::mem::MaybeUninit::<[f32; 32 * 32]>::uninit();
            let cp = c.as_mut_ptr() as *mut f32;
            store!("0", cp, 128usize);
            store!("1", cp.add(16), 128usize);
            store!("2", cp.add(16 * 32), 128usize);
            store!("3", cp.add(16 * 32 + 16), 128usize);
            for i in 0..rows.min(32) {
                for v in 0..2 {
                    if !store_bf16(at.add(i * ld + 16 * v), _mm512_loadu_ps(cp.add(i * 32 + 16 * v)), cols.saturating_sub(16 * v)) {
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::cell::Cell;

    thread_local! {
        /// Keeps this test thread on the `vdpbf16ps` tile (tests run side by side).
        pub(crate) static OFF: Cell<bool> = const { Cell::new(false) };
    }

    /// `f()` with AMX switched off on this thread.
    pub(crate) fn without_amx<R>(f: impl FnOnce() -> R) -> R {
        super::super::tests::switched_off(&OFF, f)
    }

    /// Where the CPU has AMX the kernel must take it (Linux ≥ 5.16 grants it), so the tests of
    /// the parent module run the AMX path there rather than silently the other one.
    #[test]
    fn ready_where_the_cpu_has_amx() {
        if !(is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")) {
            return;
        }
        let has = super::cpu_has_amx();
        if !crate::process::env::bf16_amx() {
            assert!(!super::ready());
        } else {
            assert_eq!(super::ready(), has);
        }
    }
}
