//! Llama-family decoder on the Burn engine, from a GGUF file or a Hugging Face directory
//! (`decoder_source`): Llama, Qwen2, Qwen3, Phi-3, Gemma 2 and Gemma 3, whose differences (Q/K/V
//! biases, per-head Q/K norms, which pairs RoPE rotates, Gemma's activation and output norms) are
//! a `Family` read from `general.architecture` (or config.json's `model_type`), and whose soft
//! caps, attention scale and sliding windows are `LlamaConfig`'s. On the CPU the linear layers
//! and the embedding keep the file's F16/Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K blocks
//! (`qmatmul`), Q3_K as Q6_K blocks and Q2_K as f16 rows (`weights::Gguf::quantised`);
//! elsewhere, and for other formats, tensors are dequantised to f32 at load.
//!
//! llama.cpp's converter permutes the rows of Q and K so that GGUF Llama models use the
//! interleaved-pair rotary embedding (pairs `(2i, 2i+1)` rotate together), as candle's
//! `quantized_llama` (`rope_i`) and llama.cpp itself do; it leaves Qwen's rows in Hugging Face's
//! order, where the two halves of a head rotate together (`RopeStyle`).

use std::any::Any;
use std::path::Path;
use std::sync::{Arc, Mutex};

use burn::tensor::activation::{silu, softmax};
use burn::tensor::{Device, Tensor};

use super::kv_pool::{KvPool, Pages, PAGE};
use super::llama_host::{self, HostBlock, HostKv, HostSeq, Shape};
use super::qmatmul::QStack;
use super::decoder_source::DecoderSource;
use super::weights::{f32_tensor, i32_tensor};
use crate::kernels::cpu::vector::flex_f32;
use super::prefix_cache::SavedKv;
use super::{own_chunks, CausalLm, Chunk, LmSession, Next};
use crate::device::{DeviceKind, DeviceRef};
use crate::gpu::paged_attention::{self, Paged};
use crate::gpu::rope_cache::{self, Rope};
use crate::gpu::blocks::{read_runs, GpuBlocks};
use crate::gpu::rows::{self, Input, RopeOut, Weight};
use crate::error::{catch, ExError, ExResult};

use super::decoder_family::{part_names, HeadExtras, RopeStyle};
pub use super::llama_config::LlamaConfig;

impl HeadExtras {
    /// Layer `l`'s extras from the file.
    pub(crate) fn read(g: &mut DecoderSource, cfg: &LlamaConfig, l: usize) -> ExResult<HeadExtras> {
        let (dh, f) = (cfg.head_dim(), cfg.family);
        let n = |name: &str| format!("blk.{l}.{name}");
        let qkv_bias = if f.qkv_bias {
            let mut b = g.values(&n("attn_q.bias"), &[cfg.head_count * dh])?;
            b.extend(g.values(&n("attn_k.bias"), &[cfg.head_count_kv * dh])?);
            b.extend(g.values(&n("attn_v.bias"), &[cfg.head_count_kv * dh])?);
            Some(b)
        } else {
            None
        };
        let (q_norm, k_norm) = if f.qk_norm {
            (Some(g.values(&n("attn_q_norm.weight"), &[dh])?), Some(g.values(&n("attn_k_norm.weight"), &[dh])?))
        } else {
            (None, None)
        };
        let h = cfg.embedding_length;
        let post_norms = if f.post_norms {
            Some((g.values(&n("post_attention_norm.weight"), &[h])?, g.values(&n("post_ffw_norm.weight"), &[h])?))
        } else {
            None
        };
        Ok(HeadExtras { qkv_bias, q_norm, k_norm, post_norms })
    }
}

/// Where a model's matrices keep the file's blocks.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Keep {
    /// In host memory, for the CPU's block kernels (`qmatmul`).
    Host,
    /// On the GPU, as codes the rows kernel decodes (`gpu::blocks`).
    Gpu,
    /// Nowhere: dequantised to f32 tensors.
    Dense,
}

/// A linear layer `x @ Wᵀ` without bias. Clones share the weights.
#[derive(Clone)]
enum Linear {
    /// Dequantised, `[out, in]`.
    Dense(Tensor<2>),
    /// The file's blocks, `[out, in]`, on the CPU.
    Quant(Arc<QStack>),
    /// The file's blocks on a GPU, `[out, in]` together: runs of parts of one layout each.
    Blocks(Arc<Vec<GpuBlocks>>),
}

impl Linear {
    /// The matrices `parts` (each `[rows, cols]`) stacked along their rows: kept in their blocks
    /// where `keep` says and every part's format allows, else dequantised.
    fn load(g: &mut DecoderSource, parts: &[(&str, usize)], cols: usize, dev: &Device, keep: Keep) -> ExResult<Linear> {
        match keep {
            Keep::Host => {
                let mut q = Vec::with_capacity(parts.len());
                for (name, rows) in parts {
                    match g.quantised(name, *rows, cols)? {
                        Some(m) => q.push(m),
                        None => break,
                    }
                }
                if q.len() == parts.len() {
                    if let Some(stack) = QStack::new(q) {
                        return Ok(Linear::Quant(Arc::new(stack)));
                    }
                }
            }
            Keep::Gpu => {
                if let Some(runs) = Self::gpu_blocks(g, parts, cols, dev)? {
                    return Ok(Linear::Blocks(Arc::new(runs)));
                }
            }
            Keep::Dense => {}
        }
        let mut dense = Vec::with_capacity(parts.len());
        for (name, rows) in parts {
            dense.push(g.tensor(name, [*rows, cols], dev)?);
        }
        Ok(Linear::Dense(Tensor::cat(dense, 0)))
    }

    /// `parts` as GPU blocks, neighbours of one layout stacked together; `None` where a part's
    /// format has no layout.
    fn gpu_blocks(g: &mut DecoderSource, parts: &[(&str, usize)], cols: usize, dev: &Device) -> ExResult<Option<Vec<GpuBlocks>>> {
        let Some(runs) = read_runs(g, parts, cols)? else { return Ok(None) };
        Ok(Some(runs.into_iter().map(|(groups, rows)| GpuBlocks::new(groups, rows, cols, dev)).collect()))
    }

    fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        match self {
            Linear::Dense(w) => x.matmul(w.clone().transpose()),
            Linear::Quant(w) => {
                let ([m, _], dev) = (x.dims(), x.device());
                f32_tensor(quant_matmul(w, x), [m, w.rows()], &dev)
            }
            // the kernel takes a few rows at a time (a prompt's rows, here)
            Linear::Blocks(runs) => {
                let m = x.dims()[0];
                let chunks = (0..m).step_by(rows::MAX_ROWS).map(|r| x.clone().slice([r..(r + rows::MAX_ROWS).min(m)]));
                let outs: Vec<Tensor<2>> = chunks.map(|c| blocks_product(runs, c, Input::Plain, None).unwrap_or_else(|_| unreachable!("f32 rows within MAX_ROWS"))).collect();
                Tensor::cat(outs, 0)
            }
        }
    }
}

/// `input(x) @ Wᵀ (+ residual)` on the rows kernel for W as GPU block runs, or the operands back
/// where the kernel does not take them.
#[allow(clippy::result_large_err)]
fn blocks_product(runs: &[GpuBlocks], x: Tensor<2>, input: Input, residual: Option<Tensor<2>>) -> Result<Tensor<2>, (Tensor<2>, Option<Tensor<2>>)> {
    if let [only] = runs {
        return rows::fused(x, Weight::Blocks(only), input, residual);
    }
    let mut outs = Vec::with_capacity(runs.len());
    for run in runs {
        outs.push(rows::fused(x.clone(), Weight::Blocks(run), input, None).map_err(|_| (x.clone(), residual.clone()))?);
    }
    let y = Tensor::cat(outs, 1);
    Ok(match residual {
        Some(r) => r + y,
        None => y,
    })
}

/// `decoder_family::gelu_tanh` on every value, in tensor ops.
fn gelu_tanh(x: Tensor<2>) -> Tensor<2> {
    use super::decoder_family::{GELU_CUBIC, GELU_SCALE};
    let inner = (x.clone() * x.clone() * x.clone()).mul_scalar(GELU_CUBIC) + x.clone();
    x.mul_scalar(0.5) * inner.mul_scalar(GELU_SCALE).tanh().add_scalar(1.0)
}

/// `x @ Wᵀ` on the host for `x` on the CPU: `[rows of x, W's rows]` values.
fn quant_matmul(w: &QStack, x: Tensor<2>) -> Vec<f32> {
    let [m, _] = x.dims();
    let p = x.into_dispatch();
    match flex_f32(&p) {
        Some(xs) => w.matmul(xs, m),
        None => {
            let xs = Tensor::<2>::from_dispatch(p).into_data().convert::<f32>().try_to_vec::<f32>().expect("f32 activations");
            w.matmul(&xs, m)
        }
    }
}

struct Block {
    attn_norm: Tensor<1>,
    /// Q, K and V stacked: `(heads + 2 kv_heads) * head_dim` outputs.
    qkv: Linear,
    /// The family's biases and Q/K norms as host values (the host paths read these) and as
    /// tensors (`[width]` and `[head_dim]`, for the dequantised path).
    extras: HeadExtras,
    qkv_bias: Option<Tensor<1>>,
    q_norm: Option<Tensor<1>>,
    k_norm: Option<Tensor<1>>,
    out: Linear,
    ffn_norm: Tensor<1>,
    /// Gate and up stacked: `2 * ffn` outputs.
    gate_up: Linear,
    down: Linear,
    /// Gemma's norms of the attention and MLP outputs, as tensors.
    post_norms: Option<(Tensor<1>, Tensor<1>)>,
}

