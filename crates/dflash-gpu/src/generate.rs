//! Plain decoding on the GPU engine through the same `TokenSink` (stop ids, stop
//! strings, budget) as the CPU reference and the DFlash loop: prefill, then one row per
//! step; the host reads back one token id per step.

use crate::error::Result;
use crate::model::{GpuModel, Head};
use dflash_core::generate::{token_budget, GenerateRequest, GenerateResult, TokenSink};
use dflash_core::tokenizer::TextTokenizer;

impl GpuModel {
    /// Plain generation for event-loop hosts; `clock` gives seconds (the host's timer).
    pub async fn generate_async(
        &mut self,
        tok: &TextTokenizer,
        req: &GenerateRequest,
        clock: &dyn Fn() -> f64,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<GenerateResult> {
        let budget = token_budget(req.prompt_ids.len(), req.max_new_tokens, self.context)?;
        let head = if req.sampling.is_greedy() {
            Head::Argmax
        } else {
            Head::Sample
        };
        self.set_sampling(&req.sampling)?;
        let t0 = clock();
        let mut next = self.prefill_with_async(&req.prompt_ids, head).await?;
        let t1 = clock();
        let mut sink = TokenSink::new(tok, &req.stop_strings, budget, on_text);
        while !sink.push(next)? {
            next = self.step_with_async(&[next], head).await?[0];
        }
        Ok(sink.finish(req.prompt_ids.len(), t1 - t0, clock() - t1))
    }

    /// Plain generation, blocking (native hosts).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn generate(
        &mut self,
        tok: &TextTokenizer,
        req: &GenerateRequest,
        clock: &dyn Fn() -> f64,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<GenerateResult> {
        pollster::block_on(self.generate_async(tok, req, clock, on_text))
    }
}
