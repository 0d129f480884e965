//! Winograd convolution for 3x3 kernels (stride 1, no dilation, one group, f32) on the CPU.
//!
//! Why: most of the im2col path's time is its matrix product, 9 C multiplications per output.
//! F(m x m, 3 x 3) computes an m x m block of outputs from an (m + 2)² input tile with (m + 2)²
//! products instead of 9 m², at the price of cheap linear transforms: Y = A^T [ sum over input
//! channels of (G g G^T) (.) (B^T d B) ] A.
//!
//! How: the kernels' transform U is computed once per call in f64 and rounded once; the tiles go
//! in blocks of about 32 (one rayon task each) through three steps that keep their data in L2:
//! the inputs' transform V (8 tiles side by side, one per SIMD lane, moved in and out of the
//! lanes by 8 x 8 transposes in registers, since LLVM otherwise makes gathers and scatters), the
//! (m + 2)² products U[xi] . V[xi] by a register-blocked kernel of our own, and the outputs'
//! transform, written into the NCHW output. The tile (F(2,3) or F(4,3)) is whichever needs fewer
//! products, cropped edge tiles counted whole. F(4,3) uses the interpolation points 0, 1, -1,
//! 1/2, -2 and infinity (Barabasz et al., 2020), the most accurate of the usual sets in f32.
//!
//! A transform mixes a tile's inputs, so an Inf or NaN would spread to outputs that never see
//! it, and transformed values may overflow where the direct sum does not: any non-finite input,
//! kernel value or output sends the call back to the im2col path, whose results are Nx's.
//! A conv's gradients are convs too and come here when they qualify. guides/backend.md covers
//! the error bounds and timings. Written against Burn's public API so it could move upstream
//! into burn-flex.

use std::sync::atomic::{AtomicBool, Ordering};

use burn::backend::ops::ConvOptions;
use burn::backend::TensorData;

use super::vector::{flex_f32, par_tasks, simd, SharedMut, Simd};
use crate::dispatch::{self, Prim};

/// Tiles transformed side by side: one 256-bit vector of f32 (LLVM's preferred width for
/// AVX-512 too).
const L: usize = 8;
type Lanes = [f32; L];

/// Below this many values of work a pass runs on the calling thread.
const PAR_MIN: usize = 1 << 15;

#[inline(always)]
fn lanes(f: impl Fn(usize) -> f32) -> Lanes {
    let mut r = [0f32; L];
    for (l, r) in r.iter_mut().enumerate() {
        *r = f(l);
    }
    r
}

/// The output tile: F(2x2, 3x3) or F(4x4, 3x3).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Tile {
    F2,
    F4,
}

/// One F(M x M, 3 x 3) algorithm, N = M + 2: the kernel transform's G, and the input and output
/// transforms applied to one column of N values (a lane per tile).
trait Wino<const M: usize, const N: usize> {
    const G: [[f64; 3]; N];
    /// B^T d
    fn bt(d: &[Lanes; N]) -> [Lanes; N];
    /// A^T m
    fn at(m: &[Lanes; N]) -> [Lanes; M];
}

/// F(2, 3), points 0, 1, -1, infinity: B^T = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0],
/// [0, 1, 0, -1]], A^T = [[1, 1, 1, 0], [0, 1, -1, -1]].
struct F23;

impl Wino<2, 4> for F23 {
    const G: [[f64; 3]; 4] = [[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]];
    #[inline(always)]
    fn bt(d: &[Lanes; 4]) -> [Lanes; 4] {
        [
            lanes(|l| d[0][l] - d[2][l]),
            lanes(|l| d[1][l] + d[2][l]),
            lanes(|l| d[2][l] - d[1][l]),
            lanes(|l| d[1][l] - d[3][l]),
        ]
    }
    #[inline(always)]
    fn at(m: &[Lanes; 4]) -> [Lanes; 2] {
        [lanes(|l| m[0][l] + m[1][l] + m[2][l]), lanes(|l| m[1][l] - m[2][l] - m[3][l])]
    }
}

/// F(4, 3), points 0, 1, -1, 1/2, -2, infinity (derived by Toom-Cook, checked against the direct
/// convolution by the tests): B^T = [[1, -3/2, -2, 3/2, 1, 0], [0, -1, 1/2, 5/2, 1, 0],
/// [0, 1, -5/2, 1/2, 1, 0], [0, -2, -1, 2, 1, 0], [0, 1/2, -1, -1/2, 1, 0],
/// [0, 1, -3/2, -2, 3/2, 1]], A^T = [[1, 1, 1, 1, 1, 0], [0, 1, -1, 1/2, -2, 0],
/// [0, 1, 1, 1/4, 4, 0], [0, 1, -1, 1/8, -8, 1]]. Every coefficient of B and A is exact in f32.
struct F43;

impl Wino<4, 6> for F43 {
    const G: [[f64; 3]; 6] = [
        [1.0, 0.0, 0.0],
        [1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0],
        [-1.0 / 3.0, 1.0 / 3.0, -1.0 / 3.0],
        [-16.0 / 15.0, -8.0 / 15.0, -4.0 / 15.0],
        [1.0 / 15.0, -2.0 / 15.0, 4.0 / 15.0],
        [0.0, 0.0, 1.0],
    ];
    #[inline(always)]
    fn bt(d: &[Lanes; 6]) -> [Lanes; 6] {
        let a = lanes(|l| d[3][l] - d[1][l]);
        let b = lanes(|l| d[4][l] - d[2][l]);
        [
            lanes(|l| (d[0][l] + d[4][l] - 2.0 * d[2][l]) + 1.5 * a[l]),
            lanes(|l| (d[4][l] - d[1][l]) + (0.5 * d[2][l] + 2.5 * d[3][l])),
            lanes(|l| (d[4][l] + d[1][l]) + (0.5 * d[3][l] - 2.5 * d[2][l])),
            lanes(|l| b[l] + 2.0 * a[l]),
            lanes(|l| b[l] - 0.5 * a[l]),
            lanes(|l| (d[1][l] + d[5][l] - 2.0 * d[3][l]) + 1.5 * b[l]),
        ]
    }
    #[inline(always)]
    fn at(m: &[Lanes; 6]) -> [Lanes; 4] {
        let a = lanes(|l| m[1][l] + m[2][l]);
        let b = lanes(|l| m[1][l] - m[2][l]);
        [
            lanes(|l| (m[0][l] + a[l]) + (m[3][l] + m[4][l])),
            lanes(|l| b[l] + (0.5 * m[3][l] - 2.0 * m[4][l])),
            lanes(|l| a[l] + (0.25 * m[3][l] + 4.0 * m[4][l])),
            lanes(|l| (b[l] + m[5][l]) + (0.125 * m[3][l] - 8.0 * m[4][l])),
        ]
    }
}

/// The tile origins of one block of tiles, `L` at a time: where each lane's tile starts in the
/// block's zero-bordered input (`band`) and in the output, and whether it is cropped.
struct Origins {
    band: Vec<[usize; L]>,
    out: Vec<[usize; L]>,
    /// rows and columns of each lane's tile inside the output (M unless at the far edges)
    keep: Vec<[(u8, u8); L]>,
}

/// The layout shared by every block of a call.
#[derive(Clone, Copy)]
struct Plan {
    geo: Geometry,
    /// tiles down and across an image, and per image
    th: usize,
    tw: usize,
    tt: usize,
    /// width of the zero-bordered rows (every tile whole)
    pw: usize,
    checked: bool,
}

