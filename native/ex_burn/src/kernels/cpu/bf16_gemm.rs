//! bf16 x bf16 matrix products on the CPU with AVX512-BF16's `vdpbf16ps`, accumulating in f32
//! and rounding the result to bf16 once.
//!
//! Why: flex multiplies bf16 by widening both operands to f32 and running the f32 gemm, so a
//! bf16 product costs an f32 product plus two conversions, several times oneDNN's time.
//! `vdpbf16ps` (`_mm512_dpbf16_ps`) does, per 32-bit lane, `acc += a.lo·b.lo + a.hi·b.hi` with an
//! f32 accumulator: 32 multiply-adds an instruction where an f32 FMA does 16, at the same issue
//! rate on Zen 5 (two a cycle), which brings bf16 products level with PyTorch's
//! (guides/backend.md has the timings).
//!
//! How (the GotoBLAS/BLIS scheme): B is packed into panels of `16·NV` columns whose 32-bit lanes
//! hold k pairs, (b[2p][j], b[2p+1][j]), once ahead of the tasks (or, where one row block covers m,
//! by each task for its own columns, a k block at a time); A is read in place when its rows are
//! contiguous and k is even (a pair of adjacent bf16 is already one 32-bit lane to broadcast), else
//! packed into rows of pairs. An odd k is padded with a zero pair half, columns past n with zero
//! columns, and the rows of a partial row group repeat its last row (their results are never
//! stored). A tile of `MR` rows by `NV` vectors of 16 columns stays in registers over a block of
//! `KC` pairs; blocks of `MC` rows by `NC` columns are the parallel tasks, looping k blocks
//! outside, then column panels (one panel's k block stays in L1/L2 for every row group), then row
//! groups. Partial sums between k blocks live in an f32 buffer per task, and the last block rounds
//! with `vcvtneps2bf16` (round to nearest even; NaN stays NaN) straight into the result.
//!
//! Semantics, against the f32 path (widen, f32 gemm, round once): `vdpbf16ps` treats bf16
//! denormal inputs as zero and flushes denormal results to zero, rounds to nearest even, and
//! adds the two products of a pair to the accumulator before the next pair. So results agree to
//! f32 accumulation error before the one bf16 rounding (the summation order differs, so the last
//! bf16 bit can), except where denormals are involved. NaN and ±Inf propagate as in f32
//! arithmetic (a NaN in a row of A makes that row of the result NaN; Inf·0 is NaN).
//!
//! On CPUs with AMX, whole groups of 32 rows go through `amx` instead (Intel's `vdpbf16ps` issues
//! once a cycle, no faster than its f32 FMAs; see that module).
//!
//! Taken only on x86-64 CPUs with avx512f/bw/vl and avx512bf16 (detected at run time);
//! `EXBURN_BF16_GEMM=0` keeps flex's path. Written against Burn's public API, so it could move
//! upstream into burn-flex's `matmul_bf16`.

// the packing and tiling helpers serve the x86-64 kernel only
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
mod amx;

use burn::backend::{DType, TensorData};
use burn::tensor::bf16;

use super::vector::{par_tasks, SharedMut};
use crate::dispatch::{self, Prim};

/// Pairs of k per block: a panel's block is 256 x 64 lanes, 64 KiB, which stays in Zen 5's L2
/// (smaller blocks gain nothing).
const KC: usize = 256;
/// Pairs per k block on AMX (a multiple of 16): fewer partial sums to store and reload than at
/// `KC`, where that traffic is a large share of the AMX kernel's time; 512 beat 256 and 1024.
const AMX_KC: usize = 512;
/// Rows per parallel task (a multiple of every `MR` used: 6 and 8).
const MC: usize = 96;
/// Columns per parallel task (a multiple of every panel width used: 16, 32, 48, 64).
const NC: usize = 192;

/// `a · b` for rank-3 bf16 flex tensors `[bsz, m, k]` and `[bsz, k, n]` (any strides), when this
/// CPU has AVX512-BF16 and the kernel is not switched off; `None` otherwise, so the caller keeps
/// Burn's matmul.
pub fn matmul(a: &Prim, b: &Prim) -> Option<Prim> {
    if !available() {
        return None;
    }
    let (va, vb) = (view(a)?, view(b)?);
    let ([bsz, m, k], [bsz_b, k_b, n]) = (va.shape, vb.shape);
    if bsz != bsz_b || k != k_b {
        return None;
    }
    let out = gemm(va, vb)?;
    Some(dispatch::from_data(TensorData::new(out, [bsz, m, n]), &burn::tensor::Device::flex()))
}

/// Whether `matmul` runs here: the CPU has the instructions, `EXBURN_BF16_GEMM` is not `0` (read
/// once), and (in tests) the calling thread has not switched it off.
fn available() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    let on = *ON.get_or_init(|| detected() && crate::process::env::bf16_gemm());
    #[cfg(test)]
    let on = on && !tests::OFF.with(|off| off.get());
    on
}

