//! Running the target model: one submission per pass, steps (fed by the GPU where the
//! host has not read the last token), prefill in chunks of `MAX_ROWS` rows, greedy
//! generation, and the read-backs of a pass's token ids, logits and taps.

use super::activations::PassState;
use super::{GpuModel, OutputHead, UNKNOWN_ID};
use crate::error::{GpuError, Result};
use crate::ops;
use crate::pipelines::MAX_ROWS;

impl GpuModel {
    /// Encodes and submits one pass over `tokens` (at most 16) at positions
    /// `len..len+n`. Nothing is read back.
    pub(crate) fn submit_pass(&mut self, tokens: &[u32], head: OutputHead) -> Result<()> {
        self.prepare_pass(tokens, head)?;
        let cb = self.encode_pass(tokens.len(), head);
        self.ctx.queue.submit([cb]);
        self.record_ids(self.len, tokens);
        self.len += tokens.len();
        Ok(())
    }

    /// Checks a pass over `tokens`, builds its plan once, writes the tokens and state.
    pub(super) fn prepare_pass(&mut self, tokens: &[u32], head: OutputHead) -> Result<()> {
        let n = tokens.len();
        assert!((1..=MAX_ROWS).contains(&n));
        if self.len + n > self.context {
            return Err(GpuError::Core(dflash_core::Error::ContextOverflow {
                prompt_tokens: self.len + n,
                max_new_tokens: 0,
                context: self.context,
            }));
        }
        let vocab = self.config.vocab_size;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(GpuError::Core(dflash_core::Error::TokenOutOfRange {
                id: bad,
                vocab,
            }));
        }
        self.ctx.check_lost()?;
        if self.states_lost {
            return Err(GpuError::Core(dflash_core::Error::Internal(
                "a linear-attention state was rolled back; the GPU keeps no earlier states".into(),
            )));
        }
        if !self.plans.contains_key(&(n, head)) {
            let plan = self.build_plan(n, head)?;
            self.plans.insert((n, head), plan);
        }
        let q = &self.ctx.queue;
        q.write_buffer(&self.act.tokens, 0, bytemuck::cast_slice(tokens));
        let state = PassState {
            rows: n as u32,
            ..PassState::at(self.len)
        };
        state.write(&self.ctx, &self.act.state);
        Ok(())
    }

    /// The command buffer of a prepared pass of `n` rows (and the copy of its tokens to
    /// the read-back buffer when it has a head).
    pub(super) fn encode_pass(&self, n: usize, head: OutputHead) -> wgpu::CommandBuffer {
        let mut enc = self
            .ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("step"),
            });
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("step"),
                timestamp_writes: None,
            });
            for disp in &self.plans[&(n, head)] {
                disp.encode(&mut pass);
            }
        }
        if head != OutputHead::None {
            enc.copy_buffer_to_buffer(
                &self.act.out_tokens,
                0,
                &self.act.readback,
                0,
                (n * 4) as u64,
            );
        }
        enc.finish()
    }

    /// One step over up to 16 tokens; returns the greedy next token of every row.
    /// The host reads back only those ids (4 bytes per row).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn step(&mut self, tokens: &[u32]) -> Result<Vec<u32>> {
        self.step_with(tokens, OutputHead::Argmax)
    }

    /// Submits a one-row decode step without waiting for the previous one's token: the
    /// input is `token` where the host knows it, else the token the previous step left
    /// on the GPU (each step copies its output into the next step's input). The step's
    /// token goes to `token_readback[slot]`; returns the submission to wait for.
    pub(crate) fn submit_fed_step(
        &mut self,
        token: Option<u32>,
        head: OutputHead,
        slot: usize,
    ) -> Result<wgpu::SubmissionIndex> {
        // The check and the plan of a one-row pass (a token the GPU feeds is in range).
        self.prepare_pass(&[token.unwrap_or(0)], head)?;
        let mut enc = self.ctx.device.create_command_encoder(&Default::default());
        if token.is_none() {
            // Over prepare_pass's placeholder (its write lands before this submission).
            enc.copy_buffer_to_buffer(&self.act.out_tokens, 0, &self.act.tokens, 0, 4);
        }
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            for disp in &self.plans[&(1, head)] {
                disp.encode(&mut pass);
            }
        }
        let out = &self.act.token_readback[slot];
        enc.copy_buffer_to_buffer(&self.act.out_tokens, 0, out, 0, 4);
        let index = self.ctx.queue.submit([enc.finish()]);
        self.record_ids(self.len, &[token.unwrap_or(UNKNOWN_ID)]);
        self.len += 1;
        Ok(index)
    }

    /// Checks what a request asks of the sampler and sets its parameters (penalties are
    /// the CPU engine's for now: `Unsupported`).
    pub fn set_request_sampling(&self, req: &dflash_core::generate::GenerateRequest) -> Result<()> {
        self.set_sampling(&req.sampling)
    }

    /// Sets the sampler's parameters for `OutputHead::Sample` passes (greedy parameters are
    /// served by the argmax head instead).
    pub fn set_sampling(&self, sp: &dflash_core::sampling::SamplingParams) -> Result<()> {
        sp.validate()?;
        if sp.has_penalties() {
            return Err(GpuError::Unsupported(
                "repetition, frequency and presence penalties on the GPU sampler (use the CPU engine)".into(),
            ));
        }
        let v = self.config.vocab_size;
        self.ctx.queue.write_buffer(
            &self.act.sample_params,
            0,
            bytemuck::bytes_of(&ops::sample_params(v, v, sp, 1)),
        );
        Ok(())
    }

    /// One step; the next token of every row from the given head.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn step_with(&mut self, tokens: &[u32], head: OutputHead) -> Result<Vec<u32>> {
        pollster::block_on(self.step_with_async(tokens, head))
    }

    /// `step_with` for hosts whose GPU answers through the event loop (the browser).
    pub async fn step_with_async(&mut self, tokens: &[u32], head: OutputHead) -> Result<Vec<u32>> {
        self.submit_pass(tokens, head)?;
        let bytes = self.ctx.read_mapped_async(&self.act.readback).await?;
        Ok(bytemuck::cast_slice::<u8, u32>(&bytes)[..tokens.len()].to_vec())
    }

    /// Prefill of a new sequence in chunks of 16 rows through the same kernels as decode (so a position's
    /// results are the same bits as in a one-row step); returns the greedy next token.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn prefill(&mut self, tokens: &[u32]) -> Result<u32> {
        self.prefill_with(tokens, OutputHead::Argmax)
    }

    /// Prefill of a new sequence (from position 0), choosing the next token with `head`
    /// (Argmax or Sample).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn prefill_with(&mut self, tokens: &[u32], head: OutputHead) -> Result<u32> {
        pollster::block_on(self.prefill_with_async(tokens, head))
    }

    /// `prefill_with` for event-loop hosts.
    pub async fn prefill_with_async(&mut self, tokens: &[u32], head: OutputHead) -> Result<u32> {
        self.prefill_from_async(tokens, 0, head).await
    }

    /// The prefill of `tokens` past their first `keep` rows, which the cache holds from
    /// the last request (`reusable_rows`).
    pub(crate) async fn prefill_from_async(
        &mut self,
        tokens: &[u32],
        keep: usize,
        head: OutputHead,
    ) -> Result<u32> {
        self.truncate(keep);
        if tokens.len() <= keep {
            return Err(GpuError::Core(dflash_core::Error::EmptyPrompt));
        }
        let chunks: Vec<&[u32]> = tokens[keep..].chunks(MAX_ROWS).collect();
        for ch in &chunks[..chunks.len() - 1] {
            self.submit_pass(ch, OutputHead::None)?;
        }
        let last = self.step_with_async(chunks[chunks.len() - 1], head).await?;
        Ok(*last.last().unwrap())
    }

    /// Logits of every row of the last pass (tests and tools only: the decode loop never
    /// reads logits back).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read_logits(&self, n: usize) -> Result<Vec<f32>> {
        let bytes =
            self.ctx
                .read_back(&self.act.logits, 0, (n * self.config.vocab_size * 4) as u64)?;
        Ok(bytemuck::cast_slice(&bytes).to_vec())
    }

    /// Tap rows of the last pass: `[n, taps.len() * hidden]`.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read_taps(&self, n: usize) -> Result<Vec<f32>> {
        let bytes = self.ctx.read_back(
            &self.act.taps,
            0,
            (n * self.taps.len() * self.config.hidden_size * 4) as u64,
        )?;
        Ok(bytemuck::cast_slice(&bytes).to_vec())
    }

    /// Greedy generation: prefill then one-row steps; stops at a stop id.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn generate_greedy(
        &mut self,
        prompt: &[u32],
        max_new: usize,
        is_stop: &dyn Fn(u32) -> bool,
    ) -> Result<Vec<u32>> {
        self.truncate(0);
        let mut out = Vec::new();
        if max_new == 0 {
            return Ok(out);
        }
        let mut next = self.prefill(prompt)?;
        loop {
            if is_stop(next) {
                break;
            }
            out.push(next);
            if out.len() >= max_new {
                break;
            }
            next = self.step(&[next])?[0];
        }
        Ok(out)
    }
}