pub struct Weights {
    cfg: LlamaConfig,
    device: Device,
    embed: Linear,
    blocks: Vec<Block>,
    out_norm: Tensor<1>,
    /// The output projection (the embedding when the file has none: tied).
    output: Linear,
    /// For the tensor path: `[context, rope_dim]` tables with cos repeated over each pair and
    /// sin as (-sin, sin), so RoPE is `x ⊙ C + swap(x) ⊙ S` (`rope`).
    pair_tables: (Tensor<2>, Tensor<2>),
    /// The same for the sliding layers, where their rope differs (`LlamaConfig::rope_swa`).
    pair_tables_swa: Option<(Tensor<2>, Tensor<2>)>,
    /// Where every linear layer is quantised (the CPU): what the host path (`llama_host`) reads
    /// besides them.
    host: Option<HostWeights>,
    /// The tensor path's KV caches, every session's (`kv_pool`); held through a whole step.
    pool: Mutex<KvPool>,
    /// Whether the crate's GPU kernels run on `device` (`gpu::kernels_run`).
    gpu_kernels: bool,
}

/// Norm weights and rotary tables as host values.
struct HostWeights {
    /// Each layer's attention and feed-forward norm weights.
    norms: Vec<(Vec<f32>, Vec<f32>)>,
    out_norm: Vec<f32>,
    cos: Vec<f32>,
    sin: Vec<f32>,
    /// The sliding layers' tables, where they differ.
    swa: Option<(Vec<f32>, Vec<f32>)>,
}

/// The quantised matrices of a layer, where it has them.
fn quant_stack(l: &Linear) -> Option<&QStack> {
    match l {
        Linear::Quant(q) => Some(q),
        Linear::Dense(_) | Linear::Blocks(_) => None,
    }
}

pub struct BurnLlama {
    w: Arc<Weights>,
}

/// Loads a Llama-family GGUF file or Hugging Face directory: on CUDA with `EXBURN_CUDA_DECODER`
/// on, on the decoder's own step kernels where the model is theirs (`cuda_llama`), else on the
/// tensor path.
pub fn load(path: &Path, device: &DeviceRef) -> ExResult<Box<dyn CausalLm>> {
    #[cfg(feature = "cuda")]
    if device.kind == DeviceKind::Cuda && crate::process::env::cuda_decoder() {
        match super::cuda_llama::load(path, device) {
            Ok(Some(m)) => return Ok(Box::new(m)),
            Ok(None) => {}
            Err(e) => eprintln!("ex_burn: the CUDA decoder did not load ({e}); decoding on the tensor path"),
        }
    }
    Ok(Box::new(BurnLlama::load(path, device)?))
}

impl BurnLlama {
    /// Keeps the file's blocks: on the CPU in host memory (the host path), on a GPU where its
    /// kernels run as codes (the tensor path, its products on the rows kernel).
    pub fn load(path: &Path, device: &DeviceRef) -> ExResult<BurnLlama> {
        Self::load_with(path, device, true)
    }

    /// `quantised: false` dequantises every weight: the tensor path with f32 weights. Tests use
    /// it to check that path on the CPU.
    pub(crate) fn load_with(path: &Path, device: &DeviceRef, quantised: bool) -> ExResult<BurnLlama> {
        let mut g = DecoderSource::open(path)?;
        let cfg = g.config()?;
        let dev = device.burn()?;
        let keep = match (quantised, device.kind) {
            (false, _) => Keep::Dense,
            (true, DeviceKind::Cpu) => Keep::Host,
            (true, _) => Keep::Gpu,
        };
        let w = catch(|| Weights::load(&mut g, cfg, dev, keep))?;
        Ok(BurnLlama { w: Arc::new(w) })
    }

    /// Where the layers' matrices keep their blocks (`Keep::Dense` where any does not).
    #[cfg(test)]
    pub(crate) fn kept(&self) -> Keep {
        let w = &self.w;
        let layers = || w.blocks.iter().flat_map(|b| [&b.qkv, &b.out, &b.gate_up, &b.down]).chain([&w.output]);
        if layers().all(|l| matches!(l, Linear::Quant(_))) {
            Keep::Host
        } else if layers().all(|l| matches!(l, Linear::Blocks(_))) {
            Keep::Gpu
        } else {
            Keep::Dense
        }
    }

    pub fn config(&self) -> &LlamaConfig {
        &self.w.cfg
    }

    /// The kernel formats of the layers' products where every layer keeps its blocks (the host
    /// path), else `None`.
    #[cfg(test)]
    pub(crate) fn host_formats(&self) -> Option<Vec<String>> {
        self.w.host.as_ref()?;
        let formats: std::collections::BTreeSet<String> = self
            .w
            .blocks
            .iter()
            .flat_map(|b| [&b.qkv, &b.out, &b.gate_up, &b.down])
            .flat_map(|l| quant_stack(l).expect("every layer quantised on the host path").formats())
            .map(|f| format!("{f:?}"))
            .collect();
        Some(formats.into_iter().collect())
    }
}

impl Weights {
    fn load(g: &mut DecoderSource, cfg: LlamaConfig, dev: Device, keep: Keep) -> ExResult<Weights> {
        let (h, f, dh) = (cfg.embedding_length, cfg.feed_forward_length, cfg.head_dim());
        let (q_rows, kv_rows) = (cfg.head_count * dh, cfg.head_count_kv * dh);
        // the kernels compute Llama's layer; Gemma's runs in Burn ops
        let gpu_kernels = crate::gpu::kernels_run(&f32_tensor(vec![0.0], [1], &dev)) && !cfg.family.gemma;
        let keep = if keep == Keep::Gpu && !gpu_kernels { Keep::Dense } else { keep };
        let linear = |g: &mut DecoderSource, parts: &[(&str, usize)], cols: usize| Linear::load(g, parts, cols, &dev, keep);
        // on a GPU the embedding's rows are looked up in host memory; the (tied) output
        // projection reads the same matrix as GPU blocks
        let embed_keep = if keep == Keep::Gpu { Keep::Host } else { keep };
        let embed = Linear::load(g, &[("token_embd.weight", cfg.vocab_size)], h, &dev, embed_keep)?;
        let mut blocks = Vec::with_capacity(cfg.block_count);
        for l in 0..cfg.block_count {
            let n = |name: &str| format!("blk.{l}.{name}.weight");
            let [qkv_parts, gate_up_parts] = cfg.family.projections(l, q_rows, kv_rows, f);
            let qkv = linear(g, &part_names(&qkv_parts), h)?;
            let out = linear(g, &[(&n("attn_output"), h)], q_rows)?;
            let gate_up = linear(g, &part_names(&gate_up_parts), h)?;
            let down = linear(g, &[(&n("ffn_down"), h)], f)?;
            let (attn_norm, ffn_norm) = (g.tensor(&n("attn_norm"), [h], &dev)?, g.tensor(&n("ffn_norm"), [h], &dev)?);
            let extras = HeadExtras::read(g, &cfg, l)?;
            let tensor = |v: &Option<Vec<f32>>| v.as_ref().map(|v| f32_tensor(v.clone(), [v.len()], &dev));
            let (qkv_bias, q_norm, k_norm) = (tensor(&extras.qkv_bias), tensor(&extras.q_norm), tensor(&extras.k_norm));
            let post_norms = extras.post_norms.as_ref().map(|(a, m)| (f32_tensor(a.clone(), [h], &dev), f32_tensor(m.clone(), [h], &dev)));
            blocks.push(Block { attn_norm, qkv, extras, qkv_bias, q_norm, k_norm, out, ffn_norm, gate_up, down, post_norms });
        }
        let out_norm = g.tensor("output_norm.weight", [h], &dev)?;
        let output = if g.contains("output.weight") {
            linear(g, &[("output.weight", cfg.vocab_size)], h)?
        } else if embed_keep != keep {
            linear(g, &[("token_embd.weight", cfg.vocab_size)], h)?
        } else {
            embed.clone()
        };

        let (half, ctx) = (cfg.rope_dim / 2, cfg.context_length.max(1));
        let (cos, sin) = cfg.rope_tables(&g.rope_factors(&cfg)?);
        // each value's partner's factor, in the layout the family rotates
        let pairs = |v: &[f32], first_sign: f32| -> Vec<f32> {
            match cfg.family.rope {
                RopeStyle::Interleaved => v.iter().flat_map(|&a| [first_sign * a, a]).collect(),
                RopeStyle::Halves if half == 0 => Vec::new(),
                RopeStyle::Halves => v.chunks_exact(half).flat_map(|row| row.iter().map(move |&a| first_sign * a).chain(row.iter().copied())).collect(),
            }
        };
        let tables = |cos: &[f32], sin: &[f32]| (f32_tensor(pairs(cos, 1.0), [ctx, 2 * half], &dev), f32_tensor(pairs(sin, -1.0), [ctx, 2 * half], &dev));
        let swa = cfg.swa_rope_tables();
        let (pair_tables, pair_tables_swa) = (tables(&cos, &sin), swa.as_ref().map(|(c, s)| tables(c, s)));
        let all_quantised = [&embed, &output].into_iter().chain(blocks.iter().flat_map(|b| [&b.qkv, &b.out, &b.gate_up, &b.down])).all(|l| quant_stack(l).is_some());
        let host = if all_quantised {
            let mut norms = Vec::with_capacity(cfg.block_count);
            for l in 0..cfg.block_count {
                norms.push((g.values(&format!("blk.{l}.attn_norm.weight"), &[h])?, g.values(&format!("blk.{l}.ffn_norm.weight"), &[h])?));
            }
            Some(HostWeights { norms, out_norm: g.values("output_norm.weight", &[h])?, cos, sin, swa })
        } else {
            None
        };
        let pool = Mutex::new(KvPool::new(cfg.block_count, cfg.head_count_kv * dh, &dev));
        Ok(Weights { cfg, device: dev, embed, blocks, out_norm, output, pair_tables, pair_tables_swa, host, pool, gpu_kernels })
    }

