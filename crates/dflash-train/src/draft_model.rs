//! The DFlash drafter in candle, for training: the z-lab architecture (fc + hidden_norm
//! over the target's taps, Qwen3-style layers whose keys and values are the context
//! followed by the block, the target's embedding and lm_head), with the training-time
//! attention mask: each block sees the context strictly before its anchor, itself
//! bidirectionally, and no other block.

use crate::nn::{rms_norm, RopeTables};
use crate::target::linear;
use candle_core::{DType, Device, Result, Tensor, Var, D};
use dflash_core::config::RopeStyle;
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
    }
    v
}

impl DraftParams {
    /// Norm weights 1, matrices normal(0, 0.02) (the Qwen3 initializer range).
    pub fn init(c: &DrafterConfig, dev: &Device, seed: u64) -> Result<Self> {
        let mut vars = BTreeMap::new();
        let mut rng = crate::prompts::Rng(seed);
        for (name, shape) in param_shapes(c) {
            let n: usize = shape.iter().product();
            let t = if shape.len() == 1 {
                Tensor::ones(shape, DType::F32, dev)?
            } else {
                // Box-Muller from the seeded generator: a run is reproducible.
                let u = |r: &mut crate::prompts::Rng| ((r.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
                let v: Vec<f32> = (0..n).map(|_| (0.02 * (-2.0 * u(&mut rng).ln()).sqrt() * (std::f64::consts::TAU * u(&mut rng)).cos()) as f32).collect();
                Tensor::from_vec(v, shape, dev)?
            };
            vars.insert(name, Var::from_tensor(&t)?);
        }
        Ok(DraftParams { vars })
    }

    pub fn from_tensors(c: &DrafterConfig, mut t: BTreeMap<String, Tensor>) -> Result<Self> {
        let mut vars = BTreeMap::new();
        for (name, shape) in param_shapes(c) {
            let x = t.remove(&name).ok_or_else(|| candle_core::Error::Msg(format!("checkpoint lacks {name}")))?;
            if x.dims() != shape.as_slice() {
                candle_core::bail!("{name}: shape {:?}, expected {shape:?}", x.dims());
            }
            vars.insert(name, Var::from_tensor(&x.to_dtype(DType::F32)?)?);
        }
        Ok(DraftParams { vars })
    }

    fn get(&self, n: &str) -> &Tensor {
        self.vars[n].as_tensor()
    }

    pub fn all(&self) -> Vec<(&String, &Var)> {
        self.vars.iter().collect()
    }
}

/// One training sequence's inputs.
pub struct SeqBatch<'a> {
    /// Taps of the whole clean sequence, `[L, n_taps * H]`.
    pub taps: &'a Tensor,
    pub tokens: &'a [u32],
    /// Anchor positions (each < L - 1).
    pub anchors: &'a [usize],
    /// Positions from `loss_from` on carry labels (the response).
    pub loss_from: usize,
}

/// Loss pieces for one sequence: summed weighted NLL, summed weight, and per slot
/// (1..B) the number of labelled positions and how many the argmax got right.
pub struct SeqLoss {
    pub weighted_nll: Tensor,
    pub weight: f64,
    pub counts: Vec<usize>,
    pub correct: Vec<usize>,
}

pub struct DraftTrainer<'a> {
    pub config: DrafterConfig,
    pub embed: &'a Tensor,
    pub lm_head: &'a Tensor,
    pub rope: RopeTables,
    pub gamma: f64,
}

impl<'a> DraftTrainer<'a> {
    pub fn new(config: DrafterConfig, embed: &'a Tensor, lm_head: &'a Tensor, gamma: f64, max_pos: usize) -> Result<Self> {
        let rope = RopeTables::new(&config.rope_inv_freq(), config.head_dim, RopeStyle::Neox, max_pos, embed.device())?;
        Ok(DraftTrainer { config, embed, lm_head, rope, gamma })
    }

