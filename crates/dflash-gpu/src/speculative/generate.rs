//! Speculative generation on the GPU: the request, stop handling and result of plain
//! generation, driven step by step by the decode loop every engine shares
//! (`dflash_core::speculative::BlockLoop`).

use super::Speculative;
use crate::error::Result;
use crate::model::OutputHead;

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
        on_text: &mut dyn FnMut(&str),
    ) -> Result<dflash_core::speculative::SpeculativeResult> {
        pollster::block_on(self.generate_async(tok, req, block, clock, on_text))
    }

    /// `generate` for event-loop hosts.
    pub async fn generate_async(
        &mut self,
        tok: &dflash_core::tokenizer::TextTokenizer,
        req: &dflash_core::generate::GenerateRequest,
        block: &dflash_core::speculative::BlockSize,
        clock: &dyn Fn() -> f64,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<dflash_core::speculative::SpeculativeResult> {
        self.generate_pieces_async(tok, req, block, clock, &mut |s, _| on_text(s))
            .await
    }

    /// `generate_async` whose text callback also says whether the piece's token was an
    /// accepted draft (false for anchors and bonus tokens): what the demo highlights.
    pub async fn generate_pieces_async(
        &mut self,
        tok: &dflash_core::tokenizer::TextTokenizer,
        req: &dflash_core::generate::GenerateRequest,
        block: &dflash_core::speculative::BlockSize,
        clock: &dyn Fn() -> f64,
        on_piece: &mut dyn FnMut(&str, bool),
    ) -> Result<dflash_core::speculative::SpeculativeResult> {
        use dflash_core::generate::{prepare, TokenSink};
        use dflash_core::speculative::BlockLoop;
        let mut cfg = self.target.config.clone();
        cfg.max_position_embeddings = cfg.max_position_embeddings.min(self.target.context);
        let (_, budget) = prepare(req, &cfg)?;
        self.rejection = req.sampling.speculative_rejection && !req.sampling.is_greedy();
        self.sampled_drafts = req.sampling.sampled_drafts;
        let head = if req.sampling.is_greedy() {
            OutputHead::Argmax
        } else {
            OutputHead::Sample
        };
        self.target.set_sampling(&req.sampling)?;
        let t0 = clock();
        let keep = self.target.reusable_rows(&req.prompt_ids, true);
        let anchor = self.prefill_from_async(&req.prompt_ids, keep, head).await?;
        let t1 = clock();
        let drafted = std::cell::Cell::new(false);
        let mut on_text = |s: &str| on_piece(s, drafted.get());
        let mut sink = TokenSink::new(tok, req, budget, &mut on_text);
        let mut blocks = BlockLoop::new(block, self.block_capacity());
        let mut done = budget == 0 || sink.push(anchor)?;
        while !done {
            let b = blocks.next_block(self.target.context - self.target.len(), sink.remaining());
            let t_step = clock();
            let r = self.step_async(b, head).await?;
            done = blocks.commit_step(b, clock() - t_step, r.accepted, r.tokens, |t, d| {
                drafted.set(d);
                sink.push(t)
            })?;
        }
        let t2 = clock();
        let mut r = sink.finish(req.prompt_ids.len(), t1 - t0, t2 - t1);
        r.cached_tokens = keep;
        Ok(blocks.result(r))
    }
}
