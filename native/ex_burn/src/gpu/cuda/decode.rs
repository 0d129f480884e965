//! A Llama-family decoder step on CUDA in a few launches, replayed as a CUDA graph.
//!
//! Why: through Burn's tensors a decoding step of SmolLM2 is about 190 cubecl launches, and the
//! host's cost of issuing each one (not the GPU's work) sets the step's time. Here a step is the
//! kernels of `decode.cu`: six a layer, plus the embedding, the output head and the argmax. Every
//! value a step varies (tokens, positions, each row's cache) lives in device buffers written
//! before the step, so the launches of a step of `r` rows are captured once as a CUDA graph and
//! replayed for every later step of `r` rows: one launch from the host.
//!
//! Rows are `(token, position, cache)` triples of any sequences: a decoding step of several
//! sequences, a prompt's tokens (rows of one cache at consecutive positions, whose keys and values
//! are written before any row attends), or both. Each sequence's cache is its own device buffer,
//! `[layer][capacity][kv_heads · head_dim]` f32 for keys and again for values.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{sys, CudaContext, CudaFunction, CudaGraph, CudaSlice, CudaStream, DevicePtr, DriverError, LaunchConfig, PushKernelArg};

use crate::kernels::cpu::quant::groups::Groups;

/// Rows a step takes at most; more rows run as several steps, in order.
pub const MAX_ROWS: usize = 32;
/// Threads of a matrix block: a warp an output row at a time.
const MATVEC_THREADS: u32 = 256;
/// Matrix blocks an SM is given at most: a block's warps walk the rows beyond, so that each
/// block's copy of the input (and its norm) serves several rows of the matrix.
const BLOCKS_PER_SM: u32 = 4;
/// The dynamic shared memory a matrix block may take without opting in (48 KiB), less its own.
const SHARED_BYTES: usize = 48 * 1024 - 256;
/// Activation rows a matrix pass holds (`MAXR` in decode.cu).
const PASS_ROWS: usize = 8;

fn failed(what: &str, e: impl std::fmt::Debug) -> String {
    format!("{what}: {e:?}")
}

/// A matrix as codes on the device (`gpu::blocks`' form): `w = scale · (code − zero) + offset`.
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
    bits: u32,
    group: usize,
    zero: f32,
    codes: CudaSlice<u32>,
    scales: CudaSlice<f32>,
    offsets: Option<CudaSlice<f32>>,
}

/// Matrices of one width stacked along their rows, each with its own layout.
pub struct Stack(pub Vec<Arc<Matrix>>);

impl Stack {
    fn rows(&self) -> usize {
        self.0.iter().map(|m| m.rows).sum()
    }
}

/// One layer's weights.
pub struct Layer {
    pub attn_norm: CudaSlice<f32>,
    /// Q, K and V stacked: `(heads + 2 kv_heads) · head_dim` outputs.
    pub qkv: Stack,
    pub qkv_bias: Option<CudaSlice<f32>>,
    pub out: Stack,
    pub ffn_norm: CudaSlice<f32>,
    /// Gate and up stacked: `2 · ffn` outputs.
    pub gate_up: Stack,
    pub down: Stack,
    /// The attention window of a sliding layer.
    pub window: Option<usize>,
}

/// The shapes a step runs.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub rope_half: usize,
    /// Pairs `(2i, 2i+1)` rotate together; else `(i, i + half)`.
    pub interleaved: bool,
    pub eps: f32,
    pub attn_scale: f32,
    pub vocab: usize,
    pub context: usize,
}

impl Shape {
    fn width(&self) -> usize {
        (self.heads + 2 * self.kv_heads) * self.head_dim
    }

    pub fn kv_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Whether the kernels take these shapes: a head fits an attention block, and a row of every
    /// matrix's input fits a block's shared memory.
    pub fn fits(&self) -> bool {
        let widest = self.hidden.max(self.ffn).max(self.heads * self.head_dim);
        self.head_dim <= 256 && self.head_dim > 0 && self.kv_heads > 0 && self.heads % self.kv_heads == 0 && widest * 4 <= SHARED_BYTES && 2 * self.rope_half <= self.head_dim
    }
}

/// A sequence's keys and values.
pub struct Cache {
    k: CudaSlice<f32>,
    v: CudaSlice<f32>,
    /// Positions a layer holds.
    pub cap: usize,
}

/// One row of a step.
#[derive(Clone, Copy, Debug)]
pub struct Row {
    pub token: u32,
    pub pos: usize,
    k: u64,
    v: u64,
    cap: usize,
}

