//! DFlash on the GPU: the drafter's context projection and per-layer context K/V, the
//! block pass, the target's verification, acceptance and rollback, all in one
//! submission per step; the host reads back (accepted length, tokens).
//!
//! One step's data path is drawn in full in `docs/data-path.md`; the GPU engine's plans
//! and pipelining are in the crate docs (`crates/dflash-gpu/src/lib.rs`). The loop every
//! engine shares, the CPU reference's proposers and multi-turn KV reuse are in
//! `dflash_core::speculative`'s module docs
//! (`crates/dflash-core/src/speculative/mod.rs`), auto mode in its `policy` module
//! (`crates/dflash-core/src/speculative/policy.rs`).
//!
//! # The DFlash step on the GPU
//!
//! `speculative::Speculative::step(b, head)` (this module) records, once per (rows added
//! to the drafter's context, block, head), one dispatch list: extend the drafter's
//! context with the taps of the rows the previous step verified (rows past the committed
//! ones land at positions that the block overwrites or that are rewritten before any
//! read, so no masks are needed: `fc`, then per layer one GEMV of the stacked `[wk; wv]`
//! with the hidden norm in its prologue and `qkv.wgsl` without query heads for k's norm,
//! RoPE and the store), prepare `[anchor, MASK...]`, the drafter's block pass (the
//! target's layer builders; the greedy drafts in its lm_head's epilogue), compose
//! `[anchor, drafts]`, the target's B-row pass with taps and its head, and `accept`. One
//! submission; the host maps back `[accepted, tokens...]` (at most 17 words) and feeds
//! them to the same `TokenSink` as plain decoding. Positions come from the `state` buffer
//! the accept kernel advances, so the host never writes the position between steps.

mod constrained;
mod costs;
mod drafter;
mod generate;

use drafter::{bookkeeping_keeping, host_draft_capacity};
pub use drafter::{
    BookkeepingParams, DrafterPlan, GpuDrafter, GpuDrafterLayerWeights, GpuDrafterWeights,
};

use crate::error::{GpuError, Result};
use crate::model::{GpuModel, OutputHead, PassState, MAX_ROWS};
use crate::ops;
use crate::pipelines::Dispatch;
use dflash_core::drafter::DrafterWeights;
use std::collections::HashMap;

/// One DFlash step's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepResult {
    /// Accepted drafts.
    pub accepted: usize,
    /// The accepted drafts then the bonus token: `accepted + 1` tokens.
    pub tokens: Vec<u32>,
    /// Its plan was built for it (the first step of its block after a step of its
    /// previous block's size), compiling kernels where new: its wall time is not what a
    /// step of its size costs, so auto mode's refinement leaves it out.
    pub built_plan: bool,
}

/// The wall time auto mode refines a step size's cost with (`BlockLoop::commit_step`;
/// 0 s: not timed): only a step that follows a step of its own size and did not build its
/// plan (`StepResult::built_plan`) costs what such steps cost in a run of them. A step
/// after one of another size extends the drafter's context by that one's rows: a probe
/// after k one-row steps carries their k deferred rows, an extension that a later
/// one-row step would have made anyway (the one-row steps' own times include it once
/// every 16 steps).
pub fn step_seconds(prev_rows: Option<usize>, rows: usize, r: &StepResult, wall: f64) -> f64 {
    if r.built_plan || prev_rows != Some(rows) {
        0.0
    } else {
        wall
    }
}

/// Target and drafter on one device, with the step plans per (block, head).
/// A step plan's key: (rows of taps the context grows by, block, head, host drafts,
/// drafter pass despite host drafts, rejection sampling, sampled drafts, deferred).
type StepKey = (usize, usize, OutputHead, bool, bool, bool, bool, bool);

