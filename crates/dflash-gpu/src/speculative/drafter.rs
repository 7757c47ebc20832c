//! The drafter on the GPU: its buffers (weights, context K/V cache, activations), the
//! dispatches of its context extension and block pass, and the step's bookkeeping
//! kernels (dflash.wgsl). Its memory plan is in `drafter/memory_plan.rs`; uploading its
//! weights (or taking them already on the device) and allocating around them in
//! `drafter/load.rs`.

mod load;
mod memory_plan;

pub use load::{GpuDrafterLayerWeights, GpuDrafterWeights};
pub use memory_plan::DrafterPlan;

use crate::blocks::{
    self, ConvBuffers, ConvWeights, GpuFfn, LayerBuffers, LayerShape, LayerWeights, StackedQkv,
};
use crate::context::GpuContext;
use crate::error::Result;
use crate::model::{GpuModel, MAX_ROWS};
use crate::ops;
use crate::pipelines::{Dispatch, Kernel, Shader};
use crate::upload::GpuMatrix;
use dflash_core::config::RopeStyle;

struct DraftLayer {
    input_norm: wgpu::Buffer,
    post_norm: wgpu::Buffer,
    /// The per-head norms of q and k.
    qk_norm: [wgpu::Buffer; 2],
    qkv: StackedQkv,
    /// `[wk; wv]` stacked (one GEMV of the context rows), else the two in order.
    context_kv: Vec<GpuMatrix>,
    wo: GpuMatrix,
    ffn: GpuFfn,
    k_ctx: wgpu::Buffer,
    v_ctx: wgpu::Buffer,
    window: usize,
    /// Causal inside the block (the reference's default for sliding layers).
    causal: bool,
    /// DFlash2: the (attention, MLP) convolutions.
    conv: Option<[GpuConv; 2]>,
}

/// One DFlash2 convolution: base kernel `[2, taps, H]` and the kernel projection.
struct GpuConv {
    base: wgpu::Buffer,
    projection: GpuMatrix,
}

/// DFlash2's selector weights and its work buffers.
pub(super) struct DFlash2Gpu {
    pub(super) config: dflash_core::drafter::DFlash2Config,
    hidden_projection: GpuMatrix,
    predecessor: wgpu::Buffer,
    successor: wgpu::Buffer,
    /// Per block row: the coefficients of the current sublayer's convolution.
    coef: wgpu::Buffer,
    /// Convolved sublayer input, and the sublayer's output before its second convolution.
    xc: wgpu::Buffer,
    o: wgpu::Buffer,
    hp: wgpu::Buffer,
    pub(super) cand_ids: wgpu::Buffer,
    cand_vals: wgpu::Buffer,
    /// The walk's proposal distribution per slot (rejection sampling).
    pub(super) q_vals: wgpu::Buffer,
}

/// A plain drafter's sampled proposal (rejection sampling at T > 0): each slot's top
/// candidates of the draft logits and the q the walk draws them from (dflash2.wgsl's
/// walk with rank 0: no selector term; `none` stands in for the selector's buffers).
pub(super) struct SampledProposal {
    pub(super) ids: wgpu::Buffer,
    vals: wgpu::Buffer,
    pub(super) q: wgpu::Buffer,
    none: wgpu::Buffer,
}

/// The drafter's weights, context cache and activations on the GPU.
pub struct GpuDrafter {
    pub config: dflash_core::drafter::DrafterConfig,
    fc: GpuMatrix,
    hidden_norm: wgpu::Buffer,
    norm: wgpu::Buffer,
    layers: Vec<DraftLayer>,
    rope_table: wgpu::Buffer,
    /// The context rows' projection `fc(taps)`, before its norm.
    c: wgpu::Buffer,
    x: wgpu::Buffer,
    pub(super) xn: wgpu::Buffer,
    /// The next norm's x * weight and partial sums (`Tuning::norm_in_residual`).
    prenorm: wgpu::Buffer,
    /// q, k, v of each block row `[16, q_dim + 2 kv_dim]`; k, v of each context row.
    qkv: wgpu::Buffer,
    att: wgpu::Buffer,
    /// Chunked attention's partials (see `GpuModel`'s).
    att_parts: [wgpu::Buffer; 2],
    /// Positions the context cache holds.
    capacity: usize,
    gate: wgpu::Buffer,
    up: wgpu::Buffer,
    ff: wgpu::Buffer,
    ids: wgpu::Buffer,
    pub(super) drafts: wgpu::Buffer,
    pub(super) host_drafts: wgpu::Buffer,
    /// Rejection sampling: per block row (accepted, token).
    pub(super) verdict: wgpu::Buffer,
    pub(super) d2: Option<DFlash2Gpu>,
    /// Plain drafters only.
    pub(super) sampled: Option<SampledProposal>,
    /// The target lm_head's rows of the drafter's draft vocabulary and their token ids
    /// (greedy drafts of a plain drafter that has one).
    draft_head: Option<DraftHead>,
    pub n_bytes: u64,
}

