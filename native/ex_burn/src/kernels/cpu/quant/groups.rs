//! A block format's values as integer codes with one scale (and, for some formats, one offset)
//! per group of 16 or 32 values along a row: `w = scale·(code − zero) + offset`. The GPU's
//! matrix kernel (`gpu::rows`) reads weights this way: one decoding rule for every format, with
//! no block headers to parse in a kernel and every code at a fixed place in a 32-bit word.
//!
//! The scales and offsets are the products GGML's own dequantisation forms (an f16 times a
//! small integer, exact in f32), so the values are GGML's. 4-bit formats keep 4-bit codes (Q4_0,
//! Q4_1, Q4_K: 6 bits a value with the scales, against 4.5-5 in the file); the 5-, 6- and 8-bit
//! formats take a byte a code (10 bits a value against 5.5-8.5).

use super::{q6_k_quant, QFormat, BLOCK};

/// How a format's codes are stored and decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Bits a code: 4 (eight codes a word) or 8 (four).
    pub bits: u32,
    /// Values a scale (and offset).
    pub group: usize,
    /// Subtracted from each code.
    pub zero: u32,
    /// Whether each group has an offset.
    pub offset: bool,
}

impl Layout {
    /// `f`'s layout; `None` for f32 and f16 rows, which are not codes.
    pub fn of(f: QFormat) -> Option<Layout> {
        let l = |bits, group, zero, offset| Some(Layout { bits, group, zero, offset });
        match f {
            QFormat::Q4_0 => l(4, BLOCK, 8, false),
            QFormat::Q4_1 | QFormat::Q4_K => l(4, BLOCK, 0, true),
            QFormat::Q5_0 => l(8, BLOCK, 16, false),
            QFormat::Q5_1 | QFormat::Q5_K => l(8, BLOCK, 0, true),
            // signed bytes, stored plus 128
            QFormat::Q8_0 => l(8, BLOCK, 128, false),
            // a scale per 16 values
            QFormat::Q6_K => l(8, 16, 32, false),
            QFormat::F32 | QFormat::F16 => None,
        }
    }

    /// Codes a 32-bit word holds.
    pub fn per_word(self) -> usize {
        (32 / self.bits) as usize
    }
}

/// A matrix's codes (packed into words, value `i` of the matrix at bits `bits·(i % per_word)`
/// of word `i / per_word`), and its scales and offsets (`i / group`; no offsets without
/// `layout.offset`).
pub struct Groups {
    pub layout: Layout,
    pub codes: Vec<u32>,
    pub scales: Vec<f32>,
    pub offsets: Vec<f32>,
}

impl Groups {
    /// `data` (whole rows of `format` blocks, as GGML stores them) as codes; `None` for formats
    /// without a `Layout`.
    pub fn new(format: QFormat, data: &[u8]) -> Option<Groups> {
        let layout = Layout::of(format)?;
        let blocks = data.len() / format.block_bytes();
        let values = blocks * format.block_values();
        let mut g = Groups {
            layout,
            codes: vec![0; values.div_ceil(layout.per_word())],
            scales: Vec::with_capacity(values / layout.group),
            offsets: Vec::with_capacity(if layout.offset { values / layout.group } else { 0 }),
        };
        let mut at = 0;
        let mut q = [0i32; BLOCK];
        for b in data.chunks_exact(format.block_bytes()) {
            for s in 0..format.sub_blocks() {
                if format == QFormat::Q6_K {
                    // two groups of 16, each with its own 8-bit scale
                    let d = format.sub_header(b, s).0;
                    for j in 0..BLOCK {
                        let (sc, code) = q6_k_quant(b, s, j);
                        if j % 16 == 0 {
                            g.scales.push(d * sc as f32);
                        }
                        g.put(at + j, code as u32);
                    }
                } else {
                    let (d, m) = format.sub_header(b, s);
                    format.int_quants(b, s, &mut q);
                    g.scales.push(d);
                    if layout.offset {
                        g.offsets.push(m);
                    }
                    for (j, &code) in q.iter().enumerate() {
                        // Q8_0's signed quants, and Q4_0/Q5_0's unsigned ones, whose `zero` the
                        // header's offset (−8d, −16d) stands for
                        let code = if format == QFormat::Q8_0 { (code + 128) as u32 } else { code as u32 };
                        g.put(at + j, code);
                    }
                }
                at += BLOCK;
            }
        }
        Some(g)
    }

    fn put(&mut self, i: usize, code: u32) {
        let (bits, per) = (self.layout.bits, self.layout.per_word());
        debug_assert!(code < 1 << bits);
        self.codes[i / per] |= code << (bits * (i % per) as u32);
    }

    /// Value `i` of the matrix, decoded as the GPU kernel decodes it.
    #[cfg(test)]
    pub fn value(&self, i: usize) -> f32 {
        let l = self.layout;
        let code = (self.codes[i / l.per_word()] >> (l.bits * (i % l.per_word()) as u32)) & ((1 << l.bits) - 1);
        let v = self.scales[i / l.group] * (code as f32 - l.zero as f32);
        if l.offset {
            v + self.offsets[i / l.group]
        } else {
            v
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{random_blocks, QUANTISED};
    use super::*;

    /// Every quantised format's codes decode to GGML's values (`dequantise_row`), exactly (a zero
    /// may come out with the other sign).
    #[test]
    fn groups_decode_to_ggml_values() {
        let (rows, cols) = (3, 512);
        for f in QUANTISED {
            let data = random_blocks(f, rows, cols, 7);
            let g = Groups::new(f, &data).unwrap();
            let mut want = vec![0f32; rows * cols];
            let row_bytes = data.len() / rows;
            for (r, out) in want.chunks_exact_mut(cols).enumerate() {
                super::super::dequantise_row(f, &data[r * row_bytes..(r + 1) * row_bytes], out);
            }
            assert_eq!(g.scales.len(), rows * cols / g.layout.group, "{f:?}");
            for (i, w) in want.iter().enumerate() {
                assert_eq!(g.value(i), *w, "{f:?} value {i}");
            }
        }
        assert!(Groups::new(QFormat::F16, &[0; 64]).is_none());
    }
}
