//! Plain decoding on the GPU engine through the same `TokenSink` (stop ids, stop
//! strings, budget) as the CPU reference and the DFlash loop: prefill, then one row per
//! step; the host reads back one token id per step.

use crate::error::Result;
use crate::model::{GpuModel, OutputHead};
use dflash_core::generate::{
    commit_token, next_mask, token_budget, GenerateRequest, GenerateResult, OnPiece, TokenSink,
};
use dflash_core::grammar::{Constraint, TokenMask};
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
        let head = OutputHead::of(&req.sampling, grammar.is_some());
        self.set_request_sampling(req)?;
        let t0 = clock();
        let keep = self.reusable_rows(&req.prompt_ids, false);
        self.write_mask(&mut grammar)?;
        let next = self.prefill_from_async(&req.prompt_ids, keep, head).await?;
        commit_token(&mut grammar, next)?;
        let t1 = clock();
        let mut sink = TokenSink::new(tok, req, budget, on_piece);
        if !sink.push(next)? {
            let max = sink.remaining();
            let mut push = |t| Ok(sink.push(t)?);
            match grammar {
                Some(g) => self.decode_masked(next, max, head, g, &mut push).await?,
                None => self.decode_async(next, max, head, &mut push).await?,
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

    /// `decode_async` under a grammar: one step at a time, the host computing each
    /// step's mask from the tokens committed before it (`write_mask`) and reading its
    /// token back before the next (the mask depends on it).
    async fn decode_masked(
        &mut self,
        first: u32,
        max: usize,
        head: OutputHead,
        grammar: Constraint,
        push: &mut dyn FnMut(u32) -> Result<bool>,
    ) -> Result<()> {
        let mut grammar = Some(grammar);
        let mut next = first;
        for _ in 0..max {
            self.write_mask(&mut grammar)?;
            next = self.step_with_async(&[next], head).await?[0];
            commit_token(&mut grammar, next)?;
            if push(next)? {
                break;
            }
        }
        Ok(())
    }

    /// Uploads the grammar's mask of the next position (every row of the next pass
    /// takes it); nothing without a grammar.
    pub(crate) fn write_mask(&self, grammar: &mut Option<Constraint>) -> Result<()> {
        if let Some(mask) = next_mask(grammar)? {
            self.write_row_masks(&[mask]);
        }
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