/// One block of consecutive tiles (in image, tile row, tile column order) through the input
/// transform, the products and the output transform. A block is part of one image's tiles or
/// whole images. `scratch` holds the block's bordered input of one channel, its V [N^2, C,
/// tbp] and its M [O, N^2, tbp] (tbp = the tile count rounded up to `L`; lanes past the last
/// tile repeat it). Returns false when `plan.checked` and an input or output is not finite.
/// With `AVX`, `L` tiles' rows go in and out of the lanes through 8 x 8 transposes in registers;
/// else one value at a time.
///
/// SAFETY: `out` is the call's NCHW output, which this block alone writes at its tiles; `AVX`
/// only where the CPU has AVX.
#[inline(always)]
unsafe fn block<W: Wino<M, N>, const M: usize, const N: usize, const AVX: bool>(
    plan: &Plan,
    xs: &[f32],
    u: &[f32],
    (g0, g1): (usize, usize),
    scratch: &mut Vec<f32>,
    out: *mut f32,
) -> bool {
    let Plan { geo: Geometry { c, h, w, o, oh, ow, pt, pl, .. }, tw, tt, pw, checked, .. } = *plan;
    let nn = N * N;
    let cnt = g1 - g0;
    let tbp = cnt.div_ceil(L) * L;
    let (b0, b1) = (g0 / tt, (g1 - 1) / tt);
    // the block's tile rows (one image), or whole images
    let (ty0, ty1) = if b0 == b1 { ((g0 % tt) / tw, ((g1 - 1) % tt) / tw) } else { (0, plan.th - 1) };
    let rows = (ty1 - ty0) * M + N;
    let img_len = rows * pw;
    // L - N values of slack: a tile's rows are read L values at a time
    let band_len = (b1 - b0 + 1) * img_len + L;
    // V[xi] apart by C tbp and 2 L more: a power of two (4 KiB for 32 channels of 32 tiles) would
    // put the input transform's N^2 stores of a chunk in one L1 cache set
    let vstride = c * tbp + 2 * L;
    let need = band_len + nn * vstride + nn * o * tbp;
    if scratch.len() < need {
        scratch.resize(need, 0.0);
    }
    let (band, rest) = scratch[..need].split_at_mut(band_len);
    let (v, m) = rest.split_at_mut(nn * vstride);

    let mut origins = Origins { band: Vec::with_capacity(tbp / L), out: Vec::with_capacity(tbp / L), keep: Vec::with_capacity(tbp / L) };
    for j0 in (0..cnt).step_by(L) {
        let (mut bo, mut oo, mut kp) = ([0; L], [0; L], [(0, 0); L]);
        for l in 0..L {
            let g = g0 + (j0 + l).min(cnt - 1);
            let (b, t) = (g / tt, g % tt);
            let (ty, tx) = (t / tw, t % tw);
            bo[l] = (b - b0) * img_len + (ty - ty0) * M * pw + tx * M;
            oo[l] = (b * o * oh + ty * M) * ow + tx * M;
            kp[l] = ((oh - ty * M).min(M) as u8, (ow - tx * M).min(M) as u8);
        }
        origins.band.push(bo);
        origins.out.push(oo);
        origins.keep.push(kp);
    }

    // V = B^T d B, a channel at a time
    let mut finite = true;
    // db[p][j] = (d B)[p][j]
    let mut db = [[[0f32; L]; N]; N];
    // the border stays zero: every channel writes the same positions
    band.fill(0.0);
    for ci in 0..c {
        for b in b0..=b1 {
            let plane = &xs[(b * c + ci) * h * w..][..h * w];
            for r in 0..rows {
                let y = (ty0 * M + r) as isize - pt as isize;
                if y < 0 || y >= h as isize {
                    continue;
                }
                let src = &plane[y as usize * w..][..w];
                if checked && !all_finite(src) {
                    finite = false;
                }
                band[(b - b0) * img_len + r * pw + pl..][..w].copy_from_slice(src);
            }
        }
        if !finite {
            return false;
        }
        for (chunk, base) in origins.band.iter().enumerate() {
            for p in 0..N {
                // row p of every lane's tile (L values, N used), turned into d[q] = the tiles'
                // values at (p, q), then (d B)[p] = the row's transform
                let mut r = [[0f32; L]; L];
                for (l, r) in r.iter_mut().enumerate() {
                    r.copy_from_slice(&band[base[l] + p * pw..][..L]);
                }
                let mut d = [[0f32; L]; N];
                if AVX {
                    #[cfg(target_arch = "x86_64")]
                    {
                        // SAFETY: AVX, as the caller promises.
                        let t = unsafe { transpose8(&r) };
                        d.copy_from_slice(&t[..N]);
                    }
                } else {
                    for (q, d) in d.iter_mut().enumerate() {
                        for l in 0..L {
                            d[l] = r[l][q];
                        }
                    }
                }
                db[p] = W::bt(&d);
            }
            for j in 0..N {
                // column j of d B through B^T: V[k][j]
                let t = W::bt(&std::array::from_fn(|p| db[p][j]));
                for k in 0..N {
                    let at = (k * N + j) * vstride + ci * tbp + chunk * L;
                    v[at..at + L].copy_from_slice(&t[k]);
                }
            }
        }
    }

    // M[xi] = U[xi] (O x C) . V[xi] (C x tbp), stored [O, N^2, tbp]: an output channel's N^2
    // products are read together by its transform
    for xi in 0..nn {
        products_at(&u[xi * o * c..][..o * c], o, c, &v[xi * vstride..][..c * tbp], tbp, &mut m[xi * tbp..], nn * tbp);
    }

    // Y = A^T M A, an output channel at a time
    let mut check = [0f32; L];
    // am[i][b] = (A^T M)[i][b]
    let mut am = [[[0f32; L]; N]; M];
    let mut col = [[0f32; L]; N];
    for oi in 0..o {
        for (chunk, (base, keep)) in origins.out.iter().zip(&origins.keep).enumerate() {
            for b in 0..N {
                for (a, col) in col.iter_mut().enumerate() {
                    let at = (oi * nn + a * N + b) * tbp + chunk * L;
                    col.copy_from_slice(&m[at..at + L]);
                }
                let t = W::at(&col);
                for i in 0..M {
                    am[i][b] = t[i];
                }
            }
            let lanes = L.min(cnt - chunk * L);
            for i in 0..M {
                let y = W::at(&am[i]);
                if checked {
                    for y in &y {
                        for (c, &y) in check.iter_mut().zip(y) {
                            *c += y - y;
                        }
                    }
                }
                // yt[l][j] = y[j][l]: row i of lane l's tile
                let mut yt = [[0f32; L]; L];
                if AVX {
                    #[cfg(target_arch = "x86_64")]
                    {
                        let mut ys = [[0f32; L]; L];
                        ys[..M].copy_from_slice(&y);
                        // SAFETY: AVX, as the caller promises.
                        yt = unsafe { transpose8(&ys) };
                    }
                } else {
                    for (l, yt) in yt.iter_mut().enumerate() {
                        for j in 0..M {
                            yt[j] = y[j][l];
                        }
                    }
                }
                for l in 0..lanes {
                    let (rows, cols) = keep[l];
                    let at = base[l] + oi * oh * ow + i * ow;
                    // SAFETY: inside the output (the tile's kept rows and columns), written by
                    // this block only.
                    unsafe {
                        if rows as usize == M && cols as usize == M {
                            std::ptr::copy_nonoverlapping(yt[l].as_ptr(), out.add(at), M);
                        } else if i < rows as usize {
                            std::ptr::copy_nonoverlapping(yt[l].as_ptr(), out.add(at), cols as usize);
                        }
                    }
                }
            }
        }
    }
    finite && check.iter().all(|&c| c == 0.0)
}

