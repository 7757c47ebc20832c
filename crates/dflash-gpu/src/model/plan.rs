//! The target model's recorded plans: the dispatches of a pass of n rows (embedding,
//! every layer, taps, output head) and a hybrid model's state rollback around DFlash's
//! verify pass.

use super::{GpuModel, OutputHead};
use crate::blocks::{self, LayerBuffers, LayerShape, LinearBuffers, MoeBuffers};
use crate::context::GpuContext;
use crate::error::Result;
use crate::ops;
use crate::pipelines::{Dispatch, MAX_ROWS};

impl GpuModel {
    /// Rolls the KV cache back to `len` positions (rows past it are overwritten later).
    /// DFlash's verify pass over a hybrid model: first each linear layer's states kept
    /// (`before`), after acceptance they are put back and the accepted rows replayed
    /// (delta_net.wgsl); nothing for other models.
    pub(crate) fn state_rollback(&self, before: bool) -> Result<Vec<Dispatch>> {
        let (ctx, bufs) = (&*self.ctx, self.layer_buffers());
        let mut d = Vec::new();
        let (Some(lb), true) = (&bufs.linear, self.is_hybrid()) else {
            return Ok(d);
        };
        for dn in self.layers.iter().filter_map(|l| l.delta_net.as_ref()) {
            let b = dn.buffers(lb);
            d.push(ops::delta_net_states(ctx, &dn.shape, &b, !before)?);
            if !before {
                d.extend(ops::delta_net(ctx, &dn.shape, &b, MAX_ROWS, true)?);
            }
        }
        Ok(d)
    }

    pub(crate) fn build_plan(&self, n: usize, head: OutputHead) -> Result<Vec<Dispatch>> {
        self.build_plan_tapping_at(n, head, 0)
    }

    /// `build_plan` whose taps land at rows `tap_row..tap_row + n` of the taps buffer (a
    /// deferred DFlash step keeps the rows before it for the drafter's next extension).
    pub(crate) fn build_plan_tapping_at(
        &self,
        n: usize,
        head: OutputHead,
        tap_row: usize,
    ) -> Result<Vec<Dispatch>> {
        let ctx: &GpuContext = &self.ctx;
        let a = &self.act;
        let mut d = ops::embedding(ctx, &self.embed, &a.tokens, &a.x, n)?;
        let (shape, bufs) = (self.layer_shape(), self.layer_buffers());
        let (h, stride) = (
            self.config.hidden_size,
            self.taps.len() * self.config.hidden_size,
        );
        let mut prepared = None;
        for (li, l) in self.layers.iter().enumerate() {
            let w = l.weights();
            let last = li + 1 == self.layers.len();
            // A tap of a layer but the last is the down GEMV's epilogue (its first tap
            // there; a layer tapped twice copies the others).
            let first_tap = self.taps.iter().position(|&t| t == li).filter(|_| !last);
            let tap = first_tap.map(|ti| ops::GemvTap {
                buf: &a.taps,
                offset: tap_row * stride + ti * h,
                stride,
            });
            let b = (&bufs, prepared);
            let mlp_prepared = match &l.delta_net {
                Some(dn) => blocks::delta_net_block(ctx, &mut d, &shape, (&w, dn), b, n)?,
                None => blocks::attention_block(ctx, &mut d, &shape, &w, b, n)?,
            };
            // The norm after the layer: the next layer's, or the final one.
            let next = match self.layers.get(li + 1) {
                Some(l) => l.weights().attn_norm,
                None => &self.out_norm,
            };
            let links = (mlp_prepared, Some(next));
            prepared = blocks::mlp_block(ctx, &mut d, &shape, &w, (&bufs, tap), links, n)?;
            self.copy_taps(&mut d, (li, tap_row), first_tap, n)?;
        }
        if head != OutputHead::None {
            self.head(&mut d, (n, prepared), head)?;
        }
        Ok(d)
    }