/// What a step reads back for a row: its logits' first maximum, or its logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Read {
    Token,
    Logits,
}

/// What a step answers for a row it was asked about.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    Token(u32),
    Logits(Vec<f32>),
}

struct Kernels {
    matvec4: CudaFunction,
    matvec8: CudaFunction,
    embed: CudaFunction,
    rope_kv: CudaFunction,
    attend: CudaFunction,
    argmax: CudaFunction,
}

/// Device buffers a step reads and writes, at fixed addresses (the graphs hold them).
struct Buffers {
    /// tokens, positions and capacities, `MAX_ROWS` each
    ints: CudaSlice<i32>,
    /// key and value cache addresses, `MAX_ROWS` each
    ptrs: CudaSlice<u64>,
    x: CudaSlice<f32>,
    qkv: CudaSlice<f32>,
    ctx: CudaSlice<f32>,
    gu: CudaSlice<f32>,
    logits: CudaSlice<f32>,
    ids: CudaSlice<i32>,
    scores: CudaSlice<f32>,
}

/// A captured graph; only used under the decoder's lock.
struct Graph(CudaGraph);
// SAFETY: the graph is created, launched and dropped only while its owner's mutex is held, so no
// two threads touch it at once (CUDA's rule for graph objects).
unsafe impl Send for Graph {}

struct State {
    bufs: Buffers,
    graphs: HashMap<usize, Graph>,
}

pub struct Decoder {
    stream: Arc<CudaStream>,
    k: Kernels,
    pub shape: Shape,
    layers: Vec<Layer>,
    embed: Arc<Matrix>,
    out_norm: CudaSlice<f32>,
    /// The output projection, as the one matrix of a stack.
    output: Stack,
    cos: CudaSlice<f32>,
    sin: CudaSlice<f32>,
    graphs: bool,
    /// The most matrix blocks a launch takes.
    max_blocks: u32,
    state: Mutex<State>,
}

/// The device's context and a stream of its own, with cudarc's per-buffer event tracking off:
/// everything here runs on one stream, and a captured graph must hold launches only.
pub fn stream(ordinal: usize) -> Result<Arc<CudaStream>, String> {
    let ctx = CudaContext::new(ordinal).map_err(|e| failed("CUDA context", e))?;
    // SAFETY: no buffer of this context wrapper exists yet, and all its work goes to one stream
    unsafe { ctx.disable_event_tracking() };
    ctx.new_stream().map_err(|e| failed("CUDA stream", e))
}

/// Uploads a matrix's codes.
pub fn matrix(stream: &Arc<CudaStream>, g: Groups, rows: usize, cols: usize) -> Result<Matrix, String> {
    let up = |v: &[f32]| stream.clone_htod(v).map_err(|e| failed("uploading weights", e));
    Ok(Matrix {
        rows,
        cols,
        bits: g.layout.bits,
        group: g.layout.group,
        zero: g.layout.zero as f32,
        codes: stream.clone_htod(&g.codes).map_err(|e| failed("uploading weights", e))?,
        scales: up(&g.scales)?,
        offsets: if g.layout.offset { Some(up(&g.offsets)?) } else { None },
    })
}

pub fn values(stream: &Arc<CudaStream>, v: &[f32]) -> Result<CudaSlice<f32>, String> {
    stream.clone_htod(v).map_err(|e| failed("uploading weights", e))
}

fn ptr<T>(s: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    s.device_ptr(stream).0
}

fn opt_ptr<T>(s: &Option<CudaSlice<T>>, stream: &CudaStream) -> u64 {
    s.as_ref().map_or(0, |s| ptr(s, stream))
}

/// The weights `Decoder::new` takes.
pub struct Weights {
    pub layers: Vec<Layer>,
    pub embed: Arc<Matrix>,
    pub out_norm: CudaSlice<f32>,
    pub output: Arc<Matrix>,
    /// `[context, rope_half]` each.
    pub cos: CudaSlice<f32>,
    pub sin: CudaSlice<f32>,
}

