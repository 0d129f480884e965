//! What sentence-transformers runs after the transformer, on the last hidden states an
//! `Encoder` returns: pooling (`1_Pooling/config.json`), then `Dense` and `Normalize` modules in
//! `modules.json`'s order. One implementation for both engines.

use std::path::Path;

use super::errors::{self, kind};
use super::weights::Safetensors;
use super::TokenBatch;
use crate::error::{Detail, ExResult};

/// A pooling mode of `sentence_transformers.models.Pooling`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolMode {
    Cls,
    Max,
    Mean,
    MeanSqrtLen,
    WeightedMean,
    LastToken,
}

/// The legacy `pooling_mode_*` keys, in the order sentence-transformers concatenates them, and
/// the names its newer `pooling_mode` key uses.
const MODES: [(PoolMode, &str, &str); 6] = [
    (PoolMode::Cls, "pooling_mode_cls_token", "cls"),
    (PoolMode::Max, "pooling_mode_max_tokens", "max"),
    (PoolMode::Mean, "pooling_mode_mean_tokens", "mean"),
    (PoolMode::MeanSqrtLen, "pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len_tokens"),
    (PoolMode::WeightedMean, "pooling_mode_weightedmean_tokens", "weightedmean"),
    (PoolMode::LastToken, "pooling_mode_lasttoken", "lasttoken"),
];

impl PoolMode {
    /// The name `ExBurn.Embedding` reports.
    pub fn name(self) -> &'static str {
        match self {
            PoolMode::Cls => "cls",
            PoolMode::Max => "max",
            PoolMode::Mean => "mean",
            PoolMode::MeanSqrtLen => "mean_sqrt_len",
            PoolMode::WeightedMean => "weighted_mean",
            PoolMode::LastToken => "last_token",
        }
    }
}

/// The pooling modes on, in the order their vectors are concatenated.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolingConfig {
    pub modes: Vec<PoolMode>,
}

impl Default for PoolingConfig {
    /// A model without `1_Pooling/config.json`: mean pooling, sentence-transformers' default.
    fn default() -> Self {
        PoolingConfig { modes: vec![PoolMode::Mean] }
    }
}

impl PoolingConfig {
    /// Reads `1_Pooling/config.json` in either form sentence-transformers writes: `pooling_mode`
    /// (a name or a list, concatenated in that order; version 6 on) or the `pooling_mode_*`
    /// booleans (concatenated in `MODES` order). None on means mean, as sentence-transformers reads it.
    pub fn read(path: &Path) -> ExResult<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| errors::io(path, e))?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| errors::bad_config(path, e))?;
        Self::from_json(&v).map_err(|why| errors::bad_config(path, why))
    }

    pub fn from_json(v: &serde_json::Value) -> Result<Self, String> {
        let by_name = |n: &str| MODES.iter().find(|m| m.2 == n).map(|m| m.0).ok_or_else(|| format!("unknown pooling mode {n:?}"));
        let modes = match v.get("pooling_mode") {
            Some(serde_json::Value::String(n)) => vec![by_name(n)?],
            Some(serde_json::Value::Array(list)) => {
                list.iter().map(|n| n.as_str().ok_or_else(|| format!("pooling mode {n} is not a name")).and_then(by_name)).collect::<Result<_, _>>()?
            }
            Some(other) => return Err(format!("pooling_mode must be a name or a list of names, not {other}")),
            None => MODES.iter().filter(|m| v.get(m.1).and_then(|b| b.as_bool()).unwrap_or(false)).map(|m| m.0).collect(),
        };
        Ok(if modes.is_empty() { Self::default() } else { PoolingConfig { modes } })
    }

    pub fn modes(&self) -> usize {
        self.modes.len()
    }

    /// Pools `hidden` (`[batch, seq, hidden]`) over the tokens `batch.mask` marks, one row per
    /// input, each `modes() * hidden` long. Sums run in f64 so the order of tokens cannot matter.
    pub fn pool(&self, hidden: &[f32], batch: &TokenBatch, size: usize) -> Vec<Vec<f32>> {
        (0..batch.batch)
            .map(|b| {
                let rows = |t: usize| &hidden[(b * batch.seq + t) * size..(b * batch.seq + t + 1) * size];
                let real: Vec<usize> = (0..batch.seq).filter(|&t| batch.mask[b * batch.seq + t] != 0).collect();
                let mut out = Vec::with_capacity(self.modes() * size);
                let sums: Vec<f64> = (0..size).map(|i| real.iter().map(|&t| rows(t)[i] as f64).sum()).collect();
                // sentence-transformers clamps the token count at 1e-9 so an all-padding row gives 0s.
                let n = (real.len() as f64).max(1e-9);
                for mode in &self.modes {
                    match mode {
                        // the first real token (padding is on the right, so position 0)
                        PoolMode::Cls => out.extend_from_slice(rows(real.first().copied().unwrap_or(0))),
                        PoolMode::Max => out.extend((0..size).map(|i| real.iter().map(|&t| rows(t)[i]).fold(f32::NEG_INFINITY, f32::max))),
                        PoolMode::Mean => out.extend(sums.iter().map(|s| (s / n) as f32)),
                        PoolMode::MeanSqrtLen => out.extend(sums.iter().map(|s| (s / n.sqrt()) as f32)),
                        // weights 1, 2, … from the first real token
                        PoolMode::WeightedMean => {
                            let first = real.first().copied().unwrap_or(0);
                            let w = |t: usize| (t - first + 1) as f64;
                            let total = real.iter().map(|&t| w(t)).sum::<f64>().max(1e-9);
                            out.extend((0..size).map(|i| (real.iter().map(|&t| rows(t)[i] as f64 * w(t)).sum::<f64>() / total) as f32));
                        }
                        // the last real token; a row without one gives 0s
                        PoolMode::LastToken => match real.last() {
                            Some(&t) => out.extend_from_slice(rows(t)),
                            None => out.extend(std::iter::repeat_n(0.0, size)),
                        },
                    }
                }
                out
            })
            .collect()
    }
}

