//! sentence-transformers' pooling (`1_Pooling/config.json`) and `Normalize` module, on the last
//! hidden states an `Encoder` returns. One implementation for both engines.

use serde::Deserialize;

use super::TokenBatch;

/// The pooling modes sentence-transformers' config can ask for. Several may be on at once; the
/// pooled vector is then their concatenation, in this order (as in `sentence_transformers.models.Pooling`).
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct PoolingConfig {
    #[serde(default)]
    pub pooling_mode_cls_token: bool,
    #[serde(default)]
    pub pooling_mode_max_tokens: bool,
    #[serde(default)]
    pub pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pub pooling_mode_mean_sqrt_len_tokens: bool,
}

impl Default for PoolingConfig {
    /// A model without `1_Pooling/config.json`: mean pooling, sentence-transformers' default.
    fn default() -> Self {
        PoolingConfig {
            pooling_mode_cls_token: false,
            pooling_mode_max_tokens: false,
            pooling_mode_mean_tokens: true,
            pooling_mode_mean_sqrt_len_tokens: false,
        }
    }
}

impl PoolingConfig {
    pub fn modes(&self) -> usize {
        [self.pooling_mode_cls_token, self.pooling_mode_max_tokens, self.pooling_mode_mean_tokens, self.pooling_mode_mean_sqrt_len_tokens]
            .iter()
            .filter(|m| **m)
            .count()
    }

    /// Pools `hidden` (`[batch, seq, hidden]`) over the tokens `batch.mask` marks, one row per
    /// input, each `modes() * hidden` long. Sums run in f64 so the order of tokens cannot matter.
    pub fn pool(&self, hidden: &[f32], batch: &TokenBatch, size: usize) -> Vec<Vec<f32>> {
        (0..batch.batch)
            .map(|b| {
                let rows = |t: usize| &hidden[(b * batch.seq + t) * size..(b * batch.seq + t + 1) * size];
                let real: Vec<usize> = (0..batch.seq).filter(|&t| batch.mask[b * batch.seq + t] != 0).collect();
                let mut out = Vec::with_capacity(self.modes() * size);
                if self.pooling_mode_cls_token {
                    out.extend_from_slice(rows(0));
                }
                if self.pooling_mode_max_tokens {
                    out.extend((0..size).map(|i| real.iter().map(|&t| rows(t)[i]).fold(f32::NEG_INFINITY, f32::max)));
                }
                let sums: Vec<f64> = (0..size).map(|i| real.iter().map(|&t| rows(t)[i] as f64).sum()).collect();
                // sentence-transformers clamps the token count at 1e-9 so an all-padding row gives 0s.
                let n = (real.len() as f64).max(1e-9);
                if self.pooling_mode_mean_tokens {
                    out.extend(sums.iter().map(|s| (s / n) as f32));
                }
                if self.pooling_mode_mean_sqrt_len_tokens {
                    out.extend(sums.iter().map(|s| (s / n.sqrt()) as f32));
                }
                out
            })
            .collect()
    }
}

/// `torch.nn.functional.normalize(p=2, eps=1e-12)`: divides by max(‖v‖, 1e-12).
pub fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| (*x as f64) * (*x as f64)).sum::<f64>().sqrt().max(1e-12);
    v.iter_mut().for_each(|x| *x = (*x as f64 / norm) as f32);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(mask: Vec<u32>, b: usize, s: usize) -> TokenBatch {
        TokenBatch { ids: vec![0; b * s], type_ids: vec![0; b * s], mask, batch: b, seq: s }
    }

    #[test]
    fn mean_pooling_ignores_padding() {
        // Two inputs of 3 positions, hidden size 2; the second has one padding position.
        let hidden = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 10.0, 20.0, 30.0, 40.0, 1e9, 1e9];
        let pooled = PoolingConfig::default().pool(&hidden, &batch(vec![1, 1, 1, 1, 1, 0], 2, 3), 2);
        assert_eq!(pooled, vec![vec![3.0, 4.0], vec![20.0, 30.0]]);
    }

    #[test]
    fn modes_concatenate_in_sentence_transformers_order() {
        let cfg = PoolingConfig { pooling_mode_cls_token: true, pooling_mode_max_tokens: true, pooling_mode_mean_tokens: true, pooling_mode_mean_sqrt_len_tokens: false };
        let hidden = [1.0, -2.0, 3.0, 4.0];
        let pooled = cfg.pool(&hidden, &batch(vec![1, 1], 1, 2), 2);
        assert_eq!(pooled, vec![vec![1.0, -2.0, 3.0, 4.0, 2.0, 1.0]]);
    }

    #[test]
    fn normalize_matches_torch() {
        let mut v = [3.0f32, 4.0];
        normalize(&mut v);
        assert_eq!(v, [0.6, 0.8]);
        let mut zero = [0.0f32, 0.0];
        normalize(&mut zero);
        assert_eq!(zero, [0.0, 0.0]);
    }
}