impl Decoder {
    /// Compiles the kernels for the stream's device and sets up a step's buffers.
    pub fn new(stream: Arc<CudaStream>, shape: Shape, w: Weights, graphs: bool) -> Result<Decoder, String> {
        let ctx = stream.context().clone();
        let attr = |a| ctx.attribute(a).map_err(|e| failed("device attribute", e));
        let (major, minor) = (
            attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let sms = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let opts = cudarc::nvrtc::CompileOptions { options: vec![format!("--gpu-architecture=compute_{major}{minor}")], ..Default::default() };
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(include_str!("decode.cu"), opts).map_err(|e| failed("compiling decode.cu", e))?;
        let module = ctx.load_module(ptx).map_err(|e| failed("loading decode.cu", e))?;
        let f = |name: &str| module.load_function(name).map_err(|e| failed(name, e));
        let k = Kernels { matvec4: f("matvec4")?, matvec8: f("matvec8")?, embed: f("embed")?, rope_kv: f("rope_kv")?, attend: f("attend")?, argmax: f("argmax_rows")? };
        let zeros = |n: usize| stream.alloc_zeros::<f32>(n.max(1)).map_err(|e| failed("step buffers", e));
        let s = shape;
        let bufs = Buffers {
            ints: stream.alloc_zeros::<i32>(3 * MAX_ROWS).map_err(|e| failed("step buffers", e))?,
            ptrs: stream.alloc_zeros::<u64>(2 * MAX_ROWS).map_err(|e| failed("step buffers", e))?,
            x: zeros(MAX_ROWS * s.hidden)?,
            qkv: zeros(MAX_ROWS * s.width())?,
            ctx: zeros(MAX_ROWS * s.heads * s.head_dim)?,
            gu: zeros(MAX_ROWS * 2 * s.ffn)?,
            logits: zeros(MAX_ROWS * s.vocab)?,
            ids: stream.alloc_zeros::<i32>(MAX_ROWS).map_err(|e| failed("step buffers", e))?,
            scores: zeros(MAX_ROWS * s.heads * s.context)?,
        };
        let state = Mutex::new(State { bufs, graphs: HashMap::new() });
        Ok(Decoder { stream, k, shape, layers: w.layers, embed: w.embed, out_norm: w.out_norm, output: Stack(vec![w.output]), cos: w.cos, sin: w.sin, graphs, max_blocks: BLOCKS_PER_SM * sms.max(1) as u32, state })
    }

    /// Kernel launches a step takes: the embedding, six a layer (one more for each further
    /// layout of a stacked matrix), the output head and the argmax.
    pub fn launches(&self) -> usize {
        let layers: usize = self.layers.iter().map(|l| 2 + l.qkv.0.len() + l.out.0.len() + l.gate_up.0.len() + l.down.0.len()).sum();
        layers + 3
    }

    /// An empty cache of `cap` positions a layer.
    pub fn cache(&self, cap: usize) -> Result<Cache, String> {
        let n = self.layers.len() * cap.max(1) * self.shape.kv_width();
        let alloc = || self.stream.alloc_zeros::<f32>(n).map_err(|e| failed(&format!("a KV cache of {cap} positions"), e));
        Ok(Cache { k: alloc()?, v: alloc()?, cap: cap.max(1) })
    }

    /// A cache of `cap` positions holding the first `len` of `from`'s.
    pub fn copy(&self, from: &Cache, len: usize, cap: usize) -> Result<Cache, String> {
        let mut to = self.cache(cap.max(len))?;
        let w = self.shape.kv_width();
        for l in 0..self.layers.len() {
            let (src, dst) = (l * from.cap * w, l * to.cap * w);
            for (a, b) in [(&from.k, &mut to.k), (&from.v, &mut to.v)] {
                self.stream.memcpy_dtod(&a.slice(src..src + len * w), &mut b.slice_mut(dst..dst + len * w)).map_err(|e| failed("copying a KV cache", e))?;
            }
        }
        Ok(to)
    }

    /// `token` at `pos` of the sequence whose cache is `cache`.
    pub fn row(&self, cache: &Cache, token: u32, pos: usize) -> Row {
        Row { token, pos, k: ptr(&cache.k, &self.stream), v: ptr(&cache.v, &self.stream), cap: cache.cap }
    }

    /// Runs `rows` (at most `MAX_ROWS`) through the model, and reads back what `read` asks for
    /// (`(row, what)` pairs), in its order.
    pub fn step(&self, rows: &[Row], read: &[(usize, Read)]) -> Result<Vec<Answer>, String> {
        assert!(!rows.is_empty() && rows.len() <= MAX_ROWS, "a step of {} rows", rows.len());
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let State { bufs, graphs } = &mut *state;
        let mut ints = vec![0i32; 3 * MAX_ROWS];
        let mut ptrs = vec![0u64; 2 * MAX_ROWS];
        for (i, r) in rows.iter().enumerate() {
            ints[i] = r.token as i32;
            ints[MAX_ROWS + i] = r.pos as i32;
            ints[2 * MAX_ROWS + i] = r.cap as i32;
            ptrs[i] = r.k;
            ptrs[MAX_ROWS + i] = r.v;
        }
        let s = &self.stream;
        s.memcpy_htod(&ints, &mut bufs.ints).map_err(|e| failed("writing the step's rows", e))?;
        s.memcpy_htod(&ptrs, &mut bufs.ptrs).map_err(|e| failed("writing the step's rows", e))?;
        let n = rows.len();
        if self.graphs {
            if !graphs.contains_key(&n) {
                s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED).map_err(|e| failed("beginning a graph capture", e))?;
                let launched = self.launch(bufs, n);
                let graph = s.end_capture(sys::CUgraphInstantiate_flags(0));
                launched.map_err(|e| failed("recording a step", e))?;
                let graph = graph.map_err(|e| failed("instantiating a step's graph", e))?.ok_or("the capture recorded nothing")?;
                graphs.insert(n, Graph(graph));
            }
            graphs[&n].0.launch().map_err(|e| failed("launching a step's graph", e))?;
        } else {
            self.launch(bufs, n).map_err(|e| failed("launching a step", e))?;
        }
        let mut ids = vec![0i32; n];
        s.memcpy_dtoh(&bufs.ids.slice(0..n), &mut ids).map_err(|e| failed("reading the step's tokens", e))?;
        let vocab = self.shape.vocab;
        let mut out = Vec::with_capacity(read.len());
        for &(r, what) in read {
            out.push(match what {
                Read::Token => Answer::Token(ids[r] as u32),
                Read::Logits => {
                    let mut l = vec![0f32; vocab];
                    s.memcpy_dtoh(&bufs.logits.slice(r * vocab..(r + 1) * vocab), &mut l).map_err(|e| failed("reading logits", e))?;
                    Answer::Logits(l)
                }
            });
        }
        s.synchronize().map_err(|e| failed("a step", e))?;
        Ok(out)
    }

