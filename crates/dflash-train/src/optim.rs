//! AdamW with decoupled weight decay and a warmup + cosine schedule. candle-nn's AdamW
//! keeps its moments private, so a checkpoint could not resume it; this one exposes them.

use candle_core::{Result, Tensor, Var};
use std::collections::BTreeMap;

pub struct AdamW {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    pub step_t: usize,
    /// First and second moments, by parameter name.
    pub m: BTreeMap<String, Tensor>,
    pub v: BTreeMap<String, Tensor>,
}

impl AdamW {
    pub fn new(lr: f64, weight_decay: f64) -> Self {
        AdamW {
            lr,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay,
            step_t: 0,
            m: BTreeMap::new(),
            v: BTreeMap::new(),
        }
    }

    /// One update of every parameter that has a gradient. Norm weights (1-D) are not decayed.
    pub fn step(
        &mut self,
        params: &[(&String, &Var)],
        grads: &candle_core::backprop::GradStore,
    ) -> Result<()> {
        self.step_t += 1;
        let t = self.step_t as i32;
        let (c1, c2) = (
            1.0 / (1.0 - self.beta1.powi(t)),
            1.0 / (1.0 - self.beta2.powi(t)),
        );
        for (name, var) in params {
            let Some(g) = grads.get(var.as_tensor()) else {
                continue;
            };
            let m0 = match self.m.get(*name) {
                Some(m) => m.clone(),
                None => g.zeros_like()?,
            };
            let v0 = match self.v.get(*name) {
                Some(v) => v.clone(),
                None => g.zeros_like()?,
            };
            let m = ((m0 * self.beta1)? + (g * (1.0 - self.beta1))?)?;
            let v = ((v0 * self.beta2)? + (g.sqr()? * (1.0 - self.beta2))?)?;
            let update = ((&m * c1)? / ((&v * c2)?.sqrt()? + self.eps)?)?;
            let decay = if var.rank() > 1 {
                self.weight_decay
            } else {
                0.0
            };
            let theta = ((var.as_tensor() * (1.0 - self.lr * decay))? - (update * self.lr)?)?;
            var.set(&theta)?;
            self.m.insert((*name).clone(), m);
            self.v.insert((*name).clone(), v);
        }
        Ok(())
    }
}

/// Linear warmup to `peak` over `warmup` steps, then cosine decay to `peak * floor`.
pub fn schedule(step: usize, total: usize, warmup: usize, peak: f64, floor: f64) -> f64 {
    if step < warmup {
        return peak * (step + 1) as f64 / warmup as f64;
    }
    let span = total.saturating_sub(warmup).max(1);
    let p = ((step - warmup) as f64 / span as f64).min(1.0);
    peak * (floor + (1.0 - floor) * 0.5 * (1.0 + (std::f64::consts::PI * p).cos()))
}
