//! A drafter's trainable parameters: their names and shapes for a config, their
//! initialisation, and their reading and writing as safetensors.

use candle_core::{DType, Device, Result, Tensor, Var};
use dflash_core::drafter::DrafterConfig;
use std::collections::BTreeMap;

/// The trainable tensors, by their z-lab names.
pub struct DraftParams {
    pub vars: BTreeMap<String, Var>,
}

/// Every tensor name and shape of a drafter with this config.
pub fn param_shapes(c: &DrafterConfig) -> Vec<(String, Vec<usize>)> {
    let (h, hd, ff) = (c.hidden_size, c.head_dim, c.intermediate_size);
    let (qd, kvd) = (c.q_dim(), c.kv_dim());
    let mut v = vec![
        ("fc.weight".to_string(), vec![h, c.n_taps() * h]),
        ("hidden_norm.weight".into(), vec![h]),
        ("norm.weight".into(), vec![h]),
    ];
    for i in 0..c.num_layers {
        let p = |n: &str| format!("layers.{i}.{n}");
        v.extend([
            (p("input_layernorm.weight"), vec![h]),
            (p("post_attention_layernorm.weight"), vec![h]),
            (p("self_attn.q_proj.weight"), vec![qd, h]),
            (p("self_attn.k_proj.weight"), vec![kvd, h]),
            (p("self_attn.v_proj.weight"), vec![kvd, h]),
            (p("self_attn.o_proj.weight"), vec![h, qd]),
            (p("self_attn.q_norm.weight"), vec![hd]),
            (p("self_attn.k_norm.weight"), vec![hd]),
            (p("mlp.gate_proj.weight"), vec![ff, h]),
            (p("mlp.up_proj.weight"), vec![ff, h]),
            (p("mlp.down_proj.weight"), vec![h, ff]),
        ]);
        if let Some(d) = &c.dflash2 {
            for conv in ["attention_conv", "mlp_conv"] {
                v.push((
                    p(&format!("{conv}.base_kernel")),
                    vec![2, d.conv_kernel_size, h],
                ));
                v.push((
                    p(&format!("{conv}.kernel_projection.weight")),
                    vec![d.projection_rows(h), h],
                ));
            }
        }
    }
    if let Some(d) = &c.dflash2 {
        v.extend([
            (
                "candidate_selector.hidden_projection.weight".to_string(),
                vec![d.selector_rank, h],
            ),
            (
                "candidate_selector.predecessor_codebook".into(),
                vec![c.vocab_size, d.selector_rank],
            ),
            (
                "candidate_selector.successor_codebook".into(),
                vec![c.vocab_size, d.selector_rank],
            ),
        ]);
    }
    v
}

/// DFlash2's tensors start so that the drafter computes exactly what the DFlash drafter
/// with the same other weights does: each convolution the identity (base tap 0 = 1, no
/// deltas) and the selector's bilinear term zero (successor codebook 0). The predecessor
/// codebook (normal(0, 1)) and the hidden projection (normal(0, 1/sqrt(H)), on normed
/// rows) are random at unit scale, so that `A[p] * P h` is O(1) per rank: the successor
/// gets gradients, and an Adam step of size lr on it moves a score by about rank * lr
/// (at the 0.02 scale of the other matrices it would take thousands of steps to matter).
fn dflash2_init(name: &str, shape: &[usize], rng: &mut crate::prompts::Rng) -> Option<Vec<f32>> {
    let n: usize = shape.iter().product();
    let normal = |rng: &mut crate::prompts::Rng, sd: f64| -> Vec<f32> {
        let u =
            |r: &mut crate::prompts::Rng| ((r.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        (0..n)
            .map(|_| {
                (sd * (-2.0 * u(rng).ln()).sqrt() * (std::f64::consts::TAU * u(rng)).cos()) as f32
            })
            .collect()
    };
    if name == "candidate_selector.predecessor_codebook" {
        return Some(normal(rng, 1.0));
    }
    if name == "candidate_selector.hidden_projection.weight" {
        return Some(normal(rng, 1.0 / (shape[1] as f64).sqrt()));
    }
    if name.ends_with(".base_kernel") {
        let (taps, h) = (shape[1], shape[2]);
        let mut v = vec![0f32; n];
        for side in 0..2 {
            v[side * taps * h..side * taps * h + h].fill(1.0);
        }
        return Some(v);
    }
    if name.ends_with(".kernel_projection.weight")
        || name == "candidate_selector.successor_codebook"
    {
        return Some(vec![0f32; n]);
    }
    None
}

impl DraftParams {
    /// Norm weights 1, matrices normal(0, 0.02) (the Qwen3 initializer range).
    pub fn init(c: &DrafterConfig, dev: &Device, seed: u64) -> Result<Self> {
        let mut vars = BTreeMap::new();
        let mut rng = crate::prompts::Rng(seed);
        for (name, shape) in param_shapes(c) {
            let n: usize = shape.iter().product();
            let t = if let Some(v) = dflash2_init(&name, &shape, &mut rng) {
                Tensor::from_vec(v, shape, dev)?
            } else if shape.len() == 1 {
                Tensor::ones(shape, DType::F32, dev)?
            } else {
                // Box-Muller from the seeded generator: a run is reproducible.
                let u = |r: &mut crate::prompts::Rng| {
                    ((r.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
                };
                let v: Vec<f32> = (0..n)
                    .map(|_| {
                        (0.02
                            * (-2.0 * u(&mut rng).ln()).sqrt()
                            * (std::f64::consts::TAU * u(&mut rng)).cos())
                            as f32
                    })
                    .collect();
                Tensor::from_vec(v, shape, dev)?
            };
            vars.insert(name, Var::from_tensor(&t)?);
        }
        Ok(DraftParams { vars })
    }

    pub fn from_tensors(c: &DrafterConfig, mut t: BTreeMap<String, Tensor>) -> Result<Self> {
        let mut vars = BTreeMap::new();
        for (name, shape) in param_shapes(c) {
            let x = t
                .remove(&name)
                .ok_or_else(|| candle_core::Error::Msg(format!("checkpoint lacks {name}")))?;
            if x.dims() != shape.as_slice() {
                candle_core::bail!("{name}: shape {:?}, expected {shape:?}", x.dims());
            }
            vars.insert(name, Var::from_tensor(&x.to_dtype(DType::F32)?)?);
        }
        Ok(DraftParams { vars })
    }

    /// A new run's parameters started from another drafter's tensors (an exported DFlash
    /// drafter for a DFlash2 run, say): every tensor `t` has is taken (shapes must
    /// agree), the rest keep their initial values. Returns how many were taken.
    pub fn take_from(&self, t: &BTreeMap<String, Tensor>) -> Result<usize> {
        let mut n = 0;
        for (name, var) in &self.vars {
            if let Some(x) = t.get(name) {
                if x.dims() != var.dims() {
                    candle_core::bail!(
                        "{name}: shape {:?} in the initial drafter, {:?} in this one",
                        x.dims(),
                        var.dims()
                    );
                }
                var.set(&x.to_dtype(DType::F32)?.to_device(var.device())?)?;
                n += 1;
            }
        }
        Ok(n)
    }

    pub(crate) fn get(&self, n: &str) -> &Tensor {
        self.vars[n].as_tensor()
    }

    pub fn all(&self) -> Vec<(&String, &Var)> {
        self.vars.iter().collect()
    }
}
