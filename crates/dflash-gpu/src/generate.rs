//! Plain decoding on the GPU engine through the same `TokenSink` (stop ids, stop
//! strings, budget) as the CPU reference and the DFlash loop: prefill, then one row per
//! step; the host reads back one token id per step.

use crate::error::Result;
use crate::model::{GpuModel, OutputHead};
use crate::ops::{self, LOGPROB_TOP};
use dflash_core::generate::{
    commit_token, next_mask, token_budget, GenerateRequest, GenerateResult, OnPiece, TokenSink,
};
use dflash_core::grammar::{Constraint, TokenMask};
use dflash_core::sampling::TokenLogprob;
use dflash_core::tokenizer::TextTokenizer;

impl GpuModel {
    /// Plain generation for event-loop hosts; `clock` gives seconds (the host's timer).
    /// The prompt's longest common prefix with the rows the cache holds from the last
    /// request is kept (multi-turn reuse; `forget_cached` prefills everything).
    pub async fn generate_async(
        &mut self,
        tok: &TextTokenizer,
        req: &GenerateRequest,
        clock: &dyn Fn() -> f64,
        on_piece: &mut OnPiece<'_>,
    ) -> Result<GenerateResult> {
        let budget = token_budget(req.prompt_ids.len(), req.max_new_tokens, self.context)?;
        let mut grammar = req.grammar.clone();
        let top = req.sampling.logprobs;
        // Logprobs read the logits the masked heads materialize (all allowed without a
        // grammar).
        let head = OutputHead::of(&req.sampling, grammar.is_some() || top.is_some());
        self.set_request_sampling(req)?;
        let t0 = clock();
        let keep = self.reusable_rows(&req.prompt_ids, false);
        self.write_mask(&mut grammar)?;
        let next = self.prefill_from_async(&req.prompt_ids, keep, head).await?;
        let lp = match top {
            Some(top) => {
                let rows = (req.prompt_ids.len() - keep - 1) % crate::model::MAX_ROWS + 1;
                self.read_logprobs(rows, top).await?.pop()
            }
            None => None,
        };
        commit_token(&mut grammar, next)?;
        let t1 = clock();
        let mut sink = TokenSink::new(tok, req, budget, on_piece);
        if !sink.push_scored(next, false, lp.as_ref())? {
            let max = sink.remaining();
            if head.masks().is_some() {
                let mut push = |t, lp: Option<&TokenLogprob>| Ok(sink.push_scored(t, false, lp)?);
                self.decode_masked(next, max, head, (grammar, top), &mut push)
                    .await?
            } else {
                let mut push = |t| Ok(sink.push(t)?);
                self.decode_async(next, max, head, &mut push).await?
            }
        }
        let mut r = sink.finish(req.prompt_ids.len(), t1 - t0, clock() - t1);
        r.cached_tokens = keep;
        Ok(r)
    }

    /// Up to `max` tokens after `first` (the token the prefill chose), one row per step,
    /// each handed to `push` (true: generation is over). Pipelined where the adapter's
    /// tuning says so (`decode_pipelined`), else one blocking step at a time.
    pub async fn decode_async(
        &mut self,
        first: u32,
        max: usize,
        head: OutputHead,
        push: &mut dyn FnMut(u32) -> Result<bool>,
    ) -> Result<()> {
        if self.ctx.tuning.pipelined_decode {
            return self.decode_pipelined(first, max, head, push).await;
        }
        let mut next = first;
        for _ in 0..max {
            next = self.step_with_async(&[next], head).await?[0];
            if push(next)? {
                break;
            }
        }
        Ok(())
    }

    /// `decode_async` under a grammar, or with logprobs: one step at a time, the host
    /// computing each step's mask from the tokens committed before it (`write_mask`; all
    /// allowed without a grammar) and reading its token back before the next (the mask
    /// depends on it), with its log-probability where `top` asks for them.
    async fn decode_masked(
        &mut self,
        first: u32,
        max: usize,
        head: OutputHead,
        (mut grammar, top): (Option<Constraint>, Option<usize>),
        push: &mut dyn FnMut(u32, Option<&TokenLogprob>) -> Result<bool>,
    ) -> Result<()> {
        let mut next = first;
        for _ in 0..max {
            self.write_mask(&mut grammar)?;
            next = self.step_with_async(&[next], head).await?[0];
            let lp = match top {
                Some(top) => self.read_logprobs(1, top).await?.pop(),
                None => None,
            };
            commit_token(&mut grammar, next)?;
            if push(next, lp.as_ref())? {
                break;
            }
        }
        Ok(())
    }