    fn rms_norm(x: Tensor<2>, w: &Tensor<1>, eps: f64) -> Tensor<2> {
        let scale = x.clone().square().mean_dim(1).add_scalar(eps).sqrt().recip();
        x * scale * w.clone().unsqueeze::<2>()
    }

    /// `input(x)` through `lin`, plus `residual`: on the GPU's rows kernel where it applies
    /// (`gpu::rows`), else in Burn ops.
    fn project(&self, lin: &Linear, x: Tensor<2>, input: Input, residual: Option<Tensor<2>>) -> Tensor<2> {
        let fused = match lin {
            Linear::Dense(w) if self.gpu_kernels => rows::fused(x, Weight::F32(w), input, residual),
            Linear::Blocks(runs) => blocks_product(runs, x, input, residual),
            _ => Err((x, residual)),
        };
        let (x, residual) = match fused {
            Ok(y) => return y,
            Err(back) => back,
        };
        let x = match input {
            Input::Plain => x,
            Input::Norm(g, eps) => Self::rms_norm(x, g, eps),
            Input::SiluMul => {
                let [t, width] = x.dims();
                silu(x.clone().slice([0..t, 0..width / 2])) * x.slice([0..t, width / 2..width])
            }
        };
        let y = lin.forward(x);
        match residual {
            Some(r) => r + y,
            None => y,
        }
    }

    /// Per-head RMSNorm over the last dimension of `[rows, heads, head_dim]` (Qwen3's Q/K norms).
    fn head_norm(&self, x: Tensor<3>, w: &Option<Tensor<1>>) -> Tensor<3> {
        let Some(w) = w else { return x };
        let dh = w.dims()[0];
        let scale = x.clone().square().mean_dim(2).add_scalar(self.cfg.rms_eps).sqrt().recip();
        x * scale * w.clone().reshape([1, 1, dh])
    }

    /// Rotary embedding on `[rows, heads, head_dim]`, each row at its own position: `c` and `sn`
    /// are those positions' `pair_tables` rows, `[rows, 1, rope_dim]`.
    fn rope(&self, x: Tensor<3>, c: &Tensor<3>, sn: &Tensor<3>) -> Tensor<3> {
        let [t, nh, dh] = x.dims();
        let rd = self.cfg.rope_dim;
        if rd == 0 {
            return x;
        }
        let half = rd / 2;
        let (rot, pass) = if rd == dh { (x, None) } else { (x.clone().slice([0..t, 0..nh, 0..rd]), Some(x.slice([0..t, 0..nh, rd..dh]))) };
        // x0·cos + x1·(-sin) is x0·cos - x1·sin exactly: the pairwise products in four tensor
        // ops instead of a dozen (on a GPU each op is a kernel launch)
        let swapped: Tensor<3> = match self.cfg.family.rope {
            RopeStyle::Interleaved => rot.clone().reshape([t, nh, half, 2]).flip([3]).reshape([t, nh, rd]),
            RopeStyle::Halves => rot.clone().reshape([t, nh, 2, half]).flip([2]).reshape([t, nh, rd]),
        };
        let rot = rot * c.clone() + swapped * sn.clone();
        match pass {
            None => rot,
            Some(p) => Tensor::cat(vec![rot, p], 2),
        }
    }

    /// `forward` on the host path for several sequences at once, `(tokens, pos, each layer's
    /// cache)`: their rows go through every layer together. The logits of each one's last token.
    fn forward_host(&self, hw: &HostWeights, seqs: &mut [(&[u32], usize, &mut [HostKv])]) -> Vec<Vec<f32>> {
        fn q(l: &Linear) -> &QStack {
            quant_stack(l).expect("every layer quantised on the host path")
        }
        let cfg = &self.cfg;
        let h = cfg.embedding_length;
        let tokens: Vec<u32> = seqs.iter().flat_map(|(t, _, _)| t.iter().copied()).collect();
        let mut x = q(&self.embed).dequantise_rows(&tokens);
        if cfg.family.gemma {
            llama_host::scale(&mut x, (h as f32).sqrt());
        }
        let shape = Shape {
            hidden: h,
            heads: cfg.head_count,
            kv_heads: cfg.head_count_kv,
            head_dim: cfg.head_dim(),
            ffn: cfg.feed_forward_length,
            rope_dim: cfg.rope_dim,
            rope: cfg.family.rope,
            rms_eps: cfg.rms_eps,
            gemma: cfg.family.gemma,
            attn_scale: cfg.attn_scale as f32,
            attn_softcap: cfg.attn_softcap.map(|c| c as f32),
        };
        for (l, (block, (attn_norm, ffn_norm))) in self.blocks.iter().zip(&hw.norms).enumerate() {
            let b = HostBlock {
                attn_norm,
                qkv: q(&block.qkv),
                extras: &block.extras,
                out: q(&block.out),
                ffn_norm,
                gate_up: q(&block.gate_up),
                down: q(&block.down),
            };
            let mut rows: Vec<HostSeq> = seqs.iter_mut().map(|(t, pos, kv)| HostSeq { pos: *pos, len: t.len(), kv: &mut kv[l] }).collect();
            let (cos, sin) = match &hw.swa {
                Some((c, s)) if cfg.swa_rope(l) => (c, s),
                _ => (&hw.cos, &hw.sin),
            };
            llama_host::layer(&shape, &b, cos, sin, cfg.window_of(l), &mut x, &mut rows);
        }
        let mut last = Vec::with_capacity(seqs.len() * h);
        let mut end = 0;
        for (t, _, _) in seqs.iter() {
            end += t.len();
            last.extend_from_slice(&x[(end - 1) * h..end * h]);
        }
        let mut logits = q(&self.output).matmul(&llama_host::rms_norm(&last, &hw.out_norm, cfg.rms_eps), seqs.len());
        if let Some(c) = cfg.final_softcap {
            llama_host::softcap(&mut logits, c as f32);
        }
        logits.chunks_exact(cfg.vocab_size).map(<[f32]>::to_vec).collect()
    }

