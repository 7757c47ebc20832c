//! A synthetic shape's weights (`crate::synthetic`), made by a [`TensorMaker`]: on a device
//! (dflash-gpu fills its buffers) or in host memory for the CPU engines
//! ([`host_weights`]). One layer walk for both, so that a shape is the same model
//! whichever engine measures it.
//!
//! Values: every group's scale is `s = (0.75 .. 1.25) / (sigma_q * sqrt(cols))` and its
//! min centres the group's integer values on zero ([`group_scale_min`]), so that each
//! matrix maps an input of unit RMS to an output of about unit RMS and activations stay
//! finite through every layer; norm weights are 1 +- 0.1, biases +-0.1.

use crate::drafter::{DrafterLayer, DrafterWeights};
use crate::quant::{QFormat, QuantMatrix};
use crate::rng::Rng;
use crate::synthetic::{MatrixShape, SyntheticSpec};
use crate::weights::{
    AttentionWeights, DeltaNetWeights, FeedForward, LayerWeights, Mixer, ModelWeights, MoeWeights,
};
use half::f16;

/// Where a synthetic model's tensors are made. `name` is the GGUF tensor name (a label).
pub trait TensorMaker {
    type Matrix;
    type Vector;
    type Error;
    /// A random matrix of `shape` in its repacked format.
    fn matrix(&mut self, name: &str, shape: &MatrixShape) -> Result<Self::Matrix, Self::Error>;
    /// `len` values of `centre +- 0.1`.
    fn vector(&mut self, name: &str, len: usize, centre: f32) -> Self::Vector;
}

/// One group's f16 scale and min for a matrix of `cols` columns in `format`, from a
/// uniform draw `u` in -1..1 (the module's doc); None for f32.
pub fn group_scale_min(format: QFormat, cols: usize, u: f32) -> Option<(f16, f16)> {
    // Standard deviation and mean of uniform integers: q4 0..=15, q8 -128..=127.
    let (sigma, mean) = match format {
        QFormat::Q4 => (4.610, 7.5f32),
        QFormat::Q8 => (73.90, -0.5f32),
        QFormat::F32 => return None,
    };
    let base = 1.0 / (sigma * (cols as f32).sqrt());
    let s = f16::from_f32(base * (1.0 + 0.25 * u));
    Some((s, f16::from_f32(-mean * s.to_f32())))
}

/// The target's weights of `spec`, every tensor from `t`.
pub fn target_weights<T: TensorMaker>(
    t: &mut T,
    spec: &SyntheticSpec,
) -> Result<ModelWeights<T::Matrix, T::Vector>, T::Error> {
    let c = &spec.config;
    let embed = t.matrix("token_embd", &spec.embed())?;
    let lm_head = match spec.lm_head() {
        Some(m) => Some(t.matrix("output", &m)?),
        None => None,
    };
    let mut layers = Vec::with_capacity(c.num_layers);
    for i in 0..c.num_layers {
        layers.push(layer(t, spec, i)?);
    }
    Ok(ModelWeights {
        config: c.clone(),
        embed,
        layers,
        norm: t.vector("output_norm", c.hidden_size, 1.0),
        lm_head,
    })
}

/// Layer `i` of `spec`'s target.
fn layer<T: TensorMaker>(
    t: &mut T,
    spec: &SyntheticSpec,
    i: usize,
) -> Result<LayerWeights<T::Matrix, T::Vector>, T::Error> {
    let c = &spec.config;
    let s = spec.layer(i);
    let n = |w: &str| format!("blk.{i}.{w}");
    let attn_norm = t.vector(&n("attn_norm"), c.hidden_size, 1.0);
    let mixer = mixer(t, spec, i)?;
    let ffn_norm = t.vector(&n("ffn_norm"), c.hidden_size, 1.0);
    let ffn = match &s.router {
        None => FeedForward::Dense {
            gate: t.matrix(&n("ffn_gate"), &s.w_gate)?,
            up: t.matrix(&n("ffn_up"), &s.w_up)?,
            down: t.matrix(&n("ffn_down"), &s.w_down)?,
        },
        Some(router) => FeedForward::Moe(MoeWeights {
            router: t.matrix(&n("ffn_gate_inp"), router)?,
            gate: t.matrix(&n("ffn_gate_exps"), &s.w_gate)?,
            up: t.matrix(&n("ffn_up_exps"), &s.w_up)?,
            down: t.matrix(&n("ffn_down_exps"), &s.w_down)?,
            shared: None,
        }),
    };
    Ok(LayerWeights {
        attn_norm,
        mixer,
        ffn_norm,
        ffn,
    })
}

