//! A decoder layer's step from its Q/K/V projection to attention, on the cube GPU backends:
//! rotary embedding of the queries and keys, and the keys and values written to their rows of
//! the KV pool, in one kernel.
//!
//! Why: in Burn ops this is a dozen ops a layer (slices, reshapes, the pair swap, products, the
//! pool's scatter), and on a cube device each op costs host time in the fusion stream whether or
//! not it becomes a kernel of its own; a decoding step of a small model spends more time there
//! than on the GPU. Here each value of the projection is one thread: a query or key value
//! rotates with its pair partner, and keys and values land in the pool, which is updated in
//! place when the step holds its only reference.
//!
//! Where the kernels do not run (`gpu::kernels_run`), the caller runs the same arithmetic in
//! Burn ops.

use burn::tensor::{Int, Tensor};

/// A model's rotary tables in the pair layout (`x ⊙ cos + partner(x) ⊙ sin`, each `[context,
/// rope_dim]`), and which value is a value's partner.
pub struct Rope<'a> {
    pub cos: &'a Tensor<2>,
    pub sin: &'a Tensor<2>,
    /// Partners `i` and `i + rope_dim / 2` (Hugging Face's layout); else `2i` and `2i + 1`.
    pub halves: bool,
}

/// Whether `rope_write` takes `qkv`, on a device where `gpu::kernels_run` (the caller asks that
/// once for its device).
pub fn applies(qkv: &Tensor<2>) -> bool {
    qkv.dtype() == burn::tensor::DType::F32
}

/// For `qkv: [rows, (heads + 2 kv_heads) * head_dim]` at positions `pos` (`[rows]`): the rotated
/// queries `[rows, heads * head_dim]`, and the pool's key and value sides (`[pages, page,
/// kv_heads * head_dim]`) with row `at[r]` of their flattened rows holding row `r`'s rotated
/// key and its value. Only where `gpu::kernels_run`, for f32 tensors.
pub fn rope_write(qkv: Tensor<2>, rope: &Rope, pos: &Tensor<1, Int>, at: &Tensor<1, Int>, pool: [Tensor<3>; 2], heads: usize, head_dim: usize) -> (Tensor<2>, [Tensor<3>; 2]) {
    // the kernel indexes the pool by these shapes and would write past a side that lacks them
    let kw = (qkv.dims()[1] - heads * head_dim) / 2;
    let [k, v] = [pool[0].dims(), pool[1].dims()];
    assert!(k == v && k[2] == kw && k[0] * k[1] > 0, "rope_write: pool sides {k:?} and {v:?} for rows of {kw} keys");
    #[cfg(cube)]
    return cube::rope_write(qkv, rope, pos, at, pool, heads, head_dim);
    #[cfg(not(cube))]
    {
        let _ = (qkv, rope, pos, at, pool, heads, head_dim);
        unreachable!("the rotary kernel runs only where `gpu::kernels_run`")
    }
}

#[cfg(cube)]
pub(crate) mod cube {
    use burn::backend::fusion::custom::TensorSpec;
    use burn::backend::tensor::{FloatTensor, IntTensor};
    use burn::backend::{backend_extension, Backend, Dispatch};
    use burn::tensor::{Int, Tensor};
    use burn_cubecl::tensor::CubeTensor;
    use burn_cubecl::CubeBackend;
    use cubecl::prelude::*;

    use super::Rope;

    /// Threads per workgroup.
    const THREADS: u32 = 256;

    #[backend_extension(Cube: cfg(cube), Fusion: cfg(cube))]
    pub trait RopeCache: Backend {
        /// See `rope_write`: returns the queries and the two pool sides.
        #[allow(clippy::too_many_arguments)]
        #[fusion(meta = rope_meta)]
        fn rope_cache_write(
            qkv: FloatTensor<Self>,
            cos: FloatTensor<Self>,
            sin: FloatTensor<Self>,
            pos: IntTensor<Self>,
            at: IntTensor<Self>,
            k: FloatTensor<Self>,
            v: FloatTensor<Self>,
            heads: usize,
            head_dim: usize,
            halves: bool,
        ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
    }

    #[allow(clippy::too_many_arguments)]
    fn rope_meta(
        qkv: &TensorSpec,
        _cos: &TensorSpec,
        _sin: &TensorSpec,
        _pos: &TensorSpec,
        _at: &TensorSpec,
        k: &TensorSpec,
        v: &TensorSpec,
        heads: &usize,
        head_dim: &usize,
        _halves: &bool,
    ) -> (TensorSpec, TensorSpec, TensorSpec) {
        let mut shape = qkv.shape.clone();
        shape[1] = heads * head_dim;
        (TensorSpec::new(shape, qkv.dtype), k.clone(), v.clone())
    }

