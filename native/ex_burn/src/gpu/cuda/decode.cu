// The CUDA decoder's kernels (gpu/cuda/decode.rs), compiled by NVRTC when a model loads.
//
// A step runs a set of rows, each a (token, position, cache) of some sequence, through the layers:
// a layer is six launches (Q/K/V with the attention norm; RoPE and the cache writes; attention;
// the output projection and its residual; gate and up with the feed-forward norm; down with the
// SiLU product and its residual). Everything a step varies (tokens, positions, the caches'
// addresses) is read from device memory, so one captured graph replays every step of a size.
//
// Weights are codes with a scale (and an offset) per group, as gpu::blocks keeps them:
// w = scale * (code - zero) + offset, GGML's values.

typedef unsigned long long u64;
typedef unsigned long long usize;
#define NEG_INF __int_as_float(0xff800000)

#define FULL 0xffffffffu
// activation rows a matrix pass keeps in registers
#define MAXR 8

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL, v, o));
    return v;
}

// The block's total (or maximum) of one value a thread, returned to every thread; `red` holds
// 32 floats.
template <bool MAX>
__device__ float block_reduce(float v, float* red) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = MAX ? warp_max(v) : warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    const float t = lane < nw ? red[lane] : (MAX ? NEG_INF : 0.0f);
    return MAX ? warp_max(t) : warp_sum(t);
}

// GGML's value of a code: the product and the sum rounded apart, as the host's kernels do.
__device__ __forceinline__ float weight(float scale, unsigned code, float zero, float offset) {
    return __fadd_rn(__fmul_rn(scale, (float)code - zero), offset);
}

// out[r][n] (+)= input(x[r]) . W[n] for rows r < nrows and n < rows, one warp a row of W at a
// time. mode 0: x as it is; 1: RMS-normalised with `normw`; 2: silu(x[:cols]) * x[cols:2 cols].
// A lane takes whole words of codes; the block's copy of x is stored transposed by a word's
// values (value c at (c % per_word) * words + c / per_word), so that the lanes of a warp, on
// consecutive words, read consecutive floats of shared memory.
template <int BITS>
__device__ void matvec(const unsigned* __restrict__ codes, const float* __restrict__ scales,
                       const float* __restrict__ offsets, int rows, int cols, int group, float zero,
                       const float* x, int x_stride, int nrows, int pass_rows, int mode,
                       const float* __restrict__ normw, float eps, float* out, int out_stride,
                       int residual) {
    extern __shared__ float xs[];
    __shared__ float red[32];
    const int per_word = 32 / BITS;
    const unsigned mask = (1u << BITS) - 1u;
    const int words = cols / per_word;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
    for (int r0 = 0; r0 < nrows; r0 += pass_rows) {
        const int pr = min(pass_rows, nrows - r0);
        __syncthreads();
        for (int i = threadIdx.x; i < pr * cols; i += blockDim.x) {
            const int r = i / cols, c = i - r * cols;
            const float* xr = x + (usize)(r0 + r) * x_stride;
            float v = xr[c];
            if (mode == 2) v = v / (1.0f + expf(-v)) * xr[cols + c];
            xs[r * cols + (c % per_word) * words + c / per_word] = v;
        }
        __syncthreads();
        if (mode == 1) {
            for (int r = 0; r < pr; r++) {
                float* xr = xs + r * cols;
                float s = 0.0f;
                for (int i = threadIdx.x; i < cols; i += blockDim.x) s += xr[i] * xr[i];
                s = block_reduce<false>(s, red);
                const float scale = 1.0f / sqrtf(s / (float)cols + eps);
                for (int c = threadIdx.x; c < cols; c += blockDim.x) {
                    const int i = (c % per_word) * words + c / per_word;
                    xr[i] = xr[i] * scale * normw[c];
                }
            }
            __syncthreads();
        }
        for (int n = blockIdx.x * nwarps + warp; n < rows; n += gridDim.x * nwarps) {
            float acc[MAXR];
#pragma unroll
            for (int r = 0; r < MAXR; r++) acc[r] = 0.0f;
            const unsigned* wrow = codes + (usize)n * words;
            const usize first = (usize)n * cols;
            for (int w = lane; w < words; w += 32) {
                const unsigned word = wrow[w];
                const usize g = (first + (usize)w * per_word) / group;
                const float s = scales[g], o = offsets ? offsets[g] : 0.0f;
#pragma unroll
                for (int k = 0; k < per_word; k++) {
                    const float wv = weight(s, (word >> (BITS * k)) & mask, zero, o);
                    const float* xk = xs + k * words + w;
#pragma unroll
                    for (int r = 0; r < MAXR; r++)
                        if (r < pr) acc[r] = fmaf(wv, xk[r * cols], acc[r]);
                }
            }
#pragma unroll
            for (int r = 0; r < MAXR; r++) {
                if (r < pr) {
                    const float v = warp_sum(acc[r]);
                    if (lane == 0) {
                        float* o = out + (usize)(r0 + r) * out_stride + n;
                        *o = residual ? *o + v : v;
                    }
                }
            }
        }
    }
}