    /// The launches of a step of `n` rows (the rows already in `bufs`).
    fn launch(&self, bufs: &Buffers, n: usize) -> Result<(), DriverError> {
        let (s, sh) = (&*self.stream, self.shape);
        let (h, dh, nh, nkv, f) = (sh.hidden as i32, sh.head_dim as i32, sh.heads as i32, sh.kv_heads as i32, sh.ffn as i32);
        let rows = n as i32;
        let ints = ptr(&bufs.ints, s);
        let (tokens, pos, cap) = (ints, ints + 4 * MAX_ROWS as u64, ints + 8 * MAX_ROWS as u64);
        let kb = ptr(&bufs.ptrs, s);
        let vb = kb + 8 * MAX_ROWS as u64;
        let (x, qkv, ctx, gu, logits) = (ptr(&bufs.x, s), ptr(&bufs.qkv, s), ptr(&bufs.ctx, s), ptr(&bufs.gu, s), ptr(&bufs.logits, s));
        let (ids, scores) = (ptr(&bufs.ids, s), ptr(&bufs.scores, s));
        let e = &self.embed;
        let (ecodes, escales, eoffsets) = (ptr(&e.codes, s), ptr(&e.scales, s), opt_ptr(&e.offsets, s));
        let (ebits, ecols, egroup) = (e.bits as i32, e.cols as i32, e.group as i32);
        let cfg = |grid: (u32, u32), block: u32| LaunchConfig { grid_dim: (grid.0, grid.1, 1), block_dim: (block, 1, 1), shared_mem_bytes: 0 };
        // SAFETY (every launch here): the arguments match decode.cu's signatures, and every
        // buffer is sized for MAX_ROWS rows of these shapes
        unsafe { s.launch_builder(&self.k.embed).arg(&ecodes).arg(&escales).arg(&eoffsets).arg(&ebits).arg(&ecols).arg(&egroup).arg(&e.zero).arg(&tokens).arg(&x).launch(cfg((n as u32, 1), 256))? };
        let rope_threads = (sh.head_dim.max(sh.rope_half).div_ceil(32) * 32).min(256) as u32;
        let (half, inter) = (sh.rope_half as i32, sh.interleaved as i32);
        let (cos, sin) = (ptr(&self.cos, s), ptr(&self.sin, s));
        let ctx_len = sh.context as i32;
        for (l, layer) in self.layers.iter().enumerate() {
            let li = l as i32;
            self.matvec(&layer.qkv, x, h, rows, 1, ptr(&layer.attn_norm, s), qkv, sh.width() as i32, false)?;
            let bias = opt_ptr(&layer.qkv_bias, s);
            unsafe {
                s.launch_builder(&self.k.rope_kv)
                    .arg(&qkv)
                    .arg(&nh)
                    .arg(&nkv)
                    .arg(&dh)
                    .arg(&half)
                    .arg(&inter)
                    .arg(&bias)
                    .arg(&cos)
                    .arg(&sin)
                    .arg(&pos)
                    .arg(&kb)
                    .arg(&vb)
                    .arg(&cap)
                    .arg(&li)
                    .launch(cfg((n as u32, (sh.heads + sh.kv_heads) as u32), rope_threads))?
            };
            let window = layer.window.map_or(0, |w| w as i32);
            unsafe {
                s.launch_builder(&self.k.attend)
                    .arg(&qkv)
                    .arg(&nh)
                    .arg(&nkv)
                    .arg(&dh)
                    .arg(&sh.attn_scale)
                    .arg(&window)
                    .arg(&pos)
                    .arg(&kb)
                    .arg(&vb)
                    .arg(&cap)
                    .arg(&li)
                    .arg(&scores)
                    .arg(&ctx_len)
                    .arg(&ctx)
                    .launch(cfg((n as u32, sh.heads as u32), 256))?
            };
            self.matvec(&layer.out, ctx, nh * dh, rows, 0, 0, x, h, true)?;
            self.matvec(&layer.gate_up, x, h, rows, 1, ptr(&layer.ffn_norm, s), gu, 2 * f, false)?;
            self.matvec(&layer.down, gu, 2 * f, rows, 2, 0, x, h, true)?;
        }
        self.matvec(&self.output, x, h, rows, 1, ptr(&self.out_norm, s), logits, sh.vocab as i32, false)?;
        let vocab = sh.vocab as i32;
        unsafe { s.launch_builder(&self.k.argmax).arg(&logits).arg(&vocab).arg(&ids).launch(cfg((n as u32, 1), 1024))? };
        Ok(())
    }