fn detected() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// A `[bsz, rows, cols]` strided view of bf16 bit patterns.
type View<'a> = super::strided::View<'a, u16>;

/// The view of a rank-3 bf16 flex tensor, so a permuted operand is read where it lies rather than
/// copied first.
fn view(p: &Prim) -> Option<View<'_>> {
    View::of::<bf16>(p, DType::BF16)
}

/// bf16 bits `lo` and `hi` as one 32-bit lane, `lo` in the low half: vdpbf16ps multiplies
/// element 2j of one operand with element 2j of the other, so k index 2p goes low.
#[inline(always)]
fn pair(lo: u16, hi: u16) -> u32 {
    lo as u32 | (hi as u32) << 16
}

/// `a · b`, `[bsz, m, n]` row-major; `None` where the CPU lacks the instructions. The shapes must
/// agree (`a` `[bsz, m, k]`, `b` `[bsz, k, n]`) and the views be `in_bounds`.
fn gemm(a: View, b: View) -> Option<Vec<bf16>> {
    if !detected() {
        return None;
    }
    let n = b.shape[2];
    // narrow panels for narrow products, where 64 columns would be mostly padding; six rows
    // by four vectors otherwise (24 accumulators: vdpbf16ps' latency (6 cycles on Zen 5) times
    // its two a cycle needs 12 in flight; 8x3 and 8x2 tiles do no better)
    match n.div_ceil(16) {
        #[cfg(target_arch = "x86_64")]
        1 => Some(run::<8, 1>(a, b, false)),
        #[cfg(target_arch = "x86_64")]
        2 => Some(run::<8, 2>(a, b, false)),
        #[cfg(target_arch = "x86_64")]
        3 => Some(run::<8, 3>(a, b, false)),
        #[cfg(target_arch = "x86_64")]
        // AMX reads 16-column panels, two at a time
        _ if amx::usable(a.shape) => Some(run::<6, 1>(a, b, true)),
        #[cfg(target_arch = "x86_64")]
        _ => Some(run::<6, 4>(a, b, false)),
        #[cfg(not(target_arch = "x86_64"))]
        _ => None,
    }
}

/// Packs k pairs `ps` of B's batch `bi`, for the panels of `nr` columns from column `j0` to `j1`
/// (`j0` a multiple of `nr`), into `out`: lane (p, j) of panel c goes to
/// `out[(c·stride + p - ps.start)·nr + j]` and holds (b[2p][j0 + c·nr + j], b[2p+1][...]), zero
/// past n and for the missing row of an odd k. Rows contiguous along n are read whole, in order
/// (walking one panel down B strides through memory a row apart); other layouts pair by pair,
/// the panel's columns innermost, so a transposed B is read along its stored rows, the panel's
/// `nr` cache lines staying in L1 while their pairs are used.
///
/// # Safety
/// `b` passed `in_bounds`, `ps` and `j0..j1` lie inside it, and `out` holds the panels.
unsafe fn pack_b(b: &View, bi: usize, ps: std::ops::Range<usize>, (j0, j1): (usize, usize), nr: usize, out: *mut u32, stride: usize) {
    let k = b.shape[1];
    let (width, panels) = (j1 - j0, (j1 - j0).div_ceil(nr));
    let at = |c: usize, p: usize| out.add((c * stride + p - ps.start) * nr);
    if b.strides[2] != 1 {
        for c in 0..panels {
            let cols = nr.min(width - c * nr);
            for p in ps.clone() {
                let o = std::slice::from_raw_parts_mut(at(c, p), nr);
                for (jj, o) in o[..cols].iter_mut().enumerate() {
                    let j = j0 + c * nr + jj;
                    let hi = if 2 * p + 1 < k { *b.ptr(bi, 2 * p + 1, j) } else { 0 };
                    *o = pair(*b.ptr(bi, 2 * p, j), hi);
                }
                o[cols..].fill(0);
            }
        }
        return;
    }
    // two rows widened to whole panels (zero past n)
    let (mut lo_row, mut hi_row) = (vec![0u16; panels * nr], vec![0u16; panels * nr]);
    for p in ps.clone() {
        lo_row[..width].copy_from_slice(std::slice::from_raw_parts(b.ptr(bi, 2 * p, j0), width));
        if 2 * p + 1 < k {
            hi_row[..width].copy_from_slice(std::slice::from_raw_parts(b.ptr(bi, 2 * p + 1, j0), width));
        } else {
            hi_row.fill(0);
        }
        for (c, (lo, hi)) in lo_row.chunks_exact(nr).zip(hi_row.chunks_exact(nr)).enumerate() {
            let o = std::slice::from_raw_parts_mut(at(c, p), nr);
            for ((o, &l), &h) in o.iter_mut().zip(lo).zip(hi) {
                *o = pair(l, h);
            }
        }
    }
}