/// A draft vocabulary's rows of the target's lm_head (gathered on the GPU) and the
/// token id of each row.
struct DraftHead {
    rows: GpuMatrix,
    ids: wgpu::Buffer,
}

/// Host drafts the drafter of a target keeps room for (one per absolute position).
pub(super) fn host_draft_capacity(target: &GpuModel) -> usize {
    target.context + MAX_ROWS + 1
}

impl GpuDrafter {
    /// Greedy drafts among `v`'s ids of the target's lm_head from now on (a plain
    /// drafter whose head rows can be gathered; before any step is recorded).
    pub(super) fn set_draft_vocab(
        &mut self,
        ctx: &GpuContext,
        target: &GpuModel,
        v: &dflash_core::drafter::DraftVocab,
    ) {
        if self.d2.is_none() {
            self.draft_head = DraftHead::gather(ctx, target, v);
            self.n_bytes += self
                .draft_head
                .as_ref()
                .map_or(0, |h| h.rows.n_bytes + h.ids.size());
        }
    }

    /// The ids greedy drafts are chosen among where a draft vocabulary's rows of the
    /// head are in use (None: the whole head).
    pub fn draft_head_ids(&self) -> Option<usize> {
        self.draft_head.as_ref().map(|h| h.rows.rows)
    }

    /// Grows the context cache by `n` rows of the target's taps at positions
    /// `ext_state[0]..`: `c = hidden_norm(fc(taps))`, per layer one GEMV of `[wk; wv]`,
    /// then `k_norm` + RoPE of k and the store of k and v (qkv.wgsl without query heads).
    pub(super) fn extend_dispatches(
        &self,
        ctx: &GpuContext,
        t: &GpuModel,
        n: usize,
    ) -> Result<Vec<Dispatch>> {
        let c = &self.config;
        let mut d = ops::gemv(ctx, &self.fc, &t.act.taps, &self.c, n, false)?;
        let (norm, x) = blocks::norm_input(
            ctx,
            &mut d,
            (&self.hidden_norm, c.rms_norm_eps),
            (&self.c, &self.xn, &self.prenorm),
            (None, n),
            c.hidden_size,
        )?;
        let row = 2 * c.kv_dim();
        let shape = ops::QkvShape {
            n_heads: 0,
            ..self.qkv_shape()
        };
        for l in &self.layers {
            let mut col = 0;
            for m in &l.context_kv {
                let f = ops::GemvFusion {
                    out_offset: col,
                    out_stride: row,
                    ..norm
                };
                d.extend(ops::gemv_fused(ctx, m, x, &self.qkv, n, &f)?);
                col += m.rows;
            }
            let bufs = ops::QkvBuffers {
                state: &t.act.ext_state,
                table: &self.rope_table,
                qkv: &self.qkv,
                qk_norm: Some([&l.qk_norm[0], &l.qk_norm[1]]),
                k_cache: &l.k_ctx,
                v_cache: &l.v_ctx,
            };
            d.push(ops::qkv_rope_store(ctx, &shape, &bufs, n)?);
        }
        Ok(d)
    }

    fn qkv_shape(&self) -> ops::QkvShape {
        let c = &self.config;
        ops::QkvShape {
            style: RopeStyle::Neox,
            n_heads: c.num_heads,
            n_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            rope_dim: c.head_dim,
            eps: c.rms_norm_eps,
            gate: false,
        }
    }