#define MATVEC(NAME, BITS)                                                                              \
    extern "C" __global__ void NAME(const unsigned* codes, const float* scales, const float* offsets,   \
                                    int rows, int cols, int group, float zero, const float* x,          \
                                    int x_stride, int nrows, int pass_rows, int mode,                   \
                                    const float* normw, float eps, float* out, int out_stride,          \
                                    int residual) {                                                     \
        matvec<BITS>(codes, scales, offsets, rows, cols, group, zero, x, x_stride, nrows, pass_rows,    \
                     mode, normw, eps, out, out_stride, residual);                                      \
    }
MATVEC(matvec4, 4)
MATVEC(matvec8, 8)

// out[r] = row tokens[r] of the embedding, one block a row.
extern "C" __global__ void embed(const unsigned* codes, const float* scales, const float* offsets,
                                 int bits, int cols, int group, float zero, const int* tokens,
                                 float* out) {
    const int r = blockIdx.x;
    const int per_word = 32 / bits;
    const unsigned mask = (1u << bits) - 1u;
    const usize first = (usize)tokens[r] * cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const usize i = first + c;
        const unsigned code = (codes[i / per_word] >> (bits * (int)(i % per_word))) & mask;
        const usize g = i / group;
        out[(usize)r * cols + c] = weight(scales[g], code, zero, offsets ? offsets[g] : 0.0f);
    }
}

// One block a (row, head) of qkv ([rows][(nh + 2 nkv) dh]): adds the bias, rotates the query and
// key heads at the row's position, and writes the key and value heads into the row's cache,
// laid out [layer][cap][nkv dh].
extern "C" __global__ void rope_kv(float* qkv, int nh, int nkv, int dh, int half, int interleaved,
                                   const float* bias, const float* cos_t, const float* sin_t,
                                   const int* pos, const u64* kbase, const u64* vbase,
                                   const int* cap, int layer) {
    const int r = blockIdx.x, h = blockIdx.y;
    const int width = (nh + 2 * nkv) * dh;
    float* row = qkv + (usize)r * width;
    float* x = row + (usize)h * dh;
    float* v = row + (usize)(nh + nkv) * dh + (usize)(h - nh) * dh;
    const int p = pos[r];
    if (bias) {
        for (int d = threadIdx.x; d < dh; d += blockDim.x) {
            x[d] += bias[h * dh + d];
            if (h >= nh) v[d] += bias[(nh + nkv) * dh + (h - nh) * dh + d];
        }
        __syncthreads();
    }
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
        const float c = cos_t[(usize)p * half + i], s = sin_t[(usize)p * half + i];
        const float x0 = x[a], x1 = x[b];
        x[a] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
        x[b] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
    }
    if (h < nh) return;
    __syncthreads();
    const int kvw = nkv * dh;
    const usize at = ((usize)layer * cap[r] + p) * kvw + (usize)(h - nh) * dh;
    float* kc = (float*)kbase[r];
    float* vc = (float*)vbase[r];
    for (int d = threadIdx.x; d < dh; d += blockDim.x) {
        kc[at + d] = x[d];
        vc[at + d] = v[d];
    }
}

