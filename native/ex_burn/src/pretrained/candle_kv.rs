//! The Candle decoder's KV cache. Each block of a sequence keeps K and V in buffers with room to
//! grow, written in place: a decoding step appends one row instead of copying the whole cache,
//! and the sequences of a batch are stacked to a common length (the positions past a sequence's
//! end hold zeros, which a mask hides) for one attention call.

use candle_core::{Result, Tensor};

/// The fewest positions a buffer is made with; it doubles beyond.
const MIN_POSITIONS: usize = 64;

/// One block's cache of one sequence: K and V as `[1, kv_heads, capacity, head_dim]`, zeros past
/// `len`.
pub struct KvBuf {
    k: Tensor,
    v: Tensor,
    len: usize,
}

impl KvBuf {
    /// Appends `k` and `v` (`[1, kv_heads, s, head_dim]`), making room for at least `room`
    /// positions in all when the buffer is made or grows.
    pub fn append(slot: &mut Option<KvBuf>, k: &Tensor, v: &Tensor, room: usize) -> Result<()> {
        let len = slot.as_ref().map_or(0, |b| b.len);
        Self::make_room(slot, k, len + k.dim(2)?, room)?;
        let b = slot.as_mut().expect("made above");
        b.k.slice_set(&k.contiguous()?, 2, len)?;
        b.v.slice_set(&v.contiguous()?, 2, len)?;
        b.len += k.dim(2)?;
        Ok(())
    }

    /// Grows the buffer (made like `like`, `[1, kv_heads, _, head_dim]`) to hold at least
    /// `positions`: to `room` or twice its size where that is more.
    pub fn make_room(slot: &mut Option<KvBuf>, like: &Tensor, positions: usize, room: usize) -> Result<()> {
        let capacity = slot.as_ref().map_or(0, |b| b.k.dim(2).unwrap_or(0));
        if positions <= capacity {
            return Ok(());
        }
        let grown = positions.max(room).max(2 * capacity).max(MIN_POSITIONS);
        let (_, heads, _, head_dim) = like.dims4()?;
        let zeros = || Tensor::zeros((1, heads, grown, head_dim), like.dtype(), like.device());
        let (k, v) = (zeros()?, zeros()?);
        let len = match slot.take() {
            Some(old) => {
                k.slice_set(&old.k, 2, 0)?;
                v.slice_set(&old.v, 2, 0)?;
                old.len
            }
            None => 0,
        };
        *slot = Some(KvBuf { k, v, len });
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// K and V over the cached positions.
    pub fn cached(&self) -> Result<(Tensor, Tensor)> {
        self.first(self.len)
    }

    /// K and V over the first `positions` (at most the capacity): past `len`, zeros.
    pub fn first(&self, positions: usize) -> Result<(Tensor, Tensor)> {
        Ok((self.k.narrow(2, 0, positions)?, self.v.narrow(2, 0, positions)?))
    }
}

/// The additive mask of sequences stacked to `positions`, one query each: `[n, 1, 1, positions]`,
/// 0 where sequence `i` (its cache `lens[i]` long, the query its last position) sees a key and
/// -inf where not: past its end, and in a window's layers `window` or more positions back.
/// None where nothing is hidden.
pub fn stacked_mask(lens: &[usize], positions: usize, window: Option<usize>, dev: &candle_core::Device) -> Result<Option<Tensor>> {
    let hidden = |len: usize, j: usize| j >= len || window.is_some_and(|w| len - 1 - j >= w);
    if !lens.iter().any(|&len| (0..positions).any(|j| hidden(len, j))) {
        return Ok(None);
    }
    let m: Vec<f32> = lens.iter().flat_map(|&len| (0..positions).map(move |j| if hidden(len, j) { f32::NEG_INFINITY } else { 0.0 })).collect();
    Tensor::from_vec(m, (lens.len(), 1, 1, positions), dev).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn rows(heads: usize, s: usize, from: f32) -> Tensor {
        let v: Vec<f32> = (0..heads * s * 2).map(|i| from + i as f32).collect();
        Tensor::from_vec(v, (1, heads, s, 2), &Device::Cpu).unwrap()
    }

    #[test]
    fn appended_rows_read_back_in_order_across_growth() {
        let mut slot = None;
        let (a, b) = (rows(3, 50, 0.0), rows(3, 30, 1000.0));
        KvBuf::append(&mut slot, &a, &a, 0).unwrap();
        assert_eq!(slot.as_ref().unwrap().k.dim(2).unwrap(), MIN_POSITIONS);
        KvBuf::append(&mut slot, &b, &(&b * 2.0).unwrap(), 0).unwrap();
        let buf = slot.as_ref().unwrap();
        assert_eq!((buf.len(), buf.k.dim(2).unwrap()), (80, 128), "grown to twice its size");
        let (k, v) = buf.cached().unwrap();
        let want_k = Tensor::cat(&[&a, &b], 2).unwrap();
        let want_v = Tensor::cat(&[&a, &(&b * 2.0).unwrap()], 2).unwrap();
        assert_eq!(k.flatten_all().unwrap().to_vec1::<f32>().unwrap(), want_k.flatten_all().unwrap().to_vec1::<f32>().unwrap());
        assert_eq!(v.flatten_all().unwrap().to_vec1::<f32>().unwrap(), want_v.flatten_all().unwrap().to_vec1::<f32>().unwrap());
        let (padded, _) = buf.first(100).unwrap();
        let tail = padded.narrow(2, 80, 20).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert!(tail.iter().all(|&x| x == 0.0), "zeros past the cached positions");
    }

    #[test]
    fn a_reserved_room_is_made_at_once() {
        let mut slot = None;
        KvBuf::append(&mut slot, &rows(2, 5, 0.0), &rows(2, 5, 0.0), 300).unwrap();
        assert_eq!(slot.as_ref().unwrap().k.dim(2).unwrap(), 300);
    }

    #[test]
    fn the_stacked_mask_hides_what_each_sequence_does_not_see() {
        let m = stacked_mask(&[2, 4], 4, None, &Device::Cpu).unwrap().unwrap();
        assert_eq!(m.dims(), [2, 1, 1, 4]);
        let ninf = f32::NEG_INFINITY;
        assert_eq!(m.flatten_all().unwrap().to_vec1::<f32>().unwrap(), [0.0, 0.0, ninf, ninf, 0.0, 0.0, 0.0, 0.0]);
        let w = stacked_mask(&[4, 3], 4, Some(2), &Device::Cpu).unwrap().unwrap();
        assert_eq!(w.flatten_all().unwrap().to_vec1::<f32>().unwrap(), [ninf, ninf, 0.0, 0.0, ninf, 0.0, 0.0, ninf]);
        assert!(stacked_mask(&[3, 3], 3, None, &Device::Cpu).unwrap().is_none());
    }
}