/// Packs rows `rs` of A's batch `bi` as `kp` pairs each into `out` (row after row), the last
/// pair zero-padded for odd k. Pair by pair with the rows innermost: a transposed A is then read
/// along its stored rows, and the rows being written stay in L1.
///
/// # Safety
/// `a` passed `in_bounds`, `rs` are rows of it, and `out` holds `rs.len()·kp` pairs.
unsafe fn pack_a(a: &View, bi: usize, rs: std::ops::Range<usize>, kp: usize, out: *mut u32) {
    let k = a.shape[2];
    for p in 0..kp {
        for (i, r) in rs.clone().enumerate() {
            let hi = if 2 * p + 1 < k { *a.ptr(bi, r, 2 * p + 1) } else { 0 };
            *out.add(i * kp + p) = pair(*a.ptr(bi, r, 2 * p), hi);
        }
    }
}

/// The whole product for one tile shape: A packed if its pairs are not adjacent, B packed once
/// for all tasks (or by each task for its own columns where one row block covers m), then the
/// `MC` x `NC` blocks of the result as parallel tasks.
#[cfg(target_arch = "x86_64")]
fn run<const MR: usize, const NV: usize>(a: View, b: View, amx: bool) -> Vec<bf16> {
    let ([bsz, m, k], n) = (a.shape, b.shape[2]);
    let (nr, kp) = (16 * NV, k.div_ceil(2));
    let (mb, nb) = (m.div_ceil(MC), n.div_ceil(NC));

    // A in place when a row's pairs are adjacent bf16 (the broadcast reads them unaligned)
    let direct = a.strides[2] == 1 && k % 2 == 0;
    let mut ap: Vec<u32> = Vec::new();
    if !direct {
        // RB rows a packing task
        const RB: usize = 16;
        let blocks = m.div_ceil(RB);
        ap.reserve_exact(bsz * m * kp);
        let base = SharedMut(ap.as_mut_ptr());
        par_tasks(bsz * blocks, &|t| {
            let (bi, r0) = (t / blocks, t % blocks * RB);
            // SAFETY: a is in bounds (`view`); each task writes its own rows
            unsafe { pack_a(&a, bi, r0..m.min(r0 + RB), kp, base.get().add((bi * m + r0) * kp)) };
        });
        // SAFETY: the tasks wrote every pair of every row
        unsafe { ap.set_len(bsz * m * kp) };
    }
    let rows = Rows { a, direct, packed: SharedMut(ap.as_mut_ptr()), m, kp };

    // With AMX, A's whole 32-row groups as tiles, once for every column block (`amx::pack_a`)
    let groups = m / 32;
    let mut at: Vec<u32> = Vec::new();
    if amx {
        at.reserve_exact(bsz * groups * kp * 32);
        let base = SharedMut(at.as_mut_ptr());
        par_tasks(bsz * groups, &|t| {
            let (bi, g) = (t / groups, t % groups);
            let first = rows.row(bi, 32 * g) as *const u8;
            let stride = (rows.row(bi, 32 * g + 1) as isize).wrapping_sub(first as isize);
            // SAFETY: the group's 32 rows are rows of A; each task writes its own group's tiles
            unsafe { amx::pack_a(kp, first, stride, base.get().add(t * kp * 32)) };
        });
        // SAFETY: the tasks wrote every group's tiles
        unsafe { at.set_len(bsz * groups * kp * 32) };
    }
    let a_tiles = amx.then_some(SharedMut(at.as_mut_ptr()));

    // With one row block each B block is used by one task: it packs its own, a k block at a
    // time, into a buffer that stays in cache. Packed ahead, a large B is also a fresh mapping
    // (a 4096² B packs to 32 MiB, glibc's mmap threshold as the NIF sets it), whose page faults
    // cost a one-row product more than its arithmetic.
    // with AMX an even number of panels: the last pair's second one zero where n needs an odd
    let panels = if amx { n.div_ceil(2 * nr) * 2 } else { n.div_ceil(nr) };
    let per_batch = panels * kp * nr;
    let mut bp: Vec<u32> = Vec::new();
    if mb > 1 {
        // PB pairs a packing task: 16 pairs of 1024 columns read 64 KiB
        const PB: usize = 16;
        let chunks = kp.div_ceil(PB);
        bp.reserve_exact(bsz * per_batch);
        let base = SharedMut(bp.as_mut_ptr());
        par_tasks(bsz * chunks, &|t| {
            let (bi, p0) = (t / chunks, t % chunks * PB);
            // SAFETY: b is in bounds; tasks write disjoint pairs of the batch's panels
            unsafe { pack_b(&b, bi, p0..kp.min(p0 + PB), (0, n), nr, base.get().add(bi * per_batch + p0 * nr), kp) };
        });
        if panels > n.div_ceil(nr) {
            for bi in 0..bsz {
                // SAFETY: the padding panel lies inside the reserved capacity
                unsafe { std::ptr::write_bytes(base.get().add(bi * per_batch + (panels - 1) * kp * nr), 0, kp * nr) };
            }
        }
        // SAFETY: the tasks wrote every pair of every panel of every batch (and the padding)
        unsafe { bp.set_len(bsz * per_batch) };
    }
    let packed_b = (mb > 1).then_some(SharedMut(bp.as_mut_ptr()));

    let mut out: Vec<bf16> = Vec::with_capacity(bsz * m * n);
    let dst = SharedMut(out.as_mut_ptr() as *mut u16);
    par_tasks(bsz * mb * nb, &|t| {
        let (bi, jc, ic) = (t / (mb * nb), t / mb % nb, t % mb);
        let bs = match packed_b {
            Some(bp) => Panels::Packed(bp.get().wrapping_add(bi * per_batch)),
            None => Panels::Pack(&b),
        };
        // SAFETY: `gemm` checked the features; the task writes its own block of `out`
        unsafe { block::<MR, NV>(&rows, bi, ic * MC, jc * NC, [m, kp, n], bs, dst.get().wrapping_add(bi * m * n), a_tiles.map(|t| t.get().wrapping_add(bi * groups * kp * 32) as *const u32)) };
    });
    // SAFETY: the blocks cover the result and every block stored each of its elements
    unsafe { out.set_len(bsz * m * n) };
    out
}