    impl RopeCache for CubeBackend {
        fn rope_cache_write(
            qkv: CubeTensor,
            cos: CubeTensor,
            sin: CubeTensor,
            pos: CubeTensor,
            at: CubeTensor,
            k: CubeTensor,
            v: CubeTensor,
            heads: usize,
            head_dim: usize,
            halves: bool,
        ) -> (CubeTensor, CubeTensor, CubeTensor) {
            let [qkv, cos, sin, pos, at] = [qkv, cos, sin, pos, at].map(crate::gpu::contiguous);
            let [k, v] = [k, v].map(crate::gpu::writable);
            let (rows, width, rope_dim) = (qkv.meta.shape()[0], qkv.meta.shape()[1], cos.meta.shape()[1]);
            let (qw, kw) = (heads * head_dim, k.meta.shape()[2]);
            let client = qkv.client.clone();
            let q = crate::gpu::output(&qkv, [rows, qw]);
            let total = rows * width;
            rope_cache::launch(
                &client,
                CubeCount::Static((total as u32).div_ceil(THREADS).max(1), 1, 1),
                CubeDim::new_1d(THREADS),
                qkv.into_buffer_arg(),
                cos.into_buffer_arg(),
                sin.into_buffer_arg(),
                pos.into_buffer_arg(),
                at.into_buffer_arg(),
                q.clone().into_buffer_arg(),
                k.clone().into_buffer_arg(),
                v.clone().into_buffer_arg(),
                total,
                width,
                qw,
                kw,
                head_dim,
                rope_dim,
                halves,
            );
            (q, k, v)
        }
    }

    /// One thread per value `c` of a `qkv` row `r`: a query or key value below `rope_dim` in its
    /// head becomes `x[c] · cos[p, d] + x[partner] · sin[p, d]` at position `p = pos[r]`; queries
    /// go to `q`, keys and values to row `at[r]` of `k` and `v`.
    #[cube(launch)]
    #[allow(clippy::too_many_arguments)]
    fn rope_cache(
        qkv: &[f32],
        cos: &[f32],
        sin: &[f32],
        pos: &[i32],
        at: &[i32],
        q: &mut [f32],
        k: &mut [f32],
        v: &mut [f32],
        total: usize,
        width: usize,
        qw: usize,
        kw: usize,
        head_dim: usize,
        rope_dim: usize,
        #[comptime] halves: bool,
    ) {
        let i = ABSOLUTE_POS as usize;
        if i < total {
            let (row, c) = (i / width, i % width);
            let x = qkv[i];
            if c < qw + kw {
                let d = c % head_dim;
                let mut y = x;
                if d < rope_dim {
                    let half = rope_dim / 2;
                    let mut partner = c + 1;
                    if halves {
                        if d >= half {
                            partner = c - half;
                        } else {
                            partner = c + half;
                        }
                    } else if d % 2 == 1 {
                        partner = c - 1;
                    }
                    y = rotate(x, qkv[row * width + partner], cos, sin, pos[row] as usize * rope_dim + d);
                }
                store(y, row, c, at, q, k, v, qw, kw);
            } else {
                store(x, row, c, at, q, k, v, qw, kw);
            }
        }
    }

    /// Value `x` with its pair partner `y` rotated by table entry `t`: `x · cos[t] + y · sin[t]`.
    #[cube]
    pub(crate) fn rotate(x: f32, y: f32, cos: &[f32], sin: &[f32], t: usize) -> f32 {
        x * cos[t] + y * sin[t]
    }

    /// Column `c` of a Q/K/V projection row `row` where it goes: a query to `q` (`qw` wide), a
    /// key or value to row `at[row]` of its pool side (`kw` wide).
    #[cube]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn store(y: f32, row: usize, c: usize, at: &[i32], q: &mut [f32], k: &mut [f32], v: &mut [f32], qw: usize, kw: usize) {
        if c < qw {
            q[row * qw + c] = y;
        } else if c < qw + kw {
            k[at[row] as usize * kw + c - qw] = y;
        } else {
            v[at[row] as usize * kw + c - qw - kw] = y;
        }
    }

