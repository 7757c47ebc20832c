//! The bookkeeping of one speculative step, shared by every engine's driver (the CPU
//! loop here, the GPU's pipelined steps): choose the block, commit what the target
//! accepted, keep the statistics; and the result with its per-step tau.

use super::policy::*;
use crate::generate::GenerateResult;

/// The bookkeeping every speculative loop shares (the CPU reference, the GPU engine,
/// the benchmark's by-id loop): the block of each step under the policy (auto mode's
/// step costs refined by the steps' wall times, its probes), the per-position
/// acceptance and the tokens committed per step.
#[derive(Debug, Clone)]
pub struct BlockLoop {
    policy: BlockSize,
    costs: Option<StepCosts>,
    max_block: usize,
    /// Steps since the last one that drafted.
    idle: usize,
    /// One-row steps forced to time the baseline (at most [`BASELINE_MAX_FORCED`]).
    forced: usize,
    pub acceptance: Acceptance,
    /// Tokens committed per step (tau).
    pub taus: Vec<usize>,
}

impl BlockLoop {
    /// `max_block`: the largest block the engine's step holds (a fixed block is clamped
    /// to it; `auto` also stops at its cost table's end, the drafter's own block).
    pub fn new(policy: &BlockSize, max_block: usize) -> Self {
        BlockLoop {
            policy: policy.clone(),
            costs: StepCosts::new(policy),
            max_block: max_block.max(1),
            idle: 0,
            forced: 0,
            acceptance: Acceptance::default(),
            taus: Vec::new(),
        }
    }

    /// The block of the next step: at most `room` rows (what the context has left), and
    /// at most one more than the `tokens_left` the budget still allows, as z-lab's
    /// reference verifies near the end of `max_new_tokens` (`min(block_size, max_length -
    /// start)`): a block's drafts depend on its length, its rows attending to each other,
    /// so this keeps them the reference's (and verifies no row past the budget).
    pub fn next_block(&mut self, room: usize, tokens_left: usize) -> usize {
        let room = room.min(tokens_left.saturating_add(1));
        let current = self.costs.as_ref().map(StepCosts::policy);
        let policy = current.as_ref().unwrap_or(&self.policy);
        let mut b = choose_block(policy, &self.acceptance, self.max_block, self.idle)
            .min(room)
            .max(1);
        if let (Some(costs), BlockSize::Auto { verify_cost }) = (&self.costs, policy) {
            if b > 1
                && self.forced < BASELINE_MAX_FORCED
                && costs.needs_baseline()
                && marginal(verify_cost, &self.acceptance, b)
            {
                self.forced += 1;
                b = 1;
            }
        }
        self.idle = if b > 1 { 0 } else { self.idle + 1 };
        b
    }

    /// The largest block `next_block` can return when neither the context nor the
    /// budget caps it: a fixed block (within the step's rows), or auto's ceiling. An
    /// engine that chooses the next block before this step's outcome is known (a
    /// pipelined loop) chooses the same block whenever its worst-case room holds this.
    pub fn largest_block(&self) -> usize {
        match &self.policy {
            BlockSize::Fixed(b) => (*b).clamp(1, self.max_block),
            BlockSize::Auto { .. } => self.max_block,
        }
    }

    /// A step of `b` rows took `seconds` (0 without a clock) and accepted `accepted`
    /// drafts.
    pub fn record(&mut self, b: usize, seconds: f64, accepted: usize) {
        if let Some(c) = self.costs.as_mut() {
            c.record(b, seconds);
        }
        self.acceptance.record_step(b - 1, accepted);
        self.taus.push(accepted + 1);
    }

    /// Records a step of `b` rows that took `seconds` and committed `tokens` (its
    /// `accepted` drafts, then the bonus token), handing each token to `push` with
    /// whether it was an accepted draft; true as soon as `push` says generation has
    /// ended (the step's later tokens are dropped). Every engine's loop is
    /// `next_block`, the engine's step, `commit_step`.
    pub fn commit_step<E>(
        &mut self,
        b: usize,
        seconds: f64,
        accepted: usize,
        tokens: impl IntoIterator<Item = u32>,
        mut push: impl FnMut(u32, bool) -> std::result::Result<bool, E>,
    ) -> std::result::Result<bool, E> {
        self.record(b, seconds, accepted);
        for (i, t) in tokens.into_iter().enumerate() {
            if push(t, i < accepted)? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// In auto mode, the step costs as this loop's steps have refined them.
    pub fn step_costs(&self) -> Option<Vec<f64>> {
        self.costs.as_ref().map(StepCosts::verify_cost)
    }

    /// The run's result around the sink's.
    pub fn result(self, result: GenerateResult) -> SpeculativeResult {
        let step_costs = self.step_costs();
        SpeculativeResult {
            step_costs,
            result,
            steps: self.taus.len(),
            taus: self.taus,
            acceptance: self.acceptance,
        }
    }
}

#[derive(Debug, Clone)]
pub struct SpeculativeResult {
    pub result: GenerateResult,
    pub steps: usize,
    /// Tokens committed per step (tau), one entry per step.
    pub taus: Vec<usize>,
    pub acceptance: Acceptance,
    /// In auto mode, the step costs as the run's own steps refined them: the prior of
    /// the next request on the same engine.
    pub step_costs: Option<Vec<f64>>,
}

impl SpeculativeResult {
    pub fn mean_tau(&self) -> f64 {
        mean_tau(&self.taus)
    }
}

/// The mean of the tokens committed per step (0 without steps).
pub fn mean_tau(taus: &[usize]) -> f64 {
    if taus.is_empty() {
        0.0
    } else {
        taus.iter().sum::<usize>() as f64 / taus.len() as f64
    }
}
