//! Weight rows repacked eight at a time, so that one vector lane holds one weight row: a block's
//! integer products then come out as eight rows' sums in one register, are scaled by eight
//! scales at once, and never need a horizontal sum. GGML keeps a row's blocks together, which
//! leaves each block's sum to be reduced across lanes.
//!
//! A group's block (a 32-block, or a Q4_K super-block of eight sub-blocks) holds, in order:
//! - the eight rows' `d` as f16, then their `m` (Q4_1, Q5_1) or `dmin` (Q4_K) as f16;
//! - Q4_K and Q5_K: each sub-block's eight 6-bit scales, then its eight mins, one byte each;
//!   Q6_K only: its 16 scales of 16 values, eight bytes each;
//! - for each sub-block: the 5-bit formats' 32 bytes of fifth bits, byte `4·lane + t` bit `g`
//!   for value `4g + t`; then its quants in lane order: the 4-bit formats in 4 × 32 bytes, where byte
//!   `32p + 4·lane + t` holds value `4p + t` in its low nibble and value `16 + 4p + t` in its
//!   high nibble; Q6_K likewise, then 2 × 32 bytes of its high two bits, byte
//!   `32·(g / 4) + 4·lane + t` bits `2·(g % 4)..` for value `4g + t`; Q8_0 in 8 × 32 bytes, byte
//!   `32g + 4·lane + t` holding value `4g + t`.
//!
//! So the four bytes of lane `lane` in quant group `g` (`g < 4` low nibbles, else high) meet the
//! activations `4g..4g + 4` of the block, one broadcast 32-bit word. The same number of bytes as
//! the GGML rows, but Q4_K's 12 packed scale bytes a row become 16.
//!
//! F16 rows: value `v` of the eight rows as eight f16 at `16v` (`packed_f16`).
//!
//! Every path sums a row the same way: per block the exact integer sum, then
//! `acc += (d_w·d_x)·Σ` and, apart, `acc_m += m_w·(d_x·Σq_x)` with fused multiply-adds, and
//! `acc + acc_m` at the end. So a row's result has the same bits on every path and whatever
//! activation rows come with it.

use super::{f16_at, q6_k_quant, q8::Q8Rows, scale_min_k4, QFormat, BLOCK};

/// Weight rows per group: the f32 lanes of a 256-bit register.
pub const LANES: usize = 8;

/// Activation rows a kernel call takes, each with its two accumulators.
pub(super) const ROWS: usize = 4;

/// Whether `f` is kept in groups (every quantised format; f32 rows keep GGML's rows).
pub fn packs(f: QFormat) -> bool {
    f != QFormat::F32
}

/// Bytes of the scales and offsets at the start of a group's block.
#[inline(always)]
pub(super) const fn header_bytes(f: QFormat) -> usize {
    match f {
        QFormat::Q4_1 | QFormat::Q5_1 => 32,
        QFormat::Q4_K | QFormat::Q5_K => 32 + 2 * 8 * LANES,
        QFormat::Q6_K => 16 + 16 * LANES,
        QFormat::F16 => 0,
        _ => 16,
    }
}

/// Bytes of one sub-block's quants for the eight rows.
#[inline(always)]
pub(super) const fn quant_bytes(f: QFormat) -> usize {
    match f {
        QFormat::Q8_0 => BLOCK * LANES,
        QFormat::F16 => 2 * BLOCK * LANES,
        QFormat::Q6_K => BLOCK * LANES * 3 / 4,
        _ => BLOCK * LANES / 2,
    }
}

/// Where sub-block `s`'s quants start in a group's block (after its fifth bits, if any).
#[inline(always)]
pub(super) const fn quants_at(f: QFormat, s: usize) -> usize {
    fifth_bits_at(f, s) + fifth_bit_bytes(f)
}

/// Where sub-block `s`'s fifth bits start in a group's block.
#[inline(always)]
pub(super) const fn fifth_bits_at(f: QFormat, s: usize) -> usize {
    header_bytes(f) + s * (fifth_bit_bytes(f) + quant_bytes(f))
}

