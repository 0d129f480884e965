//! The Candle decoder's KV cache. Each block of a sequence keeps K and V in buffers with room to
//! grow, written in place: a decoding step appends one row instead of copying the whole cache.
//! The sequences of a batch attend together over their caches stacked to a common length (the
//! positions past a sequence's end hold zeros, which a mask hides); sequences that keep decoding
//! together keep their caches as the rows of one stack, so a step appends to all of them with one
//! write and attends without copying.

use std::sync::Arc;

use candle_core::{Result, Tensor};

/// The fewest positions a buffer is made with; it doubles beyond.
const MIN_POSITIONS: usize = 64;

/// Positions a stack is made with past its longest sequence, so it serves that many steps.
const STACK_HEADROOM: usize = 64;

/// One block's cache of one sequence: K and V as `[1, kv_heads, capacity, head_dim]`, zeros past
/// `len`; either buffers of its own or a row of a stack.
pub struct KvBuf {
    k: Tensor,
    v: Tensor,
    len: usize,
    stack: Option<(Arc<Stack>, usize)>,
}

/// The caches of several sequences: K and V as `[rows, kv_heads, capacity, head_dim]`.
pub struct Stack {
    k: Tensor,
    v: Tensor,
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
        *slot = Some(KvBuf { k, v, len, stack: None });
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

/// Appends a row to each of `slots` (`k`, `v`: `[n, kv_heads, 1, head_dim]`, row `i` for slot
/// `i`, whose caches are `at[i]` long, all of them one position each), and returns their K and V
/// stacked over the first `positions`: the longest cache after the row. Where the caches are the
/// rows `0..n` of one stack with room, the rows go in with one write (`write_at`: `at` as `[n,
/// kv_heads, 1, head_dim]` indices). Otherwise they move into a new stack first, when it (up to
/// the longest cache, plus headroom) stays within what they reserved (`rooms`, each at least its
/// length) plus the headroom; past that each cache appends on its own and they are copied
/// together.
pub fn append_stacked(slots: &mut [&mut Option<KvBuf>], k: &Tensor, v: &Tensor, at: &[usize], write_at: &Tensor, rooms: &[usize]) -> Result<(Tensor, Tensor)> {
    let n = slots.len();
    let positions = at.iter().max().map_or(1, |m| m + 1);
    let stack = match shared_stack(slots, positions) {
        Some(stack) => stack,
        None => {
            let capacity = positions + STACK_HEADROOM;
            let reserved: usize = rooms.iter().zip(at).map(|(&r, &len)| r.max(len + 1)).sum();
            if n * capacity > reserved + n * STACK_HEADROOM {
                return append_each(slots, k, v, positions, rooms);
            }
            new_stack(slots, k, capacity)?
        }
    };
    let (sk, sv) = (stack.k.narrow(0, 0, n)?, stack.v.narrow(0, 0, n)?);
    sk.scatter_set(write_at, &k.contiguous()?, 2)?;
    sv.scatter_set(write_at, &v.contiguous()?, 2)?;
    for slot in slots.iter_mut() {
        slot.as_mut().expect("stacked").len += 1;
    }
    Ok((sk.narrow(2, 0, positions)?, sv.narrow(2, 0, positions)?))
}

/// The stack whose rows `0..n` `slots` are, in order, where it holds `positions`.
fn shared_stack(slots: &[&mut Option<KvBuf>], positions: usize) -> Option<Arc<Stack>> {
    let first = match slots.first().and_then(|s| s.as_ref()).and_then(|b| b.stack.as_ref()) {
        Some((stack, 0)) => Arc::clone(stack),
        _ => return None,
    };
    let rows = slots.iter().enumerate().all(|(i, s)| matches!(s.as_ref().and_then(|b| b.stack.as_ref()), Some((st, row)) if *row == i && Arc::ptr_eq(st, &first)));
    (rows && first.k.dim(2).ok()? >= positions).then_some(first)
}

/// A stack of `capacity` positions holding `slots`' caches, which become its rows.
fn new_stack(slots: &mut [&mut Option<KvBuf>], like: &Tensor, capacity: usize) -> Result<Arc<Stack>> {
    let (_, heads, _, head_dim) = like.dims4()?;
    let zeros = || Tensor::zeros((slots.len(), heads, capacity, head_dim), like.dtype(), like.device());
    let stack = Arc::new(Stack { k: zeros()?, v: zeros()? });
    for (i, slot) in slots.iter_mut().enumerate() {
        let (k, v) = (stack.k.narrow(0, i, 1)?, stack.v.narrow(0, i, 1)?);
        let len = match slot.take() {
            // a buffer that fits goes in whole (zeros past its length), one copy
            Some(old) if old.k.dim(2)? <= capacity => {
                k.slice_set(&old.k, 2, 0)?;
                v.slice_set(&old.v, 2, 0)?;
                old.len
            }
            Some(old) => {
                let (ok, ov) = old.cached()?;
                k.slice_set(&ok.contiguous()?, 2, 0)?;
                v.slice_set(&ov.contiguous()?, 2, 0)?;
                old.len
            }
            None => 0,
        };
        **slot = Some(KvBuf { k, v, len, stack: Some((Arc::clone(&stack), i)) });
    }
    Ok(stack)
}

/// `append_stacked` one cache at a time: each appends its row and they are copied together.
fn append_each(slots: &mut [&mut Option<KvBuf>], k: &Tensor, v: &Tensor, positions: usize, rooms: &[usize]) -> Result<(Tensor, Tensor)> {
    let (mut ks, mut vs) = (Vec::with_capacity(slots.len()), Vec::with_capacity(slots.len()));
    for (i, slot) in slots.iter_mut().enumerate() {
        KvBuf::append(slot, &k.narrow(0, i, 1)?, &v.narrow(0, i, 1)?, rooms[i])?;
        KvBuf::make_room(slot, k, positions, 0)?;
        let (kc, vc) = slot.as_ref().expect("appended above").first(positions)?;
        ks.push(kc);
        vs.push(vc);
    }
    Ok((Tensor::cat(&ks, 0)?, Tensor::cat(&vs, 0)?))
}

/// `at` as the indices `append_stacked` writes with: `[at.len(), heads, 1, head_dim]`.
pub fn write_indices(at: &[usize], heads: usize, head_dim: usize, dev: &candle_core::Device) -> Result<Tensor> {
    let idx: Vec<u32> = at.iter().flat_map(|&p| std::iter::repeat_n(p as u32, heads * head_dim)).collect();
    Tensor::from_vec(idx, (at.len(), heads, 1, head_dim), dev)
}

/// Whether the query at position `query` does not see the key at `key`: a later one, or in a
/// window's layers one `window` or more positions back.
pub fn hidden(query: usize, key: usize, window: Option<usize>) -> bool {
    key > query || window.is_some_and(|w| query - key >= w)
}

/// The additive mask of sequences stacked to `positions`, one query each: `[n, 1, 1, positions]`,
/// 0 where sequence `i` (its cache `lens[i]` long, the query its last position) sees a key and
/// -inf where not: past its end, and in a window's layers `window` or more positions back.
/// None where nothing is hidden.
pub fn stacked_mask(lens: &[usize], positions: usize, window: Option<usize>, dev: &candle_core::Device) -> Result<Option<Tensor>> {
    let hidden = |len: usize, j: usize| hidden(len - 1, j, window);
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

    /// The Candle tests' device: the caches' writes are device kernels (a scatter on a GPU).
    fn dev() -> Device {
        super::super::candle_device::test_candle_device()
    }

    fn rows(heads: usize, s: usize, from: f32) -> Tensor {
        let v: Vec<f32> = (0..heads * s * 2).map(|i| from + i as f32).collect();
        Tensor::from_vec(v, (1, heads, s, 2), &dev()).unwrap()
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

    fn values(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
    }

    /// Two caches of 3 and 5 positions appended to together, three times: the stacked K is each
    /// cache's rows then zeros, whether the rows went in by a new stack or into the stack.
    #[test]
    fn sequences_appended_together_read_back_as_alone() {
        let (heads, dim) = (2, 2);
        let mut slots: Vec<Option<KvBuf>> = vec![None, None];
        let mut alone: Vec<Option<KvBuf>> = vec![None, None];
        for (i, len) in [3, 5].into_iter().enumerate() {
            let r = rows(heads, len, 100.0 * i as f32);
            KvBuf::append(&mut slots[i], &r, &r, 0).unwrap();
            KvBuf::append(&mut alone[i], &r, &r, 0).unwrap();
        }
        let mut stacks = vec![];
        for step in 0..3 {
            let at: Vec<usize> = slots.iter().map(|s| s.as_ref().unwrap().len()).collect();
            let new = rows(heads, 2, 1000.0 * (step + 1) as f32).reshape((2, heads, 1, dim)).unwrap();
            let write_at = write_indices(&at, heads, dim, &dev()).unwrap();
            let mut refs: Vec<&mut Option<KvBuf>> = slots.iter_mut().collect();
            let (k, _) = append_stacked(&mut refs, &new, &new, &at, &write_at, &[100, 100]).unwrap();
            let longest = at.iter().max().unwrap() + 1;
            assert_eq!(k.dims(), [2, heads, longest, dim]);
            for i in 0..2 {
                KvBuf::append(&mut alone[i], &new.narrow(0, i, 1).unwrap(), &new.narrow(0, i, 1).unwrap(), 0).unwrap();
                let (want, _) = alone[i].as_ref().unwrap().first(longest).unwrap();
                assert_eq!(values(&k.narrow(0, i, 1).unwrap()), values(&want), "step {step}, sequence {i}");
            }
            stacks.push(Arc::clone(&slots[0].as_ref().unwrap().stack.as_ref().expect("stacked").0));
        }
        assert!(Arc::ptr_eq(&stacks[0], &stacks[2]), "later steps write into the stack made at the first");
        // one of them alone goes on appending in its row
        let r = rows(heads, 1, 5000.0);
        KvBuf::append(&mut slots[1], &r, &r, 0).unwrap();
        KvBuf::append(&mut alone[1], &r, &r, 0).unwrap();
        assert_eq!(values(&slots[1].as_ref().unwrap().cached().unwrap().0), values(&alone[1].as_ref().unwrap().cached().unwrap().0));
    }

    /// A stack padded past what the sequences reserved is not made: each cache appends on its
    /// own.
    #[test]
    fn a_stack_that_would_pad_too_much_is_not_made() {
        let mut slots: Vec<Option<KvBuf>> = (0..4).map(|_| None).collect();
        let long = rows(1, 200, 0.0);
        KvBuf::append(&mut slots[0], &long, &long, 0).unwrap();
        let new = rows(1, 4, 9.0).reshape((4, 1, 1, 2)).unwrap();
        let at = [200, 0, 0, 0];
        let write_at = write_indices(&at, 1, 2, &dev()).unwrap();
        let mut refs: Vec<&mut Option<KvBuf>> = slots.iter_mut().collect();
        let (k, _) = append_stacked(&mut refs, &new, &new, &at, &write_at, &[201, 1, 1, 1]).unwrap();
        assert_eq!(k.dims(), [4, 1, 201, 2]);
        assert!(slots.iter().all(|s| s.as_ref().unwrap().stack.is_none()));
        assert_eq!(values(&k.narrow(0, 1, 1).unwrap().narrow(2, 0, 1).unwrap()), [11.0, 12.0]);
    }

    #[test]
    fn the_stacked_mask_hides_what_each_sequence_does_not_see() {
        let m = stacked_mask(&[2, 4], 4, None, &dev()).unwrap().unwrap();
        assert_eq!(m.dims(), [2, 1, 1, 4]);
        let ninf = f32::NEG_INFINITY;
        assert_eq!(m.flatten_all().unwrap().to_vec1::<f32>().unwrap(), [0.0, 0.0, ninf, ninf, 0.0, 0.0, 0.0, 0.0]);
        let w = stacked_mask(&[4, 3], 4, Some(2), &dev()).unwrap().unwrap();
        assert_eq!(w.flatten_all().unwrap().to_vec1::<f32>().unwrap(), [ninf, ninf, 0.0, 0.0, ninf, 0.0, 0.0, ninf]);
        assert!(stacked_mask(&[3, 3], 3, None, &dev()).unwrap().is_none());
    }
}
