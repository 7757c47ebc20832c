//! The DFlash drafter in candle, for training: the z-lab architecture (fc + hidden_norm
//! over the target's taps, Qwen3-style layers whose keys and values are the context
//! followed by the block, the target's embedding and lm_head), with the training-time
//! attention mask: each block sees the context strictly before its anchor, itself
//! bidirectionally, and no other block.
//!
//! DFlash2 (`DFlash2DraftModel`) adds, as the engine's CPU reference runs it: the grouped
//! dynamic depthwise convolution before and after each sublayer (its per-position kernel
//! deltas projected from the sublayer's normed input) and the candidate selector, trained
//! by a second cross-entropy over each slot's lm_head top-K (see [`SeqLoss`]).

use crate::head_loss::CandidateHead;
use crate::nn::{rms_norm, RopeTables};
pub use crate::params::{param_shapes, DraftParams};
use crate::target::linear;
use candle_core::{DType, Result, Tensor, D};
use dflash_core::config::RopeStyle;
use dflash_core::drafter::{DFlash2Config, DrafterConfig};

/// One training sequence's inputs.
pub struct SeqBatch<'a> {
    /// Taps of the whole clean sequence, `[L, n_taps * H]`.
    pub taps: &'a Tensor,
    pub tokens: &'a [u32],
    /// Anchor positions (each < L - 1).
    pub anchors: &'a [usize],
    /// Positions from `loss_from` on carry labels (the response).
    pub loss_from: usize,
    /// The step's softmax rows when the loss is sampled; None: the whole vocabulary.
    pub head: Option<&'a CandidateHead>,
}

/// Loss pieces for one sequence: summed weighted NLL, summed weight, and per slot
/// (1..B) the number of labelled positions and how many the argmax got right.
///
/// DFlash2 adds the selector's loss: for each labelled slot whose label is among the
/// slot's lm_head top-K, the cross-entropy of the selector's scores over those K
/// candidates after the true previous token (teacher forcing: the walk's predecessor
/// when every earlier draft was right), weighted like the main loss. The candidates, their
/// logits and the hidden row are taken as they are (no gradient into the drafter's body),
/// so the selector learns to re-rank what the body proposes.
pub struct SeqLoss {
    pub weighted_nll: Tensor,
    pub weight: f64,
    pub counts: Vec<usize>,
    /// Per slot, the labels the argmax got right: counted once `settle` has run (at
    /// once where the argmax is on the host, as on the CPU).
    pub correct: Vec<usize>,
    /// The argmax still on the device (candle's ops, CUDA): reading it would wait for
    /// the sequence's kernels, so that the next sequence's launches could not overlap
    /// them; `settle` reads it once the step's work is queued.
    pub pending: Option<PendingHits>,
    /// DFlash2: the selector's summed weighted NLL and weight.
    pub selector_nll: Option<Tensor>,
    pub selector_weight: f64,
    /// DFlash2, per slot: labels inside the top-K, and labels the selector picks.
    pub in_top_k: Vec<usize>,
    pub selector_correct: Vec<usize>,
}

/// Each labelled row's argmax on the device, with the rows' labels and slots.
pub struct PendingHits {
    argmax: Tensor,
    labels: Vec<u32>,
    slots: Vec<usize>,
}

impl PendingHits {
    /// Reads the argmax (waiting for the kernels before it) and adds its hits per slot
    /// to `correct`.
    pub fn count_into(self, correct: &mut [usize]) -> Result<()> {
        let pred = self.argmax.to_vec1::<u32>()?;
        count_hits(&pred, &self.labels, &self.slots, correct);
        Ok(())
    }
}

impl SeqLoss {
    /// Counts the pending argmax's hits into `correct` (nothing when none is pending).
    pub fn settle(&mut self) -> Result<()> {
        match self.pending.take() {
            Some(p) => p.count_into(&mut self.correct),
            None => Ok(()),
        }
    }
}

/// Adds to `correct[slot]` each row whose prediction is its label.
fn count_hits(pred: &[u32], labels: &[u32], slots: &[usize], correct: &mut [usize]) {
    for ((p, l), &slot) in pred.iter().zip(labels).zip(slots) {
        if p == l {
            correct[slot] += 1;
        }
    }
}

