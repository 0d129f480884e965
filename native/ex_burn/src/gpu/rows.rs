//! `x @ Wᵀ` for a few rows of `x` on the cube GPU backends, with what surrounds it in a decoder
//! layer fused in: the input's RMSNorm or SiLU gate, and the residual the result adds to. These
//! are the weight products of a decoding step, whose rows are the batch's sequences.
//!
//! Why: Burn's matmul tiles the output into blocks of rows and columns; with 1 to 32 rows most
//! of a tile is empty and a product runs on few workgroups, so a batched step's weight products
//! cost far more than their weight traffic, and each op around them is a kernel launch of its
//! own. Here one plane (warp/subgroup) computes one output column for a group of rows: its
//! lanes walk that weight row in coalesced steps, each lane keeps one partial sum per row of the
//! group, and a plane sum finishes each. The planes of one column sit in one workgroup, so a
//! weight value comes from memory once per product whatever the number of rows. Splitting the
//! rows into groups gives a batch more planes in flight and each plane fewer loads in a row;
//! with few columns and rows, several planes share a column's row the same way.
//!
//! The weights are f32 values, or GGML blocks as codes with a scale (and offset) per group
//! (`gpu::blocks`), which each lane decodes as it reads them: a decoding step reads a quarter to a
//! third of the bytes.
//!
//! `fused_rope` runs a layer's Q/K/V projection the same way with its RoPE and the KV pool's
//! writes (`rope_cache`'s arithmetic) in the same kernel: each plane sums a value and its rotary
//! partner, so the pair rotates in registers, and a decoding layer is five launches, not six.
//!
//! `fused` hands its operands back where it does not apply (more rows, other dtypes, devices
//! without plane kernels, the CPU): the caller then runs the same arithmetic in Burn ops.

use burn::tensor::{DType, Int, Tensor};

pub use super::blocks::GpuBlocks;

/// The most rows of `x` the kernel takes (and it takes at least one): its partial sums live in
/// registers.
pub const MAX_ROWS: usize = 32;

/// What the product's input is made of.
#[derive(Clone, Copy)]
pub enum Input<'a> {
    /// `x` itself.
    Plain,
    /// RMSNorm of `x`'s rows with this weight and epsilon.
    Norm(&'a Tensor<1>, f64),
    /// `silu(gate) * up` of `x = [gate | up]`, halves of equal width.
    SiluMul,
}