    /// The tensor path for several sessions' chunks at once, `(pages, tokens, pos)`, each
    /// session's pages reserved for its chunk: the rows of all chunks go through the dense layers
    /// together, attention reads each chunk's own pages of `pool` (padded to the longest chunk,
    /// masked past each one's positions), and the new keys and values are written with one op
    /// per layer. The logits of each chunk's last token.
    fn forward_pooled(&self, pool: &mut KvPool, chunks: &[(&Pages, &[u32], usize)], greedy: &[bool]) -> ExResult<Vec<Next>> {
        let cfg = &self.cfg;
        let (h, dh, nh, nkv) = (cfg.embedding_length, cfg.head_dim(), cfg.head_count, cfg.head_count_kv);
        let (rep, dev) = (nh / nkv, &self.device);
        let b = chunks.len();
        let smax = chunks.iter().map(|c| c.1.len()).max().unwrap_or(0);
        let tokens: Vec<u32> = chunks.iter().flat_map(|c| c.1.iter().copied()).collect();
        let t = tokens.len();
        let positions = || chunks.iter().flat_map(|&(pages, toks, pos)| (pos..pos + toks.len()).map(move |p| (pages, p)));
        let at = pool.rows(positions());
        let table = pool.table(&chunks.iter().map(|c| c.0).collect::<Vec<_>>());
        let len = table.1 * PAGE;
        let pos = i32_tensor(positions().map(|(_, p)| p as i32).collect(), dev);
        let rd = cfg.rope_dim;
        let rows = |table: &Tensor<2>| table.clone().select(0, pos.clone()).reshape([t, 1, rd]);
        // the positions' rows of the rotary tables (the global and the sliding layers'), for
        // layers that rotate in Burn ops
        let mut pair_rows: [Option<(Tensor<3>, Tensor<3>)>; 2] = [None, None];
        let rope = Rope { cos: &self.pair_tables.0, sin: &self.pair_tables.1, halves: cfg.family.rope == RopeStyle::Halves };
        // each chunk's rows padded to `smax`; nothing to move when they are as long
        let starts: Vec<usize> = chunks.iter().scan(0, |acc, c| Some(std::mem::replace(acc, *acc + c.1.len()))).collect();
        let ragged = chunks.iter().any(|c| c.1.len() != smax);
        let (to_padded, to_packed) = if ragged {
            let padded = (0..b * smax).map(|p| (starts[p / smax] + (p % smax).min(chunks[p / smax].1.len() - 1)) as i32).collect();
            let packed = chunks.iter().enumerate().flat_map(|(i, c)| (0..c.1.len()).map(move |tt| (i * smax + tt) as i32)).collect();
            (Some(i32_tensor(padded, dev)), Some(i32_tensor(packed, dev)))
        } else {
            (None, None)
        };
        let scale = cfg.attn_scale;
        let mut x = match &self.embed {
            Linear::Dense(e) => e.clone().select(0, i32_tensor(tokens.iter().map(|&t| t as i32).collect(), dev)),
            Linear::Quant(e) => f32_tensor(e.dequantise_rows(&tokens), [t, h], dev),
            Linear::Blocks(_) => unreachable!("an embedding's rows are read from host memory"),
        };
        if cfg.family.gemma {
            x = x.mul_scalar((h as f32).sqrt());
        }
        // a decoding step (one token a chunk) on a GPU attends straight from the pages; otherwise
        // the pages are gathered, padded and masked
        let lens = (smax == 1 && self.gpu_kernels && paged_attention::applies(&x)).then(|| i32_tensor(chunks.iter().map(|c| (c.2 + 1) as i32).collect(), dev));
        // query `tt` of chunk `i`, at position p = pos + tt, sees keys 0..=p, or the window's
        // p - window < j <= p (a padding query sees what its chunk's last query sees, and is
        // dropped)
        let mask_for = |window: Option<usize>| {
            let mask: Vec<f32> = chunks
                .iter()
                .flat_map(|&(_, toks, p0)| {
                    (0..smax).flat_map(move |tt| {
                        let p = p0 + tt.min(toks.len() - 1);
                        (0..len).map(move |j| if j <= p && window.is_none_or(|w| p - j < w) { 0.0 } else { f32::NEG_INFINITY })
                    })
                })
                .collect();
            f32_tensor(mask, [b, 1, 1, smax, len], dev)
        };
        let mask = lens.is_none().then(|| mask_for(None));
        let mask_swa = lens.is_none().then(|| cfg.window.map(|w| mask_for(Some(w)))).flatten();
        let rope_out = RopeOut { rope: &rope, pos: &pos, at: &at, heads: nh, kv_heads: nkv, head_dim: dh };
        for (l, block) in self.blocks.iter().enumerate() {
            let plain_rope = self.gpu_kernels && rd > 0 && block.q_norm.is_none() && block.k_norm.is_none();
            // the projection, its RoPE and the pool's writes in one kernel where they can be
            let qkv_weight = match &block.qkv {
                Linear::Dense(w) => Some(Weight::F32(w)),
                Linear::Blocks(runs) if runs.len() == 1 => Some(Weight::Blocks(&runs[0])),
                _ => None,
            };
            let fused = match qkv_weight {
                Some(w) if plain_rope && block.qkv_bias.is_none() => pool.update(l, |sides| match rows::fused_rope(x.clone(), w, (&block.attn_norm, cfg.rms_eps), &rope_out, sides) {
                    Ok((q, sides)) => (Some(q), sides),
                    Err((_, sides)) => (None, sides),
                }),
                _ => None,
            };
            let qkv = || {
                let qkv = self.project(&block.qkv, x.clone(), Input::Norm(&block.attn_norm, cfg.rms_eps), None);
                match &block.qkv_bias {
                    Some(bias) => qkv + bias.clone().unsqueeze::<2>(),
                    None => qkv,
                }
            };
            let q = if let Some(q) = fused {
                q
            } else if plain_rope && rope_cache::applies(&x) {
                let qkv = qkv();
                pool.update(l, |sides| rope_cache::rope_write(qkv, &rope, &pos, &at, sides, nh, dh))
            } else {
                let qkv = qkv();
                let swa = cfg.swa_rope(l);
                let tables = if swa { self.pair_tables_swa.as_ref().expect("tables for the sliding layers") } else { &self.pair_tables };
                let (c, sn) = pair_rows[swa as usize].get_or_insert_with(|| (rows(&tables.0), rows(&tables.1)));
                let split = |from: usize, heads: usize| -> Tensor<3> { qkv.clone().slice([0..t, from..from + heads * dh]).reshape([t, heads, dh]) };
                let q = self.rope(self.head_norm(split(0, nh), &block.q_norm), c, sn);
                let k = self.rope(self.head_norm(split(nh * dh, nkv), &block.k_norm), c, sn);
                pool.write(l, &at, k.reshape([t, nkv * dh]), split((nh + nkv) * dh, nkv).reshape([t, nkv * dh]));
                q.reshape([t, nh * dh])
            };
            let ctx = match &lens {
                Some(lens) => {
                    let [k, v] = pool.layer(l);
                    paged_attention::attend(q, &Paged { k, v, table: &table.0, pages_each: table.1, lens }, nh, nkv, scale as f32)
                }
                None => {
                    let mask = if cfg.window_of(l).is_some() { mask_swa.clone() } else { mask.clone() }.expect("a mask where the pages are gathered");
                    let [k, v] = pool.read(l, &table, b).map(|s| s.reshape([b, len, nkv, dh]).swap_dims(1, 2));
                    // queries grouped by their K/V head (head = kv * rep + r): no repeated K/V
                    let q = match &to_padded {
                        Some(i) => q.select(0, i.clone()),
                        None => q,
                    };
                    let q = q.reshape([b, smax, nkv, rep, dh]).permute([0, 2, 3, 1, 4]).reshape([b, nkv, rep * smax, dh]);
                    let scores = q.matmul(k.swap_dims(2, 3)).mul_scalar(scale);
                    let scores = match cfg.attn_softcap {
                        Some(cap) => scores.div_scalar(cap).tanh().mul_scalar(cap),
                        None => scores,
                    };
                    let scores = scores.reshape([b, nkv, rep, smax, len]) + mask;
                    let probs = softmax(scores, 4).reshape([b, nkv, rep * smax, len]);
                    let ctx = probs.matmul(v).reshape([b, nkv, rep, smax, dh]).permute([0, 3, 1, 2, 4]).reshape([b * smax, nh * dh]);
                    match &to_packed {
                        Some(i) => ctx.select(0, i.clone()),
                        None => ctx,
                    }
                }
            };
            // Gemma 2 and 3 normalise each output before it joins the residual
            x = match &block.post_norms {
                Some((post_attn, _)) => x + Self::rms_norm(self.project(&block.out, ctx, Input::Plain, None), post_attn, cfg.rms_eps),
                None => self.project(&block.out, ctx, Input::Plain, Some(x)),
            };
            let gu = self.project(&block.gate_up, x.clone(), Input::Norm(&block.ffn_norm, cfg.rms_eps), None);
            let (act, input) = if cfg.family.gemma {
                let [rows, width] = gu.dims();
                (gelu_tanh(gu.clone().slice([0..rows, 0..width / 2])) * gu.slice([0..rows, width / 2..width]), Input::Plain)
            } else {
                (gu, Input::SiluMul)
            };
            x = match &block.post_norms {
                Some((_, post_ffn)) => x.clone() + Self::rms_norm(self.project(&block.down, act, input, None), post_ffn, cfg.rms_eps),
                None => self.project(&block.down, act, input, Some(x)),
            };
        }
        let last = i32_tensor(chunks.iter().zip(&starts).map(|(c, s)| (s + c.1.len() - 1) as i32).collect(), dev);
        let logits = self.project(&self.output, x.select(0, last), Input::Norm(&self.out_norm, cfg.rms_eps), None);
        let logits = match cfg.final_softcap {
            Some(cap) => logits.div_scalar(cap).tanh().mul_scalar(cap),
            None => logits,
        };
        read_rows(logits, greedy)
    }
}

/// Each row of `logits` as `forward_batch_next` answers it: the argmax of a greedy row, taken on
/// the device so only the ids travel, the values of the others.
fn read_rows(logits: Tensor<2>, greedy: &[bool]) -> ExResult<Vec<Next>> {
    fn failed(e: impl std::fmt::Debug) -> ExError {
        ExError::Execution(format!("reading the logits: {e:?}"))
    }
    let [rows, vocab] = logits.dims();
    debug_assert_eq!(rows, greedy.len());
    let kept: Vec<i32> = (0..rows as i32).filter(|&r| !greedy[r as usize]).collect();
    // every row's argmax (one launch), read where a row is greedy
    let tokens: Vec<i64> = match kept.len() < rows {
        true => logits.clone().argmax(1).try_into_data().map_err(failed)?.iter::<i64>().collect(),
        false => Vec::new(),
    };
    let values = match kept.len() {
        0 => Vec::new(),
        n if n == rows => logits.try_into_data().map_err(failed)?.try_into_vec::<f32>().map_err(failed)?,
        _ => {
            let device = logits.device();
            logits.select(0, i32_tensor(kept, &device)).try_into_data().map_err(failed)?.try_into_vec::<f32>().map_err(failed)?
        }
    };
    let mut values = values.chunks_exact(vocab.max(1));
    Ok(greedy
        .iter()
        .enumerate()
        .map(|(r, &g)| match g {
            true => Next::Token(tokens[r] as u32),
            false => Next::Logits(values.next().expect("values a kept row").to_vec()),
        })
        .collect())
}