/// Where A's rows of pairs are: in the operand itself, or packed `kp` pairs a row.
struct Rows<'a> {
    a: View<'a>,
    direct: bool,
    packed: SharedMut<u32>,
    m: usize,
    kp: usize,
}
unsafe impl Sync for Rows<'_> {}

impl Rows<'_> {
    #[inline(always)]
    fn row(&self, bi: usize, r: usize) -> *const u32 {
        if self.direct {
            self.a.ptr(bi, r, 0) as *const u32
        } else {
            self.packed.get().wrapping_add((bi * self.m + r) * self.kp)
        }
    }
}

/// B's panels for a block: the batch's, packed ahead, or B itself for the block to pack.
enum Panels<'a> {
    Packed(*const u32),
    Pack(&'a View<'a>),
}

/// Where a tile's accumulators go after a k block.
#[derive(Clone, Copy)]
enum Sink {
    /// Partial sums: the whole tile, rows `ld` f32 apart.
    F32 { at: *mut f32, ld: usize },
    /// The result rounded to bf16: `rows` x `cols` of the tile, rows `ld` apart.
    Bf16 { at: *mut u16, ld: usize, rows: usize, cols: usize },
}

/// The `MC` x `NC` block of batch `bi`'s result at (`m0`, `n0`), `dims` = [m, kp, n]: every k
/// block in turn over every panel and row group of the block. With `amx` (the batch's A as
/// `amx::pack_a` tiles), the block's whole groups of 32 rows go through `amx::tile`, a pair of
/// 16-column panels at a time (`run` pads to pairs), and only the rows after them through
/// `tile`.
///
/// # Safety
/// The CPU has avx512f/bw/vl and avx512bf16; `panels` are the batch's packed panels or its B
/// (in bounds); `dst` is the batch's `m x n` result, of which this call alone writes the block.
/// With `amx`, `amx::usable` held for the product (so every `kc` is a multiple of 16), `NV` is 1
/// and packed panels come in pairs.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn block<const MR: usize, const NV: usize>(
    rows: &Rows,
    bi: usize,
    m0: usize,
    n0: usize,
    [m, kp, n]: [usize; 3],
    panels_of: Panels,
    dst: *mut u16,
    amx: Option<*const u32>,
) {
    let nr = 16 * NV;
    let (height, width) = (MC.min(m - m0), NC.min(n - n0));
    // rows [0, tiled) by AMX, 32 at a time; the rest in groups of MR (the last one padded)
    let tiled = if amx.is_some() { height / 32 * 32 } else { 0 };
    let (groups, panels) = ((height - tiled).div_ceil(MR), width.div_ceil(nr));
    let kcb = if amx.is_some() { AMX_KC } else { KC };
    let kblocks = kp.div_ceil(kcb);
    // partial sums between k blocks, the block's tiles side by side (AMX pairs the panels)
    let ld = if amx.is_some() { panels.next_multiple_of(2) } else { panels } * nr;
    let mut partial = if kblocks > 1 { vec![0.0f32; (tiled + groups * MR) * ld] } else { Vec::new() };
    if tiled > 0 {
        amx::configure();
    }
    let mut own = match panels_of {
        Panels::Pack(_) => vec![0u32; kcb.min(kp) * ld],
        Panels::Packed(_) => Vec::new(),
    };
    for kb in 0..kblocks {
        let (p0, kc) = (kb * kcb, kcb.min(kp - kb * kcb));
        if let Panels::Pack(b) = panels_of {
            pack_b(b, bi, p0..p0 + kc, (n0, n0 + width), nr, own.as_mut_ptr(), kc);
        }
        let panel_at = |jr: usize| match panels_of {
            Panels::Packed(bp) => bp.add(((n0 / nr + jr) * kp + p0) * nr),
            Panels::Pack(_) => own.as_ptr().add(jr * kc * nr),
        };
        // AMX: each 32-row group (its tiles packed by `run`) against every panel of the block
        if let Some(base) = amx {
            for r0 in (0..tiled).step_by(32) {
                // the group's first pair of the k block: 32 rows by 16 pairs per tile pair
                let a_tiles = base.wrapping_add(((m0 + r0) / 32 * kp + p0) * 32);
                for jr in (0..panels).step_by(2) {
                    let c0 = jr * nr;
                    let tmp = partial.as_mut_ptr().wrapping_add(r0 * ld + c0);
                    let init = (kb > 0).then_some((tmp as *const f32, ld));
                    let sink = if kb + 1 == kblocks {
                        let at = dst.add((m0 + r0) * n + n0 + c0);
                        Sink::Bf16 { at, ld: n, rows: 32, cols: (width - c0).min(32) }
                    } else {
                        Sink::F32 { at: tmp, ld }
                    };
                    amx::tile(kc, a_tiles, (panel_at(jr) as *const u8, panel_at(jr + 1) as *const u8), init, sink);
                }
            }
        }
        for jr in 0..panels {
            let panel = panel_at(jr);
            for ir in 0..groups {
                let r0 = tiled + ir * MR;
                let valid = MR.min(height - r0);
                // a partial group repeats its last row: computed, never stored
                let a: [*const u32; MR] = std::array::from_fn(|i| rows.row(bi, m0 + r0 + i.min(valid - 1)).wrapping_add(p0));
                let tmp = partial.as_mut_ptr().wrapping_add(r0 * ld + jr * nr);
                let init = (kb > 0).then_some((tmp as *const f32, ld));
                let sink = if kb + 1 == kblocks {
                    let at = dst.add((m0 + r0) * n + n0 + jr * nr);
                    Sink::Bf16 { at, ld: n, rows: valid, cols: (width - jr * nr).min(nr) }
                } else {
                    Sink::F32 { at: tmp, ld }
                };
                tile::<MR, NV>(kc, a, panel, init, sink);
            }
        }
    }
    if tiled > 0 {
        amx::release();
    }
}