/// The weight matrix `w: [n, k]`.
#[derive(Clone, Copy)]
pub enum Weight<'a> {
    /// f32 values.
    F32(&'a Tensor<2>),
    /// GGML blocks as codes and scales (`gpu::blocks`), decoded in registers.
    Blocks(&'a GpuBlocks),
}

/// `input(x) @ wᵀ (+ residual)`: `[rows of x, n]`, or the operands back. For tensors where
/// `gpu::kernels_run`, which the caller asks once for its device.
#[allow(clippy::result_large_err)]
pub fn fused(x: Tensor<2>, w: Weight, input: Input, residual: Option<Tensor<2>>) -> Result<Tensor<2>, (Tensor<2>, Option<Tensor<2>>)> {
    let runs = takes(&x, w);
    #[cfg(cube)]
    if runs {
        return Ok(cube::fused(x, w, input, residual));
    }
    let _ = (runs, w, input);
    Err((x, residual))
}

/// Whether the kernel takes `x` and `w`: 1 to `MAX_ROWS` rows of f32, f32 values or GGML blocks.
fn takes(x: &Tensor<2>, w: Weight) -> bool {
    (1..=MAX_ROWS).contains(&x.dims()[0])
        && x.dtype() == DType::F32
        && match w {
            Weight::F32(w) => w.dtype() == DType::F32,
            Weight::Blocks(_) => true,
        }
}

/// The rotary side of `fused_rope`: the model's tables and the step's positions and pool rows.
pub struct RopeOut<'a> {
    pub rope: &'a super::rope_cache::Rope<'a>,
    pub pos: &'a Tensor<1, Int>,
    pub at: &'a Tensor<1, Int>,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// The Q/K/V projection of a decoder layer with what follows it in one kernel: `norm(x) @ wᵀ`
/// (RMSNorm with `g`, `eps`), RoPE of its queries and keys (`rope_cache::rope_write`'s
/// arithmetic), the queries returned and the keys and values written to rows `at` of the pool's
/// sides: `(q, sides)`. Each plane sums a pair of columns, a value and its rotary partner. Or
/// the operands back where `fused` would not run, or the projection is not `(heads + 2 kv_heads)
/// head_dim` wide.
#[allow(clippy::result_large_err, clippy::type_complexity)]
pub fn fused_rope(x: Tensor<2>, w: Weight, (g, eps): (&Tensor<1>, f64), out: &RopeOut, pool: [Tensor<3>; 2]) -> Result<(Tensor<2>, [Tensor<3>; 2]), (Tensor<2>, [Tensor<3>; 2])> {
    let n = match w {
        Weight::F32(w) => w.dims()[0],
        Weight::Blocks(b) => b.rows,
    };
    let (dh, rd) = (out.head_dim, out.rope.cos.dims()[1]);
    let kw = out.kv_heads * dh;
    let shaped = n == out.heads * dh + 2 * kw && dh % 2 == 0 && rd % 2 == 0 && rd <= dh && pool.iter().all(|p| p.dims()[2] == kw && p.dims()[0] * p.dims()[1] > 0);
    let runs = shaped && takes(&x, w);
    #[cfg(cube)]
    if runs {
        return Ok(cube::fused_rope(x, w, (g, eps), out, pool));
    }
    let _ = (runs, w, g, eps);
    Err((x, pool))
}

#[cfg(cube)]
mod cube {
    use burn::backend::fusion::custom::TensorSpec;
    use burn::backend::tensor::{FloatTensor, IntTensor};
    use burn::backend::{backend_extension, Backend, Dispatch};
    use burn::tensor::Tensor;
    use burn_cubecl::tensor::CubeTensor;
    use burn_cubecl::CubeBackend;
    use cubecl::prelude::*;

    use super::super::rope_cache::cube::{rotate, store};
    use super::{Input, Weight};

    /// Planes per workgroup.
    const PLANES: usize = 8;

    /// The most rows one plane sums; more rows are split into groups of equal size (the size
    /// was picked by measuring several, guides/devices.md).
    const GROUP_ROWS: usize = 4;

    /// Planes a product should keep in flight: about what a large GPU holds at once. Below it a
    /// column's weight row is split between several planes of its workgroup, since one plane
    /// walking a long row alone waits on one load after another.
    const PLANES_IN_FLIGHT: usize = 8192;

    /// Planes that share one column's row (a power of two, at most the workgroup's planes over
    /// its row groups), for `n` columns, `groups` row groups and rows of `k` values.
    pub(super) fn splits(n: usize, groups: usize, k: usize, plane: usize) -> usize {
        let most = (PLANES / groups.min(PLANES)).min(k.div_ceil(plane)).max(1);
        let want = (PLANES_IN_FLIGHT / (n * groups).max(1)).clamp(1, most);
        1 << want.ilog2()
    }

    #[backend_extension(Cube: cfg(cube), Fusion: cfg(cube))]
    pub trait RowsMatmul: Backend {
        /// `input(x) @ wᵀ (+ res)`, f32, `x` of at most `MAX_ROWS` rows. `g` is the norm's
        /// weight where `norm`, `res` the residual where `residual`; unused ones are any
        /// tensor. `eps` is the norm's epsilon as f32 bits.
        #[allow(clippy::too_many_arguments)]
        #[fusion(meta = rows_meta)]
        fn rows_fused(
            x: FloatTensor<Self>,
            w: FloatTensor<Self>,
            g: FloatTensor<Self>,
            res: FloatTensor<Self>,
            norm: bool,
            silu: bool,
            residual: bool,
            eps: u32,
        ) -> FloatTensor<Self>;

        /// The same with the weights as GGML codes (`n` rows): `scales`, `codes` and `offsets`
        /// as `GpuBlocks` holds them (`offsets` any tensor without `offset`), decoded as
        /// `groups::Layout` says (`bits`, `group`, `zero`, `offset`).
        #[allow(clippy::too_many_arguments)]
        #[fusion(meta = blocks_meta)]
        fn rows_fused_blocks(
            x: FloatTensor<Self>,
            scales: FloatTensor<Self>,
            codes: IntTensor<Self>,
            offsets: FloatTensor<Self>,
            g: FloatTensor<Self>,
            res: FloatTensor<Self>,
            n: usize,
            norm: bool,
            silu: bool,
            residual: bool,
            eps: u32,
            bits: u32,
            group: usize,
            zero: u32,
            offset: bool,
        ) -> FloatTensor<Self>;

        /// `fused_rope`: the weights as `rows_fused_blocks` takes them (`bits` 0: f32 values in
        /// `scales`), the rotary tables, positions and pool rows, and the pool's sides; returns
        /// the queries and the sides.
        #[allow(clippy::too_many_arguments)]
        #[fusion(meta = rope_meta)]
        fn rows_rope(
            x: FloatTensor<Self>,
            scales: FloatTensor<Self>,
            codes: IntTensor<Self>,
            offsets: FloatTensor<Self>,
            g: FloatTensor<Self>,
            cos: FloatTensor<Self>,
            sin: FloatTensor<Self>,
            pos: IntTensor<Self>,
            at: IntTensor<Self>,
            k: FloatTensor<Self>,
            v: FloatTensor<Self>,
            eps: u32,
            bits: u32,
            group: usize,
            zero: u32,
            offset: bool,
            heads: usize,
            head_dim: usize,
            halves: bool,
        ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
    }

    #[allow(clippy::too_many_arguments)]
    fn rope_meta(
        x: &TensorSpec,
        _scales: &TensorSpec,
        _codes: &TensorSpec,
        _offsets: &TensorSpec,
        _g: &TensorSpec,
        _cos: &TensorSpec,
        _sin: &TensorSpec,
        _pos: &TensorSpec,
        _at: &TensorSpec,
        k: &TensorSpec,
        v: &TensorSpec,
        _eps: &u32,
        _bits: &u32,
        _group: &usize,
        _zero: &u32,
        _offset: &bool,
        heads: &usize,
        head_dim: &usize,
        _halves: &bool,
    ) -> (TensorSpec, TensorSpec, TensorSpec) {
        let mut shape = x.shape.clone();
        shape[1] = heads * head_dim;
        (TensorSpec::new(shape, x.dtype), k.clone(), v.clone())
    }

    #[allow(clippy::too_many_arguments)]
    fn blocks_meta(
        x: &TensorSpec,
        _scales: &TensorSpec,
        _codes: &TensorSpec,
        _offsets: &TensorSpec,
        _g: &TensorSpec,
        _res: &TensorSpec,
        n: &usize,
        _norm: &bool,
        _silu: &bool,
        _residual: &bool,
        _eps: &u32,
        _bits: &u32,
        _group: &usize,
        _zero: &u32,
        _offset: &bool,
    ) -> TensorSpec {
        let mut shape = x.shape.clone();
        shape[1] = *n;
        TensorSpec::new(shape, x.dtype)
    }

    /// How `rows_by_weight` reads the weights: f32 values (`bits` 0), or codes.
    #[derive(Clone, Copy)]
    struct Codes {
        bits: u32,
        group: usize,
        zero: u32,
        offset: bool,
    }

    /// The rotary part of a launch (`fused_rope`): tables, positions, pool rows, the pool's
    /// sides to write, and the projection's heads.
    struct RopeArgs {
        cos: CubeTensor,
        sin: CubeTensor,
        pos: CubeTensor,
        at: CubeTensor,
        k: CubeTensor,
        v: CubeTensor,
        heads: usize,
        head_dim: usize,
        halves: bool,
    }

    /// Launches `rows_by_weight` for `x` and weights `w` (f32 values, or the scales of `codes`)
    /// with `n` output columns; operands a flag leaves unused are bound to any buffer. With
    /// `rope`, the output is the queries and the pool's sides come back written.
    #[allow(clippy::too_many_arguments)]
    fn launch(
        x: CubeTensor,
        [w, codes, offsets]: [CubeTensor; 3],
        g: CubeTensor,
        res: CubeTensor,
        n: usize,
        [norm, silu, residual]: [bool; 3],
        eps: u32,
        c: Codes,
        rope: Option<RopeArgs>,
    ) -> (CubeTensor, Option<(CubeTensor, CubeTensor)>) {
        let plane = x.client.properties().hardware.plane_size_max;
        let [x, w, codes, offsets, g, res] = [x, w, codes, offsets, g, res].map(crate::gpu::contiguous);
        let [m, width] = [x.meta.shape()[0], x.meta.shape()[1]];
        let k = if silu { width / 2 } else { width };
        let client = x.client.clone();
        // with RoPE a plane sums a column and its partner, and the output is the queries
        let (units, out_cols) = match &rope {
            Some(r) => (n / 2, r.heads * r.head_dim),
            None => (n, n),
        };
        let out = crate::gpu::output(&x, [m, out_cols]);
        let groups = m.div_ceil(GROUP_ROWS);
        let splits = splits(units, groups, k, plane as usize);
        let (columns, rows) = (PLANES / (groups.min(PLANES) * splits), m.div_ceil(groups));
        let (rd, halves, kw) = rope.as_ref().map_or((0, false, 0), |r| (r.cos.meta.shape()[1], r.halves, r.k.meta.shape()[2]));
        let (qw, head_dim) = rope.as_ref().map_or((n, 1), |r| (r.heads * r.head_dim, r.head_dim));
        let (cos, sin, pos, at, kside, vside) = match rope {
            Some(r) => {
                let [cos, sin, pos, at] = [r.cos, r.sin, r.pos, r.at].map(crate::gpu::contiguous);
                let [k, v] = [r.k, r.v].map(crate::gpu::writable);
                (cos, sin, pos, at, k, v)
            }
            None => (w.clone(), w.clone(), codes.clone(), codes.clone(), out.clone(), out.clone()),
        };
        rows_by_weight::launch(
            &client,
            CubeCount::Static(units.div_ceil(columns) as u32, 1, 1),
            CubeDim::new_1d(plane * (columns * groups * splits) as u32),
            x.into_buffer_arg(),
            w.into_buffer_arg(),
            codes.into_buffer_arg(),
            offsets.into_buffer_arg(),
            g.into_buffer_arg(),
            res.into_buffer_arg(),
            cos.into_buffer_arg(),
            sin.into_buffer_arg(),
            pos.into_buffer_arg(),
            at.into_buffer_arg(),
            out.clone().into_buffer_arg(),
            kside.clone().into_buffer_arg(),
            vside.clone().into_buffer_arg(),
            k,
            n,
            width,
            f32::from_bits(eps),
            m,
            qw,
            kw,
            head_dim,
            rd,
            groups,
            rows,
            splits,
            norm,
            silu,
            residual,
            c.bits as usize,
            c.group,
            c.zero as usize,
            c.offset,
            units != n,
            halves,
        );
        let sides = (units != n).then_some((kside, vside));
        (out, sides)
    }

    #[allow(clippy::too_many_arguments)]
    fn rows_meta(
        x: &TensorSpec,
        w: &TensorSpec,
        _g: &TensorSpec,
        _res: &TensorSpec,
        _norm: &bool,
        _silu: &bool,
        _residual: &bool,
        _eps: &u32,
    ) -> TensorSpec {
        let mut shape = x.shape.clone();
        shape[1] = w.shape[0];
        TensorSpec::new(shape, x.dtype)
    }

    impl RowsMatmul for CubeBackend {
        fn rows_fused(
            x: CubeTensor,
            w: CubeTensor,
            g: CubeTensor,
            res: CubeTensor,
            norm: bool,
            silu: bool,
            residual: bool,
            eps: u32,
        ) -> CubeTensor {
            let n = w.meta.shape()[0];
            let none = Codes { bits: 0, group: 1, zero: 0, offset: false };
            launch(x, [w.clone(), w.clone(), w], g, res, n, [norm, silu, residual], eps, none, None).0
        }

        fn rows_fused_blocks(
            x: CubeTensor,
            scales: CubeTensor,
            codes: CubeTensor,
            offsets: CubeTensor,
            g: CubeTensor,
            res: CubeTensor,
            n: usize,
            norm: bool,
            silu: bool,
            residual: bool,
            eps: u32,
            bits: u32,
            group: usize,
            zero: u32,
            offset: bool,
        ) -> CubeTensor {
            launch(x, [scales, codes, offsets], g, res, n, [norm, silu, residual], eps, Codes { bits, group, zero, offset }, None).0
        }

        fn rows_rope(
            x: CubeTensor,
            scales: CubeTensor,
            codes: CubeTensor,
            offsets: CubeTensor,
            g: CubeTensor,
            cos: CubeTensor,
            sin: CubeTensor,
            pos: CubeTensor,
            at: CubeTensor,
            k: CubeTensor,
            v: CubeTensor,
            eps: u32,
            bits: u32,
            group: usize,
            zero: u32,
            offset: bool,
            heads: usize,
            head_dim: usize,
            halves: bool,
        ) -> (CubeTensor, CubeTensor, CubeTensor) {
            let kw = k.meta.shape()[2];
            let n = heads * head_dim + 2 * kw;
            let rope = RopeArgs { cos, sin, pos, at, k, v, heads, head_dim, halves };
            let res = g.clone();
            let (q, sides) = launch(x, [scales, codes, offsets], g, res, n, [true, false, false], eps, Codes { bits, group, zero, offset }, Some(rope));
            let (k, v) = sides.expect("the sides of a rotary launch");
            (q, k, v)
        }
    }

    /// `splits` planes per output unit and group of `rows` rows of `x` (the planes of a unit
    /// neighbours in the workgroup, its groups' planes next to one another). A unit is an output
    /// column `col`, or (`rope`) a Q/K/V column and its rotary partner `partner`. Lane `i` of
    /// split `s` sums `x'[r, j] * w[col, j]` over `j = s·PLANE_DIM + i`, stepping by
    /// `splits·PLANE_DIM`, for every row `r` of its group, where `x'` is `x`, (`norm`) its RMSNorm
    /// with weight `g`, or (`silu`) `silu(gate) * up` of its halves; then each plane adds its
    /// lanes, the first split adds the others' sums through shared memory, and (`residual`)
    /// `res` is added (`finish`), or the pair is rotated and written (`finish_pair`). `x` has `m`
    /// rows, `width` apart; a last group that runs past them repeats the last row and writes
    /// nothing for it. The weights are `w` itself (`bits` 0) or decoded from `codes` (`weight`).
    /// Buffers a flag leaves unused are bound to any operand of their kind.
    #[cube(launch)]
    #[allow(clippy::too_many_arguments)]
    fn rows_by_weight(
        x: &[f32],
        w: &[f32],
        codes: &[i32],
        offsets: &[f32],
        g: &[f32],
        res: &[f32],
        cos: &[f32],
        sin: &[f32],
        pos: &[i32],
        at: &[i32],
        out: &mut [f32],
        kside: &mut [f32],
        vside: &mut [f32],
        k: usize,
        n: usize,
        width: usize,
        eps: f32,
        m: usize,
        qw: usize,
        kw: usize,
        head_dim: usize,
        rope_dim: usize,
        #[comptime] groups: usize,
        #[comptime] rows: usize,
        #[comptime] splits: usize,
        #[comptime] norm: bool,
        #[comptime] silu: bool,
        #[comptime] residual: bool,
        #[comptime] bits: usize,
        #[comptime] group: usize,
        #[comptime] zero: usize,
        #[comptime] offset: bool,
        #[comptime] rope: bool,
        #[comptime] halves: bool,
    ) {
        let plane = PLANE_DIM as usize;
        let per_unit = comptime![groups * splits];
        let cols = comptime![if rope { 2 } else { 1 }];
        let slot = PLANE_POS as usize;
        let unit = CUBE_POS_X as usize * (CUBE_DIM as usize / plane / per_unit) + slot / per_unit;
        let (first, split) = ((slot % per_unit) / splits * rows, slot % splits);
        let units = if comptime![rope] { n / 2 } else { n };
        // the unit's columns: itself, or a value and its rotary partner
        let mut col = unit;
        let mut partner = unit;
        let mut rotates = false;
        if comptime![rope] {
            let pairs = head_dim / 2;
            let (head, j) = (unit / pairs, unit % pairs);
            rotates = head * head_dim < qw + kw && j < rope_dim / 2;
            let mut da = 2 * j;
            if rotates && comptime![halves] {
                da = j;
            }
            col = head * head_dim + da;
            partner = col + 1;
            if rotates && comptime![halves] {
                partner = col + rope_dim / 2;
            }
        }
        let mut acc = Array::<f32>::new(comptime![rows * cols]);
        let mut sq = Array::<f32>::new(rows);
        #[unroll]
        for r in 0..rows {
            sq[r] = f32::new(0.0);
            #[unroll]
            for c in 0..cols {
                acc[r * cols + c] = f32::new(0.0);
            }
        }
        // the same for every lane of a plane, so the plane sums below run in uniform control flow
        if unit < units {
            let mut j = split * plane + UNIT_POS_PLANE as usize;
            while j < k {
                let mut wv = weight(w, codes, offsets, col * k + j, bits, group, zero, offset);
                let mut wp = f32::new(0.0);
                if comptime![rope] {
                    wp = weight(w, codes, offsets, partner * k + j, bits, group, zero, offset);
                }
                if comptime![norm] {
                    wv *= g[j];
                    wp *= g[j];
                }
                #[unroll]
                for r in 0..rows {
                    let xi = (first + r).min(m - 1) * width + j;
                    let mut xv = x[xi];
                    if comptime![silu] {
                        xv = xv / (f32::new(1.0) + (-xv).exp()) * x[xi + k];
                    }
                    acc[r * cols] += xv * wv;
                    if comptime![rope] {
                        acc[r * cols + 1] += xv * wp;
                    }
                    if comptime![norm] {
                        sq[r] += xv * xv;
                    }
                }
                j += plane * splits;
            }
        }
        if comptime![splits == 1] {
            if unit < units {
                #[unroll]
                for r in 0..rows {
                    let s = plane_sum(acc[r * cols]);
                    let q = if comptime![norm] { plane_sum(sq[r]) } else { f32::new(0.0) };
                    if comptime![rope] {
                        let t = plane_sum(acc[r * cols + 1]);
                        finish_pair(s, t, q, first + r, col, partner, rotates, cos, sin, pos, at, out, kside, vside, k, m, eps, qw, kw, head_dim, rope_dim);
                    } else {
                        finish(s, q, first + r, col, res, out, k, n, m, eps, norm, residual);
                    }
                }
            }
        } else {
            // every plane reaches the barrier, whether or not its unit exists
            let stride = comptime![cols + 1];
            let mut part = Shared::<[f32]>::new_slice(comptime![PLANES * GROUP_ROWS * 3]);
            #[unroll]
            for r in 0..rows {
                let q = if comptime![norm] { plane_sum(sq[r]) } else { f32::new(0.0) };
                let base = (slot * rows + r) * stride;
                if UNIT_POS_PLANE == 0 {
                    part[base + cols] = q;
                }
                #[unroll]
                for c in 0..cols {
                    let s = plane_sum(acc[r * cols + c]);
                    if UNIT_POS_PLANE == 0 {
                        part[base + c] = s;
                    }
                }
            }
            sync_cube();
            if split == 0 && unit < units && UNIT_POS_PLANE == 0 {
                #[unroll]
                for r in 0..rows {
                    let mut s = f32::new(0.0);
                    let mut t = f32::new(0.0);
                    let mut q = f32::new(0.0);
                    #[unroll]
                    for o in 0..splits {
                        let base = ((slot + o) * rows + r) * stride;
                        s += part[base];
                        q += part[base + cols];
                        if comptime![rope] {
                            t += part[base + 1];
                        }
                    }
                    if comptime![rope] {
                        finish_pair(s, t, q, first + r, col, partner, rotates, cos, sin, pos, at, out, kside, vside, k, m, eps, qw, kw, head_dim, rope_dim);
                    } else {
                        finish(s, q, first + r, col, res, out, k, n, m, eps, norm, residual);
                    }
                }
            }
        }
    }

    /// Writes output `(row, col)` from its sum `s` (and, for `norm`, the sum of squares `q` of
    /// the row's `k` inputs), plus the residual; lane 0 of a plane only, and no row past `m`.
    #[cube]
    #[allow(clippy::too_many_arguments)]
    fn finish(s: f32, q: f32, row: usize, col: usize, res: &[f32], out: &mut [f32], k: usize, n: usize, m: usize, eps: f32, #[comptime] norm: bool, #[comptime] residual: bool) {
        let mut v = s;
        if comptime![norm] {
            v /= (q / f32::cast_from(k) + eps).sqrt();
        }
        if UNIT_POS_PLANE == 0 && row < m {
            if comptime![residual] {
                v += res[row * n + col];
            }
            out[row * n + col] = v;
        }
    }

    /// Columns `col` and `partner` of a row of the (RMS-normalised) Q/K/V projection from their
    /// sums `s` and `t`: rotated together where they are a rotary pair of a query or key head
    /// (`rope_cache`'s `rotate`, position `pos[row]`), then stored as `rope_cache` stores them
    /// (queries to `out`). Lane 0 of a plane only, and no row past `m`.
    #[cube]
    #[allow(clippy::too_many_arguments)]
    fn finish_pair(
        s: f32,
        t: f32,
        q: f32,
        row: usize,
        col: usize,
        partner: usize,
        rotates: bool,
        cos: &[f32],
        sin: &[f32],
        pos: &[i32],
        at: &[i32],
        out: &mut [f32],
        kside: &mut [f32],
        vside: &mut [f32],
        k: usize,
        m: usize,
        eps: f32,
        qw: usize,
        kw: usize,
        head_dim: usize,
        rope_dim: usize,
    ) {
        if UNIT_POS_PLANE == 0 && row < m {
            let scale = f32::new(1.0) / (q / f32::cast_from(k) + eps).sqrt();
            let (a, b) = (s * scale, t * scale);
            let mut ya = a;
            let mut yb = b;
            if rotates {
                let base = pos[row] as usize * rope_dim;
                ya = rotate(a, b, cos, sin, base + col % head_dim);
                yb = rotate(b, a, cos, sin, base + partner % head_dim);
            }
            store(ya, row, col, at, out, kside, vside, qw, kw);
            store(yb, row, partner, at, out, kside, vside, qw, kw);
        }
    }

    /// Weight `e` of the matrix (row-major): `w[e]`, or (`bits` > 0) the code at bits
    /// `bits·(e % per)` of word `e / per` of `codes` (`per = 32 / bits`), less `zero`, times the
    /// group's scale `w[e / group]`, plus its offset where the layout has one. The words are i32:
    /// the mask drops what an arithmetic shift brings in.
    #[cube]
    #[allow(clippy::too_many_arguments)]
    fn weight(w: &[f32], codes: &[i32], offsets: &[f32], e: usize, #[comptime] bits: usize, #[comptime] group: usize, #[comptime] zero: usize, #[comptime] offset: bool) -> f32 {
        if comptime![bits == 0] {
            w[e]
        } else {
            let per = comptime![32 / bits];
            let mask = comptime![((1u32 << bits) - 1) as i32];
            let code = (codes[e / per] >> i32::cast_from((e % per) * bits)) & mask;
            let v = w[e / group] * (f32::cast_from(code) - f32::new(comptime![zero as f32]));
            if comptime![offset] {
                v + offsets[e / group]
            } else {
                v
            }
        }
    }

    pub fn fused(x: Tensor<2>, w: Weight, input: Input, residual: Option<Tensor<2>>) -> Tensor<2> {
        let (norm, silu) = (matches!(input, Input::Norm(..)), matches!(input, Input::SiluMul));
        let (g, eps) = match input {
            Input::Norm(g, eps) => (g.clone().unsqueeze::<2>().into_dispatch(), eps as f32),
            _ => (x.clone().into_dispatch(), 0.0),
        };
        let has_residual = residual.is_some();
        let res = residual.unwrap_or_else(|| x.clone()).into_dispatch();
        Tensor::from_dispatch(match w {
            Weight::F32(w) => Dispatch::rows_fused(x.into_dispatch(), w.clone().into_dispatch(), g, res, norm, silu, has_residual, eps.to_bits()),
            Weight::Blocks(b) => {
                let l = b.layout;
                let offsets = b.offsets.as_ref().unwrap_or(&b.scales).clone().into_dispatch();
                Dispatch::rows_fused_blocks(
                    x.into_dispatch(),
                    b.scales.clone().into_dispatch(),
                    b.codes.clone().into_dispatch(),
                    offsets,
                    g,
                    res,
                    b.rows,
                    norm,
                    silu,
                    has_residual,
                    eps.to_bits(),
                    l.bits,
                    l.group,
                    l.zero,
                    l.offset,
                )
            }
        })
    }

    pub fn fused_rope(x: Tensor<2>, w: Weight, (g, eps): (&Tensor<1>, f64), out: &super::RopeOut, pool: [Tensor<3>; 2]) -> (Tensor<2>, [Tensor<3>; 2]) {
        let ((scales, codes, offsets), l) = match w {
            // no codes to decode: any int tensor takes their place
            Weight::F32(w) => ((w.clone().into_dispatch(), out.pos.clone().into_dispatch(), w.clone().into_dispatch()), None),
            Weight::Blocks(b) => ((b.scales.clone().into_dispatch(), b.codes.clone().into_dispatch(), b.offsets.as_ref().unwrap_or(&b.scales).clone().into_dispatch()), Some(b.layout)),
        };
        let (bits, group, zero, offset) = l.map_or((0, 1, 0, false), |l| (l.bits, l.group, l.zero, l.offset));
        let [k, v] = pool;
        let (q, k, v) = Dispatch::rows_rope(
            x.into_dispatch(),
            scales,
            codes,
            offsets,
            g.clone().unsqueeze::<2>().into_dispatch(),
            out.rope.cos.clone().into_dispatch(),
            out.rope.sin.clone().into_dispatch(),
            out.pos.clone().into_dispatch(),
            out.at.clone().into_dispatch(),
            k.into_dispatch(),
            v.into_dispatch(),
            (eps as f32).to_bits(),
            bits,
            group,
            zero,
            offset,
            out.heads,
            out.head_dim,
            out.rope.halves,
        );
        (Tensor::from_dispatch(q), [Tensor::from_dispatch(k), Tensor::from_dispatch(v)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::test_support::{kernels_run, value};
    use crate::pretrained::weights::f32_tensor;

    /// Each input form, with and without a residual, against f64 arithmetic on the host, for row
    /// counts around the kernel's limit, ones whose last group runs past the rows (5 and 17), and
    /// a `k` that is no multiple of a plane. Where the kernels run, it must take every case of at
    /// most `MAX_ROWS` rows; the CPU runs none.
    #[test]
    fn rows_kernel_equals_f64_arithmetic() {
        let device = crate::testing::device();
        let dev = device.burn().unwrap();
        let (k, n, eps) = (577, 70, 1e-5);
        let w: Vec<f64> = (0..n * k).map(|i| value(i, 1)).collect();
        let g: Vec<f64> = (0..k).map(|i| 0.5 + value(i, 2)).collect();
        let f32s = |v: &[f64]| v.iter().map(|&a| a as f32).collect::<Vec<f32>>();
        let (wt, gt) = (f32_tensor(f32s(&w), [n, k], &dev), f32_tensor(f32s(&g), [k], &dev));
        if !kernels_run(&wt, &device) {
            return;
        }
        for m in [1, 5, 17, MAX_ROWS, MAX_ROWS + 1] {
            for form in 0..3 {
                for with_residual in [false, true] {
                    let width = if form == 2 { 2 * k } else { k };
                    // rounded to f32 first, as the kernel sees them
                    let x: Vec<f64> = (0..m * width).map(|i| value(i, m + form) as f32 as f64).collect();
                    let res: Vec<f64> = (0..m * n).map(|i| value(i, 7) as f32 as f64).collect();
                    let input = match form {
                        0 => Input::Plain,
                        1 => Input::Norm(&gt, eps),
                        _ => Input::SiluMul,
                    };
                    let residual = with_residual.then(|| f32_tensor(f32s(&res), [m, n], &dev));
                    let got = match fused(f32_tensor(f32s(&x), [m, width], &dev), Weight::F32(&wt), input, residual) {
                        Ok(got) => got,
                        Err(_) => {
                            assert!(m > MAX_ROWS, "the kernel refused {m} rows");
                            continue;
                        }
                    };
                    assert_eq!(got.dims(), [m, n]);
                    let got = got.into_data().try_into_vec::<f32>().unwrap();
                    let tag = format!("m {m} form {form} residual {with_residual}");
                    assert_rows_match(&got, &x, &w, with_residual.then_some(&res[..]), &g, (m, n, k, eps), form, &tag);
                }
            }
        }
    }

    /// The projection with RoPE and the pool's writes in one kernel (`fused_rope`) against the
    /// same steps in two (`fused` with the norm, then `rope_cache::rope_write`, which its own test
    /// holds to f64 rotation): both pair layouts, a rotary part narrower than the head, f32
    /// weights and every quantised format as GPU blocks, 1, 5 and `MAX_ROWS` rows. The queries
    /// and every row of both pool sides must agree.
    #[test]
    fn rows_rope_equals_the_product_then_rope() {
        use super::super::rope_cache::{rope_write, Rope};
        use crate::kernels::cpu::quant::tests::{random_blocks, QUANTISED};
        use crate::pretrained::weights::i32_tensor;
        let device = crate::testing::device();
        let dev = device.burn().unwrap();
        let (heads, kv_heads, dh, rd, page, pages, ctx, k, eps) = (4, 2, 12, 8, 4, 9, 40, 256, 1e-5);
        let (n, kw) = ((heads + 2 * kv_heads) * dh, kv_heads * dh);
        if !kernels_run(&f32_tensor(vec![0.0], [1], &dev), &device) {
            return;
        }
        let f32s = |n: usize, salt: usize| -> Vec<f32> { (0..n).map(|i| value(i, salt) as f32).collect() };
        let w = f32_tensor(f32s(n * k, 1), [n, k], &dev);
        let g = f32_tensor((0..k).map(|i| 0.5 + value(i, 2) as f32).collect(), [k], &dev);
        let blocks: Vec<GpuBlocks> = QUANTISED.iter().map(|&f| GpuBlocks::stack(&[(f, n, random_blocks(f, n, k, 3))], k, &dev).unwrap()).collect();
        let weights: Vec<Weight> = std::iter::once(Weight::F32(&w)).chain(blocks.iter().map(Weight::Blocks)).collect();
        let read = |t: Tensor<3>| t.reshape([pages * page * kw]).into_data().try_into_vec::<f32>().unwrap();
        for halves in [false, true] {
            let (cos, sin) = (f32_tensor(f32s(ctx * rd, 4), [ctx, rd], &dev), f32_tensor(f32s(ctx * rd, 5), [ctx, rd], &dev));
            let rope = Rope { cos: &cos, sin: &sin, halves };
            for (wi, &weight) in weights.iter().enumerate() {
                for m in [1, 5, MAX_ROWS] {
                    let x = f32_tensor(f32s(m * k, 6 + m), [m, k], &dev);
                    let pos = i32_tensor((0..m).map(|r| (r * 7 % ctx) as i32).collect(), &dev);
                    let at = i32_tensor((0..m).map(|r| ((r * 5 + 1) % (pages * page)) as i32).collect(), &dev);
                    let sides = || [8, 9].map(|salt| f32_tensor(f32s(pages * page * kw, salt), [pages, page, kw], &dev));
                    let qkv = fused(x.clone(), weight, Input::Norm(&g, eps), None).unwrap_or_else(|_| panic!("the product of {m} rows"));
                    let (want_q, [want_k, want_v]) = rope_write(qkv, &rope, &pos, &at, sides(), heads, dh);
                    let out = RopeOut { rope: &rope, pos: &pos, at: &at, heads, kv_heads, head_dim: dh };
                    let (q, [k_side, v_side]) = fused_rope(x, weight, (&g, eps), &out, sides()).unwrap_or_else(|_| panic!("fused_rope refused {m} rows"));
                    assert_eq!(q.dims(), [m, heads * dh]);
                    let tag = format!("weights {wi}, halves {halves}, {m} rows");
                    let pairs = [(q.reshape([m * heads * dh]).into_data().try_into_vec::<f32>().unwrap(), want_q.reshape([m * heads * dh]).into_data().try_into_vec::<f32>().unwrap(), "q"), (read(k_side), read(want_k), "k"), (read(v_side), read(want_v), "v")];
                    for (got, want, what) in pairs {
                        assert_eq!(got.len(), want.len());
                        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                            assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{tag}: {what}[{i}] {a} vs {b}");
                        }
                    }
                }
            }
        }
    }

    /// The kernel's `got` (`m` rows of `n`) against f64 arithmetic: each row of `x` in input form
    /// `form` (plain; RMS-normalised with the weights `g`; SiLU of its first half times its
    /// second) against the `n` rows of `k` values of `w`, plus `res` where given, within 1e-5 of
    /// the sum of the terms' magnitudes.
    #[allow(clippy::too_many_arguments)]
    fn assert_rows_match(got: &[f32], x: &[f64], w: &[f64], res: Option<&[f64]>, g: &[f64], (m, n, k, eps): (usize, usize, usize, f64), form: usize, tag: &str) {
        let width = if form == 2 { 2 * k } else { k };
        for r in 0..m {
            let row = &x[r * width..(r + 1) * width];
            let xr: Vec<f64> = match form {
                0 => row.to_vec(),
                1 => {
                    let scale = 1.0 / (row.iter().map(|a| a * a).sum::<f64>() / k as f64 + eps).sqrt();
                    row.iter().zip(g).map(|(a, b)| a * scale * b).collect()
                }
                _ => (0..k).map(|j| row[j] / (1.0 + (-row[j]).exp()) * row[k + j]).collect(),
            };
            for c in 0..n {
                let terms = (0..k).map(|j| xr[j] * w[c * k + j]);
                let want = terms.clone().sum::<f64>() + res.map_or(0.0, |res| res[r * n + c]);
                let bound = 1e-5 * (terms.map(f64::abs).sum::<f64>() + 1.0);
                let v = got[r * n + c] as f64;
                assert!((v - want).abs() <= bound, "{tag} at ({r}, {c}): {v} vs {want}");
            }
        }
    }

    /// Every quantised format as GPU blocks, each input form with a residual, against f64
    /// arithmetic on GGML's dequantised values (`dequantise_row`), for 1, 7 and `MAX_ROWS` rows:
    /// the codes are decoded as `groups` lays them out, whichever row, group and word a lane reads.
    #[test]
    fn rows_kernel_decodes_gpu_blocks() {
        use crate::kernels::cpu::quant::dequantise_row;
        use crate::kernels::cpu::quant::tests::{random_blocks, QUANTISED};
        let device = crate::testing::device();
        let dev = device.burn().unwrap();
        let (k, n, eps) = (512, 37, 1e-5);
        if !kernels_run(&f32_tensor(vec![0.0], [1], &dev), &device) {
            return;
        }
        for f in QUANTISED {
            let data = random_blocks(f, n, k, 11);
            let blocks = GpuBlocks::stack(&[(f, n, data.clone())], k, &dev).unwrap();
            let mut w = vec![0f32; n * k];
            let row = data.len() / n;
            for (r, out) in w.chunks_exact_mut(k).enumerate() {
                dequantise_row(f, &data[r * row..(r + 1) * row], out);
            }
            let w: Vec<f64> = w.into_iter().map(f64::from).collect();
            let g: Vec<f64> = (0..k).map(|i| 0.5 + value(i, 2)).collect();
            let gt = f32_tensor(g.iter().map(|&v| v as f32).collect(), [k], &dev);
            for m in [1, 7, MAX_ROWS] {
                for form in 0..3 {
                    let width = if form == 2 { 2 * k } else { k };
                    let x: Vec<f64> = (0..m * width).map(|i| value(i, m + form) as f32 as f64).collect();
                    let res: Vec<f64> = (0..m * n).map(|i| value(i, 7) as f32 as f64).collect();
                    let input = [Input::Plain, Input::Norm(&gt, eps), Input::SiluMul][form];
                    let xt = f32_tensor(x.iter().map(|&v| v as f32).collect(), [m, width], &dev);
                    let rt = f32_tensor(res.iter().map(|&v| v as f32).collect(), [m, n], &dev);
                    let got = fused(xt, Weight::Blocks(&blocks), input, Some(rt)).unwrap_or_else(|_| panic!("{f:?}: the kernel refused {m} rows"));
                    assert_eq!(got.dims(), [m, n]);
                    let got = got.into_data().try_into_vec::<f32>().unwrap();
                    assert_rows_match(&got, &x, &w, Some(&res), &g, (m, n, k, eps), form, &format!("{f:?} m {m} form {form}"));
                }
            }
        }
    }
}