    pub fn rope_write(qkv: Tensor<2>, rope: &Rope, pos: &Tensor<1, Int>, at: &Tensor<1, Int>, pool: [Tensor<3>; 2], heads: usize, head_dim: usize) -> (Tensor<2>, [Tensor<3>; 2]) {
        let [k, v] = pool;
        let (q, k, v) = Dispatch::rope_cache_write(
            qkv.into_dispatch(),
            rope.cos.clone().into_dispatch(),
            rope.sin.clone().into_dispatch(),
            pos.clone().into_dispatch(),
            at.clone().into_dispatch(),
            k.into_dispatch(),
            v.into_dispatch(),
            heads,
            head_dim,
            rope.halves,
        );
        (Tensor::from_dispatch(q), [Tensor::from_dispatch(k), Tensor::from_dispatch(v)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::test_support::{kernels_run, value};
    use crate::pretrained::weights::{f32_tensor, i32_tensor};

    /// Against f64 rotation on the host, for both pair layouts and a rotary part narrower than
    /// the head: the queries, the keys and values at scattered pool rows, the rows not written
    /// left as they were, with the pool written in place, with a side still held elsewhere (left
    /// untouched: written in a copy), and with sides laid out through strides.
    #[test]
    fn rope_cache_equals_f64_rotation() {
        let device = crate::testing::device();
        let dev = device.burn().unwrap();
        let (rows, heads, kv_heads, dh, rd, page, pages, ctx) = (3, 4, 2, 12, 8, 4, 3, 10);
        let (width, kw) = ((heads + 2 * kv_heads) * dh, kv_heads * dh);
        let qkv: Vec<f64> = (0..rows * width).map(|i| value(i, 1) as f32 as f64).collect();
        let angle = |p: usize, j: usize| p as f64 * 0.37 / (1.0 + j as f64);
        let (pos, at) = ([7usize, 0, 3], [9usize, 2, 5]);
        let pool: [Vec<f32>; 2] = [2, 3].map(|salt| (0..pages * page * kw).map(|i| value(i, salt) as f32).collect());
        let qkv_t = f32_tensor(qkv.iter().map(|&a| a as f32).collect(), [rows, width], &dev);
        if !kernels_run(&qkv_t, &device) {
            return;
        }
        assert!(applies(&qkv_t));
        // the pool written in place; with a side still held elsewhere (written in a copy); and
        // with sides laid out through strides (a permuted view, as CUDA pads uploaded rows)
        for (halves, layout) in [(false, 0), (true, 0), (false, 1), (true, 1), (false, 2), (true, 2)] {
            let hold = layout == 1;
            // pair j of a head: values (j, j + rd/2) or (2j, 2j + 1); tables in the pair layout
            let pair = |d: usize| if halves { (d % (rd / 2), d < rd / 2) } else { (d / 2, d % 2 == 0) };
            let partner = |d: usize| if halves { (d + rd / 2) % rd } else { d ^ 1 };
            let table = |f: fn(f64) -> f64, sign: f64| -> Vec<f32> {
                (0..ctx).flat_map(|p| (0..rd).map(move |d| (p, d))).map(|(p, d)| { let (j, first) = pair(d); (f(angle(p, j)) * if first { sign } else { 1.0 }) as f32 }).collect()
            };
            let (cos, sin) = (table(f64::cos, 1.0), table(f64::sin, -1.0));
            let (cos_t, sin_t) = (f32_tensor(cos, [ctx, rd], &dev), f32_tensor(sin, [ctx, rd], &dev));
            let rope = Rope { cos: &cos_t, sin: &sin_t, halves };
            let sides = pool.clone().map(|p| {
                if layout == 2 {
                    let t: Vec<f32> = (0..kw * page * pages).map(|i| p[(i % pages * page + i / pages % page) * kw + i / (pages * page)]).collect();
                    f32_tensor(t, [kw, page, pages], &dev).permute([2, 1, 0])
                } else {
                    f32_tensor(p, [pages, page, kw], &dev)
                }
            });
            let held = hold.then(|| sides[0].clone());
            let (pos_t, at_t) = (i32_tensor(pos.iter().map(|&p| p as i32).collect(), &dev), i32_tensor(at.iter().map(|&p| p as i32).collect(), &dev));
            let (q, [k, v]) = rope_write(qkv_t.clone(), &rope, &pos_t, &at_t, sides, heads, dh);
            let [q, k, v] = [q.reshape([rows * heads * dh]), k.reshape([pages * page * kw]), v.reshape([pages * page * kw])].map(|t| t.into_data().try_into_vec::<f32>().unwrap());
            if let Some(held) = held {
                assert_eq!(held.reshape([pages * page * kw]).into_data().try_into_vec::<f32>().unwrap(), pool[0], "a side held elsewhere is not written");
            }
            let rotated = |r: usize, c: usize| -> f64 {
                let (d, x) = (c % dh, qkv[r * width + c]);
                if d >= rd {
                    return x;
                }
                let (j, first) = pair(d);
                let (cs, sn) = (angle(pos[r], j).cos(), angle(pos[r], j).sin());
                let y = qkv[r * width + c - d + partner(d)];
                if first { x * cs - y * sn } else { x * cs + y * sn }
            };
            let close = |got: f32, want: f64, what: &str| assert!((got as f64 - want).abs() <= 1e-6, "{what} (halves {halves}, layout {layout}): {got} vs {want}");
            for r in 0..rows {
                (0..heads * dh).for_each(|c| close(q[r * heads * dh + c], rotated(r, c), &format!("q[{r}, {c}]")));
                for c in 0..kw {
                    close(k[at[r] * kw + c], rotated(r, heads * dh + c), &format!("k row {r} [{c}]"));
                    close(v[at[r] * kw + c], qkv[r * width + heads * dh + kw + c], &format!("v row {r} [{c}]"));
                }
            }
            for row in (0..pages * page).filter(|row| !at.contains(row)) {
                assert_eq!(&k[row * kw..][..kw], &pool[0][row * kw..][..kw], "k row {row} untouched");
                assert_eq!(&v[row * kw..][..kw], &pool[1][row * kw..][..kw], "v row {row} untouched");
            }
        }
    }
}
