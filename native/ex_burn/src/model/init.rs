//! The seeded randomness of a native model: initial weights, dropout masks and shuffling.
//!
//! Burn draws weights and dropout masks from one process-wide generator: `Param`s initialise
//! lazily, dropout draws at every training step, and on GPUs fusion takes a random op's seed
//! only when its queue runs. Any other thread may re-seed or draw from that generator in
//! between (another model's dropout, another build), so a seed alone would fix neither a model's
//! weights nor its training. Each model owns a generator instead, seeded with its seed: weights
//! are drawn from it on the host, with the distribution and fans Burn's initialiser gives the
//! layer, and uploaded; training then takes its dropout masks and shuffles from the same one.

use burn::module::Param;
use burn::nn::conv::{Conv1d, Conv1dConfig, Conv2d, Conv2dConfig};
use burn::nn::{Embedding, EmbeddingConfig, GateController, Gru, GruConfig, Initializer, Linear, LinearConfig, LinearLayout, Lstm, LstmConfig};
use burn::tensor::{Device, Distribution, Shape, Tensor, TensorData};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::error::{ExError, ExResult};

/// The same generator (and the same element draws, `TensorData::random`) as Burn's CPU backend.
pub struct SeededRng(StdRng);

impl SeededRng {
    pub fn new(seed: u64) -> Self {
        SeededRng(StdRng::seed_from_u64(seed))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// A dropout mask for `t`: 1 with probability `keep`, else 0, in `t`'s type and device.
    pub fn keep_mask<const D: usize>(&mut self, t: &Tensor<D>, keep: f64) -> Tensor<D> {
        let mask = TensorData::random::<f32, _, _>(t.shape(), Distribution::Bernoulli(keep), &mut self.0);
        Tensor::from_data(mask, (&t.device(), t.dtype()))
    }

    /// Values `init` gives a tensor of `shape` with these fans (Burn's `Initializer::init_with`).
    fn data(&mut self, init: &Initializer, shape: Shape, fan_in: Option<usize>, fan_out: Option<usize>) -> ExResult<TensorData> {
        let n = shape.num_elements();
        let fan = |f: Option<usize>, which: &str| f.ok_or_else(|| ExError::invalid(format!("{init:?} needs the layer's fan {which}")));
        let xavier_std = || Ok::<_, ExError>((2.0 / (fan(fan_in, "in")? + fan(fan_out, "out")?) as f64).sqrt());
        let kaiming_std = |fan_out_only: bool| {
            Ok::<_, ExError>(1.0 / (if fan_out_only { fan(fan_out, "out")? } else { fan(fan_in, "in")? } as f64).sqrt())
        };
        // the same arithmetic as Burn's, so the bounds and deviations are the same floats
        let dist = match init {
            Initializer::Constant { value } => return Ok(TensorData::new(vec![*value as f32; n], shape)),
            Initializer::Ones => return Ok(TensorData::new(vec![1.0f32; n], shape)),
            Initializer::Zeros => return Ok(TensorData::new(vec![0.0f32; n], shape)),
            Initializer::Uniform { min, max } => Distribution::Uniform(*min, *max),
            Initializer::Normal { mean, std } => Distribution::Normal(*mean, *std),
            Initializer::KaimingUniform { gain, fan_out_only } => {
                let a = 3.0f64.sqrt() * *gain * kaiming_std(*fan_out_only)?;
                Distribution::Uniform(-a, a)
            }
            Initializer::KaimingNormal { gain, fan_out_only } => Distribution::Normal(0.0, *gain * kaiming_std(*fan_out_only)?),
            Initializer::XavierUniform { gain } => {
                let a = 3.0f64.sqrt() * *gain * xavier_std()?;
                Distribution::Uniform(-a, a)
            }
            Initializer::XavierNormal { gain } => Distribution::Normal(0.0, *gain * xavier_std()?),
            // no layer a spec builds starts from it
            Initializer::Orthogonal { .. } => return Err(ExError::invalid("orthogonal initialisation is not supported")),
        };
        Ok(TensorData::random::<f32, _, _>(shape, dist, &mut self.0))
    }

    fn param<const D: usize>(
        &mut self,
        init: &Initializer,
        shape: [usize; D],
        fan_in: Option<usize>,
        fan_out: Option<usize>,
        device: &Device,
    ) -> ExResult<Param<Tensor<D>>> {
        Ok(Param::from_data(self.data(init, Shape::from(shape), fan_in, fan_out)?, device))
    }

    /// A `[d_in, d_out]` linear map's weight and bias, with Burn's `LinearConfig::init` fans.
    fn redraw_linear(&mut self, mut l: Linear, d_in: usize, d_out: usize, init: &Initializer, device: &Device) -> ExResult<Linear> {
        l.weight = self.param(init, [d_in, d_out], Some(d_in), Some(d_out), device)?;
        if l.bias.is_some() {
            l.bias = Some(self.param(init, [d_out], Some(d_in), Some(d_out), device)?);
        }
        Ok(l)
    }

    fn redraw_gate(&mut self, mut g: GateController, d_in: usize, d_h: usize, init: &Initializer, device: &Device) -> ExResult<GateController> {
        g.input_transform = self.redraw_linear(g.input_transform, d_in, d_h, init, device)?;
        g.hidden_transform = self.redraw_linear(g.hidden_transform, d_h, d_h, init, device)?;
        Ok(g)
    }

    // Each layer is built by Burn (its structure and checks) and its parameters, still lazy and
    // never drawn, replaced by ones drawn here.

    pub fn linear(&mut self, c: &LinearConfig, device: &Device) -> ExResult<Linear> {
        if !matches!(c.layout, LinearLayout::Row) {
            return Err(ExError::invalid("only row-major linear layers are drawn here"));
        }
        self.redraw_linear(c.init(device), c.d_input, c.d_output, &c.initializer, device)
    }

    pub fn conv1d(&mut self, c: &Conv1dConfig, device: &Device) -> ExResult<Conv1d> {
        let mut l = c.init(device);
        let (fan_in, fan_out) = (c.channels_in / c.groups * c.kernel_size, c.channels_out / c.groups * c.kernel_size);
        l.weight = self.param(&c.initializer, [c.channels_out, c.channels_in / c.groups, c.kernel_size], Some(fan_in), Some(fan_out), device)?;
        if l.bias.is_some() {
            l.bias = Some(self.param(&c.initializer, [c.channels_out], Some(fan_in), None, device)?);
        }
        Ok(l)
    }

    pub fn conv2d(&mut self, c: &Conv2dConfig, device: &Device) -> ExResult<Conv2d> {
        let mut l = c.init(device);
        let [c_in, c_out] = c.channels;
        let k = c.kernel_size.iter().product::<usize>();
        let (fan_in, fan_out) = (c_in / c.groups * k, c_out / c.groups * k);
        let shape = [c_out, c_in / c.groups, c.kernel_size[0], c.kernel_size[1]];
        l.weight = self.param(&c.initializer, shape, Some(fan_in), Some(fan_out), device)?;
        if l.bias.is_some() {
            l.bias = Some(self.param(&c.initializer, [c_out], Some(fan_in), Some(fan_out), device)?);
        }
        Ok(l)
    }

    pub fn embedding(&mut self, c: &EmbeddingConfig, device: &Device) -> ExResult<Embedding> {
        let mut l = c.init(device);
        l.weight = self.param(&c.initializer, [c.n_embedding, c.d_model], None, None, device)?;
        Ok(l)
    }

    pub fn lstm(&mut self, c: &LstmConfig, device: &Device) -> ExResult<Lstm> {
        let mut l = c.init(device);
        let (d_in, d_h, init) = (c.d_input, c.d_hidden, &c.initializer);
        l.input_gate = self.redraw_gate(l.input_gate, d_in, d_h, init, device)?;
        l.forget_gate = l.forget_gate.map(|g| self.redraw_gate(g, d_in, d_h, init, device)).transpose()?;
        l.output_gate = self.redraw_gate(l.output_gate, d_in, d_h, init, device)?;
        l.cell_gate = self.redraw_gate(l.cell_gate, d_in, d_h, init, device)?;
        Ok(l)
    }

    pub fn gru(&mut self, c: &GruConfig, device: &Device) -> ExResult<Gru> {
        let mut l = c.init(device);
        let (d_in, d_h, init) = (c.d_input, c.d_hidden, &c.initializer);
        l.update_gate = self.redraw_gate(l.update_gate, d_in, d_h, init, device)?;
        l.reset_gate = self.redraw_gate(l.reset_gate, d_in, d_h, init, device)?;
        l.new_gate = self.redraw_gate(l.new_gate, d_in, d_h, init, device)?;
        Ok(l)
    }
}

#[cfg(test)]
mod tests {
    use burn::module::{Module, ModuleVisitor};