pub struct DraftTrainer<'a> {
    pub config: DrafterConfig,
    pub embed: &'a Tensor,
    pub lm_head: &'a Tensor,
    pub rope: RopeTables,
    pub gamma: f64,
    /// The head's loss by the fused CPU op (`FrozenHeadNll`, the default on the CPU), or
    /// by candle's own ops (elsewhere, e.g. CUDA; tests run that path on the CPU too).
    pub fused_head: bool,
}

/// One side (0: before the sublayer, 1: after) of a DFlash2 grouped dynamic depthwise
/// convolution over blocks `x` `[A, B, H]`: `out[a, i, c] = sum_t (base[side, t, c] +
/// coef[a, i, (side * taps + t) * groups + c / group]) * x[a, i - t, c]`, the taps never
/// reaching before a block's first row (as `dflash_core::drafter::grouped_conv`).
pub fn grouped_conv(
    x: &Tensor,
    base: &Tensor,
    coef: &Tensor,
    side: usize,
    group: usize,
) -> Result<Tensor> {
    let (a, b, h) = x.dims3()?;
    let taps = base.dim(1)?;
    let groups = h / group;
    let mut out: Option<Tensor> = None;
    for t in 0..taps.min(b) {
        let shifted = if t == 0 {
            x.clone()
        } else {
            Tensor::cat(
                &[
                    Tensor::zeros((a, t, h), x.dtype(), x.device())?,
                    x.narrow(1, 0, b - t)?,
                ],
                1,
            )?
        };
        let delta = coef
            .narrow(2, (side * taps + t) * groups, groups)?
            .unsqueeze(3)?
            .broadcast_as((a, b, groups, group))?
            .reshape((a, b, h))?;
        let kernel = delta.broadcast_add(&base.get(side)?.get(t)?)?;
        let term = (kernel * shifted)?;
        out = Some(match out {
            Some(o) => (o + term)?,
            None => term,
        });
    }
    out.ok_or_else(|| candle_core::Error::Msg("empty block".into()))
}

impl<'a> DraftTrainer<'a> {
    pub fn new(
        config: DrafterConfig,
        embed: &'a Tensor,
        lm_head: &'a Tensor,
        gamma: f64,
        max_pos: usize,
    ) -> Result<Self> {
        let rope = RopeTables::new(
            &config.rope_inv_freq(),
            config.head_dim,
            RopeStyle::Neox,
            max_pos,
            embed.device(),
        )?;
        Ok(DraftTrainer {
            config,
            fused_head: embed.device().is_cpu(),
            embed,
            lm_head,
            rope,
            gamma,
        })
    }

    /// The drafter's final hidden rows (before the final norm) of the blocks
    /// `[tokens[anchor], MASK...]` of one sequence, `[A, B, H]`: each block attends to the
    /// context strictly before its anchor and to itself.
    pub fn block_hidden(
        &self,
        p: &DraftParams,
        taps: &Tensor,
        tokens: &[u32],
        anchors: &[usize],
    ) -> Result<Tensor> {
        let (rows, mut x) = self.block_inputs(p, taps, tokens, anchors)?;
        let d2 = self.config.dflash2.as_ref();
        for i in 0..self.config.num_layers {
            x = self.layer(&LayerParams { p, i, d2 }, x, &rows)?;
        }
        Ok(x)
    }