/// Layer `i`'s attention (gated where the architecture has it) or Gated DeltaNet.
fn mixer<T: TensorMaker>(
    t: &mut T,
    spec: &SyntheticSpec,
    i: usize,
) -> Result<Mixer<T::Matrix, T::Vector>, T::Error> {
    let c = &spec.config;
    let s = spec.layer(i);
    let n = |w: &str| format!("blk.{i}.{w}");
    // A matrix of `m`'s columns and format with half its rows (q_proj's queries and
    // gates; a DeltaNet's b and a).
    let half = |m: &MatrixShape| MatrixShape {
        rows: m.rows / 2,
        ..*m
    };
    if let Some(hy) = c.hybrid.as_ref().filter(|hy| hy.is_linear(i)) {
        return Ok(Mixer::DeltaNet(DeltaNetWeights {
            qkv: t.matrix(&n("attn_qkv"), &s.wq)?,
            z: t.matrix(&n("attn_gate"), &s.wk)?,
            b: t.matrix(&n("ssm_beta"), &half(&s.wv))?,
            a: t.matrix(&n("ssm_alpha"), &half(&s.wv))?,
            conv: t.vector(&n("ssm_conv1d"), hy.conv_dim() * hy.conv_kernel, 0.0),
            dt_bias: t.vector(&n("ssm_dt"), hy.value_heads, 0.0),
            decay: t.vector(&n("ssm_a"), hy.value_heads, -2.0),
            norm: t.vector(&n("ssm_norm"), hy.value_head_dim, 1.0),
            out: t.matrix(&n("ssm_out"), &s.wo)?,
        }));
    }
    let gated = c.arch.has_attention_gate();
    let wq = if gated { half(&s.wq) } else { s.wq };
    let (q, kv) = (c.q_dim(), c.kv_dim());
    // In the order the fields are written (the generator's draws follow it).
    let wq_m = t.matrix(&n("attn_q"), &wq)?;
    let gate = match gated {
        true => Some(t.matrix(&n("attn_q_gate"), &wq)?),
        false => None,
    };
    let wk = t.matrix(&n("attn_k"), &s.wk)?;
    let wv = t.matrix(&n("attn_v"), &s.wv)?;
    let wo = t.matrix(&n("attn_output"), &s.wo)?;
    let bias = |t: &mut T, w: &str, len| c.qkv_bias.then(|| t.vector(&n(w), len, 0.0));
    let bq = bias(t, "attn_q.bias", q);
    let bk = bias(t, "attn_k.bias", kv);
    let bv = bias(t, "attn_v.bias", kv);
    let norm = |t: &mut T, w: &str| c.qk_norm.then(|| t.vector(&n(w), c.head_dim, 1.0));
    let q_norm = norm(t, "attn_q_norm");
    let k_norm = norm(t, "attn_k_norm");
    Ok(Mixer::Attention(AttentionWeights {
        wq: wq_m,
        gate,
        wk,
        wv,
        wo,
        bq,
        bk,
        bv,
        q_norm,
        k_norm,
    }))
}

/// Tensors in host memory: `QuantMatrix`es of random values and `Vec<f32>`s.
pub struct HostTensors(pub Rng);

impl TensorMaker for HostTensors {
    type Matrix = QuantMatrix;
    type Vector = Vec<f32>;
    type Error = crate::Error;

    fn matrix(&mut self, name: &str, m: &MatrixShape) -> crate::Result<QuantMatrix> {
        // A mixture's experts are stacked in `rows` already (`parts` of them).
        let rows = m.rows;
        let words = rows * m.cols * m.format.bits() / 32;
        let groups = rows * m.cols / m.group;
        let mut scales = Vec::with_capacity(groups);
        let mut mins = Vec::with_capacity(groups);
        for _ in 0..groups {
            let (s, min) = group_scale_min(m.format, m.cols, self.0.uniform())
                .ok_or_else(|| crate::Error::BadConfig(format!("{name}: an f32 matrix")))?;
            scales.push(s.to_bits());
            mins.push(min.to_bits());
        }
        let qs = (0..words).map(|_| self.0.next_u64() as u32).collect();
        Ok(QuantMatrix {
            format: m.format,
            rows,
            cols: m.cols,
            group: m.group,
            qs,
            scales,
            mins,
        })
    }

