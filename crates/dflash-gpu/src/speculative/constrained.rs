//! DFlash under a grammar (or with logprobs) on the GPU. A verify row's mask depends on
//! the drafts before
//! it, so each step is two submissions: the drafts (the drafter's context extended, its
//! block pass, `[anchor, drafts]` composed), read back; then the host cuts the drafts at
//! the first one the grammar refuses, computes each verify row's mask from the committed
//! state advanced by the drafts before it (`Constraint::block_masks`), uploads the masks
//! and the kept drafts, and the second submission runs the target's pass over them with
//! the masked head and acceptance. A kept row's mask is plain decoding's (its drafts
//! equal plain decoding's tokens) and the target's logits are batch invariant, so the
//! output is constrained plain decoding's token for token.

use super::drafter::bookkeeping_keeping;
use super::{QueuedStep, Speculative, StepResult};
use crate::error::Result;
use crate::model::OutputHead;
use crate::pipelines::Dispatch;
use dflash_core::generate::commit_token;
use dflash_core::grammar::{Constraint, TokenMask};
use dflash_core::sampling::TokenLogprob;
use dflash_core::speculative::BlockLoop;

/// Where a constrained step's tokens go: each with whether it was an accepted draft and
/// its log-probability (where asked for); true when generation is over.
pub(crate) type ScoredPush<'a> = dyn FnMut(u32, bool, Option<&TokenLogprob>) -> Result<bool> + 'a;

impl Speculative {
    /// A grammar-constrained step's first submission: extends the drafter's context by
    /// the rows the last step verified, drafts a block of `b`, and reads the drafts back.
    async fn draft_block(&mut self, b: usize) -> Result<Vec<u32>> {
        let ctx = self.target.ctx.clone();
        ctx.check_lost()?;
        let key = (self.prev_block, b);
        if !self.draft_plans.contains_key(&key) {
            let mut d = if self.prev_block > 0 {
                self.drafter
                    .extend_dispatches(&ctx, &self.target, self.prev_block)?
            } else {
                Vec::new()
            };
            d.extend(
                self.drafter
                    .draft_dispatches(&ctx, &self.target, b, false, false, false)?,
            );
            self.draft_plans.insert(key, d);
        }
        let a = &self.target.act;
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        encode(&mut enc, &self.draft_plans[&key]);
        enc.copy_buffer_to_buffer(&a.tokens, 0, &a.readback, 0, (b * 4) as u64);
        ctx.queue.submit([enc.finish()]);
        self.prev_block = 0;
        let bytes = ctx.read_mapped_async(&self.target.act.readback).await?;
        Ok(bytemuck::cast_slice::<u8, u32>(&bytes)[1..b].to_vec())
    }

    /// The second submission: the target's pass over `[anchor, drafts]` under the masks
    /// written for its rows (`head`'s per-row form), acceptance, and its outcome.
    async fn verify_block(&mut self, drafts: &[u32], head: OutputHead) -> Result<StepResult> {
        let b = drafts.len() + 1;
        let pos = self.target.len();
        self.check_room(pos, b)?;
        let ctx = self.target.ctx.clone();
        ctx.check_lost()?;
        ctx.queue.write_buffer(
            &self.drafter.host_drafts,
            ((pos + 1) * 4) as u64,
            bytemuck::cast_slice(drafts),
        );
        let key = (self.prev_block, b, head);
        let built_plan = !self.verify_plans.contains_key(&key);
        if built_plan {
            let plan = self.verify_plan(b, head)?;
            self.verify_plans.insert(key, plan);
        }
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        encode(&mut enc, &self.verify_plans[&key]);
        let out = &self.step_readback[0];
        enc.copy_buffer_to_buffer(&self.target.act.result, 0, out, 0, ((b + 1) * 4) as u64);
        let index = ctx.queue.submit([enc.finish()]);
        self.prev_block = b;
        self.prev_single = b == 1;
        let q = QueuedStep {
            b,
            deferred: false,
            slot: 0,
            built_plan,
            index,
        };
        let map = self.begin_read(&q);
        self.read_step(&q, map).await
    }

    /// The verify submission's dispatches: the context extension where no draft
    /// submission ran (a block of one row), `[anchor, host drafts]`, the target's pass
    /// with taps and its per-row masked head, acceptance, a hybrid's state rollback.
    fn verify_plan(&self, b: usize, head: OutputHead) -> Result<Vec<Dispatch>> {
        let (ctx, t, dr) = (&*self.target.ctx, &self.target, &self.drafter);
        let mut d = match self.prev_block {
            0 => Vec::new(),
            rows => dr.extend_dispatches(ctx, t, rows)?,
        };
        d.extend(dr.draft_dispatches(ctx, t, b, true, false, false)?);
        d.extend(t.state_rollback(true)?);
        d.extend(t.build_plan_tapping_at(b, head.row_masked(), 0)?);
        d.push(bookkeeping_keeping(ctx, t, dr, "accept", (b, true), false)?);
        d.extend(t.state_rollback(false)?);
        Ok(d)
    }

    /// DFlash steps under `grammar` (its state after the anchor; all tokens allowed
    /// without one), with each committed token's log-probability where `top` asks for
    /// them, until `push` says generation is over or `tokens_left` tokens are
    /// committed: the block from `blocks`, the drafts cut by the grammar, the verify rows
    /// masked, the committed tokens taken by the grammar.
    pub(crate) async fn decode_steps_constrained(
        &mut self,
        blocks: &mut BlockLoop,
        (head, top): (OutputHead, Option<usize>),
        tokens_left: usize,
        clock: &dyn Fn() -> f64,
        mut grammar: Option<Constraint>,
        push: &mut ScoredPush<'_>,
    ) -> Result<()> {
        let mut left = tokens_left;
        let vocab = self.target.config.vocab_size;
        while left > 0 {
            let room = self.target.context - self.target.len();
            let b = blocks.next_block(room, left).min(self.block_capacity());
            let t0 = clock();
            let mut drafts = if b > 1 {
                self.draft_block(b).await?
            } else {
                Vec::new()
            };
            let masks = match grammar.as_mut() {
                Some(g) => g.block_masks(&mut drafts, true)?,
                None => vec![TokenMask::all(vocab); drafts.len() + 1],
            };
            self.target.write_row_masks(&masks[..drafts.len() + 1]);
            let r = self.verify_block(&drafts, head).await?;
            let scores = match top {
                Some(top) => self.target.read_logprobs(r.accepted + 1, top).await?,
                None => Vec::new(),
            };
            for &t in &r.tokens {
                commit_token(&mut grammar, t)?;
            }
            let seconds = if r.built_plan { 0.0 } else { clock() - t0 };
            left = left.saturating_sub(r.tokens.len());
            let b = drafts.len() + 1;
            let mut scores = scores.iter();
            let mut scored = |t, d| push(t, d, scores.next());
            if blocks.commit_step(b, seconds, r.accepted, r.tokens, &mut scored)? {
                break;
            }
        }
        Ok(())
    }
}

fn encode(enc: &mut wgpu::CommandEncoder, plan: &[Dispatch]) {
    let mut pass = enc.begin_compute_pass(&Default::default());
    for d in plan {
        d.encode(&mut pass);
    }
}