    /// What `block_hidden`'s layers read, and the blocks' embedded rows `[A, B, H]`.
    fn block_inputs(
        &self,
        p: &DraftParams,
        taps: &Tensor,
        tokens: &[u32],
        anchors: &[usize],
    ) -> Result<(BlockInputs, Tensor)> {
        let c = &self.config;
        let dev = self.embed.device();
        let h = c.hidden_size;
        let b = c.block_size;
        let l = tokens.len();
        let a = anchors.len();
        // Context: hidden_norm(fc(taps)), positions 0..L.
        let ctx = rms_norm(
            &linear(taps, p.get("fc.weight"))?,
            p.get("hidden_norm.weight"),
            c.rms_norm_eps,
        )?; // [L, H]
        let ctx_pos = Tensor::from_vec((0..l as u32).collect::<Vec<_>>(), (1, l), dev)?;
        let ctx_rope = self.rope.gather(&ctx_pos)?;
        // Blocks: [anchor token, MASK...] at positions anchor..anchor+B.
        let mut btok = Vec::with_capacity(a * b);
        let mut bpos = Vec::with_capacity(a * b);
        for &an in anchors {
            for k in 0..b {
                btok.push(if k == 0 { tokens[an] } else { c.mask_token_id });
                bpos.push((an + k) as u32);
            }
        }
        let btok = Tensor::from_vec(btok, a * b, dev)?;
        let block_rope = self.rope.gather(&Tensor::from_vec(bpos, (a, b), dev)?)?;
        let mut x = self.embed.index_select(&btok, 0)?.reshape((a, b, h))?;
        if c.input_embedding_scale != 1.0 {
            x = (x * c.input_embedding_scale as f64)?;
        }
        // Context keys visible to block i: positions < anchor_i; block keys all visible.
        let mut mask = Vec::with_capacity(a * l);
        for &an in anchors {
            mask.extend((0..l).map(|j| if j < an { 0f32 } else { f32::NEG_INFINITY }));
        }
        let ctx_mask = Tensor::from_vec(mask, (a, 1, 1, l), dev)?;
        let rows = BlockInputs {
            ctx,
            ctx_rope,
            block_rope,
            ctx_mask,
            a,
            l,
        };
        Ok((rows, x))
    }

    /// One drafter layer over the blocks' residual rows `x` `[A, B, H]`: attention over
    /// the context and the block, then the MLP, each added to `x` (DFlash2: each
    /// sublayer between its convolution's two sides).
    fn layer(&self, lw: &LayerParams, x: Tensor, rows: &BlockInputs) -> Result<Tensor> {
        let eps = self.config.rms_norm_eps;
        let (kc, vc) = self.context_kv(lw, rows)?;
        // Block Q/K/V: [A, heads, B, hd].
        let hn = rms_norm(&x, lw.w("input_layernorm.weight"), eps)?;
        let cf_att = lw.coef("attention_conv", &hn)?;
        let hn = lw.conv("attention_conv", hn, &cf_att, 0)?;
        let att = self.block_attention(lw, &hn, &kc, &vc, rows)?;
        let o = lw.conv(
            "attention_conv",
            linear(&att, lw.w("self_attn.o_proj.weight"))?,
            &cf_att,
            1,
        )?;
        let x = (x + o)?;
        let hn = rms_norm(&x, lw.w("post_attention_layernorm.weight"), eps)?;
        let cf_mlp = lw.coef("mlp_conv", &hn)?;
        let hn = lw.conv("mlp_conv", hn, &cf_mlp, 0)?;
        let act = (candle_nn::ops::silu(&linear(&hn, lw.w("mlp.gate_proj.weight"))?)?
            * linear(&hn, lw.w("mlp.up_proj.weight"))?)?;
        x + lw.conv(
            "mlp_conv",
            linear(&act, lw.w("mlp.down_proj.weight"))?,
            &cf_mlp,
            1,
        )?
    }

    /// A layer's context keys (normed and rotated) and values, each `[1, nkv, L, hd]`.
    fn context_kv(&self, lw: &LayerParams, rows: &BlockInputs) -> Result<(Tensor, Tensor)> {
        let dims = (1, rows.l, self.config.num_kv_heads);
        let kc = self.heads(lw, &rows.ctx, "self_attn.k_proj.weight", dims)?;
        let kc = self.rotated(lw, &kc, "self_attn.k_norm.weight", &rows.ctx_rope)?;
        let vc = self.heads(lw, &rows.ctx, "self_attn.v_proj.weight", dims)?;
        Ok((kc, vc))
    }

    /// The blocks' queries, keys and values of normed rows `hn`: `[A, heads, B, hd]`,
    /// queries and keys normed and rotated.
    fn block_qkv(
        &self,
        lw: &LayerParams,
        hn: &Tensor,
        rows: &BlockInputs,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let c = &self.config;
        let (a, b) = (rows.a, c.block_size);
        let q = self.heads(lw, hn, "self_attn.q_proj.weight", (a, b, c.num_heads))?;
        let q = self.rotated(lw, &q, "self_attn.q_norm.weight", &rows.block_rope)?;
        let kv_dims = (a, b, c.num_kv_heads);
        let kb = self.heads(lw, hn, "self_attn.k_proj.weight", kv_dims)?;
        let kb = self.rotated(lw, &kb, "self_attn.k_norm.weight", &rows.block_rope)?;
        let vb = self
            .heads(lw, hn, "self_attn.v_proj.weight", kv_dims)?
            .contiguous()?;
        Ok((q, kb, vb))
    }