/// The 8 x 8 transpose of `m` (rows in, columns out), in registers.
///
/// SAFETY: the CPU has AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
#[inline]
unsafe fn transpose8(m: &[Lanes; L]) -> [Lanes; L] {
    use std::arch::x86_64::*;
    // SAFETY: reads and writes of 8 f32 inside `m` and `t`; AVX, as the caller promises.
    unsafe {
        let r: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(m[i].as_ptr()));
        let a0 = _mm256_unpacklo_ps(r[0], r[1]);
        let a1 = _mm256_unpackhi_ps(r[0], r[1]);
        let a2 = _mm256_unpacklo_ps(r[2], r[3]);
        let a3 = _mm256_unpackhi_ps(r[2], r[3]);
        let a4 = _mm256_unpacklo_ps(r[4], r[5]);
        let a5 = _mm256_unpackhi_ps(r[4], r[5]);
        let a6 = _mm256_unpacklo_ps(r[6], r[7]);
        let a7 = _mm256_unpackhi_ps(r[6], r[7]);
        let b0 = _mm256_shuffle_ps::<0x44>(a0, a2);
        let b1 = _mm256_shuffle_ps::<0xee>(a0, a2);
        let b2 = _mm256_shuffle_ps::<0x44>(a1, a3);
        let b3 = _mm256_shuffle_ps::<0xee>(a1, a3);
        let b4 = _mm256_shuffle_ps::<0x44>(a4, a6);
        let b5 = _mm256_shuffle_ps::<0xee>(a4, a6);
        let b6 = _mm256_shuffle_ps::<0x44>(a5, a7);
        let b7 = _mm256_shuffle_ps::<0xee>(a5, a7);
        let c = [
            _mm256_permute2f128_ps::<0x20>(b0, b4),
            _mm256_permute2f128_ps::<0x20>(b1, b5),
            _mm256_permute2f128_ps::<0x20>(b2, b6),
            _mm256_permute2f128_ps::<0x20>(b3, b7),
            _mm256_permute2f128_ps::<0x31>(b0, b4),
            _mm256_permute2f128_ps::<0x31>(b1, b5),
            _mm256_permute2f128_ps::<0x31>(b2, b6),
            _mm256_permute2f128_ps::<0x31>(b3, b7),
        ];
        let mut t = [[0f32; L]; L];
        for (t, c) in t.iter_mut().zip(c) {
            _mm256_storeu_ps(t.as_mut_ptr(), c);
        }
        t
    }
}

/// `m = u . v` for `u` (o x c), `v` (c x tbp) and `m` (o x tbp, rows `mrow` apart), row-major,
/// `tbp` a multiple of `L`: blocks of R rows by V vectors of `L` columns (R V accumulators) over c.
#[inline(always)]
fn products<const R: usize, const V: usize, const FMA: bool>(u: &[f32], o: usize, c: usize, v: &[f32], tbp: usize, m: &mut [f32], mrow: usize) {
    assert!(u.len() >= o * c && v.len() >= c * tbp && m.len() >= (o - 1) * mrow + tbp && mrow >= tbp && tbp % L == 0 && R <= 6 && V <= 4);
    let mut o0 = 0;
    while o0 < o {
        let rows = R.min(o - o0);
        let mut t0 = 0;
        while t0 < tbp {
            let vecs = V.min((tbp - t0) / L);
            // SAFETY: rows o0..o0 + rows of u and m, columns t0..t0 + vecs L of v and m: inside
            // the slices checked above.
            unsafe {
                let (u, v, m) = (u.as_ptr().add(o0 * c), v.as_ptr().add(t0), m.as_mut_ptr().add(o0 * mrow + t0));
                macro_rules! by_rows {
                    ($v:literal) => {
                        match rows {
                            1 => tile_product::<1, $v, FMA>(u, c, v, tbp, m, mrow),
                            2 => tile_product::<2, $v, FMA>(u, c, v, tbp, m, mrow),
                            3 => tile_product::<3, $v, FMA>(u, c, v, tbp, m, mrow),
                            4 => tile_product::<4, $v, FMA>(u, c, v, tbp, m, mrow),
                            5 => tile_product::<5, $v, FMA>(u, c, v, tbp, m, mrow),
                            _ => tile_product::<6, $v, FMA>(u, c, v, tbp, m, mrow),
                        }
                    };
                }
                match vecs {
                    1 => by_rows!(1),
                    2 => by_rows!(2),
                    3 => by_rows!(3),
                    _ => by_rows!(4),
                }
            }
            t0 += vecs * L;
        }
        o0 += rows;
    }
}