impl CausalLm for BurnLlama {
    fn vocab_size(&self) -> usize {
        self.w.cfg.vocab_size
    }

    fn context_length(&self) -> usize {
        self.w.cfg.context_length
    }

    fn kv_bytes_per_token(&self) -> usize {
        self.w.cfg.kv_bytes_per_token()
    }

    fn session(&self) -> ExResult<Box<dyn LmSession>> {
        Ok(Box::new(BurnLlamaSession::empty(Arc::clone(&self.w), 0)))
    }

    fn save_prefix(&self, session: &mut dyn LmSession, len: usize) -> Option<SavedKv> {
        let any: &mut dyn Any = session;
        let s = any.downcast_mut::<BurnLlamaSession>().filter(|s| Arc::ptr_eq(&s.w, &self.w) && !s.failed && s.len >= len)?;
        if self.w.host.is_none() {
            let pool = self.w.pool.lock().unwrap_or_else(|e| e.into_inner());
            let kv = pool.holds(&s.pages).then(|| catch(|| Ok(pool.copy_out(&s.pages, len))).ok()).flatten()?;
            return Some(Arc::new(SavedPooledKv(kv)));
        }
        let dh = self.w.cfg.head_dim();
        let kv = s.host_kv.iter().map(|kv| kv.prefix(len, dh)).collect::<Option<Vec<_>>>()?;
        Some(Arc::new(SavedHostKv(kv)))
    }

    fn session_from(&self, saved: &(dyn Any + Send + Sync), len: usize) -> Option<Box<dyn LmSession>> {
        let w = Arc::clone(&self.w);
        if let Some(saved) = saved.downcast_ref::<SavedPooledKv>() {
            let mut s = BurnLlamaSession::empty(Arc::clone(&w), len);
            let mut pool = w.pool.lock().unwrap_or_else(|e| e.into_inner());
            let written = catch(|| {
                pool.reserve(&mut [(&mut s.pages, len)]);
                let at = pool.rows((0..len).map(|pos| (&s.pages, pos)));
                for (layer, [k, v]) in saved.0.iter().enumerate() {
                    pool.write(layer, &at, k.clone().slice(0..len), v.clone().slice(0..len));
                }
                Ok(())
            });
            // a write that failed part-way may have left a layer out: as after a failed step
            if written.is_err() {
                pool.reset();
                return None;
            }
            drop(pool);
            return Some(Box::new(s));
        }
        let saved = saved.downcast_ref::<SavedHostKv>()?;
        let dh = w.cfg.head_dim();
        let host_kv = saved.0.iter().map(|kv| kv.prefix(len, dh)).collect::<Option<Vec<_>>>()?;
        Some(Box::new(BurnLlamaSession { w, pages: Pages::default(), host_kv, len, failed: false }))
    }

    /// The chunks of this model's sessions run through the layers together, on either path; a
    /// chunk a session refuses is answered alone.
    fn forward_batch(&self, batch: &mut [Chunk]) -> Vec<ExResult<Vec<f32>>> {
        let greedy = vec![false; batch.len()];
        self.forward_batch_next(batch, &greedy).into_iter().map(|r| r.map(Next::into_logits)).collect()
    }

    /// The host path's logits are in host memory already, and are all returned.
    fn forward_batch_next(&self, batch: &mut [Chunk], greedy: &[bool]) -> Vec<ExResult<Next>> {
        own_chunks(batch, |s: &BurnLlamaSession| Arc::ptr_eq(&s.w, &self.w), BurnLlamaSession::check, |mut ours, index| match &self.w.host {
            Some(hw) => BurnLlamaSession::forward_host(&self.w, hw, ours).into_iter().map(|r| r.map(Next::Logits)).collect(),
            None => BurnLlamaSession::forward_pooled(&mut ours, &index.iter().map(|&i| greedy[i]).collect::<Vec<_>>()),
        })
    }
}

/// The host path's caches of a prompt prefix, for `prefix_cache`.
struct SavedHostKv(Vec<HostKv>);

/// A prompt's keys and values copied out of the tensor path's pool, `[len, width]` per layer
/// and side.
struct SavedPooledKv(Vec<[Tensor<2>; 2]>);

/// One generation: the shared weights and this sequence's KV cache.
pub struct BurnLlamaSession {
    w: Arc<Weights>,
    /// The tensor path's cache: pages of the model's pool (`kv_pool`), taken as it grows.
    pages: Pages,
    /// The host path's cache (`llama_host`), used instead of `pages` where the weights take it.
    host_kv: Vec<HostKv>,
    len: usize,
    /// A step failed part-way, leaving the layers' caches inconsistent.
    failed: bool,
}

impl BurnLlamaSession {
    /// A session holding no pages and empty host caches, that counts `len` tokens cached (the
    /// caller fills them).
    fn empty(w: Arc<Weights>, len: usize) -> BurnLlamaSession {
        let n = w.cfg.block_count;
        BurnLlamaSession { w, pages: Pages::default(), host_kv: vec![HostKv::default(); n], len, failed: false }
    }

    /// Whether `tokens` at `pos` may run next.
    fn check(&self, tokens: &[u32], pos: usize) -> ExResult<()> {
        if !self.failed && self.w.host.is_none() {
            if !self.w.pool.lock().unwrap_or_else(|e| e.into_inner()).holds(&self.pages) {
                return Err(ExError::invalid("this session's cache was emptied after another session's step failed; start a new session"));
            }
        }
        self.w.cfg.check_chunk(self.failed, self.len, tokens, pos)
    }

    /// After a step: `n` more tokens in the cache, or, when it failed part-way (some layers'
    /// caches extended, others not), a session that refuses further steps.
    fn settle<T>(&mut self, n: usize, result: ExResult<T>) -> ExResult<T> {
        match result {
            Ok(v) => {
                self.len += n;
                Ok(v)
            }
            Err(e) => {
                self.host_kv.iter_mut().for_each(|c| *c = HostKv::default());
                self.failed = true;
                Err(e)
            }
        }
    }
}

impl LmSession for BurnLlamaSession {
    fn reserve(&mut self, tokens: usize) {
        let cfg = &self.w.cfg;
        let tokens = tokens.min(cfg.context_length);
        if self.w.host.is_some() {
            self.host_kv.iter_mut().for_each(|kv| kv.reserve(cfg.head_count_kv, tokens, cfg.head_dim()));
            return;
        }
        // the pages now, when the scheduler admits the request, not part-way through its steps
        let w = Arc::clone(&self.w);
        let mut pool = w.pool.lock().unwrap_or_else(|e| e.into_inner());
        if pool.holds(&self.pages) && catch(|| Ok(pool.reserve(&mut [(&mut self.pages, tokens)]))).is_err() {
            pool.reset();
            self.failed = true;
        }
    }

    fn forward(&mut self, tokens: &[u32], pos: usize) -> ExResult<Vec<f32>> {
        self.forward_next(tokens, pos, false).map(Next::into_logits)
    }

    fn forward_next(&mut self, tokens: &[u32], pos: usize, greedy: bool) -> ExResult<Next> {
        self.check(tokens, pos)?;
        let w = Arc::clone(&self.w);
        match &w.host {
            Some(hw) => Self::forward_host(&w, hw, vec![(self, tokens, pos)]).remove(0).map(Next::Logits),
            None => Self::forward_pooled(&mut [(self, tokens, pos)], &[greedy]).remove(0),
        }
    }
}

impl BurnLlamaSession {
    /// One step of the host path for sessions of one model that passed `check`, each with its
    /// chunk; a failed step fails them all.
    fn forward_host(w: &Weights, hw: &HostWeights, sessions: Vec<(&mut BurnLlamaSession, &[u32], usize)>) -> Vec<ExResult<Vec<f32>>> {
        let mut seqs: Vec<(&[u32], usize, &mut [HostKv])> = Vec::with_capacity(sessions.len());
        let mut rest: Vec<(usize, &mut bool, &mut usize)> = Vec::with_capacity(sessions.len());
        for (s, tokens, pos) in sessions {
            let BurnLlamaSession { host_kv, failed, len, .. } = s;
            seqs.push((tokens, pos, &mut host_kv[..]));
            rest.push((tokens.len(), failed, len));
        }
        match catch(|| Ok(w.forward_host(hw, &mut seqs))) {
            Ok(logits) => rest
                .into_iter()
                .zip(logits)
                .map(|((n, _, len), l)| {
                    *len += n;
                    Ok(l)
                })
                .collect(),
            Err(e) => rest
                .into_iter()
                .zip(&mut seqs)
                .map(|((_, failed, _), seq)| {
                    seq.2.iter_mut().for_each(|c| *c = HostKv::default());
                    *failed = true;
                    Err(ExError::Execution(format!("batched step: {e}")))
                })
                .collect(),
        }
    }