    /// Rows `x` `[N, T, ·]` through the layer's projection `proj`, split into heads:
    /// `[N, heads, T, hd]` for `(N, T, heads)` = `dims`.
    fn heads(
        &self,
        lw: &LayerParams,
        x: &Tensor,
        proj: &str,
        (n, t, heads): (usize, usize, usize),
    ) -> Result<Tensor> {
        linear(x, lw.w(proj))?
            .reshape((n, t, heads, self.config.head_dim))?
            .transpose(1, 2)
    }

    /// Heads `x` normed by the layer's `norm` and rotated by `(cos, sin)`.
    fn rotated(
        &self,
        lw: &LayerParams,
        x: &Tensor,
        norm: &str,
        (cos, sin): &(Tensor, Tensor),
    ) -> Result<Tensor> {
        self.rope.apply(
            &rms_norm(x, lw.w(norm), self.config.rms_norm_eps)?,
            cos,
            sin,
        )
    }

    /// The blocks' attention of normed rows `hn` over the visible context keys `kc` /
    /// values `vc` and over their own block, before the output projection:
    /// `[A, B, nh * hd]`.
    fn block_attention(
        &self,
        lw: &LayerParams,
        hn: &Tensor,
        kc: &Tensor,
        vc: &Tensor,
        rows: &BlockInputs,
    ) -> Result<Tensor> {
        let c = &self.config;
        let (hd, nh, nkv) = (c.head_dim, c.num_heads, c.num_kv_heads);
        let (rep, a, b, l) = (nh / nkv, rows.a, c.block_size, rows.l);
        let scale = 1.0 / (hd as f64).sqrt();
        let (q, kb, vb) = self.block_qkv(lw, hn, rows)?;
        // Queries grouped by KV head: [A, nkv, rep*B, hd].
        let qg = q.contiguous()?.reshape((a, nkv, rep * b, hd))?;
        // Scores against the context: [nkv, A*rep*B, hd] x [nkv, hd, L].
        let qc = qg
            .transpose(0, 1)?
            .contiguous()?
            .reshape((nkv, a * rep * b, hd))?;
        let kc2 = kc.squeeze(0)?.contiguous()?; // [nkv, L, hd]
        let s_ctx = qc
            .matmul(&kc2.t()?.contiguous()?)?
            .reshape((nkv, a, rep * b, l))?
            .transpose(0, 1)?; // [A, nkv, rep*B, L]
        let s_blk = qg.matmul(&kb.t()?.contiguous()?)?; // [A, nkv, rep*B, B]
        let scores =
            (Tensor::cat(&[s_ctx.broadcast_add(&rows.ctx_mask)?, s_blk], D::Minus1)? * scale)?;
        let probs = candle_nn::ops::softmax(&scores, D::Minus1)?;
        let p_ctx = probs
            .narrow(D::Minus1, 0, l)?
            .transpose(0, 1)?
            .contiguous()?
            .reshape((nkv, a * rep * b, l))?;
        let o_ctx = p_ctx
            .matmul(&vc.squeeze(0)?.contiguous()?)?
            .reshape((nkv, a, rep * b, hd))?
            .transpose(0, 1)?;
        let o_blk = probs.narrow(D::Minus1, l, b)?.contiguous()?.matmul(&vb)?;
        (o_ctx + o_blk)?
            .reshape((a, nh, b, hd))?
            .transpose(1, 2)?
            .reshape((a, b, nh * hd))
    }

    /// The final norm of `block_hidden`'s rows: what the lm_head and the selector read.
    pub fn final_norm(&self, p: &DraftParams, x: &Tensor) -> Result<Tensor> {
        rms_norm(x, p.get("norm.weight"), self.config.rms_norm_eps)
    }