#[inline(always)]
const fn fifth_bit_bytes(f: QFormat) -> usize {
    if matches!(f, QFormat::Q5_0 | QFormat::Q5_1 | QFormat::Q5_K) {
        32
    } else {
        0
    }
}

/// Bytes of a group's block.
pub const fn block_bytes(f: QFormat) -> usize {
    quants_at(f, f.sub_blocks())
}

/// The quant group (`0..8`, the 32-bit word of activations it meets) and byte of value `v`.
#[inline(always)]
const fn place(v: usize) -> (usize, usize) {
    (v / 4, v % 4)
}

/// Bytes of a group of eight rows of `cols` values.
pub fn group_bytes(f: QFormat, cols: usize) -> usize {
    cols / f.block_values() * block_bytes(f)
}

/// `rows` GGML rows of `cols` values (`data`) in groups of eight, the last one padded with
/// zero rows, into `out` (`rows.div_ceil(8)` groups, zeroed).
pub fn pack(f: QFormat, rows: usize, cols: usize, data: &[u8], out: &mut [u8]) {
    debug_assert!(packs(f) && out.len() == rows.div_ceil(LANES) * group_bytes(f, cols));
    let (blocks, bb, pb, subs) = (cols / f.block_values(), f.block_bytes(), block_bytes(f), f.sub_blocks());
    let mut q = [0i32; BLOCK];
    for r in 0..rows {
        let (group, lane) = (r / LANES, r % LANES);
        for b in 0..blocks {
            let src = &data[(r * blocks + b) * bb..(r * blocks + b + 1) * bb];
            let dst = &mut out[(group * blocks + b) * pb..(group * blocks + b + 1) * pb];
            if f == QFormat::F16 {
                for v in 0..BLOCK {
                    dst[2 * (LANES * v + lane)..2 * (LANES * v + lane) + 2].copy_from_slice(&src[2 * v..2 * v + 2]);
                }
                continue;
            }
            // f16 scales copied as they are; Q4_K's scales and mins unpacked to a byte each
            if f == QFormat::Q6_K {
                dst[2 * lane..2 * lane + 2].copy_from_slice(&src[208..210]);
                for i in 0..16 {
                    dst[16 + LANES * i + lane] = src[192 + i];
                }
            } else {
                dst[2 * lane..2 * lane + 2].copy_from_slice(&src[0..2]);
            }
            if matches!(f, QFormat::Q4_1 | QFormat::Q5_1 | QFormat::Q4_K | QFormat::Q5_K) {
                dst[16 + 2 * lane..18 + 2 * lane].copy_from_slice(&src[2..4]);
            }
            for s in 0..subs {
                if matches!(f, QFormat::Q4_K | QFormat::Q5_K) {
                    let (sc, mn) = scale_min_k4(s, &src[4..16]);
                    dst[32 + LANES * s + lane] = sc;
                    dst[32 + LANES * subs + LANES * s + lane] = mn;
                }
                // Q6_K's quants kept unsigned and apart from their scales
                if f == QFormat::Q6_K {
                    q.iter_mut().enumerate().for_each(|(j, q)| *q = q6_k_quant(src, s, j).1 as i32);
                } else {
                    f.int_quants(src, s, &mut q);
                }
                let at = quants_at(f, s);
                for (v, &q) in q.iter().enumerate() {
                    let (g, t) = place(v);
                    if f == QFormat::Q6_K {
                        dst[at + 128 + 32 * (g / 4) + 4 * lane + t] |= ((q >> 4) as u8) << (2 * (g % 4));
                    }
                    if f == QFormat::Q8_0 {
                        dst[at + 32 * g + 4 * lane + t] = q as i8 as u8;
                        continue;
                    }
                    dst[at + 32 * (g % 4) + 4 * lane + t] |= ((q & 0x0f) as u8) << (4 * (g / 4));
                    if fifth_bit_bytes(f) > 0 {
                        dst[fifth_bits_at(f, s) + 4 * lane + t] |= (((q >> 4) & 1) as u8) << g;
                    }
                }
            }
        }
    }
}