/// One tile: `MR` rows by `NV` vectors of 16 columns over `kc` pairs, `a[i]` at row i's first
/// pair of the block, `panel` at the packed panel's; starting from `init` (rows `ld` apart) or
/// zero.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn tile<const MR: usize, const NV: usize>(kc: usize, a: [*const u32; MR], panel: *const u32, init: Option<(*const f32, usize)>, sink: Sink) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); NV]; MR];
    if let Some((at, ld)) = init {
        for (i, row) in acc.iter_mut().enumerate() {
            for (v, x) in row.iter_mut().enumerate() {
                *x = _mm512_loadu_ps(at.add(i * ld + 16 * v));
            }
        }
    }
    // loops rather than closures (`array::from_fn`): a closure is a function of its own, which
    // need not inherit the caller's target features
    for p in 0..kc {
        let mut bv = [_mm512_setzero_si512(); NV];
        for (v, x) in bv.iter_mut().enumerate() {
            *x = _mm512_loadu_si512(panel.add((p * NV + v) * 16) as *const _);
        }
        for (i, row) in acc.iter_mut().enumerate() {
            // one (a[i][2p], a[i][2p+1]) pair in every lane
            let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(a[i].add(p).read_unaligned() as i32));
            for (x, &bv) in row.iter_mut().zip(&bv) {
                *x = _mm512_dpbf16_ps(*x, av, std::mem::transmute::<__m512i, __m512bh>(bv));
            }
        }
    }
    match sink {
        Sink::F32 { at, ld } => {
            for (i, row) in acc.iter().enumerate() {
                for (v, &x) in row.iter().enumerate() {
                    _mm512_storeu_ps(at.add(i * ld + 16 * v), x);
                }
            }
        }
        Sink::Bf16 { at, ld, rows, cols } => {
            for (i, row) in acc.iter().enumerate().take(rows) {
                for (v, &x) in row.iter().enumerate() {
                    if !store_bf16(at.add(i * ld + 16 * v), x, cols.saturating_sub(16 * v)) {
                        break;
                    }
                }
            }
        }
    }
}