pub struct Speculative {
    pub target: GpuModel,
    pub drafter: GpuDrafter,
    /// Plans by (rows of taps to add to the drafter's context, block, head, host drafts).
    plans: HashMap<StepKey, Vec<Dispatch>>,
    ext_plans: HashMap<usize, Vec<Dispatch>>,
    /// Under a grammar (`constrained`): a step's draft submission by (rows the context
    /// grows by, block), and its verify submission by (rows, block, head).
    draft_plans: HashMap<(usize, usize), Vec<Dispatch>>,
    verify_plans: HashMap<(usize, usize, OutputHead), Vec<Dispatch>>,
    /// Rows of taps the next step's context extension adds: the rows the last verify
    /// pass computed (its committed rows feed the extension), or the rows of one-row
    /// steps in a row whose extension was deferred; 0 right after a prefill, which
    /// extends the context itself.
    prev_block: usize,
    /// The last step was a one-row step: its row and the deferred ones before it are
    /// committed rows at consecutive positions, so the next one-row step may defer.
    prev_single: bool,
    /// The next block's first token (the prefill's token, then each step's bonus), which
    /// stays on the GPU; the host keeps it to know the rows the step writes.
    anchor: u32,
    /// Drafts come from the host buffer (tests that force acceptance patterns).
    pub host_drafts: bool,
    /// With host drafts, the drafter's block pass still runs (its drafts unused): a step
    /// does and costs what a real step does while acceptance follows the host's drafts
    /// (`dflash bench --accept-profile`).
    pub simulate: bool,
    /// Verify by rejection sampling (set from the request's sampling parameters).
    rejection: bool,
    /// With rejection sampling, a plain drafter's drafts sampled (`sampled_drafts`).
    sampled_drafts: bool,
    /// Where a step leaves (accepted, tokens) for the host: two, so that a pipelined
    /// loop's next step writes the other while the host reads this one.
    step_readback: [wgpu::Buffer; 2],
    /// Steps submitted before the step before them was read (pipelined decoding).
    pub steps_queued_ahead: usize,
    /// Steps queued ahead and dropped because generation ended before them.
    pub steps_dropped: usize,
}

/// A step submitted whose outcome the host has not read yet.
pub(crate) struct QueuedStep {
    /// Its rows.
    b: usize,
    /// It deferred the drafter's context extension (the context still ends where it did).
    deferred: bool,
    /// Its `step_readback` buffer.
    slot: usize,
    /// Its plan was built for it (`StepResult::built_plan`).
    built_plan: bool,
    index: wgpu::SubmissionIndex,
}

impl Speculative {
    pub fn new(target: GpuModel, w: &DrafterWeights) -> Result<Self> {
        let ctx = target.ctx.clone();
        let drafter = GpuDrafter::new(&ctx, w, &target, host_draft_capacity(&target))?;
        Ok(Self::with_drafter(target, drafter))
    }

    /// A pair whose drafter's weights are already on the GPU, drafting among
    /// `draft_vocab` where given.
    pub fn from_gpu_drafter(
        target: GpuModel,
        config: &dflash_core::drafter::DrafterConfig,
        w: GpuDrafterWeights,
        draft_vocab: Option<&dflash_core::drafter::DraftVocab>,
    ) -> Result<Self> {
        let ctx = target.ctx.clone();
        let mut drafter =
            GpuDrafter::from_gpu_weights(&ctx, config, w, &target, host_draft_capacity(&target))?;
        if let Some(v) = draft_vocab {
            drafter.set_draft_vocab(&ctx, &target, v);
        }
        Ok(Self::with_drafter(target, drafter))
    }

    fn with_drafter(target: GpuModel, drafter: GpuDrafter) -> Self {
        let step_readback = [0, 1].map(|_| {
            target.ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("step readback"),
                size: ((MAX_ROWS + 1) * 4) as u64,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        });
        Speculative {
            step_readback,
            steps_queued_ahead: 0,
            steps_dropped: 0,
            target,
            drafter,
            plans: HashMap::new(),
            ext_plans: HashMap::new(),
            draft_plans: HashMap::new(),
            verify_plans: HashMap::new(),
            prev_block: 0,
            prev_single: false,
            anchor: 0,
            host_drafts: false,
            simulate: false,
            rejection: false,
            sampled_drafts: false,
        }
    }

    /// The drafter's own block (within what a step holds): the ceiling of `auto`.
    pub fn max_block(&self) -> usize {
        self.drafter.config.block_size.clamp(1, MAX_ROWS)
    }

    /// The largest block a step verifies: a fixed block may exceed the drafter's own, as
    /// z-lab's reference runs any `block_size` over a drafter.
    pub fn block_capacity(&self) -> usize {
        MAX_ROWS
    }

