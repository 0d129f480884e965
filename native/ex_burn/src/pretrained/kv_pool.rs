//! The Burn tensor path's KV cache: the keys and values of all of a model's sessions in pages
//! of `PAGE` positions, one tensor per layer and side, `[pages, PAGE, kv_heads * head_dim]`; a
//! session holds a list of pages. A step's new keys and values are written with one op per
//! layer and side, however many sessions it runs, and its attention reads every session's pages
//! with one gather: on a GPU every op is a kernel launch and decoding is launch-bound, so a step
//! of many sessions costs about what one costs. Nothing is concatenated per token, and a
//! session holds memory for its own length only (rounded up to a page).

use burn::tensor::{DType, Device, IndexingUpdateOp, Int, Tensor};

use super::weights::i32_tensor;

/// Positions a page holds.
pub(crate) const PAGE: usize = 32;

/// Pages a new pool starts with; it grows by a quarter (at least this many) when they run out,
/// so it holds at most a quarter more than its sessions' high-water mark.
const FIRST_PAGES: usize = 16;

/// Page 0 is never handed out and stays zero: the padding of a shorter session's page list.
/// Rows past a session's length are masked out of attention, but 0 · NaN would still reach the
/// sum, so every row a step reads is either written by its session or zero.
const ZERO_PAGE: usize = 0;

pub(crate) struct KvPool {
    /// Per layer, keys and values: `[pages, PAGE, width]`.
    layers: Vec<[Tensor<3>; 2]>,
    pages: usize,
    width: usize,
    free: Vec<usize>,
    /// Pages a released session wrote: zeroed before their next owner's step reads them.
    dirty: Vec<bool>,
    /// Counts resets: pages taken before the last one hold nothing any more.
    epoch: u64,
    layer_count: usize,
    device: Device,
    /// What a side holds while it is out of the pool (`take`): one empty tensor, cloned, so
    /// taking a side registers no op.
    vacant: Tensor<3>,
}

/// A session's pages, in position order, in the pool of one epoch.
#[derive(Debug, Default)]
pub(crate) struct Pages {
    list: Vec<usize>,
    epoch: u64,
}

impl KvPool {
    pub(crate) fn new(layers: usize, width: usize, device: &Device) -> KvPool {
        let vacant = Tensor::empty([0, 0, 0], (device, DType::F32));
        let mut pool = KvPool { layers: Vec::new(), pages: 0, width, free: Vec::new(), dirty: Vec::new(), epoch: 0, layer_count: layers, device: device.clone(), vacant };
        pool.reset();
        pool
    }

    /// Empties the pool: after a step failed part-way (a layer's tensor may be gone), every
    /// page taken before is stale (`holds`).
    pub(crate) fn reset(&mut self) {
        self.layers = (0..self.layer_count).map(|_| [self.zeros(1), self.zeros(1)]).collect();
        (self.pages, self.free, self.dirty) = (1, Vec::new(), vec![false]);
        self.epoch += 1;
    }

    fn zeros(&self, pages: usize) -> Tensor<3> {
        Tensor::zeros([pages, PAGE, self.width], (&self.device, DType::F32))
    }

    /// Whether `pages` belong to this pool since its last reset (an empty list always does).
    pub(crate) fn holds(&self, pages: &Pages) -> bool {
        pages.list.is_empty() || pages.epoch == self.epoch
    }

    /// Gives a session's pages back; stale ones (taken before a reset) are already gone.
    pub(crate) fn release(&mut self, pages: &mut Pages) {
        let list = std::mem::take(&mut pages.list);
        if pages.epoch == self.epoch {
            for p in list {
                self.dirty[p] = true;
                self.free.push(p);
            }
        }
    }

    /// Pages enough for each session's `positions`, taken from the free list (the pool growing
    /// when it is empty); dirty ones are zeroed, all in one op per layer and side.
    pub(crate) fn reserve(&mut self, sessions: &mut [(&mut Pages, usize)]) {
        let mut zero = Vec::new();
        for (pages, positions) in sessions.iter_mut() {
            if pages.list.is_empty() {
                pages.epoch = self.epoch;
            }
            while pages.list.len() * PAGE < *positions {
                let p = self.take_page();
                if std::mem::take(&mut self.dirty[p]) {
                    zero.push(p as i32);
                }
                pages.list.push(p);
            }
        }
        if !zero.is_empty() {
            let n = zero.len();
            let (at, zeros) = (i32_tensor(zero, &self.device), self.zeros(n));
            for side in self.layers.iter_mut().flatten() {
                *side = take(side, &self.vacant).select_assign(0, at.clone(), zeros.clone(), IndexingUpdateOp::Assign);
            }
        }
    }