/// One R x (V L) block of `m = u . v`: rows of `u` `c` apart, of `v` `tbp`, of `m` `mrow`.
/// The sum over c runs in order, one rounding (FMA) or two per term.
///
/// SAFETY: the R rows of c values at `u`, c rows of V L values at `v` and R rows of V L values
/// at `m` are in bounds.
#[inline(always)]
unsafe fn tile_product<const R: usize, const V: usize, const FMA: bool>(u: *const f32, c: usize, v: *const f32, tbp: usize, m: *mut f32, mrow: usize) {
    let mut acc = [[[0f32; L]; V]; R];
    for k in 0..c {
        let mut vk = [[0f32; L]; V];
        for (j, x) in vk.iter_mut().enumerate() {
            *x = unsafe { *(v.add(k * tbp + j * L) as *const Lanes) };
        }
        for (r, acc) in acc.iter_mut().enumerate() {
            let a = unsafe { *u.add(r * c + k) };
            for (acc, x) in acc.iter_mut().zip(&vk) {
                for (acc, &x) in acc.iter_mut().zip(x) {
                    *acc = if FMA { a.mul_add(x, *acc) } else { a * x + *acc };
                }
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (j, acc) in acc.iter().enumerate() {
            unsafe { *(m.add(r * mrow + j * L) as *mut Lanes) = *acc };
        }
    }
}

/// `products` compiled for AVX-512 (blocks of 6 x 4 vectors: 24 accumulators of its 32
/// registers, which LLVM pairs into 512-bit ones for full-width FMAs), AVX2+FMA (4 x 2: 8
/// of 16) or baseline x86-64, the widest this CPU runs.
fn products_at(u: &[f32], o: usize, c: usize, v: &[f32], tbp: usize, m: &mut [f32], mrow: usize) {
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512dq,avx512vl,avx512bw,avx2,fma")]
    unsafe fn avx512(u: &[f32], o: usize, c: usize, v: &[f32], tbp: usize, m: &mut [f32], mrow: usize) {
        products::<6, 4, true>(u, o, c, v, tbp, m, mrow)
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2(u: &[f32], o: usize, c: usize, v: &[f32], tbp: usize, m: &mut [f32], mrow: usize) {
        products::<4, 2, true>(u, o, c, v, tbp, m, mrow)
    }
    match simd() {
        // SAFETY: `simd()` found these features on this CPU.
        #[cfg(target_arch = "x86_64")]
        Simd::Avx512 => unsafe { avx512(u, o, c, v, tbp, m, mrow) },
        #[cfg(target_arch = "x86_64")]
        Simd::Avx2 => unsafe { avx2(u, o, c, v, tbp, m, mrow) },
        _ => products::<4, 2, { cfg!(target_feature = "fma") }>(u, o, c, v, tbp, m, mrow),
    }
}

/// `block` compiled for AVX-512 or AVX2+FMA (with the transposes) where the CPU has them, else
/// baseline x86-64 (moving one value at a time).
///
/// SAFETY: as `block`.
unsafe fn block_at<W: Wino<M, N>, const M: usize, const N: usize>(plan: &Plan, xs: &[f32], u: &[f32], range: (usize, usize), scratch: &mut Vec<f32>, out: *mut f32) -> bool {
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512dq,avx512vl,avx512bw,avx2,fma")]
    unsafe fn avx512<W: Wino<M, N>, const M: usize, const N: usize>(plan: &Plan, xs: &[f32], u: &[f32], range: (usize, usize), scratch: &mut Vec<f32>, out: *mut f32) -> bool {
        unsafe { block::<W, M, N, true>(plan, xs, u, range, scratch, out) }
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2<W: Wino<M, N>, const M: usize, const N: usize>(plan: &Plan, xs: &[f32], u: &[f32], range: (usize, usize), scratch: &mut Vec<f32>, out: *mut f32) -> bool {
        unsafe { block::<W, M, N, true>(plan, xs, u, range, scratch, out) }
    }
    match simd() {
        // SAFETY: `simd()` found these features on this CPU.
        #[cfg(target_arch = "x86_64")]
        Simd::Avx512 => unsafe { avx512::<W, M, N>(plan, xs, u, range, scratch, out) },
        #[cfg(target_arch = "x86_64")]
        Simd::Avx2 => unsafe { avx2::<W, M, N>(plan, xs, u, range, scratch, out) },
        _ => unsafe { block::<W, M, N, false>(plan, xs, u, range, scratch, out) },
    }
}

/// U = G g G^T for every (output, input) channel pair, [N^2, O C], in f64 rounded once, `L`
/// pairs side by side; `None` when a value is not finite and `checked`.
fn kernel_transform<W: Wino<M, N>, const M: usize, const N: usize>(ks: &[f32], pairs: usize, checked: bool) -> Option<Vec<f32>> {
    /// U for pairs p0..p0 + cnt (cnt <= L) into `u`, `pairs` apart; false when not finite.
    ///
    /// SAFETY: `u` holds N^2 rows of `pairs`, p0 + cnt <= pairs.
    #[inline(always)]
    unsafe fn chunk<W: Wino<M, N>, const M: usize, const N: usize>(ks: &[f32], p0: usize, cnt: usize, pairs: usize, u: *mut f32) -> bool {
        let gm: &[[f64; 3]; N] = &W::G;
        // g[e][l] = kernel tap e of pair p0 + l (lanes past cnt repeat the last pair)
        let mut g = [[0f64; L]; 9];
        for l in 0..L {
            let k = &ks[(p0 + l.min(cnt - 1)) * 9..][..9];
            for e in 0..9 {
                g[e][l] = k[e] as f64;
            }
        }
        // gg[k][v] = (G g)[k][v]
        let mut gg = [[[0f64; L]; 3]; N];
        for k in 0..N {
            for v in 0..3 {
                for l in 0..L {
                    gg[k][v][l] = gm[k][0] * g[v][l] + gm[k][1] * g[3 + v][l] + gm[k][2] * g[6 + v][l];
                }
            }
        }
        let mut check = [0f32; L];
        for k in 0..N {
            for j in 0..N {
                let mut x = [0f32; L];
                for l in 0..L {
                    x[l] = (gg[k][0][l] * gm[j][0] + gg[k][1][l] * gm[j][1] + gg[k][2][l] * gm[j][2]) as f32;
                    check[l] += x[l] - x[l];
                }
                unsafe { std::ptr::copy_nonoverlapping(x.as_ptr(), u.add((k * N + j) * pairs + p0), cnt) };
            }
        }
        check.iter().all(|&c| c == 0.0)
    }
    /// `chunk` over tasks..., compiled for AVX2+FMA where the CPU has it.
    ///
    /// SAFETY: as `chunk`.
    unsafe fn chunk_at<W: Wino<M, N>, const M: usize, const N: usize>(ks: &[f32], p0: usize, cnt: usize, pairs: usize, u: *mut f32) -> bool {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx2<W: Wino<M, N>, const M: usize, const N: usize>(ks: &[f32], p0: usize, cnt: usize, pairs: usize, u: *mut f32) -> bool {
            unsafe { chunk::<W, M, N>(ks, p0, cnt, pairs, u) }
        }
        match simd() {
            // SAFETY: `simd()` found these features on this CPU.
            #[cfg(target_arch = "x86_64")]
            Simd::Avx2 | Simd::Avx512 => unsafe { avx2::<W, M, N>(ks, p0, cnt, pairs, u) },
            _ => unsafe { chunk::<W, M, N>(ks, p0, cnt, pairs, u) },
        }
    }
    const PER_TASK: usize = 32 * L;
    let mut u: Vec<f32> = Vec::with_capacity(N * N * pairs);
    let dst = SharedMut(u.as_mut_ptr());
    let bad = AtomicBool::new(false);
    tasks(pairs.div_ceil(PER_TASK), N * N * pairs, &|task| {
        let end = pairs.min((task + 1) * PER_TASK);
        for p0 in (task * PER_TASK..end).step_by(L) {
            // SAFETY: each pair is written by one task, inside `u`'s capacity, which outlives
            // `tasks`.
            if !unsafe { chunk_at::<W, M, N>(ks, p0, L.min(end - p0), pairs, dst.get()) } {
                bad.store(true, Ordering::Relaxed);
            }
        }
    });
    if checked && bad.load(Ordering::Relaxed) {
        return None;
    }
    // SAFETY: every (xi, pair) was written.
    unsafe { u.set_len(N * N * pairs) };
    Some(u)
}

/// Whether every value is finite, in one vectorisable pass (x - x is NaN for an infinite or NaN x).
fn all_finite(xs: &[f32]) -> bool {
    let mut acc = [0f32; L];
    let mut chunks = xs.chunks_exact(L);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += x - x;
        }
    }
    for &x in chunks.remainder() {
        acc[0] += x - x;
    }
    acc.iter().all(|&a| a == 0.0)
}

/// `f(i)` for `i < n` on rayon's pool, or on this thread below `PAR_MIN` values of `work`.
fn tasks(n: usize, work: usize, f: &(dyn Fn(usize) + Sync)) {
    if work < PAR_MIN {
        (0..n).for_each(f);
    } else {
        par_tasks(n, f);
    }
}

/// The shape of a qualifying convolution.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    o: usize,
    oh: usize,
    ow: usize,
    /// padding before the first row and column
    pt: usize,
    pl: usize,
}

impl Geometry {
    /// A 3x3 kernel, stride 1, no dilation, one group, non-empty input, kernel and output.
    fn of(x: &Prim, k: &Prim, opts: &ConvOptions<2>) -> Option<Geometry> {
        if opts.groups != 1 || opts.stride != [1, 1] || opts.dilation != [1, 1] {
            return None;
        }
        let (xd, kd) = (dispatch::dims(x), dispatch::dims(k));
        let ([n, c, h, w], [o, kc, 3, 3]) = (<[usize; 4]>::try_from(xd).ok()?, <[usize; 4]>::try_from(kd).ok()?) else {
            return None;
        };
        let [(pt, pb), (pl, pr)] = opts.padding;
        let (oh, ow) = ((h + pt + pb).checked_sub(2)?, (w + pl + pr).checked_sub(2)?);
        if kc != c || n * c * o * oh * ow == 0 {
            return None;
        }
        Some(Geometry { n, c, h, w, o, oh, ow, pt, pl })
    }

    /// The tile with fewer products (a^2 per tile, edge tiles whole); F(2,3) on a tie.
    fn tile(&self) -> Tile {
        let products = |m: usize, a: usize| self.oh.div_ceil(m) * self.ow.div_ceil(m) * a * a;
        if products(4, 6) < products(2, 4) {
            Tile::F4
        } else {
            Tile::F2
        }
    }
}

#[cfg(test)]
thread_local! {
    /// Calls this thread's `conv2d` answered (the tests' view of which path ran).
    pub(crate) static TAKEN: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// `conv2d(x, k)` without bias through Winograd for contiguous f32 flex tensors, a 3x3 kernel,
/// stride 1, no dilation and one group; `None` otherwise, or when an input, kernel value or
/// output is not finite (see the module doc), so the caller keeps the im2col path.
pub fn conv2d(x: &Prim, k: &Prim, opts: &ConvOptions<2>) -> Option<Prim> {
    let geo = Geometry::of(x, k, opts)?;
    let y = conv2d_with(x, k, &geo, geo.tile(), true)?;
    #[cfg(test)]
    TAKEN.with(|t| t.set(t.get() + 1));
    Some(y)
}

/// `conv2d` with the tile given, and without the non-finite checks when `checked` is false.
fn conv2d_with(x: &Prim, k: &Prim, geo: &Geometry, tile: Tile, checked: bool) -> Option<Prim> {
    let (xs, ks) = (flex_f32(x)?, flex_f32(k)?);
    if checked && !all_finite(ks) {
        return None;
    }
    let y = match tile {
        Tile::F2 => run::<F23, 2, 4>(xs, ks, geo, checked)?,
        Tile::F4 => run::<F43, 4, 6>(xs, ks, geo, checked)?,
    };
    let &Geometry { n, o, oh, ow, .. } = geo;
    Some(dispatch::from_data(TensorData::new(y, [n, o, oh, ow]), &burn::tensor::Device::flex()))
}

/// Tiles per block: V and M of a block (N^2 (C + O) values a tile) in about 512 KiB, so they stay
/// in the core's L2 cache between the passes; at least `L`, at most an image's tiles, fewer
/// where that gives the pool too few blocks.
fn block_tiles(nn: usize, c: usize, o: usize, tt: usize, n: usize) -> usize {
    let fit = ((512 << 10) / (4 * nn * (c + o))).max(L) / L * L;
    let threads = rayon::current_num_threads().max(1);
    let mut tb = fit.min(tt);
    while tb > L && n * tt.div_ceil(tb) < 4 * threads {
        tb = (tb / 2).max(L);
    }
    tb
}

/// The kernel transform, then blocks of tiles on rayon's pool; NCHW output values, `None` when
/// `checked` and a value is not finite.
fn run<W: Wino<M, N>, const M: usize, const N: usize>(xs: &[f32], ks: &[f32], geo: &Geometry, checked: bool) -> Option<Vec<f32>> {
    let &Geometry { n, c, o, oh, ow, .. } = geo;
    let u = kernel_transform::<W, M, N>(ks, o * c, checked)?;
    let (th, tw) = (oh.div_ceil(M), ow.div_ceil(M));
    let tt = th * tw;
    let plan = Plan { geo: *geo, th, tw, tt, pw: tw * M + 2, checked };
    // blocks: an image's tiles in `per` pieces, or `per` whole images
    let tb = block_tiles(N * N, c, o, tt, n);
    let blocks: Vec<(usize, usize)> = if tb < tt {
        let pieces = tt.div_ceil(tb);
        let size = tt.div_ceil(pieces);
        (0..n).flat_map(|b| (0..pieces).map(move |i| (b * tt + i * size, b * tt + ((i + 1) * size).min(tt)))).filter(|(a, b)| a < b).collect()
    } else {
        let per = (tb / tt).max(1);
        (0..n.div_ceil(per)).map(|i| (i * per * tt, ((i + 1) * per).min(n) * tt)).collect()
    };
    let len = n * o * oh * ow;
    let mut out: Vec<f32> = Vec::with_capacity(len);
    let dst = SharedMut(out.as_mut_ptr());
    let bad = AtomicBool::new(false);
    thread_local! {
        /// A block's buffers, kept by each thread between calls (a fresh allocation of a few
        /// hundred KiB costs page faults each time); they grow to the largest block seen, about
        /// 0.5 MiB for the benchmark's layer.
        static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    tasks(blocks.len(), N * N * (c + o) * n * tt, &|i| {
        SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            // SAFETY: blocks are disjoint sets of tiles, so of outputs, inside `out`'s capacity,
            // which outlives `tasks`.
            if !unsafe { block_at::<W, M, N>(&plan, xs, &u, blocks[i], &mut s, dst.get()) } {
                bad.store(true, Ordering::Relaxed);
            }
        })
    });
    if bad.load(Ordering::Relaxed) {
        return None;
    }
    // SAFETY: the blocks cover every tile, and a tile's kept rows and columns cover its outputs.
    unsafe { out.set_len(len) };
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{flex_f32s as flex, prim_f32s as values};
    use burn::backend::ops::ModuleOps;
    use burn::backend::Dispatch;

    /// splitmix64 values in [lo, lo + 1)
    fn random(n: usize, seed: u64, lo: f32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9e3779b97f4a7c15);
        (0..n)
            .map(|_| {
                s = s.wrapping_add(0x9e3779b97f4a7c15);
                let mut z = s;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
                z ^= z >> 31;
                lo + (z >> 40) as f32 / (1u64 << 24) as f32
            })
            .collect()
    }

    fn opts(pads: [usize; 4]) -> ConvOptions<2> {
        ConvOptions { stride: [1, 1], padding: [(pads[0], pads[1]), (pads[2], pads[3])], dilation: [1, 1], groups: 1 }
    }

    /// The direct convolution in f64 (padding top, bottom, left, right) and, per output, the sum
    /// of |x w| over its receptive field.
    fn direct(xs: &[f32], ks: &[f32], [n, c, h, w]: [usize; 4], o: usize, [pt, pb, pl, pr]: [usize; 4]) -> (Vec<f64>, Vec<f64>) {
        let (oh, ow) = (h + pt + pb - 2, w + pl + pr - 2);
        let (mut y, mut abs) = (vec![0.0; n * o * oh * ow], vec![0.0; n * o * oh * ow]);
        for b in 0..n {
            for oi in 0..o {
                for r in 0..oh {
                    for q in 0..ow {
                        let (mut s, mut a) = (0.0f64, 0.0f64);
                        for ci in 0..c {
                            for i in 0..3 {
                                for j in 0..3 {
                                    let (iy, ix) = ((r + i) as isize - pt as isize, (q + j) as isize - pl as isize);
                                    if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                        continue;
                                    }
                                    let p = xs[((b * c + ci) * h + iy as usize) * w + ix as usize] as f64 * ks[((oi * c + ci) * 3 + i) * 3 + j] as f64;
                                    s += p;
                                    a += p.abs();
                                }
                            }
                        }
                        y[((b * o + oi) * oh + r) * ow + q] = s;
                        abs[((b * o + oi) * oh + r) * ow + q] = a;
                    }
                }
            }
        }
        (y, abs)
    }

    /// |B^T|, |G|, |A^T| of each tile size, written out again from the matrices in the docs.
    fn abs_matrices(tile: Tile) -> (Vec<Vec<f64>>, Vec<Vec<f64>>, Vec<Vec<f64>>) {
        let rows = |r: &[&[f64]]| r.iter().map(|r| r.iter().map(|v: &f64| v.abs()).collect()).collect();
        match tile {
            Tile::F2 => (
                rows(&[&[1., 0., -1., 0.], &[0., 1., 1., 0.], &[0., -1., 1., 0.], &[0., 1., 0., -1.]]),
                rows(&[&[1., 0., 0.], &[0.5, 0.5, 0.5], &[0.5, -0.5, 0.5], &[0., 0., 1.]]),
                rows(&[&[1., 1., 1., 0.], &[0., 1., -1., -1.]]),
            ),
            Tile::F4 => (
                rows(&[
                    &[1., -1.5, -2., 1.5, 1., 0.],
                    &[0., -1., 0.5, 2.5, 1., 0.],
                    &[0., 1., -2.5, 0.5, 1., 0.],
                    &[0., -2., -1., 2., 1., 0.],
                    &[0., 0.5, -1., -0.5, 1., 0.],
                    &[0., 1., -1.5, -2., 1.5, 1.],
                ]),
                rows(&[
                    &[1., 0., 0.],
                    &[1. / 3., 1. / 3., 1. / 3.],
                    &[1. / 3., 1. / 3., 1. / 3.],
                    &[16. / 15., 8. / 15., 4. / 15.],
                    &[1. / 15., 2. / 15., 4. / 15.],
                    &[0., 0., 1.],
                ]),
                rows(&[&[1., 1., 1., 1., 1., 0.], &[0., 1., 1., 0.5, 2., 0.], &[0., 1., 1., 0.25, 4., 0.], &[0., 1., 1., 0.125, 8., 1.]]),
            ),
        }
    }

    /// Per output, the sum Winograd's rounding errors scale with: |A^T| [sum over channels of
    /// (|G| |g| |G|^T) (.) (|B^T| |d| |B|)] |A| over the output's tile. Each step (the two input
    /// transform passes, the kernel transform's final rounding, the channel sum, the two output
    /// passes) adds at most a few units of roundoff times its share of it, so the error is below
    /// (C + 20) 2^-23 times this, to first order.
    fn winograd_bound(xs: &[f32], ks: &[f32], [n, c, h, w]: [usize; 4], o: usize, [pt, pb, pl, pr]: [usize; 4], tile: Tile) -> Vec<f64> {
        let (bt, g, at) = abs_matrices(tile);
        let (m, a) = (at.len(), bt.len());
        let (oh, ow) = (h + pt + pb - 2, w + pl + pr - 2);
        let (th, tw) = (oh.div_ceil(m), ow.div_ceil(m));
        // X Y Z^T for a x b, b x b2 and c x b2 matrices
        let triple = |x: &Vec<Vec<f64>>, y: &Vec<Vec<f64>>, z: &Vec<Vec<f64>>| -> Vec<Vec<f64>> {
            let xy: Vec<Vec<f64>> = x.iter().map(|xr| (0..y[0].len()).map(|j| xr.iter().zip(y).map(|(a, yr)| a * yr[j]).sum()).collect()).collect();
            xy.iter().map(|r| z.iter().map(|zr| r.iter().zip(zr).map(|(a, b)| a * b).sum()).collect()).collect()
        };
        let us: Vec<Vec<Vec<f64>>> = (0..o * c)
            .map(|p| triple(&g, &(0..3).map(|i| (0..3).map(|j| (ks[p * 9 + i * 3 + j] as f64).abs()).collect()).collect(), &g))
            .collect();
        let mut bound = vec![0.0; n * o * oh * ow];
        for b in 0..n {
            for ty in 0..th {
                for tx in 0..tw {
                    let vs: Vec<Vec<Vec<f64>>> = (0..c)
                        .map(|ci| {
                            let d: Vec<Vec<f64>> = (0..a)
                                .map(|p| {
                                    (0..a)
                                        .map(|q| {
                                            let (iy, ix) = ((ty * m + p) as isize - pt as isize, (tx * m + q) as isize - pl as isize);
                                            if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                                0.0
                                            } else {
                                                (xs[((b * c + ci) * h + iy as usize) * w + ix as usize] as f64).abs()
                                            }
                                        })
                                        .collect()
                                })
                                .collect();
                            triple(&bt, &d, &bt)
                        })
                        .collect();
                    for oi in 0..o {
                        let r: Vec<Vec<f64>> = (0..a).map(|i| (0..a).map(|j| (0..c).map(|ci| us[oi * c + ci][i][j] * vs[ci][i][j]).sum()).collect()).collect();
                        let yb = triple(&at, &r, &at);
                        for i in 0..m {
                            for j in 0..m {
                                let (y, x) = (ty * m + i, tx * m + j);
                                if y < oh && x < ow {
                                    bound[((b * o + oi) * oh + y) * ow + x] = yb[i][j];
                                }
                            }
                        }
                    }
                }
            }
        }
        bound
    }

    /// The worst errors of a run: error / sum |x w| over outputs whose receptive field lies
    /// inside the input, the same over the outputs that see padding, error / winograd_bound.
    #[derive(Default, Clone, Copy, Debug)]
    struct Worst {
        inner: f64,
        border: f64,
        bound: f64,
    }

    impl Worst {
        fn max(self, o: Worst) -> Worst {
            Worst { inner: self.inner.max(o.inner), border: self.border.max(o.border), bound: self.bound.max(o.bound) }
        }
    }

    /// Runs `tile` on random data and checks every output against the f64 direct convolution:
    /// within (C + 20) 2^-23 of `winograd_bound`, and within `rel.0` (outputs inside the input) or
    /// `rel.1` (outputs that see padding) of the sum of |x w| over the receptive field.
    #[allow(clippy::too_many_arguments)]
    fn check(tile: Tile, [n, c, h, w]: [usize; 4], o: usize, pads: [usize; 4], seed: u64, lo: f32, rel: (f64, f64)) -> Worst {
        let (xs, ks) = (random(n * c * h * w, seed, lo), random(o * c * 9, seed + 1, -0.5));
        let (x, k) = (flex(xs.clone(), &[n, c, h, w]), flex(ks.clone(), &[o, c, 3, 3]));
        let geo = Geometry::of(&x, &k, &opts(pads)).unwrap();
        let ours = conv2d_with(&x, &k, &geo, tile, true).expect("finite");
        let (oh, ow) = (h + pads[0] + pads[1] - 2, w + pads[2] + pads[3] - 2);
        assert_eq!(dispatch::dims(&ours), vec![n, o, oh, ow]);
        let ours = values(ours);
        let (want, abs) = direct(&xs, &ks, [n, c, h, w], o, pads);
        let bound = winograd_bound(&xs, &ks, [n, c, h, w], o, pads, tile);
        let gamma = (c + 20) as f64 * f64::powi(2.0, -23);
        let mut worst = Worst::default();
        for (i, (&y, &want)) in ours.iter().zip(&want).enumerate() {
            let err = (y as f64 - want).abs();
            let (q, r) = (i % ow, (i / ow) % oh);
            let inner = r >= pads[0] && r + 2 < h + pads[0] && q >= pads[2] && q + 2 < w + pads[2];
            let rel = if inner { rel.0 } else { rel.1 };
            let case = format!("{tile:?} x {:?} o {o} pads {pads:?} at {i}: {y} vs {want}", [n, c, h, w]);
            assert!(err <= gamma * bound[i], "{case}: error {err} over the a priori bound {}", gamma * bound[i]);
            assert!(err <= rel * abs[i], "{case}: error {err} over {rel} * sum |x w| = {}", rel * abs[i]);
            if abs[i] > 0.0 {
                let worst = if inner { &mut worst.inner } else { &mut worst.border };
                *worst = worst.max(err / abs[i]);
            }
            if bound[i] > 0.0 {
                worst.bound = worst.bound.max(err / bound[i]);
            }
        }
        worst
    }

    const SIDES: [usize; 8] = [1, 2, 3, 4, 5, 7, 8, 13];
    const PADS: [[usize; 4]; 4] = [[0, 0, 0, 0], [1, 1, 1, 1], [2, 2, 2, 2], [0, 2, 1, 0]];
    /// Larger shapes: batch, channels, outputs, sides, paddings.
    const LARGE: [([usize; 4], usize, [usize; 4]); 9] = [
        ([1, 32, 32, 32], 64, [1, 1, 1, 1]),
        ([3, 32, 13, 7], 5, [0, 2, 1, 0]),
        ([2, 1, 32, 32], 1, [0, 0, 0, 0]),
        ([1, 3, 32, 32], 64, [1, 1, 1, 1]),
        ([3, 32, 8, 8], 64, [2, 2, 2, 2]),
        ([2, 32, 5, 32], 1, [1, 0, 0, 1]),
        ([1, 1, 1, 1], 64, [1, 1, 1, 1]),
        ([3, 3, 2, 2], 5, [2, 2, 2, 2]),
        ([2, 32, 4, 13], 5, [0, 0, 2, 2]),
    ];

    /// Every side in `SIDES` against every other, every padding in `PADS`, and the `LARGE`
    /// shapes, for one tile size; inputs in [lo, lo + 1).
    fn sweep(tile: Tile, lo: f32, rel: (f64, f64)) -> Worst {
        let mut worst = Worst::default();
        let mut seed = 1;
        for h in SIDES {
            for w in SIDES {
                for pads in PADS {
                    if h + pads[0] + pads[1] < 3 || w + pads[2] + pads[3] < 3 {
                        continue;
                    }
                    seed += 2;
                    worst = worst.max(check(tile, [2, 3, h, w], 5, pads, seed, lo, rel));
                }
            }
        }
        for (shape, o, pads) in LARGE {
            seed += 2;
            worst = worst.max(check(tile, shape, o, pads, seed, lo, rel));
        }
        worst
    }

    #[test]
    fn f2_matches_the_f64_direct_convolution() {
        for lo in [-0.5, 0.0] {
            let worst = sweep(Tile::F2, lo, (1e-5, 1e-5));
            println!("F(2,3), inputs from {lo}: error / sum |x w| inside {:.2e}, next to padding {:.2e}; error / winograd_bound {:.2e}", worst.inner, worst.border, worst.bound);
        }
    }

    /// F(4,3)'s matrices hold larger and smaller coefficients (up to 8 in A, 5/2 in B, 16/15 and
    /// 1/15 in G), so the sum its rounding scales with (`winograd_bound`) is larger against the
    /// direct sum of |x w|, most of all next to padding, where a tile's zeros drop products
    /// from the direct sum but the transforms still mix the tile's other inputs and the kernel's
    /// other taps into the output: measured, error / sum |x w| reaches about 1.3e-6 inside the
    /// input and 5.4e-5 at a padded corner (a 1 x 1 input: one product, the tile's 36 transformed
    /// values cancelling to it), against 2.4e-7 and 4.4e-6 for F(2,3). So 1e-5 inside the input,
    /// 1e-4 next to padding (the a priori bound holds everywhere).
    #[test]
    fn f4_matches_the_f64_direct_convolution() {
        for lo in [-0.5, 0.0] {
            let worst = sweep(Tile::F4, lo, (1e-5, 1e-4));
            println!("F(4,3), inputs from {lo}: error / sum |x w| inside {:.2e}, next to padding {:.2e}; error / winograd_bound {:.2e}", worst.inner, worst.border, worst.bound);
        }
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|v| v.to_bits()).collect()
    }

    fn non_finite(v: &[f32]) -> usize {
        v.iter().filter(|v| !v.is_finite()).count()
    }

    fn taken() -> usize {
        TAKEN.with(|t| t.get())
    }

    /// An Inf and a NaN in the input, or an Inf in the kernel: the im2col path's result, bit for
    /// bit (each Inf or NaN reaches the outputs whose receptive field holds it, as in a direct
    /// convolution; a kernel Inf times a padding zero is NaN, as in Nx's own conv). What Winograd
    /// itself would give is shown unchecked: more non-finite outputs, or NaN for Inf.
    #[test]
    fn non_finite_values_take_the_im2col_path() {
        let ([n, c, h, w], o, pads) = ([2, 3, 9, 10], 4, [1, 1, 1, 1]);
        let mut xs = random(n * c * h * w, 5, -0.5);
        xs[((c + 1) * h + 3) * w + 4] = f32::INFINITY;
        xs[((c + 2) * h + 7) * w + 1] = f32::NAN;
        let ks = random(o * c * 9, 6, -0.5);
        let mut ks_inf = ks.clone();
        ks_inf[(2 * c + 1) * 9 + 4] = f32::NEG_INFINITY;
        for (xs, ks, what) in [(xs.clone(), ks.clone(), "input"), (random(n * c * h * w, 7, -0.5), ks_inf, "kernel")] {
            let (x, k) = (flex(xs, &[n, c, h, w]), flex(ks, &[o, c, 3, 3]));
            let before = taken();
            let ours = values(super::super::conv::conv2d(&x, &k, &opts(pads)).unwrap());
            assert_eq!(taken(), before, "{what}: Winograd declined");
            let im2col = values(super::super::conv::im2col(&x, &k, &opts(pads)).unwrap());
            assert_eq!(bits(&ours), bits(&im2col), "{what}");
            assert!(non_finite(&ours) > 0, "{what}");
            let geo = Geometry::of(&x, &k, &opts(pads)).unwrap();
            for tile in [Tile::F2, Tile::F4] {
                let raw = values(conv2d_with(&x, &k, &geo, tile, false).unwrap());
                for (r, d) in raw.iter().zip(&ours) {
                    assert!(d.is_finite() || !r.is_finite(), "{what}, {tile:?}: {r} where the direct convolution gives {d}");
                }
                let inf_to_nan = raw.iter().zip(&ours).filter(|(r, d)| r.is_nan() && d.is_infinite()).count();
                println!("{what}, {tile:?}: {} non-finite outputs unchecked ({inf_to_nan} NaN for Inf), {} through im2col", non_finite(&raw), non_finite(&ours));
                // F(4,3) spreads an input's Inf or NaN over its tiles; F(2,3) keeps the set of
                // non-finite outputs (each input reaches only the outputs that read it) but, as
                // both do with a kernel's Inf, turns many of the direct convolution's Infs into
                // NaN (Inf - Inf inside the transforms)
                if what == "input" && tile == Tile::F4 {
                    assert!(non_finite(&raw) > non_finite(&ours), "{what}, {tile:?}");
                } else {
                    assert!(inf_to_nan > 0, "{what}, {tile:?}");
                }
            }
        }
    }

    /// Finite inputs whose transforms overflow (3e38 + 3e38) where the direct sums do not: the
    /// output check sends them to im2col, which gives finite values.
    #[test]
    fn transforms_that_overflow_take_the_im2col_path() {
        let ([n, c, h, w], o, pads) = ([1, 3, 8, 8], 2, [1, 1, 1, 1]);
        let (x, k) = (flex(vec![3e38; n * c * h * w], &[n, c, h, w]), flex(vec![1e-3; o * c * 9], &[o, c, 3, 3]));
        let before = taken();
        let ours = values(super::super::conv::conv2d(&x, &k, &opts(pads)).unwrap());
        assert_eq!(taken(), before);
        assert_eq!(bits(&ours), bits(&values(super::super::conv::im2col(&x, &k, &opts(pads)).unwrap())));
        assert_eq!(non_finite(&ours), 0);
        let geo = Geometry::of(&x, &k, &opts(pads)).unwrap();
        for tile in [Tile::F2, Tile::F4] {
            assert!(non_finite(&values(conv2d_with(&x, &k, &geo, tile, false).unwrap())) > 0, "{tile:?}");
        }
    }

    /// 3x3 kernels at stride 1 in f32 go through Winograd from `conv::conv2d`; other strides,
    /// dilations, kernel sizes, groups and dtypes do not (they take im2col or flex), and give
    /// flex's results.
    #[test]
    fn only_3x3_stride_1_kernels_are_taken() {
        let x = flex(random(2 * 4 * 9 * 9, 1, -0.5), &[2, 4, 9, 9]);
        let k3 = flex(random(6 * 4 * 9, 2, -0.5), &[6, 4, 3, 3]);
        let base = opts([1, 1, 1, 1]);
        let before = taken();
        let y = super::super::conv::conv2d(&x, &k3, &base).unwrap();
        assert_eq!(taken(), before + 1);
        let flex_y = values(Dispatch::conv2d(x.clone(), k3.clone(), None, base.clone()));
        for (a, b) in values(y).iter().zip(&flex_y) {
            assert!((a - b).abs() <= 1e-5 * 36.0, "{a} vs {b}");
        }
        let cases = [
            (k3.clone(), ConvOptions { stride: [2, 1], ..base.clone() }, "stride 2"),
            (k3.clone(), ConvOptions { dilation: [1, 2], ..base.clone() }, "dilation 2"),
            (flex(random(6 * 4 * 25, 3, -0.5), &[6, 4, 5, 5]), base.clone(), "5x5"),
            (flex(random(6 * 4 * 6, 4, -0.5), &[6, 4, 3, 2]), base.clone(), "3x2"),
            (flex(random(6 * 2 * 9, 5, -0.5), &[6, 2, 3, 3]), ConvOptions { groups: 2, ..base.clone() }, "2 groups"),
        ];
        for (k, o, what) in cases {
            assert!(conv2d(&x, &k, &o).is_none(), "{what}");
            let before = taken();
            let want = values(Dispatch::conv2d(x.clone(), k.clone(), None, o.clone()));
            let got = super::super::conv::conv2d(&x, &k, &o).map(values).unwrap_or_else(|| want.clone());
            assert_eq!(taken(), before, "{what}");
            assert_eq!(got.len(), want.len(), "{what}");
            for (a, b) in got.iter().zip(&want) {
                assert!((a - b).abs() <= 1e-5 * 100.0, "{what}: {a} vs {b}");
            }
        }
        let x64 = dispatch::from_data(TensorData::new(random(2 * 4 * 9 * 9, 1, -0.5).into_iter().map(f64::from).collect::<Vec<f64>>(), [2, 4, 9, 9]), &burn::tensor::Device::flex());
        let k64 = dispatch::from_data(TensorData::new(random(6 * 4 * 9, 2, -0.5).into_iter().map(f64::from).collect::<Vec<f64>>(), [6, 4, 3, 3]), &burn::tensor::Device::flex());
        assert!(conv2d(&x64, &k64, &base).is_none(), "f64");
    }
}