    /// Loss of the blocks of one sequence.
    pub fn sequence_loss(&self, p: &DraftParams, s: &SeqBatch) -> Result<SeqLoss> {
        let c = &self.config;
        let dev = self.embed.device();
        let (h, b, a) = (c.hidden_size, c.block_size, s.anchors.len());
        let x = self.block_hidden(p, s.taps, s.tokens, s.anchors)?;
        let lab = self.slot_labels(s);
        let mut out = SeqLoss {
            weighted_nll: Tensor::zeros((), DType::F32, dev)?,
            weight: 0.0,
            counts: vec![0; b],
            correct: vec![0; b],
            pending: None,
            selector_nll: None,
            selector_weight: 0.0,
            in_top_k: vec![0; b],
            selector_correct: vec![0; b],
        };
        if lab.rows.is_empty() {
            return Ok(out);
        }
        let n = lab.rows.len();
        let hsel = x
            .reshape((a * b, h))?
            .index_select(&Tensor::from_vec(lab.rows.clone(), n, dev)?, 0)?;
        let normed = self.final_norm(p, &hsel)?;
        let top_k = c.dflash2.as_ref().map_or(0, |d| d.selector_top_k);
        let HeadNll {
            nll,
            argmax: pred,
            top,
        } = self.head_nll(&normed, &lab.labels, top_k, s.head)?;
        out.weight = lab.weights.iter().map(|&w| w as f64).sum();
        let wt = Tensor::from_vec(lab.weights.clone(), n, dev)?;
        out.weighted_nll = (nll * wt)?.sum_all()?;
        for &slot in &lab.slots {
            out.counts[slot] += 1;
        }
        match pred {
            Argmax::Host(pred) => count_hits(&pred, &lab.labels, &lab.slots, &mut out.correct),
            Argmax::Device(argmax) => {
                out.pending = Some(PendingHits {
                    argmax,
                    labels: lab.labels.clone(),
                    slots: lab.slots.clone(),
                })
            }
        }
        if c.dflash2.is_some() {
            self.selector_loss(p, &normed, &lab, &top, &mut out)?;
        }
        Ok(out)
    }

    /// The labelled slots of a sequence's blocks: slot k (1..B) predicts the token at
    /// anchor + k, inside the sequence and the loss region.
    fn slot_labels(&self, s: &SeqBatch) -> SlotLabels {
        let (b, l) = (self.config.block_size, s.tokens.len());
        let mut lab = SlotLabels {
            rows: Vec::new(),
            labels: Vec::new(),
            weights: Vec::new(),
            slots: Vec::new(),
            preds: Vec::new(),
        };
        for (ai, &an) in s.anchors.iter().enumerate() {
            for k in 1..b {
                let t = an + k;
                if t < l && t >= s.loss_from {
                    lab.rows.push((ai * b + k) as u32);
                    lab.labels.push(s.tokens[t]);
                    lab.preds.push(s.tokens[t - 1]);
                    lab.weights
                        .push((-((k - 1) as f64) / self.gamma).exp() as f32);
                    lab.slots.push(k);
                }
            }
        }
        lab
    }

    /// The lm_head's NLL of `labels` on the final-normed rows `normed` `[n, H]`, each
    /// row's argmax, and (`top_k` > 0) each row's top-K (id, logit): over the whole
    /// vocabulary, or over the rows of `head` only (the ids it returns are vocabulary ids).
    fn head_nll(
        &self,
        normed: &Tensor,
        labels: &[u32],
        top_k: usize,
        head: Option<&CandidateHead>,
    ) -> Result<HeadNll> {
        let Some(head) = head else {
            return self.matrix_nll(self.lm_head, normed, labels.to_vec(), top_k);
        };
        let mut out = self.matrix_nll(&head.rows, normed, head.local_labels(labels)?, top_k)?;
        let local = out.argmax.read()?;
        out.argmax = Argmax::Host(local.iter().map(|&a| head.ids[a as usize]).collect());
        for (id, _) in out.top.iter_mut().flatten() {
            *id = head.ids[*id as usize];
        }
        Ok(out)
    }

