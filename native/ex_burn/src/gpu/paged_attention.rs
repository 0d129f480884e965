//! Attention of one new query per sequence over its keys and values in a paged pool, on the cube
//! GPU backends: the attention of a decoding step.
//!
//! Why: in Burn ops a step gathers every sequence's pages into one padded tensor, multiplies by
//! the queries, masks, takes a softmax and multiplies by the values: about eight kernels a layer,
//! most of them copies. Here one plane (warp/subgroup) handles one query head of one sequence:
//! its lanes hold the head's dimensions, walk the sequence's positions through its page table,
//! and keep a running (online) softmax, so nothing is gathered or padded.
//!
//! Where the kernels do not run (`gpu::kernels_run`: devices without plane kernels, the CPU) or
//! `applies` says no, the caller runs the same arithmetic in Burn ops.

use burn::tensor::{Int, Tensor};

/// A pool layer and the step's view of it.
pub struct Paged<'a> {
    /// Keys and values, `[pages, page, kv_heads * head_dim]`.
    pub k: &'a Tensor<3>,
    pub v: &'a Tensor<3>,
    /// Each sequence's pages, `[sequences * pages_each]`.
    pub table: &'a Tensor<1, Int>,
    pub pages_each: usize,
    /// Each sequence's count of positions to attend, `[sequences]`.
    pub lens: &'a Tensor<1, Int>,
}

/// Whether `attend` takes `q`, on a device where `gpu::kernels_run` (the caller asks that once
/// for its device).
pub fn applies(q: &Tensor<2>) -> bool {
    q.dtype() == burn::tensor::DType::F32
}