    fn vector(&mut self, _: &str, len: usize, centre: f32) -> Vec<f32> {
        (0..len).map(|_| centre + 0.1 * self.0.uniform()).collect()
    }
}

/// A plain DFlash drafter's tensors, whatever holds them: host matrices, or the GPU's
/// buffers (`dflash_gpu`'s `GpuDrafterWeights`).
pub struct DrafterTensors<M, V> {
    /// `[H, n_ids * H]`.
    pub fc: M,
    pub hidden_norm: V,
    pub norm: V,
    pub layers: Vec<DrafterLayerTensors<M, V>>,
}

/// One draft layer's tensors.
pub struct DrafterLayerTensors<M, V> {
    pub input_norm: V,
    pub post_norm: V,
    pub q_norm: V,
    pub k_norm: V,
    pub wq: M,
    pub wk: M,
    pub wv: M,
    pub wo: M,
    pub w_gate: M,
    pub w_up: M,
    pub w_down: M,
}

/// The synthetic drafter of `spec` (`spec.drafter`, the shapes of `drafter_matrices`),
/// every tensor from `t`.
pub fn drafter_tensors<T: TensorMaker>(
    t: &mut T,
    spec: &SyntheticSpec,
) -> Result<DrafterTensors<T::Matrix, T::Vector>, T::Error> {
    let d = &spec.drafter;
    let (h, hd) = (d.hidden_size, d.head_dim);
    let shapes = spec.drafter_matrices();
    let fc = t.matrix("d.fc", &shapes[0])?;
    let mut layers = Vec::with_capacity(d.num_layers);
    for (i, s) in shapes[1..].chunks_exact(7).enumerate() {
        let n = |w: &str| format!("d.layers.{i}.{w}");
        layers.push(DrafterLayerTensors {
            input_norm: t.vector(&n("input_layernorm"), h, 1.0),
            post_norm: t.vector(&n("post_attention_layernorm"), h, 1.0),
            q_norm: t.vector(&n("q_norm"), hd, 1.0),
            k_norm: t.vector(&n("k_norm"), hd, 1.0),
            wq: t.matrix(&n("q_proj"), &s[0])?,
            wk: t.matrix(&n("k_proj"), &s[1])?,
            wv: t.matrix(&n("v_proj"), &s[2])?,
            wo: t.matrix(&n("o_proj"), &s[3])?,
            w_gate: t.matrix(&n("gate_proj"), &s[4])?,
            w_up: t.matrix(&n("up_proj"), &s[5])?,
            w_down: t.matrix(&n("down_proj"), &s[6])?,
        });
    }
    Ok(DrafterTensors {
        fc,
        hidden_norm: t.vector("d.hidden_norm", h, 1.0),
        norm: t.vector("d.norm", h, 1.0),
        layers,
    })
}

/// `spec`'s synthetic drafter in host memory, for the CPU engines (drawn after the
/// target's weights from the same generator, as on the GPU).
pub fn host_drafter(spec: &SyntheticSpec, seed: u64) -> crate::Result<DrafterWeights> {
    let mut t = HostTensors(Rng(seed ^ 0xD4AF_7E45_D4AF_7E45));
    let d = drafter_tensors(&mut t, spec)?;
    let layers = d.layers.into_iter().map(|l| DrafterLayer {
        input_norm: l.input_norm,
        post_norm: l.post_norm,
        wq: l.wq,
        wk: l.wk,
        wv: l.wv,
        wo: l.wo,
        q_norm: l.q_norm,
        k_norm: l.k_norm,
        w_gate: l.w_gate,
        w_up: l.w_up,
        w_down: l.w_down,
        conv: None,
    });
    Ok(DrafterWeights {
        config: spec.drafter.clone(),
        fc: d.fc,
        hidden_norm: d.hidden_norm,
        norm: d.norm,
        layers: layers.collect(),
        selector: None,
        draft_vocab: None,
    })
}

/// `spec`'s target weights in host memory, for the CPU engines.
pub fn host_weights(spec: &SyntheticSpec, seed: u64) -> crate::Result<ModelWeights> {
    target_weights(&mut HostTensors(Rng(seed ^ 0x5EED_5EED_5EED_5EED)), spec)
}