    /// Layer `li`'s taps but the one its down GEMV wrote (`in_epilogue`): copies of the
    /// residual stream, or of the final norm's output for the last layer (the
    /// reference's `output_hidden_states`; the head norms `x` again itself).
    fn copy_taps(
        &self,
        d: &mut Vec<Dispatch>,
        (li, tap_row): (usize, usize),
        in_epilogue: Option<usize>,
        n: usize,
    ) -> Result<()> {
        let (ctx, a, c) = (&*self.ctx, &self.act, &self.config);
        let h = c.hidden_size;
        let last = li + 1 == self.layers.len();
        if last && self.taps.contains(&li) {
            d.push(ops::rmsnorm(
                ctx,
                c.rms_norm_eps,
                &self.out_norm,
                &a.x,
                &a.xn,
                n,
                h,
            )?);
        }
        let tapped = if last { &a.xn } else { &a.x };
        let stride = self.taps.len() * h;
        for (ti, _) in self
            .taps
            .iter()
            .enumerate()
            .filter(|&(ti, &t)| t == li && Some(ti) != in_epilogue)
        {
            d.push(ops::copy_rows(
                ctx,
                tapped,
                &a.taps,
                &a.state,
                n,
                h,
                stride,
                tap_row * stride + ti * h,
            )?);
        }
        Ok(())
    }

    /// The sizes of every layer's dispatches.
    fn layer_shape(&self) -> LayerShape {
        let c = &self.config;
        LayerShape {
            hidden: c.hidden_size,
            n_heads: c.num_heads,
            n_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            intermediate: c.intermediate_size,
            rope_style: c.rope.style,
            rope_dim: c.rope.dim,
            eps: c.rms_norm_eps,
            causal: true,
            capacity: self.context,
            gate: c.arch.has_attention_gate(),
        }
    }

    fn layer_buffers(&self) -> LayerBuffers<'_> {
        let a = &self.act;
        LayerBuffers {
            state: &a.state,
            rope_table: &self.rope_table,
            x: &a.x,
            xn: &a.xn,
            prenorm: &a.prenorm,
            qkv: &a.qkv,
            att: &a.att,
            att_parts: [&a.att_parts[0], &a.att_parts[1]],
            gate: &a.gate,
            up: &a.up,
            ff: &a.ff,
            conv: None,
            linear: a
                .linear
                .as_deref()
                .map(|[mixed, read, pass_start]| LinearBuffers {
                    mixed,
                    read,
                    position: &a.state,
                    pass_start,
                }),
            moe: a.moe.as_deref().map(
                |[scores, routes, weights, expert_out, shared_out, shared_gate]| MoeBuffers {
                    scores,
                    routes,
                    weights,
                    expert_out,
                    shared: [shared_out, shared_gate],
                },
            ),
        }
    }

    /// Final RMSNorm + lm_head (one GEMV), then the greedy head (`ops::greedy_head`) or
    /// the sampler.
    fn head(
        &self,
        d: &mut Vec<Dispatch>,
        (n, prepared): (usize, blocks::Prepared),
        head: OutputHead,
    ) -> Result<()> {
        let (ctx, a) = (&*self.ctx, &self.act);
        let lm = self.lm_head.as_ref().unwrap_or(&self.embed);
        let c = &self.config;
        let (norm, x) = blocks::norm_input(
            ctx,
            d,
            (&self.out_norm, c.rms_norm_eps),
            (&a.x, &a.xn, &a.prenorm),
            (prepared, n),
            c.hidden_size,
        )?;
        let masked = head.masks().is_some();
        if head.samples() || masked {
            d.extend(ops::gemv_fused(ctx, lm, x, &a.logits, n, &norm)?);
            if let Some(broadcast) = head.masks() {
                let v = c.vocab_size;
                d.push(ops::mask_logits(
                    ctx,
                    &a.logit_mask,
                    &a.logits,
                    n,
                    v,
                    broadcast,
                )?);
            }
        }
        if masked && !head.samples() {
            let v = c.vocab_size;
            d.push(ops::argmax(ctx, &a.logits, &a.out_tokens, n, v, v)?);
            return Ok(());
        }
        if head.samples() {
            let b = ops::SampleBuffers {
                params: &a.sample_params,
                state: &a.state,
                logits: &a.logits,
                tokens: &a.out_tokens,
                scratch: &a.sample_scratch,
            };
            d.extend(ops::sample(ctx, &b, n, c.vocab_size)?);
            return Ok(());
        }
        let bufs = (&a.logits, &a.best, &a.out_tokens);
        d.extend(ops::greedy_head(ctx, (lm, x, &norm), bufs, n, None)?);
        Ok(())
    }
}
