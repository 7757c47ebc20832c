//! Speculative generation on the GPU: the request, stop handling and result of plain
//! generation, driven step by step by the decode loop every engine shares
//! (`dflash_core::speculative::BlockLoop`).

use super::{step_seconds, QueuedStep, Speculative};
use crate::error::Result;
use crate::model::OutputHead;
use dflash_core::generate::OnPiece;
use dflash_core::speculative::BlockLoop;

impl Speculative {
    /// Speculative generation: the same request, stop handling and result as plain
    /// generation, plus per-step tau and per-position acceptance.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn generate(
        &mut self,
        tok: &dflash_core::tokenizer::TextTokenizer,
        req: &dflash_core::generate::GenerateRequest,
        block: &dflash_core::speculative::BlockSize,
        clock: &dyn Fn() -> f64,
        on_piece: &mut OnPiece<'_>,
    ) -> Result<dflash_core::speculative::SpeculativeResult> {
        pollster::block_on(self.generate_async(tok, req, block, clock, on_piece))
    }

    /// `generate` for event-loop hosts; each piece says whether its last token was an
    /// accepted draft (what the demo highlights).
    pub async fn generate_async(
        &mut self,
        tok: &dflash_core::tokenizer::TextTokenizer,
        req: &dflash_core::generate::GenerateRequest,
        block: &dflash_core::speculative::BlockSize,
        clock: &dyn Fn() -> f64,
        on_piece: &mut OnPiece<'_>,
    ) -> Result<dflash_core::speculative::SpeculativeResult> {
        use dflash_core::generate::{commit_token, prepare, TokenSink};
        let mut cfg = self.target.config.clone();
        cfg.max_position_embeddings = cfg.max_position_embeddings.min(self.target.context);
        let (_, budget) = prepare(req, &cfg)?;
        let mut grammar = req.grammar.clone();
        let top = req.sampling.logprobs;
        // Under a grammar, or with logprobs (which read the logits the masked heads
        // materialize), a step is two submissions (`constrained`) and drafts are verified
        // by exact match (the plain sampler's tokens, which have the target's
        // distribution too).
        let split = grammar.is_some() || top.is_some();
        self.rejection = req.sampling.speculative_rejection && !req.sampling.is_greedy() && !split;
        self.sampled_drafts = req.sampling.sampled_drafts;
        let head = OutputHead::of(&req.sampling, split);
        self.target.set_request_sampling(req)?;
        let t0 = clock();
        let keep = self.target.reusable_rows(&req.prompt_ids, true);
        self.target.write_mask(&mut grammar)?;
        let anchor = self.prefill_from_async(&req.prompt_ids, keep, head).await?;
        let lp = match top {
            Some(top) => {
                let rows = (req.prompt_ids.len() - keep - 1) % crate::model::MAX_ROWS + 1;
                self.target.read_logprobs(rows, top).await?.pop()
            }
            None => None,
        };
        commit_token(&mut grammar, anchor)?;
        let t1 = clock();
        let mut sink = TokenSink::new(tok, req, budget, on_piece);
        let mut blocks = BlockLoop::new(block, self.block_capacity());
        if budget > 0 && !sink.push_scored(anchor, false, lp.as_ref())? {
            let left = sink.remaining();
            if split {
                let mut push = |t, d, lp: Option<&_>| Ok(sink.push_scored(t, d, lp)?);
                let heads = (head, top);
                self.decode_steps_constrained(&mut blocks, heads, left, clock, grammar, &mut push)
                    .await?
            } else {
                let mut push = |t: u32, d: bool| Ok(sink.push_token(t, d)?);
                self.decode_steps_async(&mut blocks, head, left, clock, &mut push)
                    .await?
            }
        }
        let t2 = clock();
        let mut r = sink.finish(req.prompt_ids.len(), t1 - t0, t2 - t1);
        r.cached_tokens = keep;
        Ok(blocks.result(r))
    }

    /// DFlash steps after the prefill until `push` says generation is over or
    /// `tokens_left` tokens are committed: each step's block from `blocks`, its tokens
    /// through `blocks.commit_step` with its time (from its submission, or for a step
    /// queued ahead from the completion of the step before).
    ///
    /// Pipelined where the adapter's tuning says so (`pipelined_decode`): the next step
    /// is submitted before this one is read whenever its block cannot depend on this
    /// step's outcome, i.e. even if this step commits all its rows the context and the
    /// budget leave room for the largest block the policy gives. The GPU keeps the
    /// positions, the anchor and the drafter's context itself, so the host only reads.
    /// A step queued past the end of generation is dropped (nothing of it is committed).
    /// Not with the bench's simulated acceptance, whose host drafts follow each step.
    pub async fn decode_steps_async(
        &mut self,
        blocks: &mut BlockLoop,
        head: OutputHead,
        mut tokens_left: usize,
        clock: &dyn Fn() -> f64,
        push: &mut dyn FnMut(u32, bool) -> Result<bool>,
    ) -> Result<()> {
        let pipelined = self.target.ctx.tuning.pipelined_decode && !self.simulate;
        let context = self.target.context;
        // A step queued ahead, and when it began: when the step before it completed.
        let mut queued: Option<(QueuedStep, f64)> = None;
        // The rows of the step before (see `step_seconds`).
        let mut prev_rows = None;
        while tokens_left > 0 {
            let (q, began) = match queued.take() {
                Some(q) => q,
                None => {
                    let (began, pos) = (clock(), self.target.len());
                    let b = blocks.next_block(context - pos, tokens_left);
                    (self.submit_step(b, head, 0, pos)?, began)
                }
            };
            let map = self.begin_read(&q);
            // The worst case of this step for the next one's room: all its rows kept.
            let (pos, left) = (self.target.len() + q.b, tokens_left.saturating_sub(q.b));
            let largest = blocks.largest_block();
            if pipelined && left > 0 && left + 1 >= largest && pos + largest <= context {
                let b = blocks.next_block(context - pos, left);
                match self.queue_step(b, head, 1 - q.slot, pos) {
                    Ok(next) => queued = Some((next, 0.0)),
                    Err(e) => {
                        let _ = self.target.ctx.finish_map(map).await;
                        self.target.states_ran_ahead();
                        return Err(e);
                    }
                }
            }
            let read = self.read_step(&q, map).await;
            let now = clock();
            let done = read.and_then(|r| {
                tokens_left = tokens_left.saturating_sub(r.accepted + 1);
                let seconds = step_seconds(prev_rows.replace(q.b), q.b, &r, now - began);
                blocks.commit_step(q.b, seconds, r.accepted, r.tokens, &mut *push)
            });
            match (done, queued.as_mut()) {
                (Ok(false), Some(next)) => next.1 = now,
                (Ok(false), None) => {}
                (over, _) => {
                    if let Some((next, _)) = queued.take() {
                        self.drop_queued(next);
                    }
                    return over.map(|_| ());
                }
            }
        }
        Ok(())
    }

    /// `decode_steps_async`, blocking (native hosts).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn decode_steps(
        &mut self,
        blocks: &mut BlockLoop,
        head: OutputHead,
        tokens_left: usize,
        clock: &dyn Fn() -> f64,
        push: &mut dyn FnMut(u32, bool) -> Result<bool>,
    ) -> Result<()> {
        pollster::block_on(self.decode_steps_async(blocks, head, tokens_left, clock, push))
    }
}