    /// `out[r] (+)= input(x[r]) · Wᵀ` for the stack's matrices in turn (`mode` as decode.cu's
    /// `matvec`: 0 plain, 1 RMS-normalised with `norm`, 2 SiLU product).
    #[allow(clippy::too_many_arguments)]
    fn matvec(&self, w: &Stack, x: u64, x_stride: i32, rows: i32, mode: i32, norm: u64, out: u64, out_stride: i32, residual: bool) -> Result<(), DriverError> {
        let s = &*self.stream;
        let mut first = 0u64;
        for m in &w.0 {
            let cols = m.cols as i32;
            let pass = PASS_ROWS.min(rows as usize).min(SHARED_BYTES / (4 * m.cols)).max(1) as i32;
            let (codes, scales, offsets) = (ptr(&m.codes, s), ptr(&m.scales, s), opt_ptr(&m.offsets, s));
            let (mrows, group, eps, res) = (m.rows as i32, m.group as i32, self.shape.eps, residual as i32);
            let at = out + 4 * first;
            let f = if m.bits == 4 { &self.k.matvec4 } else { &self.k.matvec8 };
            let warps = MATVEC_THREADS / 32;
            let cfg = LaunchConfig { grid_dim: ((m.rows as u32).div_ceil(warps).min(self.max_blocks), 1, 1), block_dim: (MATVEC_THREADS, 1, 1), shared_mem_bytes: (pass as usize * m.cols * 4) as u32 };
            // SAFETY: as in `launch`
            unsafe {
                s.launch_builder(f)
                    .arg(&codes)
                    .arg(&scales)
                    .arg(&offsets)
                    .arg(&mrows)
                    .arg(&cols)
                    .arg(&group)
                    .arg(&m.zero)
                    .arg(&x)
                    .arg(&x_stride)
                    .arg(&rows)
                    .arg(&pass)
                    .arg(&mode)
                    .arg(&norm)
                    .arg(&eps)
                    .arg(&at)
                    .arg(&out_stride)
                    .arg(&res)
                    .launch(cfg)?
            };
            first += m.rows as u64;
        }
        debug_assert_eq!(first as usize, w.rows());
        Ok(())
    }
}