    /// The sizes of the block pass's layers: every row sees the whole context and block
    /// (but where a layer is causal or has a window, `LayerWeights`).
    fn layer_shape(&self) -> LayerShape {
        let (c, q) = (&self.config, self.qkv_shape());
        LayerShape {
            hidden: c.hidden_size,
            n_heads: q.n_heads,
            n_kv_heads: q.n_kv_heads,
            head_dim: q.head_dim,
            intermediate: c.intermediate_size,
            rope_style: q.style,
            rope_dim: q.rope_dim,
            eps: q.eps,
            causal: false,
            capacity: self.capacity,
            gate: false,
        }
    }

    fn layer_buffers<'a>(&'a self, state: &'a wgpu::Buffer) -> LayerBuffers<'a> {
        LayerBuffers {
            state,
            rope_table: &self.rope_table,
            x: &self.x,
            xn: &self.xn,
            prenorm: &self.prenorm,
            qkv: &self.qkv,
            att: &self.att,
            att_parts: [&self.att_parts[0], &self.att_parts[1]],
            gate: &self.gate,
            up: &self.up,
            ff: &self.ff,
            conv: self.d2.as_ref().map(|s| ConvBuffers {
                coef: &s.coef,
                xc: &s.xc,
                o: &s.o,
            }),
            moe: None,
            linear: None,
        }
    }