/// `softmax(q·kᵀ · scale) · v` for `q: [sequences, heads * head_dim]`, one query per sequence,
/// query head `h` reading K/V head `h / (heads / kv_heads)`: `[sequences, heads * head_dim]`.
/// Only where `applies` and `gpu::kernels_run`.
pub fn attend(q: Tensor<2>, pool: &Paged, heads: usize, kv_heads: usize, scale: f32) -> Tensor<2> {
    #[cfg(cube)]
    return cube::attend(q, pool, heads, kv_heads, scale);
    #[cfg(not(cube))]
    {
        let _ = (q, pool, heads, kv_heads, scale);
        unreachable!("paged attention runs only where `applies`")
    }
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

    use super::Paged;

    /// Planes per workgroup.
    const PLANES: usize = 4;

    /// Positions a plane scores before it updates its softmax: their loads and plane sums are
    /// independent, so they overlap instead of waiting on one another.
    const UNROLL: usize = 4;

    #[backend_extension(Cube: cfg(cube), Fusion: cfg(cube))]
    pub trait PagedAttention: Backend {
        /// See `attend`; `page` positions a page, `scale` as f32 bits.
        #[allow(clippy::too_many_arguments)]
        #[fusion(meta = attention_meta)]
        fn paged_decode_attention(
            q: FloatTensor<Self>,
            k: FloatTensor<Self>,
            v: FloatTensor<Self>,
            table: IntTensor<Self>,
            lens: IntTensor<Self>,
            heads: usize,
            kv_heads: usize,
            pages_each: usize,
            scale: u32,
        ) -> FloatTensor<Self>;
    }

    #[allow(clippy::too_many_arguments)]
    fn attention_meta(
        q: &TensorSpec,
        _k: &TensorSpec,
        _v: &TensorSpec,
        _t: &TensorSpec,
        _l: &TensorSpec,
        _h: &usize,
        _kv: &usize,
        _p: &usize,
        _s: &u32,
    ) -> TensorSpec {
        q.clone()
    }

    impl PagedAttention for CubeBackend {
        fn paged_decode_attention(
            q: CubeTensor,
            k: CubeTensor,
            v: CubeTensor,
            table: CubeTensor,
            lens: CubeTensor,
            heads: usize,
            kv_heads: usize,
            pages_each: usize,
            scale: u32,
        ) -> CubeTensor {
            let [q, k, v, table, lens] = [q, k, v, table, lens].map(crate::gpu::contiguous);
            let [b, qw] = [q.meta.shape()[0], q.meta.shape()[1]];
            let (page, width) = (k.meta.shape()[1], k.meta.shape()[2]);
            let dh = qw / heads;
            let client = q.client.clone();
            let plane = client.properties().hardware.plane_size_max as usize;
            let out = crate::gpu::output(&q, [b, qw]);
            paged_decode::launch(
                &client,
                CubeCount::Static((b * heads).div_ceil(PLANES) as u32, 1, 1),
                CubeDim::new_1d((plane * PLANES) as u32),
                q.into_buffer_arg(),
                k.into_buffer_arg(),
                v.into_buffer_arg(),
                table.into_buffer_arg(),
                lens.into_buffer_arg(),
                out.clone().into_buffer_arg(),
                b * heads,
                heads,
                heads / kv_heads,
                width,
                page,
                pages_each,
                f32::from_bits(scale),
                dh,
                dh.div_ceil(plane),
                UNROLL,
            );
            out
        }
    }

    /// One plane per (sequence, query head): lane `i` holds dimensions `i, i + PLANE_DIM, ...`
    /// of the head; for each `unroll` positions the plane sums their query-key products, and
    /// every lane updates the running maximum, the softmax denominator and its dimensions of the
    /// weighted values.
    #[cube(launch)]
    #[allow(clippy::too_many_arguments)]
    fn paged_decode(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        table: &[i32],
        lens: &[i32],
        out: &mut [f32],
        planes: usize,
        heads: usize,
        rep: usize,
        width: usize,
        page: usize,
        pages_each: usize,
        scale: f32,
        #[comptime] dh: usize,
        #[comptime] per_lane: usize,
        #[comptime] unroll: usize,
    ) {
        let plane = PLANE_DIM as usize;
        let id = CUBE_POS_X as usize * (CUBE_DIM as usize / plane) + PLANE_POS as usize;
        // the same for every lane of a plane, so the plane sums below run in uniform control flow
        if id < planes {
            let (seq, head) = (id / heads, id % heads);
            let lane = UNIT_POS_PLANE as usize;
            let kv_at = (head / rep) * dh;
            let q_at = (seq * heads + head) * dh;
            let mut qv = Array::<f32>::new(per_lane);
            let mut acc = Array::<f32>::new(per_lane);
            #[unroll]
            for c in 0..per_lane {
                let d = lane + c * plane;
                qv[c] = f32::new(0.0);
                acc[c] = f32::new(0.0);
                if d < dh {
                    qv[c] = q[q_at + d] * scale;
                }
            }
            let mut max = f32::new(-1.0e30);
            let mut denom = f32::new(0.0);
            let len = lens[seq] as usize;
            let pages_at = seq * pages_each;
            let mut j = 0usize;
            while j < len {
                // positions past the end repeat the last one and weigh nothing
                let mut s = Array::<f32>::new(unroll);
                let mut top = max;
                #[unroll]
                for u in 0..unroll {
                    let pos = (j + u).min(len - 1);
                    let at = (table[pages_at + pos / page] as usize * page + pos % page) * width + kv_at;
                    let mut part = f32::new(0.0);
                    #[unroll]
                    for c in 0..per_lane {
                        let d = lane + c * plane;
                        if d < dh {
                            part += qv[c] * k[at + d];
                        }
                    }
                    s[u] = select(j + u < len, plane_sum(part), f32::new(-1.0e30));
                    top = f32::max(top, s[u]);
                }
                let fade = (max - top).exp();
                denom *= fade;
                #[unroll]
                for c in 0..per_lane {
                    acc[c] *= fade;
                }
                #[unroll]
                for u in 0..unroll {
                    let pos = (j + u).min(len - 1);
                    let at = (table[pages_at + pos / page] as usize * page + pos % page) * width + kv_at;
                    let p = (s[u] - top).exp();
                    denom += p;
                    #[unroll]
                    for c in 0..per_lane {
                        let d = lane + c * plane;
                        if d < dh {
                            acc[c] += p * v[at + d];
                        }
                    }
                }
                max = top;
                j += unroll;
            }
            #[unroll]
            for c in 0..per_lane {
                let d = lane + c * plane;
                if d < dh {
                    out[q_at + d] = acc[c] / denom;
                }
            }
        }
    }

    pub fn attend(q: Tensor<2>, pool: &Paged, heads: usize, kv_heads: usize, scale: f32) -> Tensor<2> {
        Tensor::from_dispatch(Dispatch::paged_decode_attention(
            q.into_dispatch(),
            pool.k.clone().into_dispatch(),
            pool.v.clone().into_dispatch(),
            pool.table.clone().into_dispatch(),
            pool.lens.clone().into_dispatch(),
            heads,
            kv_heads,
            pool.pages_each,
            scale.to_bits(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::test_support::{kernels_run, value};
    use crate::pretrained::weights::{f32_tensor, i32_tensor};

    /// Against f64 attention on the host: three sequences of different lengths over pages in
    /// scattered order (one padded with page 0), grouped query heads, and a head size that is no
    /// multiple of a plane.
    #[test]
    fn paged_attention_equals_f64_attention() {
        let device = crate::testing::device();
        let dev = device.burn().unwrap();
        let (page, pages, heads, kv_heads, dh) = (4, 6, 6, 2, 40);
        let width = kv_heads * dh;
        let kv: [Vec<f64>; 2] = [1, 2].map(|salt| (0..pages * page * width).map(|i| value(i, salt) as f32 as f64).collect());
        let [kt, vt] = [0, 1].map(|s| f32_tensor(kv[s].iter().map(|&a| a as f32).collect(), [pages, page, width], &dev));
        // sequence i's pages, and how many positions it attends
        let (table, pages_each, lens) = (vec![3, 1, 0, 5, 2, 4, 1, 0, 0], 3, [9usize, 10, 1]);
        let q: Vec<f64> = (0..3 * heads * dh).map(|i| value(i, 3) as f32 as f64).collect();
        let qt = f32_tensor(q.iter().map(|&a| a as f32).collect(), [3, heads * dh], &dev);
        if !kernels_run(&qt, &device) {
            return;
        }
        assert!(applies(&qt));
        let (table_t, lens_t) = (i32_tensor(table.clone(), &dev), i32_tensor(lens.iter().map(|&l| l as i32).collect(), &dev));
        let scale = (dh as f64).powf(-0.5);
        let paged = Paged { k: &kt, v: &vt, table: &table_t, pages_each, lens: &lens_t };
        let got = attend(qt, &paged, heads, kv_heads, scale as f32).into_data().try_into_vec::<f32>().unwrap();
        for (s, &len) in lens.iter().enumerate() {
            for h in 0..heads {
                let at = |j: usize| (table[s * pages_each + j / page] as usize * page + j % page) * width + (h / (heads / kv_heads)) * dh;
                let qh = &q[(s * heads + h) * dh..][..dh];
                let scores: Vec<f64> = (0..len).map(|j| (0..dh).map(|d| qh[d] * kv[0][at(j) + d]).sum::<f64>() * scale).collect();
                let top = scores.iter().cloned().fold(f64::MIN, f64::max);
                let weights: Vec<f64> = scores.iter().map(|x| (x - top).exp()).collect();
                let total: f64 = weights.iter().sum();
                for d in 0..dh {
                    let want: f64 = (0..len).map(|j| weights[j] * kv[1][at(j) + d]).sum::<f64>() / total;
                    let v = got[(s * heads + h) * dh + d] as f64;
                    assert!((v - want).abs() <= 1e-5, "sequence {s} head {h} dim {d}: {v} vs {want}");
                }
            }
        }
    }
}