    use super::*;

    /// Every float parameter's values, in visiting order (which draws lazy ones in that order).
    struct Values(Vec<Vec<f32>>);
    impl ModuleVisitor for Values {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.0.push(param.val().into_data().try_to_vec::<f32>().unwrap());
        }
    }

    fn values<M: Module>(m: &M) -> Vec<Vec<f32>> {
        let mut v = Values(Vec::new());
        m.visit(&mut v);
        v.0
    }

    /// Burn's CPU backend draws its own initialisers from the same generator type, so a layer
    /// drawn here equals the one Burn draws after seeding its process-wide generator alike,
    /// bit for bit, when nothing else draws in between (other tests may: such runs are retried).
    fn same_as_burn<M: Module>(what: &str, ours: impl Fn(&mut SeededRng, &Device) -> M, burns: impl Fn(&Device) -> M) {
        let device = Device::flex();
        let want = values(&ours(&mut SeededRng::new(11), &device));
        assert!(want.iter().all(|p| !p.is_empty()), "{what}");
        let matched = (0..50).any(|_| {
            device.seed(11);
            values(&burns(&device)) == want
        });
        assert!(matched, "{what}: weights differ from Burn's initialiser");
    }

    #[test]
    fn each_layer_draws_what_burns_initialiser_draws() {
        // Kaiming uniform (dense, convolutions), normal (embedding), Xavier normal (recurrent)
        let dense = LinearConfig::new(24, 7);
        same_as_burn("dense", |r, d| r.linear(&dense, d).unwrap(), |d| dense.init(d));
        let conv1d = Conv1dConfig::new(3, 5, 4);
        same_as_burn("conv1d", |r, d| r.conv1d(&conv1d, d).unwrap(), |d| conv1d.init(d));
        let conv2d = Conv2dConfig::new([3, 6], [3, 2]);
        same_as_burn("conv2d", |r, d| r.conv2d(&conv2d, d).unwrap(), |d| conv2d.init(d));
        let embedding = EmbeddingConfig::new(9, 4);
        same_as_burn("embedding", |r, d| r.embedding(&embedding, d).unwrap(), |d| embedding.init(d));
        let lstm = LstmConfig::new(5, 3, true);
        same_as_burn("lstm", |r, d| r.lstm(&lstm, d).unwrap(), |d| lstm.init(d));
        let gru = GruConfig::new(5, 3, true);
        same_as_burn("gru", |r, d| r.gru(&gru, d).unwrap(), |d| gru.init(d));
        let no_bias = LinearConfig::new(6, 2).with_bias(false).with_initializer(Initializer::XavierUniform { gain: 2.0 });
        same_as_burn("xavier uniform", |r, d| r.linear(&no_bias, d).unwrap(), |d| no_bias.init(d));
        let kaiming_normal = LinearConfig::new(6, 2).with_initializer(Initializer::KaimingNormal { gain: 1.5, fan_out_only: true });
        same_as_burn("kaiming normal", |r, d| r.linear(&kaiming_normal, d).unwrap(), |d| kaiming_normal.init(d));
    }

    #[test]
    fn the_same_seed_draws_the_same_weights_and_masks_and_another_seed_others() {
        let device = Device::flex();
        let draw = |seed| {
            let mut rng = SeededRng::new(seed);
            let w = values(&rng.linear(&LinearConfig::new(16, 16), &device).unwrap());
            let mask = rng.keep_mask(&Tensor::<2>::zeros([8, 8], &device), 0.5).into_data().try_to_vec::<f32>().unwrap();
            (w, mask)
        };
        let (w, mask) = draw(5);
        assert_eq!(draw(5), (w.clone(), mask.clone()));
        let (w2, mask2) = draw(6);
        assert!(w2 != w && mask2 != mask);
        let kept = mask.iter().filter(|&&m| m == 1.0).count();
        assert!(mask.iter().all(|&m| m == 0.0 || m == 1.0) && (16..48).contains(&kept), "keep 0.5 of 64: {kept}");
    }
}