    fn layer_weights<'a>(&'a self, l: &'a DraftLayer) -> LayerWeights<'a> {
        let conv = match (&l.conv, &self.d2) {
            (Some([a, m]), Some(s)) => {
                let w = |g: &'a GpuConv| ConvWeights {
                    projection: &g.projection,
                    base: &g.base,
                    taps: s.config.conv_kernel_size,
                    group: s.config.conv_group_size,
                };
                Some([w(a), w(m)])
            }
            _ => None,
        };
        LayerWeights {
            attn_norm: &l.input_norm,
            ffn_norm: &l.post_norm,
            qkv: &l.qkv,
            qk_norm: Some([&l.qk_norm[0], &l.qk_norm[1]]),
            wo: &l.wo,
            ffn: &l.ffn,
            k_cache: &l.k_ctx,
            v_cache: &l.v_ctx,
            window: l.window,
            causal: l.causal,
            conv,
        }
    }

    /// The block pass: [anchor, MASK...] at positions state[0].., attending to the whole
    /// context and the block; the target's lm_head and argmax give the drafts. With
    /// `host` drafts the pass is skipped unless `pass` (simulated acceptance: the pass
    /// runs and its drafts are replaced by the host's).
    pub(super) fn draft_dispatches(
        &self,
        ctx: &GpuContext,
        t: &GpuModel,
        b: usize,
        host: bool,
        pass: bool,
        sampled: bool,
    ) -> Result<Vec<Dispatch>> {
        let mut d = vec![bookkeeping(ctx, t, self, "prepare", b, host)?];
        // A block of one row is the anchor alone: no drafts, no drafter pass.
        if (!host || pass) && b > 1 {
            let pass = BlockPass { ctx, t, b };
            self.block_layers(&pass, &mut d)?;
            match &self.d2 {
                // DFlash2: the top-K candidates of slots 1..b, then the selector's walk.
                Some(s) => self.selector_drafts(&pass, s, sampled, &mut d)?,
                // DFlash, sampled (rejection sampling at T > 0): the top candidates of
                // each slot and a draw among them at the sampler's temperature.
                None if sampled => self.sampled_drafts(&pass, &mut d)?,
                // DFlash: the greedy drafts, the argmax in the lm_head's epilogue (the
                // target's partials buffer: its head runs later in the step).
                None => self.greedy_drafts(&pass, &mut d)?,
            }
        }
        d.push(bookkeeping(ctx, t, self, "compose", b, host)?);
        Ok(d)
    }

    /// The block's rows through the drafter: the embedding (scaled), every layer's
    /// attention and MLP, and the final norm into `xn`.
    fn block_layers(&self, p: &BlockPass, d: &mut Vec<Dispatch>) -> Result<()> {
        let (ctx, t, b) = (p.ctx, p.t, p.b);
        let c = &self.config;
        let (h, eps) = (c.hidden_size, c.rms_norm_eps);
        d.extend(ops::embedding(ctx, &t.embed, &self.ids, &self.x, b)?);
        if c.input_embedding_scale != 1.0 {
            d.push(ops::scale(ctx, &self.x, b * h, c.input_embedding_scale)?);
        }
        let (shape, bufs) = (self.layer_shape(), self.layer_buffers(&t.act.state));
        let mut prepared = None;
        for (li, l) in self.layers.iter().enumerate() {
            let w = self.layer_weights(l);
            let mlp_prepared = blocks::attention_block(ctx, d, &shape, &w, (&bufs, prepared), b)?;
            // The next layer's norm (the final one stays apart: the heads read xn).
            let next = self.layers.get(li + 1).map(|l| self.layer_weights(l));
            let next = next.filter(|w| w.conv.is_none()).map(|w| w.attn_norm);
            let links = (mlp_prepared, next);
            prepared = blocks::mlp_block(ctx, d, &shape, &w, (&bufs, None), links, b)?;
        }
        d.push(ops::rmsnorm(ctx, eps, &self.norm, &self.x, &self.xn, b, h)?);
        Ok(())
    }

    /// DFlash2's drafts: the logits and the selector's projection of `xn`, the top-K
    /// candidates of slots 1..b, then the selector's walk among them.
    fn selector_drafts(
        &self,
        p: &BlockPass,
        s: &DFlash2Gpu,
        sampled: bool,
        d: &mut Vec<Dispatch>,
    ) -> Result<()> {
        let (ctx, t, b) = (p.ctx, p.t, p.b);
        let c = &self.config;
        let lm = t.lm_head.as_ref().unwrap_or(&t.embed);
        let v = t.config.vocab_size;
        d.extend(ops::gemv(ctx, lm, &self.xn, &t.act.logits, b, false)?);
        let dc = &s.config;
        d.extend(ops::gemv(
            ctx,
            &s.hidden_projection,
            &self.xn,
            &s.hp,
            b,
            false,
        )?);
        d.push(ops::top_k(
            ctx,
            &t.act.logits,
            &s.cand_ids,
            &s.cand_vals,
            1,
            b - 1,
            v,
            dc.selector_top_k,
            c.output_multiplier,
            c.final_logit_softcapping.unwrap_or(0.0),
        )?);
        let selector = [&s.hp, &s.predecessor, &s.successor];
        let wb = self.walk_buffers(t, [&s.cand_ids, &s.cand_vals], selector, &s.q_vals);
        d.push(ops::selector_walk(
            ctx,
            &wb,
            b - 1,
            dc.selector_top_k,
            dc.selector_rank,
            1,
            sampled,
        )?);
        Ok(())
    }

    /// A plain drafter's sampled drafts: the top candidates of each slot's logits and a
    /// draw among them at the sampler's temperature (the walk with no selector term).
    fn sampled_drafts(&self, pass: &BlockPass, d: &mut Vec<Dispatch>) -> Result<()> {
        let (ctx, t, b) = (pass.ctx, pass.t, pass.b);
        let c = &self.config;
        let lm = t.lm_head.as_ref().unwrap_or(&t.embed);
        let v = t.config.vocab_size;
        let p = self.sampled.as_ref().expect("a plain drafter's buffers");
        let k = c.candidate_count();
        d.extend(ops::gemv(ctx, lm, &self.xn, &t.act.logits, b, false)?);
        let cap = c.final_logit_softcapping.unwrap_or(0.0);
        let (ids, vals) = (&p.ids, &p.vals);
        let mult = c.output_multiplier;
        d.push(ops::top_k(
            ctx,
            &t.act.logits,
            ids,
            vals,
            1,
            b - 1,
            v,
            k,
            mult,
            cap,
        )?);
        let wb = self.walk_buffers(t, [ids, vals], [&p.none; 3], &p.q);
        d.push(ops::selector_walk(ctx, &wb, b - 1, k, 0, 0, true)?);
        Ok(())
    }

    /// The selector walk's buffers: the candidates (ids, values), the selector's
    /// (hidden projection, predecessor and successor codebooks), and where it records q;
    /// with the step's state, the drafts and the sampler's uniform.
    fn walk_buffers<'a>(
        &'a self,
        t: &'a GpuModel,
        [ids, vals]: [&'a wgpu::Buffer; 2],
        [hp, predecessor, successor]: [&'a wgpu::Buffer; 3],
        q_vals: &'a wgpu::Buffer,
    ) -> ops::WalkBuffers<'a> {
        ops::WalkBuffers {
            ids,
            vals,
            hp,
            predecessor,
            successor,
            state: &t.act.state,
            drafts: &self.drafts,
            sample_params: &t.act.sample_params,
            q_vals,
        }
    }

    /// A plain drafter's greedy drafts (`ops::greedy_head`: the target's logits and
    /// partials buffers, its head runs later in the step), over the draft vocabulary's
    /// rows where the drafter has one.
    fn greedy_drafts(&self, p: &BlockPass, d: &mut Vec<Dispatch>) -> Result<()> {
        let (ctx, t, b) = (p.ctx, p.t, p.b);
        let lm = match &self.draft_head {
            Some(h) => &h.rows,
            None => t.lm_head.as_ref().unwrap_or(&t.embed),
        };
        let head = (lm, &self.xn, &ops::GemvFusion::default());
        let bufs = (&t.act.logits, &t.act.best, &self.drafts);
        let ids = self.draft_head.as_ref().map(|h| &h.ids);
        d.extend(ops::greedy_head(ctx, head, bufs, b, ids)?);
        Ok(())
    }
}

