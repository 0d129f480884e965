//! Weight matrices kept in their GGML formats on a GPU: the codes, scales and offsets of
//! `groups::Groups` as device tensors, which the rows kernel (`gpu::rows`) decodes as it reads
//! them.

use burn::tensor::{Device, Int, Tensor};

use crate::kernels::cpu::quant::groups::{Groups, Layout};
use crate::kernels::cpu::quant::QFormat;
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
        let g = all?;
        let layout = g.layout;
        debug_assert_eq!(g.scales.len(), rows * cols / layout.group);
        let words = g.codes.into_iter().map(|w| w as i32).collect();
        let (n, o) = (g.scales.len(), g.offsets.len());
        Some(GpuBlocks {
            rows,
            cols,
            layout,
            codes: i32_tensor(words, device),
            scales: f32_tensor(g.scales, [n], device),
            offsets: layout.offset.then(|| f32_tensor(g.offsets, [o], device)),
        })
    }
}