    /// `head_nll` over the rows of `matrix` `[V', H]`, labels and ids being its rows.
    fn matrix_nll(
        &self,
        matrix: &Tensor,
        normed: &Tensor,
        labels: Vec<u32>,
        top_k: usize,
    ) -> Result<HeadNll> {
        let dev = self.embed.device();
        let n = labels.len();
        if self.fused_head {
            // The fused op: no gradient for the frozen lm_head, one pass over the logits.
            let op = crate::head_loss::FrozenHeadNll::new(matrix.clone(), labels).with_top_k(top_k);
            let stats = op.stats.clone();
            let nll = normed.apply_op1(op)?;
            let mut st = stats.lock().expect("stats lock");
            Ok(HeadNll {
                nll,
                argmax: Argmax::Host(std::mem::take(&mut st.argmax)),
                top: std::mem::take(&mut st.top),
            })
        } else {
            // Other devices (CUDA): candle's own ops.
            let logits = linear(normed, matrix)?;
            let lab = Tensor::from_vec(labels, (n, 1), dev)?;
            let nll = candle_nn::ops::log_softmax(&logits, D::Minus1)?
                .gather(&lab, 1)?
                .squeeze(1)?
                .neg()?;
            let top = if top_k > 0 {
                logits
                    .to_vec2::<f32>()?
                    .iter()
                    .map(|r| dflash_core::drafter::top_k(r, top_k))
                    .collect()
            } else {
                vec![]
            };
            Ok(HeadNll {
                nll,
                argmax: Argmax::Device(logits.argmax(D::Minus1)?),
                top,
            })
        }
    }

    /// DFlash2: the selector's weighted cross-entropy over the K candidates `top` of
    /// the rows whose label is a candidate, and its per-slot counts, into `out`.
    fn selector_loss(
        &self,
        p: &DraftParams,
        normed: &Tensor,
        lab: &SlotLabels,
        top: &[Vec<(u32, f32)>],
        out: &mut SeqLoss,
    ) -> Result<()> {
        let c = &self.config;
        let dev = self.embed.device();
        let sel = SelectorRows::of(c, lab, top, out);
        let m = sel.keep.len();
        if m == 0 {
            return Ok(());
        }
        let top_k = c.dflash2.as_ref().map_or(0, |d| d.selector_top_k);
        let k = top_k.min(c.vocab_size);
        let hp = linear(
            &normed
                .detach()
                .index_select(&Tensor::from_vec(sel.keep, m, dev)?, 0)?,
            p.get("candidate_selector.hidden_projection.weight"),
        )?; // [m, rank]
        let pa = p
            .get("candidate_selector.predecessor_codebook")
            .index_select(&Tensor::from_vec(sel.preds, m, dev)?, 0)?; // [m, rank]
        let rank = hp.dim(1)?;
        let sb = p
            .get("candidate_selector.successor_codebook")
            .index_select(&Tensor::from_vec(sel.candidates, m * k, dev)?, 0)?
            .reshape((m, k, rank))?;
        let scores = ((pa * hp)?.unsqueeze(1)?.broadcast_mul(&sb)?.sum(2)?
            + Tensor::from_vec(sel.unary, (m, k), dev)?)?; // [m, K]
        let tg = Tensor::from_vec(sel.target.clone(), (m, 1), dev)?;
        let sel_nll = candle_nn::ops::log_softmax(&scores, D::Minus1)?
            .gather(&tg, 1)?
            .squeeze(1)?
            .neg()?;
        out.selector_weight = sel.weights.iter().map(|&w| w as f64).sum();
        out.selector_nll = Some((sel_nll * Tensor::from_vec(sel.weights, m, dev)?)?.sum_all()?);
        let best = scores.argmax(D::Minus1)?.to_vec1::<u32>()?;
        for ((bst, tgt), slot) in best.iter().zip(&sel.target).zip(sel.slots) {
            if bst == tgt {
                out.selector_correct[slot] += 1;
            }
        }
        Ok(())
    }
}

/// What every layer of `block_hidden` reads besides the blocks' rows: the context rows
/// `[L, H]`, the rotary tables of the context and of the blocks, and the additive mask
/// `[A, 1, 1, L]` of the context keys each block sees.
struct BlockInputs {
    ctx: Tensor,
    /// Rotary (cos, sin) of the context's positions and of the blocks'.
    ctx_rope: (Tensor, Tensor),
    block_rope: (Tensor, Tensor),
    ctx_mask: Tensor,
    /// Blocks (anchors).
    a: usize,
    /// Context length.
    l: usize,
}

/// Layer `i`'s tensors of the drafter `p`, and DFlash2's sizes (None: plain DFlash).
struct LayerParams<'p> {
    p: &'p DraftParams,
    i: usize,
    d2: Option<&'p DFlash2Config>,
}