    fn take_page(&mut self) -> usize {
        if self.free.is_empty() {
            let add = (self.pages / 4).max(FIRST_PAGES);
            let zeros = self.zeros(add);
            for side in self.layers.iter_mut().flatten() {
                *side = Tensor::cat(vec![take(side, &self.vacant), zeros.clone()], 0);
            }
            self.free.extend((self.pages..self.pages + add).rev());
            self.dirty.resize(self.pages + add, false);
            self.pages += add;
        }
        self.free.pop().expect("a free page after growing")
    }

    /// The flat row (`page * PAGE + offset`) of each position of each session, as `write`
    /// takes them; every position must be reserved.
    pub(crate) fn rows<'a>(&self, at: impl Iterator<Item = (&'a Pages, usize)>) -> Tensor<1, Int> {
        let rows: Vec<i32> = at.map(|(pages, pos)| (pages.list[pos / PAGE] * PAGE + pos % PAGE) as i32).collect();
        i32_tensor(rows, &self.device)
    }

    /// Writes `k` and `v` (`[rows, width]`) of layer `layer` at the flat rows `at`.
    pub(crate) fn write(&mut self, layer: usize, at: &Tensor<1, Int>, k: Tensor<2>, v: Tensor<2>) {
        let (pages, width) = (self.pages, self.width);
        let put = |side: Tensor<3>, new: Tensor<2>| side.reshape([pages * PAGE, width]).select_assign(0, at.clone(), new, IndexingUpdateOp::Assign).reshape([pages, PAGE, width]);
        self.update(layer, |[ks, vs]| ((), [put(ks, k), put(vs, v)]))
    }

    /// Keys and values of positions `0..len` of `pages`, per layer: `[len, width]` each, copies
    /// that later writes to the pool leave alone.
    pub(crate) fn copy_out(&self, pages: &Pages, len: usize) -> Vec<[Tensor<2>; 2]> {
        let at = self.rows((0..len).map(|pos| (pages, pos)));
        let (rows, width) = (self.pages * PAGE, self.width);
        self.layers.iter().map(|sides| sides.clone().map(|side| side.reshape([rows, width]).select(0, at.clone()))).collect()
    }

    /// Layer `layer`'s key and value sides through `f`, which hands them back updated: the pool
    /// lets go of them meanwhile, so the backend may write them in place (`gpu::rope_cache`).
    pub(crate) fn update<R>(&mut self, layer: usize, f: impl FnOnce([Tensor<3>; 2]) -> (R, [Tensor<3>; 2])) -> R {
        let vacant = &self.vacant;
        let (r, sides) = f(self.layers[layer].each_mut().map(|side| take(side, vacant)));
        self.layers[layer] = sides;
        r
    }

    /// The page table of a step: each session's pages, padded with the zero page to the longest
    /// list, and that length. `read` takes it.
    pub(crate) fn table(&self, sessions: &[&Pages]) -> (Tensor<1, Int>, usize) {
        let longest = sessions.iter().map(|p| p.list.len()).max().unwrap_or(0);
        let ids = sessions.iter().flat_map(|p| (0..longest).map(|i| p.list.get(i).copied().unwrap_or(ZERO_PAGE) as i32)).collect();
        (i32_tensor(ids, &self.device), longest)
    }

    /// Keys and values of layer `layer` for the `b` sessions of `table`: `[b, pages * PAGE,
    /// width]`, position `j` of session `i` at `[i, j]`.
    pub(crate) fn read(&self, layer: usize, table: &(Tensor<1, Int>, usize), b: usize) -> [Tensor<3>; 2] {
        let (ids, pages) = table;
        self.layers[layer].clone().map(|side| side.select(0, ids.clone()).reshape([b, pages * PAGE, self.width]))
    }

    /// Keys and values of layer `layer` as stored, `[pages, PAGE, width]`.
    pub(crate) fn layer(&self, layer: usize) -> &[Tensor<3>; 2] {
        &self.layers[layer]
    }

    /// A layer's keys gone, as an op failing part-way through `write` leaves them.
    #[cfg(test)]
    pub(crate) fn lose_a_layer(&mut self) {
        take(&mut self.layers[0][0], &self.vacant);
    }

    /// Bytes the pool holds on its device.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.layers.len() * 2 * self.pages * PAGE * self.width * 4
    }
}