    /// One step of the tensor path for sessions of one model that passed `check`, each with its
    /// chunk. A failed step fails them all and empties the pool, whose tensors it may have left
    /// half-written: the model's other sessions then find their slots gone (`check`).
    fn forward_pooled(sessions: &mut [(&mut BurnLlamaSession, &[u32], usize)], greedy: &[bool]) -> Vec<ExResult<Next>> {
        let Some(w) = sessions.first().map(|s| Arc::clone(&s.0.w)) else { return Vec::new() };
        let mut pool = w.pool.lock().unwrap_or_else(|e| e.into_inner());
        // pages inside the catch too: growing the pool allocates, and can fail part-way
        let step = catch(|| {
            pool.reserve(&mut sessions.iter_mut().map(|(s, t, p)| (&mut s.pages, *p + t.len())).collect::<Vec<_>>());
            let chunks: Vec<(&Pages, &[u32], usize)> = sessions.iter().map(|(s, t, p)| (&s.pages, *t, *p)).collect();
            w.forward_pooled(&mut pool, &chunks, greedy)
        });
        match step {
            Ok(logits) => sessions.iter_mut().zip(logits).map(|((s, t, _), l)| s.settle(t.len(), Ok(l))).collect(),
            Err(e) => {
                pool.reset();
                sessions.iter_mut().map(|(s, _, _)| s.settle(0, Err(ExError::Execution(format!("step: {e}"))))).collect()
            }
        }
    }
}