impl DraftHead {
    /// The rows of `v` out of the target's lm_head (None where they cannot be copied as
    /// words: the drafts then come from the whole head).
    fn gather(
        ctx: &GpuContext,
        t: &GpuModel,
        v: &dflash_core::drafter::DraftVocab,
    ) -> Option<Self> {
        let lm = t.lm_head.as_ref().unwrap_or(&t.embed);
        Some(DraftHead {
            rows: crate::upload::gather_rows(ctx, "d.draft_head", lm, v.ids())?,
            ids: crate::upload::storage_buffer(ctx, "d.draft_ids", bytemuck::cast_slice(v.ids())),
        })
    }
}

/// The drafter's block pass in the making: the device, its target and the block's rows.
struct BlockPass<'a> {
    ctx: &'a GpuContext,
    t: &'a GpuModel,
    b: usize,
}

/// The uniform of dflash.wgsl.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BookkeepingParams {
    pub block: u32,
    pub mask: u32,
    pub host_drafts: u32,
    /// 1: the step's commit leaves `ext_state` (a deferred one-row step).
    pub keep_context: u32,
}

pub(super) fn bookkeeping(
    ctx: &GpuContext,
    t: &GpuModel,
    dr: &GpuDrafter,
    entry: &'static str,
    b: usize,
    host: bool,
) -> Result<Dispatch> {
    bookkeeping_keeping(ctx, t, dr, entry, (b, host), false)
}

/// `bookkeeping`, whose commit leaves the drafter's context start where it is when
/// `keep_context` (a deferred one-row step).
pub(super) fn bookkeeping_keeping(
    ctx: &GpuContext,
    t: &GpuModel,
    dr: &GpuDrafter,
    entry: &'static str,
    (b, host): (usize, bool),
    keep_context: bool,
) -> Result<Dispatch> {
    let params = BookkeepingParams {
        block: b as u32,
        mask: dr.config.mask_token_id,
        host_drafts: host as u32,
        keep_context: keep_context as u32,
    };
    let a = &t.act;
    let k = Kernel::new(Shader::DFlash, entry);
    let bufs: Vec<(u32, &wgpu::Buffer)> = match entry {
        "prepare" => vec![(1, &a.state), (3, &dr.ids)],
        "compose" => vec![
            (1, &a.state),
            (3, &a.tokens),
            (4, &dr.drafts),
            (5, &dr.host_drafts),
        ],
        "accept_rejection" => vec![
            (1, &a.state),
            (2, &a.ext_state),
            (3, &a.tokens),
            (6, &a.out_tokens),
            (7, &a.result),
            (8, &dr.verdict),
        ],
        _ => vec![
            (1, &a.state),
            (2, &a.ext_state),
            (3, &a.tokens),
            (6, &a.out_tokens),
            (7, &a.result),
        ],
    };
    Dispatch::new(ctx, &k, Some(&params), &bufs, [1, 1, 1])
}
