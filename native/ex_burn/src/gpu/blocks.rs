//! Weight matrices kept in their GGML formats on a GPU: the codes, scales and offsets of
//! `groups::Groups` as device tensors, which the rows kernel (`gpu::rows`) decodes as it reads
//! them.

use burn::tensor::{Device, Int, Tensor};

use crate::kernels::cpu::quant::groups::{Groups, Layout};
use crate::kernels::cpu::quant::QFormat;
use crate::error::ExResult;
use crate::pretrained::decoder_source::DecoderSource;
use crate::pretrained::weights::{f32_tensor, i32_tensor};

/// A `[rows, cols]` matrix as codes: `codes` holds the 32-bit words (as i32), `scales` and
/// `offsets` one value per `layout.group` values, row after row.
pub struct GpuBlocks {
    pub rows: usize,
    pub cols: usize,
    pub layout: Layout,
    pub codes: Tensor<1, Int>,
    pub scales: Tensor<1>,
    pub offsets: Option<Tensor<1>>,
}

impl GpuBlocks {
    /// Several matrices of `cols` columns, each `(format, rows, data)` (whole rows of GGML
    /// blocks), stacked along their rows on `device`; `None` where a format has no `Layout` or
    /// the parts' layouts differ.
    pub fn stack(parts: &[(QFormat, usize, Vec<u8>)], cols: usize, device: &Device) -> Option<GpuBlocks> {
        let (g, rows) = merge(parts)?;
        Some(GpuBlocks::new(g, rows, cols, device))
    }

    /// `g`, a `[rows, cols]` matrix's codes, on `device`.
    pub fn new(g: Groups, rows: usize, cols: usize, device: &Device) -> GpuBlocks {
        let layout = g.layout;
        debug_assert_eq!(g.scales.len(), rows * cols / layout.group);
        let words = g.codes.into_iter().map(|w| w as i32).collect();
        let (n, o) = (g.scales.len(), g.offsets.len());
        GpuBlocks {
            rows,
            cols,
            layout,
            codes: i32_tensor(words, device),
            scales: f32_tensor(g.scales, [n], device),
            offsets: layout.offset.then(|| f32_tensor(g.offsets, [o], device)),
        }
    }
}

/// Several matrices, each `(format, rows, data)` (whole rows of GGML blocks), as one matrix of
/// codes stacked along their rows, and its row count; `None` where a format has no `Layout` or
/// the parts' layouts differ.
pub fn merge(parts: &[(QFormat, usize, Vec<u8>)]) -> Option<(Groups, usize)> {
    let mut all: Option<Groups> = None;
    let mut rows = 0;
    for (format, r, data) in parts {
        let g = Groups::new(*format, data)?;
        rows += r;
        match &mut all {
            None => all = Some(g),
            Some(a) if a.layout == g.layout => {
                a.codes.extend(g.codes);
                a.scales.extend(g.scales);
                a.offsets.extend(g.offsets);
            }
            Some(_) => return None,
        }
    }
    Some((all?, rows))
}

/// The matrices `parts` (`(name, rows)`, each `[rows, cols]`) of `g` as codes: neighbours of one
/// layout stacked along their rows, a run for each layout in turn; `None` where a part's format
/// has no layout.
pub fn read_runs(g: &mut DecoderSource, parts: &[(&str, usize)], cols: usize) -> ExResult<Option<Vec<(Groups, usize)>>> {
    let mut read = Vec::with_capacity(parts.len());
    for (name, rows) in parts {
        match g.blocks(name, *rows, cols)? {
            Some((format, data)) if Layout::of(format).is_some() => read.push((format, *rows, data)),
            _ => return Ok(None),
        }
    }
    Ok(read.chunk_by(|a, b| Layout::of(a.0) == Layout::of(b.0)).map(merge).collect())
}