    /// The log-probabilities of the last pass's first `rows` rows (of the tokens its head
    /// chose) with `top` alternatives each: one more submission and a read-back of
    /// `4 * (2 + 2 * 20)` bytes a row.
    pub(crate) async fn read_logprobs(&self, rows: usize, top: usize) -> Result<Vec<TokenLogprob>> {
        let (ctx, a) = (&self.ctx, &self.act);
        let v = self.config.vocab_size;
        let d = ops::logprobs(
            ctx,
            (&a.logits, &a.out_tokens),
            (&a.lp_vals, &a.lp_ids),
            rows,
            v,
            top,
        )?;
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            d.encode(&mut pass);
        }
        let (vals, ids) = (rows * (1 + LOGPROB_TOP) * 4, rows * LOGPROB_TOP * 4);
        enc.copy_buffer_to_buffer(&a.lp_vals, 0, &a.lp_readback, 0, vals as u64);
        enc.copy_buffer_to_buffer(&a.lp_ids, 0, &a.lp_readback, vals as u64, ids as u64);
        let at = (vals + ids) as u64;
        enc.copy_buffer_to_buffer(&a.out_tokens, 0, &a.lp_readback, at, rows as u64 * 4);
        ctx.queue.submit([enc.finish()]);
        let bytes = ctx.read_mapped_async(&a.lp_readback).await?;
        let words: &[u32] = bytemuck::cast_slice(&bytes);
        let tokens = &words[(vals + ids) / 4..];
        Ok((0..rows)
            .map(|r| {
                let lp = &words[r * (1 + LOGPROB_TOP)..(r + 1) * (1 + LOGPROB_TOP)];
                let ids = &words[rows * (1 + LOGPROB_TOP) + r * LOGPROB_TOP..][..LOGPROB_TOP];
                let top = ids
                    .iter()
                    .zip(&lp[1..])
                    .take(top)
                    .filter(|(&id, _)| id != u32::MAX)
                    .map(|(&id, &l)| (id, f32::from_bits(l)))
                    .collect();
                TokenLogprob {
                    token: tokens[r],
                    logprob: f32::from_bits(lp[0]),
                    top,
                }
            })
            .collect())
    }

    /// Uploads the grammar's mask of the next position (every row of the next pass
    /// takes it); nothing without a grammar.
    pub(crate) fn write_mask(&self, grammar: &mut Option<Constraint>) -> Result<()> {
        let mask = match next_mask(grammar)? {
            Some(m) => m,
            None => TokenMask::all(self.config.vocab_size),
        };
        self.write_row_masks(&[mask]);
        Ok(())
    }

    /// Uploads masks for the next pass's rows 0.. (`OutputHead::ArgmaxRowMasks`).
    pub(crate) fn write_row_masks(&self, masks: &[TokenMask]) {
        let words = self.config.vocab_size.div_ceil(32);
        let mut all = vec![0u32; words * masks.len()];
        for (row, m) in all.chunks_mut(words).zip(masks) {
            let n = words.min(m.words.len());
            row[..n].copy_from_slice(&m.words[..n]);
        }
        let bytes = bytemuck::cast_slice(&all);
        self.ctx.queue.write_buffer(&self.act.logit_mask, 0, bytes);
    }

    /// `decode_async`, blocking (native hosts).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn decode(
        &mut self,
        first: u32,
        max: usize,
        head: OutputHead,
        push: &mut dyn FnMut(u32) -> Result<bool>,
    ) -> Result<()> {
        pollster::block_on(self.decode_async(first, max, head, push))
    }

    /// `decode_async` with the next step submitted before the previous one's token is
    /// read: the token stays on the GPU as the next input, and the host reads it while
    /// the GPU already runs the following step. A step past a token that ends generation
    /// is computed and dropped (its KV row is never committed); none is computed past
    /// `max` or the context.
    async fn decode_pipelined(
        &mut self,
        first: u32,
        max: usize,
        head: OutputHead,
        push: &mut dyn FnMut(u32) -> Result<bool>,
    ) -> Result<()> {
        if max == 0 {
            return Ok(());
        }
        let mut in_flight = Some((self.submit_fed_step(Some(first), head, 0)?, 0));
        let mut submitted = 1;
        while let Some((index, slot)) = in_flight.take() {
            // The row this step wrote (the last submitted); its token is the next row's
            // input.
            let row = self.len - 1;
            // This step's token is asked for before the next step is queued.
            let map = self
                .ctx
                .begin_map(&self.act.token_readback[slot], Some(index));
            if self.len < self.context && submitted < max {
                match self.submit_fed_step(None, head, 1 - slot) {
                    Ok(next) => in_flight = Some((next, 1 - slot)),
                    Err(e) => {
                        let _ = self.ctx.finish_map(map).await;
                        return Err(e);
                    }
                }
                submitted += 1;
            }
            let read = self.ctx.finish_map(map).await;
            let token = read.map(|bytes| bytemuck::cast_slice::<u8, u32>(&bytes)[0]);
            if let (Ok(t), Some(id)) = (&token, self.kv_ids.get_mut(row + 1)) {
                *id = *t;
            }
            let done = token.and_then(&mut *push);
            if !matches!(done, Ok(false)) {
                // Over (or failed): the step in flight, if any, is not committed (later
                // work is queued behind it, so nothing waits for it).
                self.truncate(self.len - in_flight.map_or(0, |_| 1));
                return done.map(|_| ());
            }
        }
        Ok(())
    }

    /// Plain generation, blocking (native hosts).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn generate(
        &mut self,
        tok: &TextTokenizer,
        req: &GenerateRequest,
        clock: &dyn Fn() -> f64,
        on_piece: &mut OnPiece<'_>,
    ) -> Result<GenerateResult> {
        pollster::block_on(self.generate_async(tok, req, clock, on_piece))
    }
}