/// The tensor out of the pool, so that the backend may update it in place (its only reference).
fn take(side: &mut Tensor<3>, vacant: &Tensor<3>) -> Tensor<3> {
    std::mem::replace(side, vacant.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::TensorData;

    fn values(t: Tensor<3>) -> Vec<f32> {
        t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
    }

    /// Rows written for several sessions read back in place through the page table, across
    /// pages and the pool's growth; the padding of a shorter session reads zeros; a released
    /// page's next owner reads zeros, never its predecessor's values; a reset makes old pages
    /// stale.
    #[test]
    fn kv_pool_pages_write_read_and_grow() {
        let dev = crate::testing::device().burn().unwrap();
        let mut pool = KvPool::new(2, 3, &dev);
        let mut sessions: Vec<Pages> = (0..3).map(|_| Pages::default()).collect();
        let row = |s: usize, p: usize, side: f32| -> Vec<f32> { (0..3).map(|c| side * 1e4 + (s * 1000 + p) as f32 + c as f32 / 10.0).collect() };
        let write = |pool: &mut KvPool, sessions: &mut [Pages], at: &[(usize, usize)]| {
            let mut need: Vec<usize> = sessions.iter().map(|p| p.list.len() * PAGE).collect();
            at.iter().for_each(|&(s, p)| need[s] = need[s].max(p + 1));
            pool.reserve(&mut sessions.iter_mut().zip(need).collect::<Vec<_>>());
            let rows = pool.rows(at.iter().map(|&(s, p)| (&sessions[s], p)));
            let data = |side: f32| Tensor::<2>::from_data(TensorData::new(at.iter().flat_map(|&(s, p)| row(s, p, side)).collect::<Vec<f32>>(), [at.len(), 3]), (&dev, DType::F32));
            pool.write(1, &rows, data(1.0), data(-1.0));
        };
        // session 1 spans 20 pages: the pool grows past its first 16
        write(&mut pool, &mut sessions, &[(0, 0), (1, 0), (2, 0), (0, 1), (1, 40), (1, 639)]);
        assert_eq!(sessions.iter().map(|p| p.list.len()).collect::<Vec<_>>(), vec![1, 20, 1]);
        assert_eq!(pool.pages, 1 + 16 + 16);
        let table = pool.table(&[&sessions[1], &sessions[0]]);
        assert_eq!(table.1, 20);
        let [k, v] = pool.read(1, &table, 2);
        let (k, v) = (values(k), values(v));
        let at = |t: &[f32], b: usize, p: usize| t[(b * 20 * PAGE + p) * 3..][..3].to_vec();
        assert_eq!(at(&k, 0, 40), row(1, 40, 1.0));
        assert_eq!(at(&v, 0, 639), row(1, 639, -1.0));
        assert_eq!(at(&k, 1, 1), row(0, 1, 1.0));
        assert_eq!(at(&k, 1, 2), vec![0.0; 3]);
        assert_eq!(at(&k, 1, 600), vec![0.0; 3], "padding reads the zero page");
        assert_eq!(values(pool.read(0, &pool.table(&[&sessions[0]]), 1)[0].clone()), vec![0.0; PAGE * 3]);

        // session 1's pages go back dirty; session 2 takes them and reads zeros
        let taken = sessions[1].list.clone();
        pool.release(&mut sessions[1]);
        pool.reserve(&mut [(&mut sessions[2], 21 * PAGE)]);
        assert!(sessions[2].list[1..].iter().all(|p| taken.contains(p)));
        assert!(values(pool.read(1, &pool.table(&[&sessions[2]]), 1)[0].clone()).iter().skip(PAGE * 3).all(|&x| x == 0.0));
        assert_eq!(pool.bytes(), 2 * 2 * 33 * PAGE * 3 * 4);

        pool.reset();
        assert!(!pool.holds(&sessions[0]) && pool.holds(&Pages::default()));
        pool.release(&mut sessions[0]);
        assert!(sessions[0].list.is_empty() && pool.free.is_empty());
    }
}