/// Sub-block `s`'s scale and offset for row `lane` of a group's block, as `sub_header` gives
/// them for the GGML row.
#[inline(always)]
pub(super) fn sub_header(f: QFormat, blk: &[u8], lane: usize, s: usize) -> (f32, f32) {
    let d = f16_at(blk, 2 * lane);
    match f {
        QFormat::Q4_0 => (d, -8.0 * d),
        QFormat::Q5_0 => (d, -16.0 * d),
        QFormat::Q8_0 | QFormat::Q6_K => (d, 0.0),
        QFormat::Q4_K | QFormat::Q5_K => {
            let (sc, mn) = (blk[32 + LANES * s + lane], blk[32 + LANES * (f.sub_blocks() + s) + lane]);
            (d * sc as f32, -(f16_at(blk, 16 + 2 * lane) * mn as f32))
        }
        _ => (d, f16_at(blk, 16 + 2 * lane)),
    }
}

/// Sub-block `s`'s 32 quants of row `lane` as integers, as `int_quants` gives them.
#[inline(always)]
pub(super) fn int_quants(f: QFormat, blk: &[u8], lane: usize, s: usize, out: &mut [i32; BLOCK]) {
    let at = quants_at(f, s);
    for (v, o) in out.iter_mut().enumerate() {
        let (g, t) = place(v);
        *o = if f == QFormat::Q8_0 {
            blk[at + 32 * g + 4 * lane + t] as i8 as i32
        } else if f == QFormat::Q6_K {
            let low = (blk[at + 32 * (g % 4) + 4 * lane + t] >> (4 * (g / 4))) & 0x0f;
            let high = (blk[at + 128 + 32 * (g / 4) + 4 * lane + t] >> (2 * (g % 4))) & 3;
            blk[16 + LANES * (2 * s + v / 16) + lane] as i8 as i32 * ((low | high << 4) as i32 - 32)
        } else {
            let nibble = (blk[at + 32 * (g % 4) + 4 * lane + t] >> (4 * (g / 4))) & 0x0f;
            let fifth = if fifth_bit_bytes(f) > 0 { (blk[fifth_bits_at(f, s) + 4 * lane + t] >> g) & 1 } else { 0 };
            (nibble | fifth << 4) as i32
        };
    }
}

/// Row `lane` of a group (`group`: its blocks, one after another) dequantised into `out`.
pub fn dequantise_lane(f: QFormat, group: &[u8], lane: usize, out: &mut [f32]) {
    if f == QFormat::F16 {
        for (v, o) in out.iter_mut().enumerate() {
            *o = f16_at(group, 2 * (LANES * v + lane));
        }
        return;
    }
    let mut q = [0i32; BLOCK];
    for (blk, values) in group.chunks_exact(block_bytes(f)).zip(out.chunks_exact_mut(f.block_values())) {
        for (s, chunk) in values.chunks_exact_mut(BLOCK).enumerate() {
            let (d, m) = sub_header(f, blk, lane, s);
            int_quants(f, blk, lane, s, &mut q);
            for (o, q) in chunk.iter_mut().zip(q) {
                *o = d * q as f32 + m;
            }
        }
    }
}

/// The reference every ISA path gives the same bits as.
pub(super) fn group_dots_scalar(f: QFormat, group: &[u8], a: &Q8Rows, first: usize, out: &mut [[f32; LANES]]) {
    let subs = f.sub_blocks();
    let mut q = [0i32; BLOCK];
    for (i, o) in out.iter_mut().enumerate() {
        for (lane, o) in o.iter_mut().enumerate() {
            let (mut acc, mut acc_m) = (0f32, 0f32);
            for (b, blk) in group.chunks_exact(block_bytes(f)).enumerate() {
                for s in 0..subs {
                    let (dw, mw) = sub_header(f, blk, lane, s);
                    int_quants(f, blk, lane, s, &mut q);
                    let (xq, dx, dsx) = a.block(first + i, b * subs + s);
                    let sum: i32 = q.iter().zip(xq).map(|(w, x)| w * *x as i32).sum();
                    acc = (dw * dx).mul_add(sum as f32, acc);
                    if f.has_offset() {
                        acc_m = mw.mul_add(dsx, acc_m);
                    }
                }
            }
            *o = acc + acc_m;
        }
    }
}