/// Rounds 16 f32 lanes to bf16 (`vcvtneps2bf16`: nearest even, NaN stays NaN) and stores the
/// first `left.min(16)` of them at `at`; false (nothing stored) when `left` is 0, which ends a
/// row's vectors.
///
/// # Safety
/// The CPU has avx512f/bw/vl and avx512bf16; `left.min(16)` u16 from `at` are writable.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
#[inline]
unsafe fn store_bf16(at: *mut u16, x: std::arch::x86_64::__m512, left: usize) -> bool {
    use std::arch::x86_64::*;
    let left = left.min(16);
    if left == 0 {
        return false;
    }
    let bits: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(x));
    _mm256_mask_storeu_epi16(at as *mut _, ((1u32 << left) - 1) as u16, bits);
    true
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::cell::Cell;

    thread_local! {
        /// Switches `matmul` off on this test thread (tests run side by side, so not globally).
        pub(crate) static OFF: Cell<bool> = const { Cell::new(false) };
    }

    /// `f()` with the kernel switched off on this thread.
    pub(crate) fn without_kernel<R>(f: impl FnOnce() -> R) -> R {
        switched_off(&OFF, f)
    }

    /// `f()` with a thread-local switch set for its duration, cleared again even if it panics.
    pub(crate) fn switched_off<R>(flag: &'static std::thread::LocalKey<Cell<bool>>, f: impl FnOnce() -> R) -> R {
        flag.with(|off| off.set(true));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        flag.with(|off| off.set(false));
        r.unwrap_or_else(|e| std::panic::resume_unwind(e))
    }

    fn bits(x: f32) -> u16 {
        bf16::from_f32(x).to_bits()
    }

    fn value(b: u16) -> f64 {
        bf16::from_bits(b).to_f64()
    }

    /// Pseudo-random bf16 bits in ±[2^-4, 2) and zero (no denormals: the kernel flushes them).
    fn random(len: usize, seed: u64) -> Vec<u16> {
        let mut s = seed;
        (0..len)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let r = (s >> 33) as u32;
                if r % 17 == 0 {
                    return 0;
                }
                let v = (1.0 + (r >> 8) as f32 / (1u32 << 24) as f32) * 2f32.powi((r % 5) as i32 - 4);
                bits(if r & 0x80 != 0 { -v } else { v })
            })
            .collect()
    }

    fn contiguous(data: &[u16], shape: [usize; 3]) -> View<'_> {
        let [_, r, c] = shape;
        View { data, offset: 0, shape, strides: [(r * c) as isize, c as isize, 1] }
    }

    /// Element (b, i, j) of a view, as f64.
    fn at(v: &View, b: usize, i: usize, j: usize) -> f64 {
        let [s0, s1, s2] = v.strides;
        value(v.data[(v.offset as isize + b as isize * s0 + i as isize * s1 + j as isize * s2) as usize])
    }

    /// Checks `gemm(a, b)` against the exact product: each output's f64 sum of the widened
    /// products (exact: 8-bit significands, and k is far below 2^29, so f64 adds them without
    /// error here). Allowed: one bf16 ulp of the exact sum (the final rounding, plus a reordered
    /// f32 sum moving it across a rounding boundary), plus the f32 accumulation error bound
    /// `k · 2^-24 · Σ|a·b|` (relevant where terms cancel). A dropped, doubled or misplaced term
    /// is a whole `a·b`, far outside that for these k.
    fn check(a: View, b: View) {
        let ([bsz, m, k], n) = (a.shape, b.shape[2]);
        let got = gemm(a, b).expect("x86-64");
        assert_eq!(got.len(), bsz * m * n);
        for bi in 0..bsz {
            for i in 0..m {
                for j in 0..n {
                    let (mut sum, mut abs) = (0.0f64, 0.0f64);
                    for p in 0..k {
                        let t = at(&a, bi, i, p) * at(&b, bi, p, j);
                        sum += t;
                        abs += t.abs();
                    }
                    let ulp = if sum == 0.0 { 0.0 } else { 2f64.powi(sum.abs().log2().floor() as i32 - 7) };
                    let tol = ulp + k as f64 * 2f64.powi(-24) * abs;
                    let g = got[(bi * m + i) * n + j].to_f64();
                    assert!((g - sum).abs() <= tol, "[{bsz},{m},{k}]x[{k},{n}] at ({bi},{i},{j}): got {g}, exact {sum}, tol {tol}");
                }
            }
        }
    }

    #[test]
    fn products_match_the_exact_sums_over_odd_and_edge_sizes() {
        if !detected() {
            return;
        }
        let sizes = [1, 2, 3, 15, 17, 31, 33, 65, 129, 257];
        let mut seed = 1;
        for (t, &m) in sizes.iter().enumerate() {
            // every size as m, k and n, paired with others so that each panel width (n of 1 to
            // 16, 17-32, 33-48, wider), partial row groups and several k blocks come up
            for &(k, n) in &[(sizes[(t + 3) % 10], sizes[(t + 7) % 10]), (sizes[(t + 5) % 10], sizes[t]), (513, sizes[(t + 1) % 10])] {
                seed += 1;
                let (da, db) = (random(m * k, seed), random(k * n, seed + 100));
                check(contiguous(&da, [1, m, k]), contiguous(&db, [1, k, n]));
            }
        }
    }

    /// Shapes the AMX tile takes (k a multiple of 32, m ≥ 32, n > 48): whole and partial 32-row
    /// groups, partial 32-column halves and panels, one and several k blocks, several row blocks
    /// (B packed ahead) and one (packed by the task), A in place, transposed (packed) and
    /// batched; each run with and without AMX, both held to the exact sums. Where the CPU has no
    /// AMX both runs take `vdpbf16ps` (`amx::tests::ready_where_the_cpu_has_amx` pins which).
    #[test]
    fn amx_shaped_products_match_the_exact_sums() {
        if !detected() {
            return;
        }
        let mut seed = 500;
        for (bsz, m, k, n) in [(1, 32, 32, 64), (1, 33, 64, 49), (1, 95, 544, 100), (2, 200, 96, 250), (1, 64, 1056, 65), (1, 130, 32, 193)] {
            seed += 1;
            let (da, db) = (random(bsz * m * k, seed), random(bsz * k * n, seed + 100));
            let at = View { data: &da, offset: 0, shape: [bsz, m, k], strides: [(m * k) as isize, 1, m as isize] };
            for a in [contiguous(&da, [bsz, m, k]), at] {
                check(a, contiguous(&db, [bsz, k, n]));
                amx::tests::without_amx(|| check(a, contiguous(&db, [bsz, k, n])));
            }
        }
    }

    /// NaN in a row of A makes that row NaN, ±Inf in a column of B makes that column ±Inf, on
    /// the AMX tile as on `vdpbf16ps`.
    #[test]
    fn amx_tiles_propagate_nan_and_infinity() {
        if !detected() {
            return;
        }
        let (m, k, n) = (64, 64, 64);
        let mut da: Vec<u16> = (0..m * k).map(|i| bits(1.0 + (i % 7) as f32 / 8.0)).collect();
        let mut db: Vec<u16> = (0..k * n).map(|i| bits(0.5 + (i % 5) as f32 / 8.0)).collect();
        da[5 * k + 40] = bits(f32::NAN);
        db[33 * n + 50] = bits(f32::INFINITY);
        let out = gemm(contiguous(&da, [1, m, k]), contiguous(&db, [1, k, n])).unwrap();
        for i in 0..m {
            for j in 0..n {
                let v = out[i * n + j].to_f64();
                match (i, j) {
                    (5, _) => assert!(v.is_nan(), "({i},{j}) = {v}"),
                    (_, 50) => assert_eq!(v, f64::INFINITY, "({i},{j})"),
                    _ => assert!(v.is_finite() && v > 0.0, "({i},{j}) = {v}"),
                }
            }
        }
    }

    #[test]
    fn batched_products_and_strided_operands() {
        if !detected() {
            return;
        }
        // m of one row block (each task packs its own B) and of several (B packed ahead)
        for (bsz, m, k, n) in [(3, 37, 70, 50), (2, 130, 71, 90)] {
            let (da, db) = (random(bsz * m * k, 5), random(bsz * k * n, 6));
            check(contiguous(&da, [bsz, m, k]), contiguous(&db, [bsz, k, n]));
            // the same data read transposed: A [bsz, m, k] stored as [bsz, k, m], B as [bsz, n, k]
            let at = View { data: &da, offset: 0, shape: [bsz, m, k], strides: [(m * k) as isize, 1, m as isize] };
            let bt = View { data: &db, offset: 0, shape: [bsz, k, n], strides: [(k * n) as isize, 1, k as isize] };
            check(at, bt);
            // B broadcast over the batch (stride 0), A's rows read backwards from an offset
            let flipped = View { data: &da, offset: (m - 1) * k, shape: [bsz, m, k], strides: [0, -(k as isize), 1] };
            let shared = View { data: &db, offset: 0, shape: [bsz, k, n], strides: [0, n as isize, 1] };
            check(flipped, shared);
            // every other column of a wider B
            let wide = random(k * 2 * n, 7);
            let strided = View { data: &wide, offset: 1, shape: [1, k, n], strides: [0, 2 * n as isize, 2] };
            check(View { shape: [1, m, k], ..contiguous(&da, [bsz, m, k]) }, strided);
        }
    }

    #[test]
    fn zeros_nan_and_infinities_propagate() {
        if !detected() {
            return;
        }
        let (m, k, n) = (9, 40, 70);
        let zeros = vec![0u16; k * n];
        let da = random(m * k, 9);
        let out = gemm(contiguous(&da, [1, m, k]), contiguous(&zeros, [1, k, n])).unwrap();
        assert!(out.iter().all(|x| x.to_bits() == 0), "a · 0 is +0");
        let mut da = random(m * k, 10);
        let db = random(k * n, 11);
        da[2 * k + 7] = bits(f32::NAN);
        // row 5: +Inf times b's row 3, which is nonzero except where set to zero in column 4
        da[5 * k + 3] = bits(f32::INFINITY);
        let mut db = db;
        for j in 0..n {
            if db[3 * n + j] == 0 {
                db[3 * n + j] = bits(1.0);
            }
        }
        db[3 * n + 4] = 0;
        let out = gemm(contiguous(&da, [1, m, k]), contiguous(&db, [1, k, n])).unwrap();
        for j in 0..n {
            assert!(out[2 * n + j].is_nan(), "NaN in row 2 of a: column {j}");
            let x = out[5 * n + j];
            if j == 4 {
                assert!(x.is_nan(), "Inf · 0 is NaN");
            } else {
                let sign = if value(db[3 * n + j]) > 0.0 { 1.0 } else { -1.0 };
                assert_eq!(x.to_f64(), sign * f64::INFINITY, "Inf in row 5, column {j}");
            }
            assert!(out[j].is_finite() && out[8 * n + j].is_finite(), "other rows stay finite");
        }
    }

    #[test]
    fn rounding_is_to_nearest_even_once() {
        if !detected() {
            return;
        }
        // 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7: even is 1. 1 + 3·2^-8 is
        // halfway between 1 + 2^-7 and 1 + 2^-6: even is 1 + 2^-6. Accumulated in f32 (exact
        // here), rounded once: the ties show the rounding mode.
        let k = 2;
        let a = [bits(1.0), bits(2f32.powi(-8)), bits(1.0), bits(3.0 * 2f32.powi(-8))];
        let b = [bits(1.0), bits(1.0)];
        let out = gemm(contiguous(&a, [1, 2, k]), contiguous(&b, [1, k, 1])).unwrap();
        assert_eq!([out[0].to_f64(), out[1].to_f64()], [1.0, 1.0 + 2f64.powi(-6)]);
    }

    #[test]
    fn denormal_inputs_count_as_zero() {
        if !detected() {
            return;
        }
        // bf16 denormal 2^-130 times 1: the f32 path keeps it (a denormal), vdpbf16ps flushes
        let a = [bits(2f32.powi(-130)); 2];
        let b = [bits(1.0); 2];
        assert_ne!(a[0], 0);
        let out = gemm(contiguous(&a, [1, 1, 2]), contiguous(&b, [1, 2, 1])).unwrap();
        assert_eq!(out[0].to_bits(), 0);
    }

    /// The kernel's result through `dot`, and with it switched off flex's f32 path, bit for bit
    /// (a product of denormals tells the two apart: flex keeps them, the kernel flushes them).
    #[test]
    fn dot_takes_the_kernel_and_the_switch_restores_the_f32_path() {
        use crate::dtype::NxType;
        use crate::ops::linalg::{dot, DotSpec};
        use crate::tensor::Handle;
        if crate::testing::device() != crate::device::DeviceRef::CPU {
            return;
        }
        // above WIDE_DOT_LIMIT multiply-adds, so dot computes in bf16
        let (m, k, n) = (48, 160, 72);
        assert!(m * k * n > crate::ops::linalg::WIDE_DOT_LIMIT);
        let mut da = random(m * k, 21);
        // row 0: denormals only
        for x in &mut da[..k] {
            *x = bits(2f32.powi(-128));
        }
        let db = random(k * n, 22);
        let handle = |d: &[u16], shape: &[usize]| {
            let bytes = d.iter().flat_map(|x| x.to_ne_bytes()).collect();
            Handle::from_bytes(bytes, shape.to_vec(), NxType::BF16, crate::testing::device()).unwrap()
        };
        let (ha, hb) = (handle(&da, &[m, k]), handle(&db, &[k, n]));
        let spec = |c: usize| DotSpec { contract: vec![c], batch: vec![] };
        let result = || dot(&ha, &spec(1), &hb, &spec(0), NxType::BF16).unwrap().to_bytes().unwrap();
        let (on, off) = (result(), without_kernel(result));
        // the f32 path: flex's matmul of the same bf16 operands
        let flex = {
            let prim = |h: &Handle, s: &[usize]| dispatch::reshape(h.prim.clone(), s);
            use burn::backend::ops::FloatTensorOps;
            let p = burn::backend::Dispatch::float_matmul(prim(&ha, &[1, m, k]), prim(&hb, &[1, k, n]));
            dispatch::into_data(p).unwrap().try_to_vec::<bf16>().unwrap()
        };
        let off: Vec<bf16> = off.chunks(2).map(|c| bf16::from_ne_bytes([c[0], c[1]])).collect();
        assert_eq!(off.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), flex.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
        let on: Vec<bf16> = on.chunks(2).map(|c| bf16::from_ne_bytes([c[0], c[1]])).collect();
        // available(): detected, and EXBURN_BF16_GEMM not 0
        if available() {
            let ours = gemm(contiguous(&da, [1, m, k]), contiguous(&db, [1, k, n])).unwrap();
            assert_eq!(on.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), ours.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
            assert!(on[..n].iter().all(|x| x.to_bits() == 0 || x.to_bits() == 0x8000), "denormal row flushed");
            assert!(off[..n].iter().any(|x| x.to_f64() != 0.0), "the f32 path keeps denormal products");
        } else {
            assert_eq!(on, off);
        }
    }
}