// One block a (row, query head): the head's attention over its row's cache, positions
// start..=pos (start = pos + 1 - window for a sliding layer). `scores` is [rows][nh][ctx]
// scratch. dh <= blockDim.x = 256.
extern "C" __global__ void attend(const float* qkv, int nh, int nkv, int dh, float scale, int window,
                                  const int* pos, const u64* kbase, const u64* vbase,
                                  const int* cap, int layer, float* scores, int ctx, float* out) {
    __shared__ float red[32];
    __shared__ float part[256];
    const int r = blockIdx.x, h = blockIdx.y;
    const int width = (nh + 2 * nkv) * dh, kvw = nkv * dh, kvh = h / (nh / nkv);
    const int p = pos[r];
    const int len = p + 1, start = window > 0 ? max(0, len - window) : 0;
    const float* q = qkv + (usize)r * width + (usize)h * dh;
    const usize base = (usize)layer * cap[r] * kvw + (usize)kvh * dh;
    const float* kc = (const float*)kbase[r] + base;
    const float* vc = (const float*)vbase[r] + base;
    float* sc = scores + ((usize)r * nh + h) * ctx;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int j = start + warp; j < len; j += nw) {
        const float* k = kc + (usize)j * kvw;
        float s = 0.0f;
        for (int d = lane; d < dh; d += 32) s = fmaf(q[d], k[d], s);
        s = warp_sum(s);
        if (lane == 0) sc[j] = s * scale;
    }
    __syncthreads();
    float m = NEG_INF;
    for (int j = start + threadIdx.x; j < len; j += blockDim.x) m = fmaxf(m, sc[j]);
    m = block_reduce<true>(m, red);
    float t = 0.0f;
    for (int j = start + threadIdx.x; j < len; j += blockDim.x) {
        const float e = expf(sc[j] - m);
        sc[j] = e;
        t += e;
    }
    t = block_reduce<false>(t, red);
    // every thread's exponentials are written before any thread reads them (the sum synced)
    const int parts = blockDim.x / dh, k = threadIdx.x / dh, d = threadIdx.x - k * dh;
    float a = 0.0f;
    if (k < parts)
        for (int j = start + k; j < len; j += parts) a = fmaf(sc[j], vc[(usize)j * kvw + d], a);
    part[threadIdx.x] = a;
    __syncthreads();
    if (threadIdx.x < dh) {
        float s = 0.0f;
        for (int i = 0; i < parts; i++) s += part[i * dh + threadIdx.x];
        out[(usize)r * nh * dh + (usize)h * dh + threadIdx.x] = s / t;
    }
}

// The warp's largest (best, at) pair, the smaller position among equal values, in every lane.
__device__ __forceinline__ void warp_argmax(float& best, int& at) {
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(FULL, best, o);
        const int oi = __shfl_xor_sync(FULL, at, o);
        if (ov > best || (ov == best && oi < at)) {
            best = ov;
            at = oi;
        }
    }
}

// ids[r] = the first position of row r's maximum (0 where no value is greater than -inf).
extern "C" __global__ void argmax_rows(const float* logits, int vocab, int* ids) {
    __shared__ float bv[32];
    __shared__ int bi[32];
    const float* l = logits + (usize)blockIdx.x * vocab;
    float best = NEG_INF;
    int at = 0x7fffffff;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float v = l[i];
        if (v > best) {
            best = v;
            at = i;
        }
    }
    warp_argmax(best, at);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) {
        bv[warp] = best;
        bi[warp] = at;
    }
    __syncthreads();
    if (warp == 0) {
        best = lane < nw ? bv[lane] : NEG_INF;
        at = lane < nw ? bi[lane] : 0x7fffffff;
        warp_argmax(best, at);
        if (lane == 0) ids[blockIdx.x] = at == 0x7fffffff ? 0 : at;
    }
}