#[cfg(test)]
mod timing {
    use super::*;

    /// Winograd against im2col on a few layers (bench/rust_timings.sh runs it).
    #[test]
    #[ignore]
    fn winograd_timing() {
        let shapes: &[([usize; 4], usize)] = &[([8, 32, 32, 32], 64), ([8, 3, 32, 32], 64), ([8, 64, 16, 16], 64), ([1, 32, 32, 32], 32), ([8, 8, 32, 32], 8), ([8, 1, 28, 28], 1), ([2, 256, 14, 14], 256), ([1, 128, 56, 56], 128)];
        for &([n, c, h, w], o) in shapes {
            let x = dispatch::from_data(TensorData::new((0..n * c * h * w).map(|i| (i % 7) as f32 - 3.0).collect::<Vec<f32>>(), [n, c, h, w]), &burn::tensor::Device::flex());
            let k = dispatch::from_data(TensorData::new((0..o * c * 9).map(|i| (i % 5) as f32 - 2.0).collect::<Vec<f32>>(), [o, c, 3, 3]), &burn::tensor::Device::flex());
            let opts = ConvOptions { stride: [1, 1], padding: [(1, 1), (1, 1)], dilation: [1, 1], groups: 1 };
            let geo = Geometry::of(&x, &k, &opts).unwrap();
            let time = |f: &dyn Fn() -> Prim| {
                for _ in 0..3 {
                    drop(f());
                }
                let mut ts: Vec<f64> = (0..41)
                    .map(|_| {
                        let t = std::time::Instant::now();
                        drop(f());
                        t.elapsed().as_secs_f64() * 1e6
                    })
                    .collect();
                ts.sort_by(f64::total_cmp);
                (ts[5], ts[20])
            };
            let im2col = time(&|| super::super::conv::im2col(&x, &k, &opts).unwrap());
            let f2 = time(&|| conv2d_with(&x, &k, &geo, Tile::F2, true).unwrap());
            let f4 = time(&|| conv2d_with(&x, &k, &geo, Tile::F4, true).unwrap());
            println!("x {:?} o {o}, us (p12/median): im2col {:.0}/{:.0}, F(2,3) {:.0}/{:.0}, F(4,3) {:.0}/{:.0}", [n, c, h, w], im2col.0, im2col.1, f2.0, f2.1, f4.0, f4.1);
        }
    }
}
