//! What a step costs on this device: `auto` mode's step costs measured by running steps,
//! and the per-dispatch profile of one step (`dflash profile`).

use super::Speculative;
use crate::error::Result;
use crate::model::OutputHead;
#[cfg(not(target_arch = "wasm32"))]
use crate::pipelines::Dispatch;
use dflash_core::speculative::interpolate_costs;

/// Timed rounds of `Speculative::measure_step_costs` (after one that warms up): each
/// times one step of every size.
const COST_ROUNDS: usize = 2;

impl Speculative {
    /// Every dispatch of a step of `b` rows (after a step of `b` rows) timed on the GPU:
    /// the profiler's DFlash step. Call it after a prefill; the state the step changes is
    /// put back before each run, and afterwards, so the generation is not moved.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn profile_step(
        &mut self,
        b: usize,
        runs: usize,
        now: &dyn Fn() -> f64,
    ) -> Result<crate::profile::PlanProfile> {
        let ctx = self.target.ctx.clone();
        let b = b.clamp(1, self.block_capacity());
        let keep = (self.prev_block, self.prev_single);
        // The step after a step of b rows, extending the context by them (never deferred).
        (self.prev_block, self.prev_single) = (b, false);
        let key = self.ensure_plan(b, OutputHead::Argmax);
        (self.prev_block, self.prev_single) = keep;
        let key = key?;
        let a = &self.target.act;
        let saved: Vec<wgpu::Buffer> = [&a.state, &a.ext_state]
            .iter()
            .map(|buf| crate::upload::work_buffer(&ctx, "profile snapshot", buf.size()))
            .collect();
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(&a.state, 0, &saved[0], 0, a.state.size());
        enc.copy_buffer_to_buffer(&a.ext_state, 0, &saved[1], 0, a.ext_state.size());
        ctx.queue.submit([enc.finish()]);
        let restore = [
            (&saved[0], &a.state, a.state.size()),
            (&saved[1], &a.ext_state, a.ext_state.size()),
        ];
        let plan: Vec<&Dispatch> = self.plans[&key].iter().collect();
        let keys = self.target.len() + b;
        let name = format!("DFlash step, block {b}");
        let r = crate::profile::profile_plan(&ctx, &name, &plan, &restore, keys, runs, now);
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(&saved[0], 0, &a.state, 0, a.state.size());
        enc.copy_buffer_to_buffer(&saved[1], 0, &a.ext_state, 0, a.ext_state.size());
        ctx.queue.submit([enc.finish()]);
        r
    }

    /// Relative cost of a whole DFlash step (context extension, drafting, verification)
    /// with b rows against a step of one row (which drafts nothing), for b in 0..=max
    /// (index 0 unused): what auto mode weighs the expected accepted tokens against.
    /// Measured on dummy tokens; the KV cache is left empty.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn measure_step_costs(&mut self, max: usize, now: &dyn Fn() -> f64) -> Result<Vec<f64>> {
        pollster::block_on(self.measure_step_costs_async(max, now))
    }

    /// `measure_step_costs` for event-loop hosts. On an error midway the state it
    /// changed is put back all the same (host drafts, an empty cache, no previous block).
    pub async fn measure_step_costs_async(
        &mut self,
        max: usize,
        now: &dyn Fn() -> f64,
    ) -> Result<Vec<f64>> {
        let max = max.clamp(1, self.max_block());
        let probe = dflash_core::speculative::probe_block_sizes(max);
        let host = self.host_drafts;
        self.host_drafts = false;
        let best = self.time_step_sizes(&probe, now).await;
        self.host_drafts = host;
        self.target.truncate(0);
        self.prev_block = 0;
        self.prev_single = false;
        let times: Vec<(usize, f64)> = probe.into_iter().zip(best?).collect();
        Ok(interpolate_costs(&times, max))
    }

    /// The best time of a step of each size in `probe` over the timed rounds.
    async fn time_step_sizes(
        &mut self,
        probe: &[usize],
        now: &dyn Fn() -> f64,
    ) -> Result<Vec<f64>> {
        let prompt = vec![0u32; 8];
        // Rounds over all the sizes in turn, so that a slow spell of a busy host (a CPU
        // adapter's) slows every size alike rather than one; the best of each size. The
        // first round is not timed: it compiles and builds the steps' plans.
        let mut best = vec![f64::INFINITY; probe.len()];
        for round in 0..=COST_ROUNDS {
            for (k, &b) in probe.iter().enumerate() {
                // The prefill extends the drafter's context itself; the first step of b
                // rows follows it, the timed one follows a step of b rows, as in a run
                // of them (its context extension is theirs; b = 1 defers it).
                self.prefill_async(&prompt, OutputHead::Argmax).await?;
                self.step_async(b, OutputHead::Argmax).await?;
                let t0 = now();
                self.step_async(b, OutputHead::Argmax).await?;
                if round > 0 {
                    best[k] = best[k].min(now() - t0);
                }
            }
        }
        Ok(best)
    }
}