    /// Loss of the blocks of one sequence.
    pub fn sequence_loss(&self, p: &DraftParams, s: &SeqBatch) -> Result<SeqLoss> {
        let c = &self.config;
        let dev = self.embed.device();
        let (h, hd, nh, nkv) = (c.hidden_size, c.head_dim, c.num_heads, c.num_kv_heads);
        let rep = nh / nkv;
        let b = c.block_size;
        let l = s.tokens.len();
        let a = s.anchors.len();
        let eps = c.rms_norm_eps;
        let scale = 1.0 / (hd as f64).sqrt();
        // Context: hidden_norm(fc(taps)), positions 0..L.
        let ctx = rms_norm(&linear(s.taps, p.get("fc.weight"))?, p.get("hidden_norm.weight"), eps)?; // [L, H]
        let ctx_pos = Tensor::from_vec((0..l as u32).collect::<Vec<_>>(), (1, l), dev)?;
        let (ccos, csin) = self.rope.gather(&ctx_pos)?;
        // Blocks: [anchor token, MASK...] at positions anchor..anchor+B.
        let mut btok = Vec::with_capacity(a * b);
        let mut bpos = Vec::with_capacity(a * b);
        for &an in s.anchors {
            for k in 0..b {
                btok.push(if k == 0 { s.tokens[an] } else { c.mask_token_id });
                bpos.push((an + k) as u32);
            }
        }
        let btok = Tensor::from_vec(btok, a * b, dev)?;
        let (bcos, bsin) = self.rope.gather(&Tensor::from_vec(bpos, (a, b), dev)?)?;
        let mut x = self.embed.index_select(&btok, 0)?.reshape((a, b, h))?;
        // Context keys visible to block i: positions < anchor_i; block keys all visible.
        let mut mask = Vec::with_capacity(a * l);
        for &an in s.anchors {
            mask.extend((0..l).map(|j| if j < an { 0f32 } else { f32::NEG_INFINITY }));
        }
        let ctx_mask = Tensor::from_vec(mask, (a, 1, 1, l), dev)?;
        for i in 0..c.num_layers {
            let w = |n: &str| p.get(&format!("layers.{i}.{n}"));
            // Context K/V: [1, nkv, L, hd].
            let kc = linear(&ctx, w("self_attn.k_proj.weight"))?.reshape((1, l, nkv, hd))?.transpose(1, 2)?;
            let kc = self.rope.apply(&rms_norm(&kc, w("self_attn.k_norm.weight"), eps)?, &ccos, &csin)?;
            let vc = linear(&ctx, w("self_attn.v_proj.weight"))?.reshape((1, l, nkv, hd))?.transpose(1, 2)?;
            // Block Q/K/V: [A, heads, B, hd].
            let hn = rms_norm(&x, w("input_layernorm.weight"), eps)?;
            let q = linear(&hn, w("self_attn.q_proj.weight"))?.reshape((a, b, nh, hd))?.transpose(1, 2)?;
            let q = self.rope.apply(&rms_norm(&q, w("self_attn.q_norm.weight"), eps)?, &bcos, &bsin)?;
            let kb = linear(&hn, w("self_attn.k_proj.weight"))?.reshape((a, b, nkv, hd))?.transpose(1, 2)?;
            let kb = self.rope.apply(&rms_norm(&kb, w("self_attn.k_norm.weight"), eps)?, &bcos, &bsin)?;
            let vb = linear(&hn, w("self_attn.v_proj.weight"))?.reshape((a, b, nkv, hd))?.transpose(1, 2)?.contiguous()?;
            // Queries grouped by KV head: [A, nkv, rep*B, hd].
            let qg = q.contiguous()?.reshape((a, nkv, rep * b, hd))?;
            // Scores against the context: [nkv, A*rep*B, hd] x [nkv, hd, L].
            let qc = qg.transpose(0, 1)?.contiguous()?.reshape((nkv, a * rep * b, hd))?;
            let kc2 = kc.squeeze(0)?.contiguous()?; // [nkv, L, hd]
            let s_ctx = qc.matmul(&kc2.t()?.contiguous()?)?.reshape((nkv, a, rep * b, l))?.transpose(0, 1)?; // [A, nkv, rep*B, L]
            let s_blk = qg.matmul(&kb.t()?.contiguous()?)?; // [A, nkv, rep*B, B]
            let scores = (Tensor::cat(&[s_ctx.broadcast_add(&ctx_mask)?, s_blk], D::Minus1)? * scale)?;
            let probs = candle_nn::ops::softmax(&scores, D::Minus1)?;
            let p_ctx = probs.narrow(D::Minus1, 0, l)?.transpose(0, 1)?.contiguous()?.reshape((nkv, a * rep * b, l))?;
            let o_ctx = p_ctx.matmul(&vc.squeeze(0)?.contiguous()?)?.reshape((nkv, a, rep * b, hd))?.transpose(0, 1)?;
            let o_blk = probs.narrow(D::Minus1, l, b)?.contiguous()?.matmul(&vb)?;
            let att = (o_ctx + o_blk)?.reshape((a, nh, b, hd))?.transpose(1, 2)?.reshape((a, b, nh * hd))?;
            x = (x + linear(&att, w("self_attn.o_proj.weight"))?)?;
            let hn = rms_norm(&x, w("post_attention_layernorm.weight"), eps)?;
            let act = (candle_nn::ops::silu(&linear(&hn, w("mlp.gate_proj.weight"))?)? * linear(&hn, w("mlp.up_proj.weight"))?)?;
            x = (x + linear(&act, w("mlp.down_proj.weight"))?)?;
        }
        // Labels: slot k (1..B) predicts the token at anchor + k, inside the sequence and
        // the loss region.
        let mut rows = Vec::new();
        let mut labels = Vec::new();
        let mut weights = Vec::new();
        let mut slots = Vec::new();
        for (ai, &an) in s.anchors.iter().enumerate() {
            for k in 1..b {
                let t = an + k;
                if t < l && t >= s.loss_from {
                    rows.push((ai * b + k) as u32);
                    labels.push(s.tokens[t]);
                    weights.push((-((k - 1) as f64) / self.gamma).exp() as f32);
                    slots.push(k);
                }
            }
        }
        let mut counts = vec![0usize; b];
        let mut correct = vec![0usize; b];
        if rows.is_empty() {
            return Ok(SeqLoss { weighted_nll: Tensor::zeros((), DType::F32, dev)?, weight: 0.0, counts, correct });
        }
        let n = rows.len();
        let hsel = x.reshape((a * b, h))?.index_select(&Tensor::from_vec(rows, n, dev)?, 0)?;
        let normed = rms_norm(&hsel, p.get("norm.weight"), eps)?;
        let (nll, pred) = if dev.is_cpu() {
            // The fused op: no gradient for the frozen lm_head, one pass over the logits.
            let op = crate::head_loss::FrozenHeadNll::new(self.lm_head.clone(), labels.clone());
            let stats = op.stats.clone();
            let nll = normed.apply_op1(op)?;
            let pred = std::mem::take(&mut stats.lock().expect("stats lock").argmax);
            (nll, pred)
        } else {
            // Other devices (CUDA): candle's own ops.
            let logits = linear(&normed, self.lm_head)?;
            let lab = Tensor::from_vec(labels.clone(), (n, 1), dev)?;
            let nll = candle_nn::ops::log_softmax(&logits, D::Minus1)?.gather(&lab, 1)?.squeeze(1)?.neg()?;
            (nll, logits.argmax(D::Minus1)?.to_vec1::<u32>()?)
        };
        let wsum: f64 = weights.iter().map(|&w| w as f64).sum();
        let wt = Tensor::from_vec(weights, n, dev)?;
        let weighted_nll = (nll * wt)?.sum_all()?;
        for i in 0..n {
            counts[slots[i]] += 1;
            if pred[i] == labels[i] {
                correct[slots[i]] += 1;
            }
        }
        Ok(SeqLoss { weighted_nll, weight: wsum, counts, correct })
    }
}