impl Drop for BurnLlamaSession {
    fn drop(&mut self) {
        if self.w.host.is_none() {
            self.w.pool.lock().unwrap_or_else(|e| e.into_inner()).release(&mut self.pages);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pretrained::weights::test_support::{err_text, peak_rss_mib, reference, smollm_path, TempDir};
    use candle_core::quantized::gguf_file::{self, Value};
    use candle_core::quantized::{GgmlDType, QTensor};
    use crate::pretrained::greedy_check::{self, argmax, ids};



    #[test]
    fn pretrained_burn_llama_matches_transformers() {
        let Some(path) = smollm_path() else { return };
        let refs = reference("smollm2_reference.json");
        let t = std::time::Instant::now();
        let model = BurnLlama::load(&path, &crate::testing::device()).unwrap();
        println!("burn llama: loaded in {:.2} s; peak RSS after load {:.0} MiB", t.elapsed().as_secs_f64(), peak_rss_mib());
        let cases = refs["generate"].as_array().expect("generate cases");
        let (mut identical, mut steps, mut worst_logit, mut flips) = (0, 0, 0f64, vec![]);
        for (i, case) in cases.iter().enumerate() {
            let label = format!("{} prompt {i}", case["kind"].as_str().unwrap_or("?"));
            // Every step on the reference's own tokens, then a free-running greedy generation
            // (greedy_check says why both).
            let forced = greedy_check::teacher_forced(model.session().unwrap().as_mut(), case);
            greedy_check::assert_forced(&label, &forced);
            steps += forced.steps;
            flips.extend(forced.flips.iter().map(|f| (i, f.0, f.2)));
            let got = greedy(&model, &ids(&case["prompt_ids"]), ids(&case["generated_ids"]).len());
            identical += greedy_check::assert_free_run(&label, &got, case) as usize;
            let worst = greedy_check::first_step_error(&forced.first, case);
            println!("  {label}: first-step top-10 logits: max |diff| {worst:.5}");
            worst_logit = worst_logit.max(worst);
        }
        println!(
            "burn llama: {identical}/{} greedy generations identical; teacher-forced {} of {steps} steps pick another \
             token, all at reference near ties (case, step, margin): {flips:?}; worst first-step top-10 logit diff {worst_logit:.5}",
            cases.len(),
            flips.len()
        );
        // the quantised layers round activations to 8 bits per block, as llama.cpp and Candle do
        // (greedy_check): about a logit at most, where one layer skipped moves them by several
        assert!(worst_logit < 1.25, "first-step logits differ by {worst_logit}");
        // every weight dequantised, activations f32: transformers' own arithmetic up to f32 sums
        let dense = BurnLlama::load_with(&path, &crate::testing::device(), false).unwrap();
        for (i, case) in cases.iter().enumerate() {
            let first = dense.session().unwrap().forward(&ids(&case["prompt_ids"]), 0).unwrap();
            let worst = greedy_check::first_step_error(&first, case);
            assert!(worst < 0.05, "dequantised: case {i}: first-step logits differ by {worst}");
        }
    }

    /// Greedy decoding of `n` tokens, stopping early at eos as generation does.
    fn greedy(model: &BurnLlama, prompt: &[u32], n: usize) -> Vec<u32> {
        let mut s = model.session().unwrap();
        let mut logits = s.forward(prompt, 0).unwrap();
        let mut out = vec![];
        let mut pos = prompt.len();
        while out.len() < n {
            let tok = argmax(&logits);
            if tok == 2 {
                break; // SmolLM2's eos, which generation does not emit
            }
            out.push(tok);
            logits = s.forward(&[tok], pos).unwrap();
            pos += 1;
        }
        out
    }

    #[test]
    fn pretrained_burn_llama_prompt_equals_stepwise() {
        let Some(path) = smollm_path() else { return };
        let dev = crate::testing::device();
        let model = BurnLlama::load(&path, &dev).unwrap();
        println!("burn llama: peak RSS after load {:.0} MiB", peak_rss_mib());
        let prompt = [1u32, 504, 3458, 282, 4649, 314, 253];
        // f32 activations (every weight dequantised) keep the two orders within f32 sums; off
        // the CPU Burn's matmul kernels run f32 in TF32 (guides/devices.md). The CPU's host
        // path (every layer quantised) sums each row in one order whatever the rows beside it,
        // so the two orders give the same bits; elsewhere 8-bit activations would amplify any
        // last-bit difference up to Q8_LOGIT_DRIFT.
        let dense = BurnLlama::load_with(&path, &dev, false).unwrap();
        let cpu = dev.kind == crate::device::DeviceKind::Cpu;
        for (m, quantised) in [(&dense, false), (&model, cpu)] {
            let batched = m.session().unwrap().forward(&prompt, 0).unwrap();
            let mut s = m.session().unwrap();
            let mut last = Vec::new();
            for (i, t) in prompt.iter().enumerate() {
                last = s.forward(&[*t], i).unwrap();
            }
            assert_eq!(batched.len(), m.vocab_size());
            let diff = batched.iter().zip(&last).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            println!("burn llama (quantised {quantised}): batched prompt vs token-by-token max logit difference {diff:e}");
            let tol = if quantised { 0.0 } else if cpu { 1e-3 } else { 5e-2 };
            assert!(diff <= tol, "quantised {quantised}: {diff}");
            let (pick, want) = (argmax(&batched) as usize, argmax(&last) as usize);
            assert!(pick == want || last[want] - last[pick] < greedy_check::NEAR_TIE as f32);
        }
        let mut s = model.session().unwrap();
        for (i, t) in prompt.iter().enumerate() {
            s.forward(&[*t], i).unwrap();
        }
        // Feeding out of order is an error, and a fresh session works.
        assert!(err_text(s.forward(&[1], 3)).contains("fed in order"));
        assert!(err_text(s.forward(&[99999], prompt.len())).contains("outside the vocabulary"));
        assert!(err_text(s.forward(&[], prompt.len())).contains("at least one token"));
    }

    /// The CPU's quantised layers against every weight dequantised (the path other devices
    /// take), on a prompt long enough for the 4-row groups and their remainder, then two cached
    /// steps. The quantised layers round activations to 8 bits per block of 32, as llama.cpp
    /// does, so their logits may drift by `Q8_LOGIT_DRIFT`; the pick may differ only at a near tie.
    #[test]
    fn pretrained_burn_llama_quantised_layers_equal_dequantised() {
        let Some(path) = smollm_path() else { return };
        let dev = crate::testing::device();
        if dev.kind != DeviceKind::Cpu {
            return;
        }
        let quant = BurnLlama::load_with(&path, &dev, true).unwrap();
        let dense = BurnLlama::load_with(&path, &dev, false).unwrap();
        let kinds = |m: &BurnLlama| {
            let b = &m.w.blocks[0];
            [&m.w.embed, &b.qkv, &b.out, &b.gate_up, &b.down, &m.w.output].map(|l| matches!(l, Linear::Quant(_)))
        };
        assert_eq!(kinds(&quant), [true; 6]);
        assert_eq!(kinds(&dense), [false; 6]);
        let prompt: Vec<u32> = vec![1, 504, 3458, 282, 4649, 314, 253, 1345, 28, 216, 506, 4491, 30, 2];
        let (mut q, mut d) = (quant.session().unwrap(), dense.session().unwrap());
        for (tokens, pos) in [(&prompt[..], 0), (&[41u32][..], prompt.len()), (&[7u32][..], prompt.len() + 1)] {
            let (a, b) = (q.forward(tokens, pos).unwrap(), d.forward(tokens, pos).unwrap());
            let diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
            println!("burn llama: quantised vs dequantised layers at position {pos}: max logit difference {diff:e} (logits up to {scale})");
            assert!(diff < greedy_check::Q8_LOGIT_DRIFT * scale.max(1.0), "{diff} at position {pos}");
            let (pick, want) = (argmax(&a) as usize, argmax(&b) as usize);
            assert!(pick == want || b[want] - b[pick] < greedy_check::NEAR_TIE as f32, "picked {pick}, not {want}, at position {pos}");
        }
    }

    /// SmolLM2 requantised by llama.cpp (`llama-quantize --allow-requantize` of the Q4_1 file) as
    /// `kind`, where it has been made for benchmarks. Q4_K_M: Q5_0 and Q8_0 where rows of 576 are
    /// no multiple of 256, Q4_K and Q6_K elsewhere; Q5_K_M: Q5_1 and Q8_0, Q5_K and Q6_K; F16.
    fn smollm_requantised_path(kind: &str) -> Option<std::path::PathBuf> {
        let p = std::path::PathBuf::from(std::env::var("HOME").ok()?).join(format!(".cache/ex_burn/bench/SmolLM2-135M-Instruct.{kind}.gguf"));
        if p.is_file() {
            Some(p)
        } else {
            println!("SKIPPED: {} not found", p.display());
            None
        }
    }

    /// Q4_K_M, Q5_K_M and F16 keep every layer in its blocks (the host path), follow the
    /// dequantised model's greedy tokens up to near ties, and give a prompt's logits with the same
    /// bits fed at once or token by token.
    #[test]
    fn pretrained_burn_llama_k_quants_stay_quantised() {
        let files: [(&str, &[&str]); 3] = [("Q4_K_M", &["Q4_K", "Q5_0", "Q6_K", "Q8_0"]), ("Q5_K_M", &["Q5_1", "Q5_K", "Q6_K", "Q8_0"]), ("F16", &["F16"])];
        for (kind, want) in files {
            if let Some(path) = smollm_requantised_path(kind) {
                k_quants_stay_quantised(&path, kind, want);
            }
        }
    }

    fn k_quants_stay_quantised(path: &std::path::Path, kind: &str, want: &[&str]) {
        let dev = crate::testing::device();
        if dev.kind != DeviceKind::Cpu {
            return;
        }
        let quant = BurnLlama::load_with(path, &dev, true).unwrap();
        println!("burn llama {kind}: peak RSS after the quantised load {:.0} MiB", peak_rss_mib());
        assert_eq!(quant.host_formats().expect("every layer quantised"), want, "{kind}");

        let prompt: Vec<u32> = vec![1, 504, 3458, 282, 4649, 314, 253, 1345, 28, 216, 506, 4491, 30, 2];
        let batched = quant.session().unwrap().forward(&prompt, 0).unwrap();
        let mut s = quant.session().unwrap();
        let mut last = Vec::new();
        for (i, t) in prompt.iter().enumerate() {
            last = s.forward(&[*t], i).unwrap();
        }
        assert_eq!(batched, last, "a prompt at once and token by token");

        // greedy steps, teacher-forced on the dequantised model's picks
        let dense = BurnLlama::load_with(&path, &dev, false).unwrap();
        let (mut q, mut d) = (quant.session().unwrap(), dense.session().unwrap());
        let (mut tokens, mut pos, mut same) = (prompt.clone(), 0, 0);
        for _ in 0..12 {
            let (a, b) = (q.forward(&tokens, pos).unwrap(), d.forward(&tokens, pos).unwrap());
            let diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!(diff < greedy_check::Q8_LOGIT_DRIFT * scale.max(1.0), "{kind}: {diff} at position {pos}");
            let (pick, want) = (argmax(&a) as usize, argmax(&b) as usize);
            assert!(pick == want || b[want] - b[pick] < greedy_check::NEAR_TIE as f32, "{kind}: picked {pick}, not {want}, at position {pos}");
            same += (pick == want) as usize;
            pos += tokens.len();
            tokens = vec![want as u32];
        }
        println!("burn llama {kind}: {same} of 12 greedy picks equal to the dequantised model's");
    }

    /// Prefill and decode speed on SmolLM2, printed (bench/rust_timings.sh runs it).
    #[test]
    #[ignore]
    fn pretrained_burn_llama_timing() {
        let Some(path) = smollm_path() else { return };
        let model = BurnLlama::load(&path, &crate::testing::device()).unwrap();
        let prompt: Vec<u32> = vec![1, 504, 3458, 282, 4649, 314, 253, 1345, 28, 216, 506, 4491];
        greedy(&model, &prompt, 4);
        let (mut prefill, mut rate) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            let t = std::time::Instant::now();
            let mut s = model.session().unwrap();
            let logits = s.forward(&prompt, 0).unwrap();
            prefill.push(t.elapsed().as_secs_f64() * 1000.0);
            let mut next = argmax(&logits);
            let t = std::time::Instant::now();
            let mut steps = Vec::with_capacity(64);
            for i in 0..64 {
                let step = std::time::Instant::now();
                next = argmax(&s.forward(&[next], prompt.len() + i).unwrap());
                steps.push(step.elapsed().as_secs_f64() * 1000.0);
            }
            rate.push(64.0 / t.elapsed().as_secs_f64());
            // steady steps, or a few slow ones (kernels compiled for new shapes)?
            let mut sorted = steps.clone();
            sorted.sort_by(|a, b| a.partial_cmp(b).unwrap());
            println!("burn llama: decode step ms: median {:.2}, max {:.2}; first 8 {:.2?}", sorted[32], sorted[63], &steps[..8]);
        }
        println!(
            "burn llama: prompt of {} tokens in {:.1} ms (best of 3); 64 greedy tokens at {:.1} tokens/s (best of 3; all {:.1?}); peak RSS {:.0} MiB",
            prompt.len(),
            prefill.iter().cloned().fold(f64::INFINITY, f64::min),
            rate.iter().cloned().fold(0.0, f64::max),
            rate,
            peak_rss_mib()
        );
    }

    /// A tiny random Llama in GGUF, for shape and error tests without the real model.
    fn write_tiny(path: &Path, arch: &str, tied: bool) {
        write_tiny_with(path, arch, tied, vec![], false)
    }

    fn write_tiny_with(path: &Path, arch: &str, tied: bool, extra: Vec<(String, Value)>, rope_freqs: bool) {
        let cpu = candle_core::Device::Cpu;
        let (h, f, v, layers) = (64usize, 96usize, 40usize, 2usize);
        let mut seed = 1u64;
        let mut rand = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    ((seed >> 33) as f32 / (1u64 << 31) as f32 - 0.5) * 0.4
                })
                .collect()
        };
        let mut q = |dims: &[usize], ty: GgmlDType| {
            let t = candle_core::Tensor::from_vec(rand(dims.iter().product()), dims, &cpu).unwrap();
            QTensor::quantize(&t, ty).unwrap()
        };
        let mut tensors: Vec<(String, QTensor)> =
            vec![("token_embd.weight".into(), q(&[v, h], GgmlDType::Q8_0)), ("output_norm.weight".into(), q(&[h], GgmlDType::F32))];
        if !tied {
            tensors.push(("output.weight".into(), q(&[v, h], GgmlDType::F32)));
        }
        if rope_freqs {
            let twos = candle_core::Tensor::from_vec(vec![2f32; 8], 8, &cpu).unwrap();
            tensors.push(("rope_freqs.weight".into(), QTensor::quantize(&twos, GgmlDType::F32).unwrap()));
        }
        for l in 0..layers {
            for (n, d) in [
                ("attn_norm", vec![h]),
                ("ffn_norm", vec![h]),
                ("attn_q", vec![h, h]),
                ("attn_k", vec![32, h]),
                ("attn_v", vec![32, h]),
                ("attn_output", vec![h, h]),
                ("ffn_gate", vec![f, h]),
                ("ffn_up", vec![f, h]),
                ("ffn_down", vec![h, f]),
            ] {
                let ty = if d.len() == 1 { GgmlDType::F32 } else { GgmlDType::Q4_1 };
                let ty = if d.len() == 2 && d[1] % 32 != 0 { GgmlDType::F32 } else { ty };
                tensors.push((format!("blk.{l}.{n}.weight"), q(&d, ty)));
            }
        }
        let mut md: Vec<(String, Value)> = vec![
            ("general.architecture".into(), Value::String(arch.into())),
            (format!("{arch}.block_count"), Value::U32(layers as u32)),
            (format!("{arch}.embedding_length"), Value::U32(h as u32)),
            (format!("{arch}.feed_forward_length"), Value::U32(f as u32)),
            (format!("{arch}.attention.head_count"), Value::U32(4)),
            (format!("{arch}.attention.head_count_kv"), Value::U32(2)),
            (format!("{arch}.attention.layer_norm_rms_epsilon"), Value::F32(1e-5)),
            (format!("{arch}.context_length"), Value::U32(32)),
            (format!("{arch}.rope.dimension_count"), Value::U32(16)),
        ];
        md.extend(extra);
        let md: Vec<(&str, &Value)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let ts: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
        gguf_file::write(&mut std::fs::File::create(path).unwrap(), &md, &ts).unwrap();
    }

    /// The tensor path's RoPE (pair tables, four tensor ops, each row at its own position)
    /// against the host rotation (`llama_host::rotate`, pair by pair), up to last bits: GPU
    /// kernels may contract a product and a sum into one FMA.
    fn assert_rope_forms_agree(dense: &BurnLlama, path: &Path) {
        let (cfg, dev) = (&dense.w.cfg, &dense.w.device);
        let (dh, rd, heads) = (cfg.head_dim(), cfg.rope_dim, 2);
        let half = rd / 2;
        let (cos, sin) = cfg.rope_tables(&DecoderSource::open(path).unwrap().rope_factors(cfg).unwrap());
        let positions = [0usize, 17, 3, 4, 29, 11];
        let t = positions.len();
        let values: Vec<f32> = (0..t * heads * dh).map(|i| ((i as f32) * 0.731).sin() * 3.0).collect();
        let pos = i32_tensor(positions.iter().map(|&p| p as i32).collect(), dev);
        let table = |m: &Tensor<2>| m.clone().select(0, pos.clone()).reshape([t, 1, rd]);
        let (c, sn) = (table(&dense.w.pair_tables.0), table(&dense.w.pair_tables.1));
        let got = dense.w.rope(f32_tensor(values.clone(), [t, heads, dh], dev), &c, &sn).into_data().try_into_vec::<f32>().unwrap();
        let mut want = values;
        for (r, &p) in positions.iter().enumerate() {
            for head in want[r * heads * dh..(r + 1) * heads * dh].chunks_exact_mut(dh) {
                llama_host::rotate(&mut head[..rd], &cos[p * half..][..half], &sin[p * half..][..half], cfg.family.rope);
            }
        }
        assert!(got.iter().zip(&want).all(|(p, q)| (p - q).abs() <= 1e-6 * q.abs().max(1.0)), "{got:?} vs {want:?}");
    }

    /// The same for Qwen's rotation of a head's halves.
    #[test]
    fn pretrained_burn_llama_rope_halves() {
        let path = crate::process::env::reference_dir().parent().unwrap().join("llm/tiny-qwen3.F32.gguf");
        let dense = BurnLlama::load_with(&path, &crate::testing::device(), false).unwrap();
        assert_eq!(dense.w.cfg.family, crate::pretrained::decoder_family::Family { qkv_bias: false, qk_norm: true, rope: RopeStyle::Halves, fused: false, gemma: false, post_norms: false });
        assert_eq!((dense.w.cfg.head_dim(), dense.w.cfg.rope_dim, dense.w.cfg.embedding_length), (32, 32, 64));
        assert_rope_forms_agree(&dense, &path);
    }

    /// A step that fails part-way on the tensor path fails its sessions and empties the pool,
    /// whose tensors it may have left half-written: the model's other sessions then refuse to
    /// step (their pages are gone) with an error that says so, and new sessions work.
    #[test]
    fn pretrained_burn_llama_tensor_path_recovers_from_a_failed_step() {
        let dir = TempDir::new("llama-pool");
        let path = dir.path().join("tiny.gguf");
        write_tiny(&path, "llama", true);
        let model = BurnLlama::load_with(&path, &crate::testing::device(), false).unwrap();
        let (mut a, mut b) = (model.session().unwrap(), model.session().unwrap());
        let want = a.forward(&[1, 2, 3], 0).unwrap();
        b.forward(&[4, 5], 0).unwrap();
        model.w.pool.lock().unwrap().lose_a_layer();
        let e = err_text(a.forward(&[4], 3));
        assert!(e.contains("step: ") && e.contains("panicked"), "{e}");
        assert!(err_text(a.forward(&[4], 3)).contains("failed in an earlier step"));
        assert!(err_text(b.forward(&[6], 2)).contains("cache was emptied"));
        drop((a, b));
        assert_eq!(model.session().unwrap().forward(&[1, 2, 3], 0).unwrap(), want);
    }

    #[test]
    fn pretrained_burn_llama_tiny_model_and_errors() {
        let dir = TempDir::new("llama");
        let dev = crate::testing::device();
        assert!(err_text(load(&dir.path().join("none.gguf"), &dev)).contains("file not found"));

        let other = dir.path().join("other.gguf");
        write_tiny(&other, "gemma3n", true);
        let e = err_text(load(&other, &dev));
        assert!(e.contains("unknown architecture `gemma3n`"), "{e}");

        for tied in [true, false] {
            let path = dir.path().join(format!("tiny{tied}.gguf"));
            write_tiny(&path, "llama", tied);
            let model = BurnLlama::load(&path, &dev).unwrap();
            assert_eq!((model.vocab_size(), model.context_length()), (40, 32));
            let mut s = model.session().unwrap();
            let a = s.forward(&[1, 2, 3], 0).unwrap();
            let b = s.forward(&[4], 3).unwrap();
            assert_eq!((a.len(), b.len()), (40, 40));
            assert!(a.iter().chain(&b).all(|x| x.is_finite()));
            let mut t = model.session().unwrap();
            let c = t.forward(&[1, 2, 3, 4], 0).unwrap();
            let diff = b.iter().zip(&c).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            assert!(diff < 1e-4, "{diff}");
            assert!(err_text(t.forward(&[1; 29], 4)).contains("exceeds the model's context length 32"));
            // Every weight dequantised (the other devices' path) against the mix of quantised
            // layers (Q8_0 embedding, Q4_1 blocks) and f32 ones (rows of 8) this file loads into.
            let cpu = dev.kind == crate::device::DeviceKind::Cpu;
            let dense = BurnLlama::load_with(&path, &dev, false).unwrap();
            let mut r = dense.session().unwrap();
            r.forward(&[1, 2, 3], 0).unwrap();
            let d = r.forward(&[4], 3).unwrap();
            let diff = b.iter().zip(&d).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            // the quantised layers round activations to 8 bits (greedy_check::Q8_LOGIT_DRIFT)
            let scale = d.iter().fold(0f32, |a, v| a.max(v.abs()));
            assert!(diff < if cpu { greedy_check::Q8_LOGIT_DRIFT * scale.max(1.0) } else { 5e-4 }, "{diff}");
        }

        // The dequantised path's RoPE agrees with the pairwise form.
        let path = dir.path().join("tinytrue.gguf");
        let dense = BurnLlama::load_with(&path, &dev, false).unwrap();
        assert_eq!(dense.w.cfg.family.rope, RopeStyle::Interleaved);
        assert_rope_forms_agree(&dense, &path);

        // Rope frequency factors of 2 rotate like linear position scaling by a factor of 2.
        let logits = |extra: Vec<(String, Value)>, freqs: bool| {
            let path = dir.path().join("rope.gguf");
            write_tiny_with(&path, "llama", true, extra, freqs);
            let model = BurnLlama::load(&path, &dev).unwrap();
            let mut s = model.session().unwrap();
            s.forward(&[5, 6, 7, 8, 9], 0).unwrap()
        };
        let plain = logits(vec![], false);
        let freqs = logits(vec![], true);
        let linear = logits(
            vec![("llama.rope.scaling.type".into(), Value::String("linear".into())), ("llama.rope.scaling.factor".into(), Value::F32(2.0))],
            false,
        );
        let diff = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        assert!(diff(&freqs, &linear) < 1e-5, "{}", diff(&freqs, &linear));
        assert!(diff(&plain, &linear) > 1e-4);
        let path = dir.path().join("yarn.gguf");
        write_tiny_with(&path, "llama", true, vec![("llama.rope.scaling.type".into(), Value::String("yarn".into()))], false);
        assert!(err_text(load(&path, &dev)).contains("unsupported rope scaling `yarn`"));
        // heads as wide as the key length says, whatever hidden / heads is (Qwen3's layout)
        write_tiny_with(&path, "llama", true, vec![("llama.attention.key_length".into(), Value::U32(32))], false);
        let e = err_text(load(&path, &dev));
        assert!(e.contains("`blk.0.attn_q.weight`") && e.contains("expected [128, 64]"), "{e}");
        let lengths = vec![("llama.attention.key_length".into(), Value::U32(16)), ("llama.attention.value_length".into(), Value::U32(32))];
        write_tiny_with(&path, "llama", true, lengths, false);
        assert!(err_text(load(&path, &dev)).contains("value_length 32 differs from the key length 16"));
        write_tiny_with(&path, "llama", true, vec![("llama.block_count".into(), Value::U32(3))], false);
        assert!(err_text(load(&path, &dev)).contains("tensor `blk.2.attn_q.weight` is missing"));

        // A long prompt agrees with a shorter prompt plus one cached step, on both paths.
        let path = dir.path().join("long.gguf");
        write_tiny_with(&path, "llama", true, vec![("llama.context_length".into(), Value::U32(1024))], false);
        let prompt: Vec<u32> = (0..600).map(|i| (i * 7 % 40) as u32).collect();
        let model = BurnLlama::load(&path, &dev).unwrap();
        let whole = model.session().unwrap().forward(&prompt, 0).unwrap();
        let mut s = model.session().unwrap();
        s.forward(&prompt[..599], 0).unwrap();
        let stepped = s.forward(&prompt[599..], 599).unwrap();
        assert!(diff(&whole, &stepped) < 1e-4, "{}", diff(&whole, &stepped));
        let dense = BurnLlama::load_with(&path, &dev, false).unwrap();
        let whole = dense.session().unwrap().forward(&prompt, 0).unwrap();
        let mut s = dense.session().unwrap();
        s.forward(&prompt[..599], 0).unwrap();
        let stepped = s.forward(&prompt[599..], 599).unwrap();
        assert!(diff(&whole, &stepped) < 1e-4, "{}", diff(&whole, &stepped));

        // The same file truncated.
        let full = std::fs::read(dir.path().join("tinytrue.gguf")).unwrap();
        let cut = dir.path().join("cut.gguf");
        std::fs::write(&cut, &full[..full.len() - 64]).unwrap();
        assert!(err_text(load(&cut, &dev)).contains("truncated"));
    }
}