    /// Writes host drafts for the absolute positions `start..start + drafts.len()` (the
    /// others keep theirs); positions past the buffer (context + 17) are dropped.
    pub fn set_host_drafts_at(&mut self, start: usize, drafts: &[u32]) {
        self.host_drafts = true;
        let cap = host_draft_capacity(&self.target);
        let n = drafts.len().min(cap.saturating_sub(start));
        if n > 0 {
            self.target.ctx.queue.write_buffer(
                &self.drafter.host_drafts,
                (start * 4) as u64,
                bytemuck::cast_slice(&drafts[..n]),
            );
        }
    }

    /// Prefill of the target with taps, feeding every prompt row to the drafter's context;
    /// returns the first token (the first anchor) and leaves it on the GPU.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn prefill(&mut self, prompt: &[u32], head: OutputHead) -> Result<u32> {
        pollster::block_on(self.prefill_async(prompt, head))
    }

    /// `prefill` for event-loop hosts.
    pub async fn prefill_async(&mut self, prompt: &[u32], head: OutputHead) -> Result<u32> {
        self.prefill_from_async(prompt, 0, head).await
    }

    /// The prefill of `prompt` past its first `keep` rows, which the target's cache and
    /// the drafter's context hold from the last request (`GpuModel::reusable_rows`).
    async fn prefill_from_async(
        &mut self,
        prompt: &[u32],
        keep: usize,
        head: OutputHead,
    ) -> Result<u32> {
        self.target.truncate(keep);
        if prompt.len() <= keep {
            return Err(GpuError::Core(dflash_core::Error::EmptyPrompt));
        }
        let ctx = self.target.ctx.clone();
        let chunks: Vec<&[u32]> = prompt[keep..].chunks(MAX_ROWS).collect();
        let mut first = 0;
        for (i, ch) in chunks.iter().enumerate() {
            let start = self.target.len();
            let last = i + 1 == chunks.len();
            self.target
                .submit_pass(ch, if last { head } else { OutputHead::None })?;
            PassState::at(start).write(&ctx, &self.target.act.ext_state);
            if !self.ext_plans.contains_key(&ch.len()) {
                let p = self
                    .drafter
                    .extend_dispatches(&ctx, &self.target, ch.len())?;
                self.ext_plans.insert(ch.len(), p);
            }
            ops::submit(&ctx, &self.ext_plans[&ch.len()].iter().collect::<Vec<_>>());
            if last {
                let bytes = ctx.read_mapped_async(&self.target.act.readback).await?;
                first = bytemuck::cast_slice::<u8, u32>(&bytes)[ch.len() - 1];
            }
        }
        let pos = self.target.len();
        let state = PassState {
            anchor: first,
            ..PassState::at(pos)
        };
        state.write(&ctx, &self.target.act.state);
        PassState::at(pos).write(&ctx, &self.target.act.ext_state);
        self.prev_block = 0;
        self.prev_single = false;
        self.anchor = first;
        self.target.drafted = pos;
        Ok(first)
    }

    /// Whether a step of `b` rows defers the drafter's context extension: a one-row
    /// step after a one-row step, while the taps buffer has room for its row after the
    /// waiting ones. It drafts nothing, so the context is only needed complete at the
    /// next step that drafts (or fills the taps), which extends all the waiting rows at
    /// once: an idle step of auto mode then costs what a plain step does.
    fn defers(&self, b: usize) -> bool {
        b == 1 && self.prev_single && self.prev_block < MAX_ROWS
    }

    /// The plan of a step of `b` rows after the current previous block, built once.
    fn ensure_plan(&mut self, b: usize, head: OutputHead) -> Result<StepKey> {
        let rejection = self.rejection && head.samples();
        // DFlash2's walk always samples under rejection; a plain drafter where asked.
        let sampled = rejection && (self.drafter.d2.is_some() || self.sampled_drafts);
        let pass = self.host_drafts && self.simulate;
        let deferred = self.defers(b);
        let key = (
            self.prev_block,
            b,
            head,
            self.host_drafts,
            pass,
            rejection,
            sampled,
            deferred,
        );
        if !self.plans.contains_key(&key) {
            let ctx = self.target.ctx.clone();
            let mut d = if self.prev_block > 0 && !deferred {
                self.drafter
                    .extend_dispatches(&ctx, &self.target, self.prev_block)?
            } else {
                Vec::new()
            };
            d.extend(self.drafter.draft_dispatches(
                &ctx,
                &self.target,
                b,
                self.host_drafts,
                pass,
                sampled,
            )?);
            // A hybrid target's recurrent states: kept before the verify pass, rolled
            // back to the accepted rows after acceptance.
            d.extend(self.target.state_rollback(true)?);
            // A deferred step's taps land after the rows still waiting for the context.
            let tap_row = if deferred { self.prev_block } else { 0 };
            d.extend(self.target.build_plan_tapping_at(b, head, tap_row)?);
            if rejection && b > 1 {
                let dr = &self.drafter;
                // The drafter proposes from its walk's q (DFlash2's selector, or a
                // plain drafter's top candidates); host drafts come with certainty.
                let k = dr.config.candidate_count();
                let (q_ids, q_vals, qk) = match (&dr.d2, &dr.sampled, self.host_drafts) {
                    (Some(s), _, false) => (&s.cand_ids, &s.q_vals, k),
                    (None, Some(p), false) if sampled => (&p.ids, &p.q, k),
                    _ => (&dr.drafts, &dr.host_drafts, 0),
                };
                let a = &self.target.act;
                let rb = ops::RejectionBuffers {
                    sample_params: &a.sample_params,
                    state: &a.state,
                    logits: &a.logits,
                    ids: &a.tokens,
                    q_ids,
                    q_vals,
                    verdict: &dr.verdict,
                };
                d.push(ops::verify_rejection(&ctx, &rb, b - 1, qk)?);
            }
            let accept = if rejection {
                "accept_rejection"
            } else {
                "accept"
            };
            d.push(bookkeeping_keeping(
                &ctx,
                &self.target,
                &self.drafter,
                accept,
                (b, self.host_drafts),
                deferred,
            )?);
            d.extend(self.target.state_rollback(false)?);
            self.plans.insert(key, d);
        }
        Ok(key)
    }

    /// One step with a block of `b` rows (1 = plain decoding through the same loop):
    /// extend the drafter's context with the rows committed last step, draft, verify,
    /// accept, roll back, all in one submission; reads back (accepted, tokens).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn step(&mut self, b: usize, head: OutputHead) -> Result<StepResult> {
        pollster::block_on(self.step_async(b, head))
    }

    /// `step` for event-loop hosts.
    pub async fn step_async(&mut self, b: usize, head: OutputHead) -> Result<StepResult> {
        let q = self.submit_step(b, head, 0, self.target.len())?;
        let map = self.begin_read(&q);
        self.read_step(&q, map).await
    }

    /// `submit_step` of a step queued before the step before it is read.
    pub(crate) fn queue_step(
        &mut self,
        b: usize,
        head: OutputHead,
        slot: usize,
        pos_bound: usize,
    ) -> Result<QueuedStep> {
        let q = self.submit_step(b, head, slot, pos_bound)?;
        self.steps_queued_ahead += 1;
        Ok(q)
    }

    /// Encodes and submits a step of `b` rows (clamped to what a step holds) whose first
    /// row is at most at `pos` (the committed length, or its bound while the step before
    /// is unread: the GPU keeps the position itself); its outcome goes to
    /// `step_readback[slot]`. The next step's plan extends the drafter's context by
    /// this step's rows.
    pub(crate) fn submit_step(
        &mut self,
        b: usize,
        head: OutputHead,
        slot: usize,
        pos: usize,
    ) -> Result<QueuedStep> {
        let b = b.clamp(1, self.block_capacity());
        self.check_room(pos, b)?;
        let ctx = self.target.ctx.clone();
        ctx.check_lost()?;
        // The context grows by the rows the last step committed; the plan adds all the
        // rows that step verified: rows past the committed ones land at positions the
        // block overwrites or that are rewritten before any read.
        let plans_before = self.plans.len();
        let key = self.ensure_plan(b, head)?;
        let built_plan = self.plans.len() > plans_before;
        let mut enc = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("dflash step"),
            });
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("dflash step"),
                timestamp_writes: None,
            });
            for d in &self.plans[&key] {
                d.encode(&mut pass);
            }
        }
        let out = &self.step_readback[slot];
        enc.copy_buffer_to_buffer(&self.target.act.result, 0, out, 0, ((b + 1) * 4) as u64);
        let index = ctx.queue.submit([enc.finish()]);
        let deferred = key.7;
        self.prev_block = if deferred { self.prev_block + 1 } else { b };
        self.prev_single = b == 1;
        Ok(QueuedStep {
            built_plan,
            b,
            deferred,
            slot,
            index,
        })
    }

    /// A step of `b` rows from `pos` fits the context, or `ContextOverflow`.
    pub(crate) fn check_room(&self, pos: usize, b: usize) -> Result<()> {
        if pos + b > self.target.context {
            return Err(GpuError::Core(dflash_core::Error::ContextOverflow {
                prompt_tokens: pos + b,
                max_new_tokens: 0,
                context: self.target.context,
            }));
        }
        Ok(())
    }

    /// Requests the read-back of a queued step's outcome (before the next submission, so
    /// that in the browser the map does not wait for it).
    pub(crate) fn begin_read(&self, q: &QueuedStep) -> crate::context::PendingMap {
        let buffer = &self.step_readback[q.slot];
        self.target.ctx.begin_map(buffer, Some(q.index.clone()))
    }

    /// Reads a queued step's (accepted, tokens) and commits them on the host: the steps
    /// before it must have been read. The block's rows are the anchor (the last token of
    /// the step before, or of the prefill), then the accepted drafts; the step extended
    /// the drafter's context to its first row.
    pub(crate) async fn read_step(
        &mut self,
        q: &QueuedStep,
        map: crate::context::PendingMap,
    ) -> Result<StepResult> {
        // A step the host cannot read ran on the GPU all the same.
        let bytes = self.target.ctx.finish_map(map).await;
        let bytes = bytes.inspect_err(|_| self.target.states_ran_ahead())?;
        let r: &[u32] = bytemuck::cast_slice(&bytes);
        let acc = r[0] as usize;
        if acc >= q.b {
            self.target.states_ran_ahead();
            return Err(GpuError::Readback(format!(
                "accepted {acc} of a block of {}",
                q.b
            )));
        }
        let pos = self.target.len();
        self.target.len = pos + acc + 1;
        self.target.record_ids(pos, &[self.anchor]);
        self.target.record_ids(pos + 1, &r[1..acc + 1]);
        self.anchor = r[acc + 1];
        if !q.deferred {
            // The step extended the drafter's context up to its own first row.
            self.target.drafted = pos;
        }
        Ok(StepResult {
            accepted: acc,
            tokens: r[1..acc + 2].to_vec(),
            built_plan: q.built_plan,
        })
    }

    /// A queued step that will not be read (generation ended before it): the host's
    /// view stays at the last step read. The GPU's positions ran ahead, which the next
    /// prefill writes over, but a hybrid target's recurrent states cannot be taken back.
    pub(crate) fn drop_queued(&mut self, _: QueuedStep) {
        self.steps_dropped += 1;
        self.target.states_ran_ahead();
    }
}

/// Test hooks: the host's drafts and read-backs of the last block (the `testutil`
/// feature; neither the CLI nor the wasm package has them).
#[cfg(all(feature = "testutil", not(target_arch = "wasm32")))]
impl Speculative {
    /// Writes the drafts the host wants proposed for each absolute position (tests).
    pub fn set_host_drafts(&mut self, by_position: &[u32]) {
        self.set_host_drafts_at(0, by_position);
    }

    /// The drafts of the last block at slots 1..b (tests).
    pub fn read_drafts(&self, b: usize) -> Result<Vec<u32>> {
        let bytes = self
            .target
            .ctx
            .read_back(&self.drafter.drafts, 0, (b * 4) as u64)?;
        Ok(bytemuck::cast_slice::<u8, u32>(&bytes)[1..b].to_vec())
    }

    /// The drafter's final (normed) hidden rows of the last block (tests).
    pub fn read_draft_hidden(&self, b: usize) -> Result<Vec<f32>> {
        let bytes = self.target.ctx.read_back(
            &self.drafter.xn,
            0,
            (b * self.drafter.config.hidden_size * 4) as u64,
        )?;
        Ok(bytemuck::cast_slice(&bytes).to_vec())
    }
}