impl LayerParams<'_> {
    /// The layer's tensor `n` (its z-lab name after `layers.{i}.`).
    fn w(&self, n: &str) -> &Tensor {
        self.p.get(&format!("layers.{}.{n}", self.i))
    }

    /// DFlash2: a sublayer's convolution coefficients, from its normed input `hn`.
    fn coef(&self, conv: &str, hn: &Tensor) -> Result<Option<Tensor>> {
        self.d2
            .map(|_| linear(hn, self.w(&format!("{conv}.kernel_projection.weight"))))
            .transpose()
    }

    /// DFlash2: side `side` of convolution `conv` with coefficients `cf` over `x`;
    /// plain DFlash: `x` itself.
    fn conv(&self, conv: &str, x: Tensor, cf: &Option<Tensor>, side: usize) -> Result<Tensor> {
        match (self.d2, cf) {
            (Some(d), Some(cf)) => grouped_conv(
                &x,
                self.w(&format!("{conv}.base_kernel")),
                cf,
                side,
                d.conv_group_size,
            ),
            _ => Ok(x),
        }
    }
}

/// The labelled slots of one sequence, one entry per label: its row in the blocks
/// (`block * B + slot`), the label, its loss weight, its slot and the token before it.
struct SlotLabels {
    rows: Vec<u32>,
    labels: Vec<u32>,
    weights: Vec<f32>,
    slots: Vec<usize>,
    preds: Vec<u32>,
}

/// The lm_head's answer on labelled rows: the NLL of each label `[n]`, each row's
/// argmax, and (DFlash2) each row's top-K candidates (id, logit).
struct HeadNll {
    nll: Tensor,
    argmax: Argmax,
    top: Vec<Vec<(u32, f32)>>,
}

/// Each row's argmax: on the host (the fused CPU op leaves it there), or a device
/// tensor read when the step's work is queued (`SeqLoss::settle`).
enum Argmax {
    Host(Vec<u32>),
    Device(Tensor),
}

impl Argmax {
    fn read(&self) -> Result<Vec<u32>> {
        match self {
            Argmax::Host(v) => Ok(v.clone()),
            Argmax::Device(t) => t.to_vec1::<u32>(),
        }
    }
}

/// DFlash2: the labelled rows whose label is among the row's top-K candidates, as the
/// selector's loss reads them.
struct SelectorRows {
    /// Indices into the labelled rows.
    keep: Vec<u32>,
    /// The label's index among the row's candidates.
    target: Vec<u32>,
    /// The candidates' ids, `[m * K]`, and their unary scores (the drafted logits).
    candidates: Vec<u32>,
    unary: Vec<f32>,
    /// The token before the label (the walk's predecessor under teacher forcing).
    preds: Vec<u32>,
    weights: Vec<f32>,
    slots: Vec<usize>,
}

impl SelectorRows {
    /// The rows of `lab` whose label is in `top`; counts them per slot in `out.in_top_k`.
    fn of(c: &DrafterConfig, lab: &SlotLabels, top: &[Vec<(u32, f32)>], out: &mut SeqLoss) -> Self {
        let unary = |x: f32| c.draft_logit(x);
        let mut sel = SelectorRows {
            keep: Vec::new(),
            target: Vec::new(),
            candidates: Vec::new(),
            unary: Vec::new(),
            preds: Vec::new(),
            weights: Vec::new(),
            slots: Vec::new(),
        };
        for (i, &label) in lab.labels.iter().enumerate() {
            if let Some(j) = top[i].iter().position(|t| t.0 == label) {
                out.in_top_k[lab.slots[i]] += 1;
                sel.keep.push(i as u32);
                sel.target.push(j as u32);
                sel.candidates.extend(top[i].iter().map(|t| t.0));
                sel.unary.extend(top[i].iter().map(|t| unary(t.1)));
                sel.preds.push(lab.preds[i]);
                sel.weights.push(lab.weights[i]);
                sel.slots.push(lab.slots[i]);
            }
        }
        sel
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn pending_hits_count_each_slots_right_predictions() {
        let dev = Device::Cpu;
        let hits = PendingHits {
            argmax: Tensor::from_vec(vec![3u32, 5, 7, 9, 2], 5, &dev).unwrap(),
            labels: vec![3, 0, 7, 9, 4],
            slots: vec![1, 1, 2, 3, 3],
        };
        let mut correct = vec![0usize, 0, 5, 0];
        hits.count_into(&mut correct).unwrap();
        assert_eq!(correct, [0, 1, 6, 1]);
    }
}