/// `sentence_transformers.models.Dense`: `activation(W x + b)` on each pooled vector.
#[derive(Clone, Debug)]
pub struct Dense {
    /// `[out, in]`, as stored.
    weight: Vec<f32>,
    bias: Option<Vec<f32>>,
    pub in_features: usize,
    pub out_features: usize,
    activation: Activation,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    Identity,
    Tanh,
    Relu,
    Sigmoid,
}

impl Dense {
    /// Loads `<dir>/config.json` and `<dir>/model.safetensors` (`linear.weight`, `linear.bias`).
    pub fn load(dir: &Path) -> ExResult<Dense> {
        #[derive(serde::Deserialize)]
        struct Config {
            in_features: usize,
            out_features: usize,
            #[serde(default = "yes")]
            bias: bool,
            #[serde(default)]
            activation_function: Option<String>,
        }
        fn yes() -> bool {
            true
        }
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| errors::io(&path, e))?;
        let cfg: Config = serde_json::from_str(&text).map_err(|e| errors::bad_config(&path, e))?;
        let act = cfg.activation_function.unwrap_or_else(|| "torch.nn.modules.activation.Tanh".into());
        let activation = match act.rsplit('.').next().unwrap_or("") {
            "Identity" => Activation::Identity,
            "Tanh" => Activation::Tanh,
            "ReLU" => Activation::Relu,
            "Sigmoid" => Activation::Sigmoid,
            _ => {
                return Err(errors::err(
                    kind::UNSUPPORTED_MODULE,
                    format!("unsupported Dense activation {act:?} in {}", path.display()),
                    vec![("module", Detail::Text(act.clone())), errors::path_detail(&path)],
                ))
            }
        };
        let weights = dir.join("model.safetensors");
        if !weights.is_file() {
            return Err(errors::missing_file(&weights));
        }
        super::files::check_safetensors(&weights)?;
        let st = Safetensors::open(&weights)?;
        let weight = st.values("linear.weight", &[cfg.out_features, cfg.in_features])?;
        let bias = if cfg.bias { Some(st.values("linear.bias", &[cfg.out_features])?) } else { None };
        Ok(Dense { weight, bias, in_features: cfg.in_features, out_features: cfg.out_features, activation })
    }

    /// The layer `prefix` (`prefix.weight` `[out, in]`, `prefix.bias`) of a checkpoint.
    pub fn from_checkpoint(st: &Safetensors, prefix: &str, in_features: usize, out_features: usize, activation: Activation) -> ExResult<Dense> {
        let weight = st.values(&format!("{prefix}.weight"), &[out_features, in_features])?;
        let bias = Some(st.values(&format!("{prefix}.bias"), &[out_features])?);
        Ok(Dense { weight, bias, in_features, out_features, activation })
    }

    /// `x` is `in_features` long (checked when the model loads).
    pub fn forward(&self, x: &[f32]) -> Vec<f32> {
        (0..self.out_features)
            .map(|o| {
                let row = &self.weight[o * self.in_features..(o + 1) * self.in_features];
                let y = row.iter().zip(x).map(|(w, v)| *w as f64 * *v as f64).sum::<f64>() + self.bias.as_ref().map_or(0.0, |b| b[o] as f64);
                match self.activation {
                    Activation::Identity => y as f32,
                    Activation::Tanh => y.tanh() as f32,
                    Activation::Relu => y.max(0.0) as f32,
                    Activation::Sigmoid => (1.0 / (1.0 + (-y).exp())) as f32,
                }
            })
            .collect()
    }
}

/// A module after pooling, in `modules.json`'s order.
#[derive(Clone, Debug)]
pub enum After {
    Dense(Dense),
    Normalize,
}

impl After {
    pub fn apply(&self, v: Vec<f32>) -> Vec<f32> {
        match self {
            After::Dense(d) => d.forward(&v),
            After::Normalize => {
                let mut v = v;
                normalize(&mut v);
                v
            }
        }
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
        let cfg = PoolingConfig::from_json(&serde_json::json!({"pooling_mode_mean_tokens": true, "pooling_mode_cls_token": true, "pooling_mode_max_tokens": true})).unwrap();
        let hidden = [1.0, -2.0, 3.0, 4.0];
        let pooled = cfg.pool(&hidden, &batch(vec![1, 1], 1, 2), 2);
        assert_eq!(pooled, vec![vec![1.0, -2.0, 3.0, 4.0, 2.0, 1.0]]);
    }

    #[test]
    fn modes_of_both_config_forms() {
        let cfg = |v| PoolingConfig::from_json(&v).map(|c| c.modes);
        use PoolMode::*;
        assert_eq!(cfg(serde_json::json!({"pooling_mode": "lasttoken"})), Ok(vec![LastToken]));
        assert_eq!(cfg(serde_json::json!({"pooling_mode": ["weightedmean", "cls"]})), Ok(vec![WeightedMean, Cls]));
        assert_eq!(cfg(serde_json::json!({"pooling_mode_cls_token": false})), Ok(vec![Mean]));
        assert!(cfg(serde_json::json!({"pooling_mode": "median"})).is_err());
        // weighted mean: weights 1, 2 over the real tokens; last token: the last real one
        let hidden = [1.0, 4.0, 9.0, 9.0];
        let two = PoolingConfig { modes: vec![WeightedMean, LastToken] }.pool(&hidden, &batch(vec![1, 1, 0, 0], 1, 4), 1);
        assert_eq!(two, vec![vec![3.0, 4.0]]);
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
