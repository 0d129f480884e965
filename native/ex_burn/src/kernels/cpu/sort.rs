//! Stable f32 sort and argsort on the CPU: an LSD radix sort of order-preserving integer keys.
//!
//! The generic path (indexing::stable_argsort) makes Burn's unstable argsort stable with a
//! second argsort of group keys plus gathers and a cumulative sum, several passes where one
//! sort would do. A radix sort is stable by construction and linear: each value maps
//! to a u32 key with the order Nx wants (-0.0 equal to 0.0, every NaN above +Inf and equal to
//! the others), packed with its lane position into a u64 and sorted on the key's 32 bits in
//! three passes of 11 bits. Lanes (the sorted axis, for every other position) run in parallel.
//! Other dtypes, devices and strided views keep the generic path.

use burn::backend::TensorData;

use super::vector::{flex_f32, par_chunks_for};
use crate::dispatch::{self, Prim};

/// The u32 whose unsigned order is Nx's order of f32 values (ascending, NaN last).
fn key(x: f32) -> u32 {
    if x.is_nan() {
        return u32::MAX;
    }
    let bits = (x + 0.0).to_bits(); // -0.0 + 0.0 is +0.0: the two zeros tie
    if bits >> 31 == 1 {
        !bits
    } else {
        bits | 0x8000_0000
    }
}

/// Sorts `items` (key << 32 | position) by their high 32 bits, stably, using `tmp` as scratch.
fn radix(items: &mut Vec<u64>, tmp: &mut Vec<u64>) {
    tmp.resize(items.len(), 0);
    for shift in [32u32, 43, 54] {
        let mut count = [0usize; 2048];
        for &v in items.iter() {
            count[((v >> shift) & 2047) as usize] += 1;
        }
        if count.iter().any(|&c| c == items.len()) {
            continue; // every item has this digit: the pass would not move anything
        }
        let mut at = 0;
        for c in count.iter_mut() {
            (at, *c) = (at + *c, at);
        }
        for &v in items.iter() {
            let d = ((v >> shift) & 2047) as usize;
            tmp[count[d]] = v;
            count[d] += 1;
        }
        std::mem::swap(items, tmp);
    }
}

/// Stable sort of a contiguous f32 flex tensor along `axis`: the sorted values and the source
/// position of each along the axis (Nx.sort / Nx.argsort; `descending` keeps ties in their
/// original order too). `None` for anything else, or lanes of 2^32 values or more.
pub fn sort_f32(x: &Prim, axis: usize, descending: bool) -> Option<(Prim, Prim)> {
    let xs = flex_f32(x)?;
    let dims = dispatch::dims(x);
    let (n, inner) = (dims[axis], dims[axis + 1..].iter().product::<usize>());
    if n == 0 || inner == 0 || n > u32::MAX as usize {
        return None;
    }
    let mut values = vec![0.0f32; xs.len()];
    let mut index = vec![0i64; xs.len()];
    // one lane per task, written through its [n] piece of a per-lane buffer of (value, index)
    let mut out = vec![(0.0f32, 0i64); xs.len()];
    par_chunks_for(&mut out, n, xs.len() * 8, |lane, piece| {
        let (o, i) = (lane / inner, lane % inner);
        let at = |k: usize| xs[(o * n + k) * inner + i];
        let mut items: Vec<u64> = (0..n)
            .map(|k| {
                let kk = key(at(k));
                ((if descending { !kk } else { kk }) as u64) << 32 | k as u64
            })
            .collect();
        radix(&mut items, &mut Vec::new());
        for (slot, v) in piece.iter_mut().zip(&items) {
            let k = (v & 0xFFFF_FFFF) as usize;
            *slot = (at(k), k as i64);
        }
    });
    // back to the tensor's layout (lanes of the axis are strided by `inner`)
    for (lane, piece) in out.chunks(n).enumerate() {
        let (o, i) = (lane / inner, lane % inner);
        for (k, &(v, src)) in piece.iter().enumerate() {
            values[(o * n + k) * inner + i] = v;
            index[(o * n + k) * inner + i] = src;
        }
    }
    let device = burn::tensor::Device::flex();
    Some((dispatch::from_data(TensorData::new(values, dims.clone()), &device), dispatch::from_data(TensorData::new(index, dims), &device)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{flex_f32s as flex};

    fn run(xs: Vec<f32>, shape: &[usize], axis: usize, desc: bool) -> (Vec<f32>, Vec<i64>) {
        let (v, i) = sort_f32(&flex(xs, shape), axis, desc).unwrap();
        (dispatch::into_data(v).unwrap().try_to_vec().unwrap(), dispatch::into_data(i).unwrap().try_to_vec().unwrap())
    }

    #[test]
    fn nx_order_nan_last_zeros_tie_and_ties_stay_in_order() {
        let xs = vec![f32::NAN, 0.0, f32::NEG_INFINITY, -0.0, 1.5, f32::INFINITY, -f32::NAN, 1.5, -2.0];
        let (v, i) = run(xs.clone(), &[9], 0, false);
        assert_eq!(i, vec![2, 8, 1, 3, 4, 7, 5, 0, 6]);
        assert_eq!(v[..7].iter().map(|f| f.to_bits()).collect::<Vec<_>>(), [f32::NEG_INFINITY, -2.0, 0.0, -0.0, 1.5, 1.5, f32::INFINITY].map(f32::to_bits));
        assert!(v[7].is_nan() && v[8].is_nan());
        // descending: NaN first, ties (the NaNs, the zeros, the 1.5s) still in input order
        let (_, i) = run(xs, &[9], 0, true);
        assert_eq!(i, vec![0, 6, 5, 4, 7, 1, 3, 8, 2]);
    }

    #[test]
    fn equals_a_stable_comparison_sort_on_every_axis() {
        let shape = [3, 50, 4];
        let xs: Vec<f32> = (0..600).map(|i| (((i * 7919) % 23) as f32 - 11.0) * 0.5).collect();
        for axis in 0..3 {
            for desc in [false, true] {
                let (v, idx) = run(xs.clone(), &shape, axis, desc);
                let (n, inner) = (shape[axis], shape[axis + 1..].iter().product::<usize>());
                for lane in 0..xs.len() / n {
                    let (o, i) = (lane / inner, lane % inner);
                    let pos = |k: usize| (o * n + k) * inner + i;
                    let mut want: Vec<usize> = (0..n).collect();
                    want.sort_by(|&a, &b| {
                        let c = xs[pos(a)].partial_cmp(&xs[pos(b)]).unwrap();
                        if desc { c.reverse() } else { c }
                    });
                    let got: Vec<usize> = (0..n).map(|k| idx[pos(k)] as usize).collect();
                    assert_eq!(got, want, "axis {axis} desc {desc} lane {lane}");
                    assert!((0..n).all(|k| v[pos(k)] == xs[pos(want[k])]));
                }
            }
        }
    }
}
