//! The CPU reference of the DFlash speculative loop: prefill with taps, draft a block in
//! one drafter pass, verify it in one target pass, accept the longest prefix the target
//! agrees with, take the target's own next token as the bonus, roll the KV cache back
//! and feed the committed rows' taps to the drafter. Because the target's token at each
//! position is drawn exactly as plain decoding draws it (same logits bits, same
//! position-keyed random number), the output equals plain decoding token for token.

use crate::cpu::ops::argmax;
use crate::cpu::{CpuModel, LogitRows};
use crate::drafter::CpuDrafter;
use crate::error::{Error, Result};
use crate::generate::{prepare, CpuSession, GenerateRequest, GenerateResult, TokenSink};
use crate::rejection::{verify, Proposed, Verdict};
use crate::sampling::{distribution, sample, SamplingParams};
use crate::tokenizer::TextTokenizer;

/// How many rows each step verifies.
#[derive(Debug, Clone, PartialEq)]
pub enum BlockSize {
    /// A fixed block (1 = plain decoding through the same loop).
    Fixed(usize),
    /// Chosen each step: the B that maximises expected tokens per unit of cost, from the
    /// running per-position acceptance rates and `verify_cost[b]`, the measured relative
    /// cost of a step that verifies b rows on this device (index 0 unused).
    Auto { verify_cost: Vec<f64> },
}

impl BlockSize {
    /// Relative step costs of a device where verifying b rows costs `1 + slope * (b - 1)`
    /// times one row (a GPU: slope near 0; the CPU reference: near 1).
    pub fn auto_linear(max_block: usize, slope: f64) -> Self {
        BlockSize::Auto {
            verify_cost: (0..=max_block)
                .map(|b| 1.0 + slope * (b.max(1) - 1) as f64)
                .collect(),
        }
    }
}

/// Where a speculative loop runs: the prior of auto mode's step costs, so that a request
/// starts at once instead of waiting on a measurement (the loop refines the costs from
/// its own steps, `StepCosts`, and hosts keep the refined costs for the next request).
/// Each is a fit of `1 + fixed + slope * (b - 1)` one-row steps for b > 1 to measured
/// DFlash step costs of SmolLM2-135M with its drafter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepCostPrior {
    /// A hardware GPU: 1.75 one-row steps at b = 4, 3.9 at b = 16 on an H200
    /// (`results/h200-smollm2-dflash.jsonl`).
    Gpu,
    /// A CPU Vulkan or WebGPU adapter (lavapipe, SwiftShader): 3.8 at b = 4, 14 at b = 16
    /// (`results/lavapipe-engine-profile.jsonl`).
    CpuAdapter,
    /// The quantized CPU engine: 1.41 at b = 2, 1.91 at b = 4, 5.7 at b = 16 on 2
    /// threads (`results/cpu-side-by-side-smollm2-2threads.json`, the packed rows of
    /// 686d7b0; fixed blocks of 2 in session 41: 1.35-1.47).
    CpuEngine,
}

impl StepCostPrior {
    /// The prior for a wgpu adapter of this `device_type` (wgpu's name, `Cpu` for a
    /// software rasteriser) and name (a browser may not tell the type of SwiftShader).
    pub fn for_adapter(device_type: &str, name: &str) -> Self {
        let name = name.to_lowercase();
        match device_type {
            "Cpu" => StepCostPrior::CpuAdapter,
            _ if name.contains("swiftshader") || name.contains("llvmpipe") => {
                StepCostPrior::CpuAdapter
            }
            _ => StepCostPrior::Gpu,
        }
    }

    /// Relative costs of a step of b rows for b in 0..=max (index 0 unused, b = 1 is 1).
    pub fn costs(self, max: usize) -> Vec<f64> {
        let (fixed, slope) = match self {
            StepCostPrior::Gpu => (0.21, 0.18),
            StepCostPrior::CpuAdapter => (0.25, 0.85),
            StepCostPrior::CpuEngine => (0.11, 0.30),
        };
        (0..=max.max(1))
            .map(|b| match b {
                0 | 1 => 1.0,
                _ => 1.0 + fixed + slope * (b - 1) as f64,
            })
            .collect()
    }
}

/// Per-position acceptance: `accepted[j]` of `tried[j]` drafts at block slot j+1.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Acceptance {
    pub accepted: Vec<u64>,
    pub tried: Vec<u64>,
}

impl Acceptance {
    /// Records a step that proposed `drafts` drafts and accepted `acc`.
    pub fn record_step(&mut self, drafts: usize, acc: usize) {
        if self.tried.len() < drafts {
            self.tried.resize(drafts, 0);
            self.accepted.resize(drafts, 0);
        }
        for j in 0..drafts {
            self.tried[j] += 1;
            if j < acc {
                self.accepted[j] += 1;
            }
        }
    }
    /// Conditional acceptance rate of slot j+1 given slot j was accepted, with a
    /// Beta(1, 1) prior.
    fn conditional(&self, j: usize) -> f64 {
        let tried_here = if j == 0 {
            self.tried.first().copied().unwrap_or(0)
        } else {
            self.accepted.get(j - 1).copied().unwrap_or(0)
        };
        let acc = self.accepted.get(j).copied().unwrap_or(0);
        (acc as f64 + 1.0) / (tried_here as f64 + 2.0)
    }
    /// Adds another run's counts (per-prompt results into a whole benchmark's).
    pub fn add(&mut self, other: &Acceptance) {
        let n = self.tried.len().max(other.tried.len());
        self.tried.resize(n, 0);
        self.accepted.resize(n, 0);
        for (j, (&a, &t)) in other.accepted.iter().zip(&other.tried).enumerate() {
            self.accepted[j] += a;
            self.tried[j] += t;
        }
    }
    pub fn rates(&self) -> Vec<f64> {
        self.accepted
            .iter()
            .zip(&self.tried)
            .map(|(&a, &t)| if t == 0 { 0.0 } else { a as f64 / t as f64 })
            .collect()
    }
}

/// In auto mode, after at least this many steps without drafts, one step drafts anyway so
/// that the acceptance rates keep being measured (they may rise again later in the text).
pub const PROBE_EVERY: usize = 16;

/// The share of decode time auto mode may spend on probes: a probe of a block that costs
/// `c` one-row steps waits `(c - 1) / PROBE_BUDGET` idle steps (at least [`PROBE_EVERY`]),
/// so where rows are dear (a CPU adapter: 2 rows cost 2.1 steps) probes are rare and a
/// drafter that cannot pay costs at most this share; where rows are nearly free (a GPU)
/// they come every [`PROBE_EVERY`] steps.
pub const PROBE_BUDGET: f64 = 0.02;

/// Idle steps before a probe of block `b` under `verify_cost` (see [`PROBE_BUDGET`]).
pub fn probe_interval(verify_cost: &[f64], b: usize) -> usize {
    // Relative to a one-row step: refined costs (`StepCosts::policy`) share a scale that
    // need not make verify_cost[1] exactly 1.
    let one = verify_cost.get(1).copied().unwrap_or(1.0).max(1e-9);
    let extra = verify_cost.get(b).copied().unwrap_or(f64::INFINITY) / one - 1.0;
    let steps = (extra.max(0.0) / PROBE_BUDGET).ceil();
    if steps.is_finite() {
        (steps as usize).max(PROBE_EVERY)
    } else {
        usize::MAX
    }
}

/// Expected committed tokens per unit of cost of a step with `b` rows (b = 1: no drafts).
fn block_values(verify_cost: &[f64], acc: &Acceptance, max_block: usize) -> Vec<(usize, f64)> {
    let mut out = Vec::new();
    let mut expected = 1.0; // tokens per step with b rows: 1 + sum of prefix products
    let mut prefix = 1.0;
    #[allow(clippy::needless_range_loop)] // b is also the block size
    for b in 1..=max_block.min(verify_cost.len().saturating_sub(1)) {
        if b > 1 {
            prefix *= acc.conditional(b - 2);
            expected += prefix;
        }
        out.push((b, expected / verify_cost[b].max(1e-9)));
    }
    out
}

fn best_of(values: impl Iterator<Item = (usize, f64)>) -> Option<usize> {
    let (mut best, mut best_v) = (None, 0.0);
    for (b, v) in values {
        if v > best_v {
            best_v = v;
            best = Some(b);
        }
    }
    best
}

/// Auto mode's step costs, refined by the steps of the running generation: the costs
/// measured before it (`BlockSize::Auto`'s) are a prior, noisy on a busy machine and
/// blind to what the context length does to the step; every step's wall time updates a
/// running mean for its block size (the first step of each size is skipped: it may
/// compile), and the costs the policy then sees are the measured ones where a size has
/// run, the prior ones scaled to the measured speed elsewhere.
#[derive(Debug, Clone)]
pub struct StepCosts {
    prior: Vec<f64>,
    seconds: Vec<f64>,
    seen: Vec<u32>,
}

impl StepCosts {
    /// Weight of the newest step in a size's running mean.
    const ALPHA: f64 = 0.2;

    /// Some for the auto policy, None for a fixed block.
    pub fn new(policy: &BlockSize) -> Option<Self> {
        match policy {
            BlockSize::Auto { verify_cost } => Some(StepCosts {
                prior: verify_cost.clone(),
                seconds: vec![0.0; verify_cost.len()],
                seen: vec![0; verify_cost.len()],
            }),
            BlockSize::Fixed(_) => None,
        }
    }

    /// A step of `b` rows took `seconds` (steps without a clock, 0 s, are ignored).
    pub fn record(&mut self, b: usize, seconds: f64) {
        if b >= self.seen.len() || !(seconds > 0.0) || !seconds.is_finite() {
            return;
        }
        self.seen[b] += 1;
        match self.seen[b] {
            1 => {}
            2 => self.seconds[b] = seconds,
            _ => self.seconds[b] += Self::ALPHA * (seconds - self.seconds[b]),
        }
    }

    /// Whether steps that draft have been timed in this generation but fewer than
    /// [`BASELINE_STEPS`] steps of one row (the baseline every other size's cost is
    /// relative to) have.
    pub fn needs_baseline(&self) -> bool {
        let timed = |b: usize, n: u32| self.seen.get(b).is_some_and(|&s| s > n);
        !timed(1, BASELINE_STEPS) && (2..self.seen.len()).any(|b| timed(b, 1))
    }

    /// The policy with the current costs.
    pub fn policy(&self) -> BlockSize {
        BlockSize::Auto {
            verify_cost: self.verify_cost(),
        }
    }

    /// The current costs: measured where a size has run, the prior scaled elsewhere.
    pub fn verify_cost(&self) -> Vec<f64> {
        let measured: Vec<usize> = (1..self.seen.len())
            .filter(|&b| self.seen[b] >= 2)
            .collect();
        if measured.is_empty() {
            return self.prior.clone();
        }
        // Seconds per unit of prior cost, over the sizes that have run.
        let unit = measured.iter().map(|&b| self.seconds[b]).sum::<f64>()
            / measured
                .iter()
                .map(|&b| self.prior[b])
                .sum::<f64>()
                .max(1e-12);
        (0..self.prior.len())
            .map(|b| {
                if self.seen[b] >= 2 {
                    self.seconds[b] / unit.max(1e-12)
                } else {
                    self.prior[b]
                }
            })
            .collect()
    }
}

/// The block for the next step under `policy`. `idle` counts the steps since the last
/// one that drafted: in auto mode a block of 1 (no drafting at all) is chosen while
/// drafting does not pay for itself, with a probe after [`probe_interval`] idle steps.
pub fn choose_block(policy: &BlockSize, acc: &Acceptance, max_block: usize, idle: usize) -> usize {
    match policy {
        BlockSize::Fixed(b) => (*b).clamp(1, max_block),
        BlockSize::Auto { verify_cost } => {
            let values = block_values(verify_cost, acc, max_block);
            let best = best_of(values.iter().copied()).unwrap_or(1);
            if best == 1 && idle >= PROBE_EVERY {
                let probe = best_of(values.into_iter().filter(|&(b, _)| b > 1)).unwrap_or(1);
                if probe > 1 && idle >= probe_interval(verify_cost, probe) {
                    return probe;
                }
            }
            best
        }
    }
}

/// Once steps that draft have been timed, a block whose expected tokens per unit of
/// cost are less than this many times plain decoding's is drafted again only after
/// this generation has timed its own one-row steps too. The prior's costs are relative
/// to a one-row step measured before it (the probe of `measure_step_costs`, or another
/// request's refinement); where that is off, a generation that drafts from its first
/// step would refine the block's seconds and scale every other size with them, never
/// learning that the block is dear (lavapipe: a 4-row step probed at 1.25 one-row
/// steps, truly 2.4). A few plain steps (never slower than plain decoding) settle it;
/// where drafting clearly pays (a GPU with a good drafter) it is never interrupted.
pub const BASELINE_MARGIN: f64 = 1.5;

/// One-row steps timed before a marginal block is drafted again (a running mean: one
/// slow sample on a busy machine moves it by `StepCosts::ALPHA` only).
pub const BASELINE_STEPS: u32 = 2;

/// At most this many one-row steps are forced for the baseline in a generation (a clock
/// too coarse to time a one-row step must not stop drafting for good).
pub const BASELINE_MAX_FORCED: usize = 8;

/// Whether block `b` under `verify_cost` and `acc` is worth less than [`BASELINE_MARGIN`]
/// times plain decoding.
fn marginal(verify_cost: &[f64], acc: &Acceptance, b: usize) -> bool {
    let values = block_values(verify_cost, acc, b);
    match (values.first(), values.last()) {
        (Some(&(1, plain)), Some(&(last, value))) if last == b => value < BASELINE_MARGIN * plain,
        _ => false,
    }
}

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

/// The block sizes whose step cost is measured for `auto` up to `max` (the rest are
/// interpolated): powers of two to 16, and `max` past that.
pub fn probe_block_sizes(max: usize) -> Vec<usize> {
    [1, 2, 4, 8, 16]
        .into_iter()
        .filter(|&b| b <= max)
        .chain((max > 16).then_some(max))
        .collect()
}

/// Costs for every b in 1..=max relative to b = 1, linearly interpolated between the
/// measured (b, seconds) points (index 0 unused).
pub fn interpolate_costs(times: &[(usize, f64)], max: usize) -> Vec<f64> {
    let base = times.first().map(|t| t.1).unwrap_or(1.0).max(1e-9);
    let mut costs = vec![1.0; max + 1];
    #[allow(clippy::needless_range_loop)] // b is also the block size
    for b in 1..=max {
        let hi = times
            .iter()
            .position(|&(pb, _)| pb >= b)
            .unwrap_or(times.len() - 1);
        let lo = hi.saturating_sub(1);
        let (b0, t0) = times[lo];
        let (b1, t1) = times[hi];
        let t = if b1 == b0 {
            t1
        } else {
            t0 + (t1 - t0) * (b - b0) as f64 / (b1 - b0) as f64
        };
        costs[b] = t / base;
    }
    costs
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

/// What proposes the drafts of a step. The DFlash drafter is one; tests use others.
pub trait Proposer {
    /// Target layers whose taps the proposer consumes (may be empty).
    fn tap_layers(&self) -> Vec<usize>;
    /// The block it was made for: the ceiling of `auto` (its cost table's size).
    fn max_block(&self) -> usize;
    /// The largest block a fixed request may run (default: [`Proposer::max_block`]). A
    /// DFlash drafter runs any block its engine's step holds, as z-lab's reference runs
    /// any `block_size` over a drafter (the extra rows are mask tokens like the rest).
    fn block_capacity(&self) -> usize {
        self.max_block()
    }
    /// Committed tap rows (`[r, n_taps * H]`) for the next positions.
    fn commit(&mut self, taps: &[f32]);
    /// Rows of committed taps it holds (`usize::MAX` for a proposer without context).
    fn context_rows(&self) -> usize {
        usize::MAX
    }
    /// Forgets the committed rows from `len` on (before a prompt that keeps `len` rows of
    /// the last request's cache).
    fn truncate(&mut self, len: usize) {
        let _ = len;
    }
    /// Takes into its context now every committed row it has not yet taken but the last
    /// `keep`: the backlog of the prompt and of one-row steps that drafted nothing. The
    /// loop calls it before it times a step that drafts, so that the step costs what a
    /// step after a drafting step does (it takes in only the last step's rows) and auto
    /// mode does not charge a probe with the backlog. Default: nothing held back.
    fn settle(&mut self, keep: usize) {
        let _ = keep;
    }
    /// `b - 1` draft tokens following `anchor` at absolute position `pos`.
    fn draft(&mut self, anchor: u32, pos: usize, b: usize) -> Result<Vec<u32>>;
    /// Drafts with the distributions they were drawn from, for rejection sampling at
    /// `sampling`'s temperature. Default: the drafts of `draft`, proposed with certainty.
    fn propose(
        &mut self,
        anchor: u32,
        pos: usize,
        b: usize,
        sampling: &SamplingParams,
    ) -> Result<Vec<Proposed>> {
        let _ = sampling;
        Ok(self
            .draft(anchor, pos, b)?
            .into_iter()
            .map(Proposed::certain)
            .collect())
    }
}

/// The DFlash drafter on the CPU: context cache, block pass, the target's embedding and
/// lm_head.
pub struct DFlashCpu<'a> {
    pub drafter: &'a CpuDrafter,
    pub target: &'a CpuModel,
    state: DraftState,
}

/// The drafter's context between requests (kept by the host beside its `CpuSession`).
#[derive(Clone, Default)]
pub struct DraftState {
    ctx: crate::drafter::DraftContext,
    /// Committed tap rows not yet in the context. They join it in one batched pass when
    /// the next block is drafted (the extension is batch invariant: the same context as
    /// row by row), so steps that do not draft pay nothing for it; all but the last
    /// step's rows join just before a drafting step is timed (`Proposer::settle`).
    pending: Vec<f32>,
    /// The lm_head's rows of the drafter's draft vocabulary (greedy drafts of a plain
    /// drafter that has one), gathered once for the requests that resume this state.
    head: Option<std::sync::Arc<crate::cpu::DraftHead>>,
}

impl<'a> DFlashCpu<'a> {
    pub fn new(drafter: &'a CpuDrafter, target: &'a CpuModel) -> Result<Self> {
        Self::resume(drafter, target, DraftState::default())
    }

    /// A proposer continuing from the context `state` of an earlier request (see
    /// `into_state`); a state of another drafter is dropped.
    pub fn resume(
        drafter: &'a CpuDrafter,
        target: &'a CpuModel,
        state: DraftState,
    ) -> Result<Self> {
        drafter.config.validate_against(&target.config)?;
        let fits = state.ctx.layers() == drafter.config.num_layers
            && state
                .pending
                .len()
                .is_multiple_of((drafter.config.n_taps() * target.config.hidden_size).max(1));
        let mut state = match fits {
            true => state,
            false => DraftState {
                ctx: drafter.new_context(),
                ..Default::default()
            },
        };
        let wanted = drafter
            .draft_vocab
            .as_ref()
            .filter(|_| !drafter.is_dflash2());
        if wanted != state.head.as_ref().map(|h| h.vocab()) {
            state.head = wanted.map(|v| std::sync::Arc::new(target.draft_head(v)));
        }
        Ok(DFlashCpu {
            drafter,
            target,
            state,
        })
    }

    /// The context, for the next request to `resume` from.
    pub fn into_state(self) -> DraftState {
        self.state
    }

    /// The context with every committed row in it.
    fn context(&mut self) -> &crate::drafter::DraftContext {
        let st = &mut self.state;
        if !st.pending.is_empty() {
            self.drafter.extend_context(&mut st.ctx, &st.pending);
            st.pending.clear();
        }
        &st.ctx
    }

    fn tap_width(&self) -> usize {
        self.drafter.config.n_taps() * self.target.config.hidden_size
    }

    /// The drafter's final hidden rows for a block `[anchor, MASK...]` of `b` rows at
    /// `pos`.
    fn block_hidden(&mut self, anchor: u32, pos: usize, b: usize) -> Result<Vec<f32>> {
        let mut ids = vec![anchor];
        ids.extend(std::iter::repeat_n(
            self.drafter.config.mask_token_id,
            b - 1,
        ));
        let embeds = self.target.embed(&ids)?;
        let drafter = self.drafter;
        Ok(drafter.forward_block(self.context(), &embeds, pos))
    }

    /// `block_hidden`, and the target lm_head's logits of its `b - 1` draft rows.
    fn block(&mut self, anchor: u32, pos: usize, b: usize) -> Result<(Vec<f32>, Vec<f32>)> {
        let h = self.target.config.hidden_size;
        let hidden = self.block_hidden(anchor, pos, b)?;
        let logits = self.target.lm_head_rows(&hidden[h..], b - 1);
        Ok((hidden, logits))
    }

    /// The relative cost of a step of each block size up to `max` (`verify_cost[b]`; a
    /// plain one-row step is 1), measured on this host: the target's pass over `b` rows
    /// after a short prompt and, for `b > 1`, the drafter's block pass and the lm_head of
    /// its draft rows; best of 3, interpolated between the sizes probed.
    pub fn measure_step_costs(&mut self, max: usize, clock: &dyn Fn() -> f64) -> Result<Vec<f64>> {
        let max = max.clamp(1, self.max_block());
        let probe = probe_block_sizes(max);
        let (taps, prompt) = (self.tap_layers(), vec![0u32; 8]);
        let mut times = Vec::new();
        for &b in &probe {
            let mut best = f64::INFINITY;
            for _ in 0..3 {
                let mut cache = self.target.new_cache(prompt.len() + b);
                let out = self
                    .target
                    .forward(&prompt, &mut cache, LogitRows::None, &taps)?;
                let mut probe = DFlashCpu::new(self.drafter, self.target)?;
                probe.commit(&out.taps);
                probe.context();
                let t0 = clock();
                self.target
                    .forward(&vec![0; b], &mut cache, LogitRows::All, &taps)?;
                if b > 1 {
                    probe.draft(0, prompt.len(), b)?;
                }
                best = best.min(clock() - t0);
            }
            times.push((b, best));
        }
        Ok(interpolate_costs(&times, max))
    }
}

impl Proposer for DFlashCpu<'_> {
    fn tap_layers(&self) -> Vec<usize> {
        self.drafter.config.target_layer_ids.clone()
    }
    fn max_block(&self) -> usize {
        self.drafter.config.block_size
    }
    fn block_capacity(&self) -> usize {
        crate::limits::MAX_BLOCK_SIZE as usize
    }
    fn commit(&mut self, taps: &[f32]) {
        self.state.pending.extend_from_slice(taps);
    }
    fn context_rows(&self) -> usize {
        self.state.ctx.len + self.state.pending.len() / self.tap_width().max(1)
    }
    fn settle(&mut self, keep: usize) {
        let tap_w = self.tap_width().max(1);
        let st = &mut self.state;
        let backlog = (st.pending.len() / tap_w).saturating_sub(keep) * tap_w;
        if backlog > 0 {
            self.drafter
                .extend_context(&mut st.ctx, &st.pending[..backlog]);
            st.pending.drain(..backlog);
        }
    }
    fn truncate(&mut self, len: usize) {
        let tap_w = self.tap_width();
        let st = &mut self.state;
        if len >= st.ctx.len {
            st.pending.truncate((len - st.ctx.len) * tap_w);
        } else {
            st.pending.clear();
            st.ctx.truncate(len, self.drafter.config.kv_dim());
        }
    }
    fn draft(&mut self, anchor: u32, pos: usize, b: usize) -> Result<Vec<u32>> {
        let (h, vocab) = (
            self.target.config.hidden_size,
            self.target.config.vocab_size,
        );
        if let Some(head) = self.state.head.clone() {
            let hidden = self.block_hidden(anchor, pos, b)?;
            return Ok(head.drafts(&hidden[h..], b - 1, &self.drafter.config));
        }
        let (hidden, logits) = self.block(anchor, pos, b)?;
        if self.drafter.is_dflash2() {
            return Ok(self.drafter.select(anchor, &hidden[h..], &logits));
        }
        // The reference's argmax of `compute_logits` (multiplier, soft-cap): the raw
        // argmax but where the cap saturates two logits into a tie.
        let c = &self.drafter.config;
        let scaled: Vec<f32>;
        let logits = if c.output_multiplier != 1.0 || c.final_logit_softcapping.is_some() {
            scaled = logits.iter().map(|&x| c.draft_logit(x)).collect();
            &scaled
        } else {
            &logits
        };
        Ok((0..b - 1)
            .map(|j| argmax(&logits[j * vocab..(j + 1) * vocab]) as u32)
            .collect())
    }
    fn propose(
        &mut self,
        anchor: u32,
        pos: usize,
        b: usize,
        sampling: &SamplingParams,
    ) -> Result<Vec<Proposed>> {
        if sampling.is_greedy() || !(self.drafter.is_dflash2() || sampling.sampled_drafts) {
            return Ok(self
                .draft(anchor, pos, b)?
                .into_iter()
                .map(Proposed::certain)
                .collect());
        }
        let h = self.target.config.hidden_size;
        let (hidden, logits) = self.block(anchor, pos, b)?;
        let (t, seed) = (sampling.temperature, sampling.seed);
        Ok(match self.drafter.is_dflash2() {
            true => self
                .drafter
                .select_sampled(anchor, &hidden[h..], &logits, t, seed, pos + 1),
            false => self.drafter.sample_plain(&logits, t, seed, pos + 1),
        })
    }
}

/// Speculative generation with the DFlash drafter on the CPU reference models.
pub fn generate_speculative_cpu(
    target: &CpuModel,
    drafter: &CpuDrafter,
    tok: &TextTokenizer,
    req: &GenerateRequest,
    block: &BlockSize,
    clock: &dyn Fn() -> f64,
    on_text: &mut dyn FnMut(&str),
) -> Result<SpeculativeResult> {
    let mut p = DFlashCpu::new(drafter, target)?;
    generate_speculative_with(target, &mut p, tok, req, block, clock, on_text)
}

/// The speculative loop on the CPU reference target with any proposer.
pub fn generate_speculative_with(
    target: &CpuModel,
    proposer: &mut dyn Proposer,
    tok: &TextTokenizer,
    req: &GenerateRequest,
    block: &BlockSize,
    clock: &dyn Fn() -> f64,
    on_text: &mut dyn FnMut(&str),
) -> Result<SpeculativeResult> {
    let mut session = CpuSession::default();
    let mut g = SpeculativeGeneration::start(
        &mut session,
        target,
        proposer,
        tok,
        req,
        block,
        clock,
        on_text,
    )?;
    while !g.step(clock)? {}
    Ok(g.finish(clock))
}

/// `generate_speculative_with` one step at a time, for hosts that must yield between
/// steps (the browser worker, so that an interrupt can arrive while DFlash runs on the
/// CPU engine).
pub struct SpeculativeGeneration<'a> {
    target: &'a CpuModel,
    proposer: &'a mut dyn Proposer,
    req: &'a GenerateRequest,
    context: usize,
    taps: Vec<usize>,
    session: &'a mut CpuSession,
    cached_tokens: usize,
    history: Vec<u32>,
    anchor: u32,
    sink: TokenSink<'a>,
    blocks: BlockLoop,
    /// Rows the last step committed (1 after the prefill): what a drafting step takes
    /// into the drafter's context within its timed part (`Proposer::settle`).
    last_committed: usize,
    done: bool,
    /// Start and end of the prefill.
    times: (f64, f64),
}

impl<'a> SpeculativeGeneration<'a> {
    /// Checks the request, runs the prefill of the prompt past the rows `session` and
    /// the proposer already hold (its taps to the proposer) and takes the first token.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        session: &'a mut CpuSession,
        target: &'a CpuModel,
        proposer: &'a mut dyn Proposer,
        tok: &'a TextTokenizer,
        req: &'a GenerateRequest,
        block: &BlockSize,
        clock: &dyn Fn() -> f64,
        on_text: &'a mut dyn FnMut(&str),
    ) -> Result<Self> {
        let (context, budget) = prepare(req, &target.config)?;
        let taps = proposer.tap_layers();
        let capacity = proposer.block_capacity().max(1);
        let t0 = clock();
        let k = session
            .keep_prefix(target, &req.prompt_ids, context, true)
            .min(proposer.context_rows());
        session.truncate(k);
        proposer.truncate(k);
        let out = session.forward(target, &req.prompt_ids[k..], LogitRows::Last, &taps)?;
        proposer.commit(&out.taps);
        session.drafted = session.len();
        let history = req.prompt_ids.clone();
        let anchor = sample(&out.logits, &req.sampling, &history, history.len());
        let t1 = clock();
        let mut sink = TokenSink::new(tok, req, budget, on_text);
        let done = budget == 0 || sink.push(anchor)?;
        Ok(SpeculativeGeneration {
            target,
            proposer,
            req,
            context,
            taps,
            session,
            cached_tokens: k,
            history,
            anchor,
            sink,
            blocks: BlockLoop::new(block, capacity),
            last_committed: 1,
            done,
            times: (t0, t1),
        })
    }

    /// One draft + verify step; true when generation has ended.
    pub fn step(&mut self, clock: &dyn Fn() -> f64) -> Result<bool> {
        if self.done {
            return Ok(true);
        }
        let target = self.target;
        let vocab = target.config.vocab_size;
        let tap_w = self.taps.len() * target.config.hidden_size;
        let pos = self.session.len();
        let b = self
            .blocks
            .next_block(self.context - pos, self.sink.remaining());
        if b > 1 {
            self.proposer.settle(self.last_committed);
        }
        let t_step = clock();
        let (block_ids, proposed) = self.draft(pos, b)?;
        // Verify: one target pass over the block, with taps.
        let out = self
            .session
            .forward(target, &block_ids, LogitRows::All, &self.taps)?;
        self.history.push(self.anchor);
        let (acc, bonus) = self.accept(&out.logits, &block_ids, &proposed, pos, vocab);
        // Commit anchor + acc drafts; roll back the rest; feed the drafter their taps.
        self.session.truncate(pos + acc + 1);
        self.proposer.commit(&out.taps[..(acc + 1) * tap_w]);
        self.session.drafted = pos + acc + 1;
        self.last_committed = acc + 1;
        let committed = block_ids[1..=acc].iter().copied().chain([bonus]);
        let sink = &mut self.sink;
        self.done = self
            .blocks
            .commit_step(b, clock() - t_step, acc, committed, |t, _| sink.push(t))?;
        self.anchor = bonus;
        Ok(self.done)
    }

    /// The block `[anchor, drafts]` of `b` rows at `pos`, and the proposals drawn
    /// (rejection sampling) or none.
    fn draft(&mut self, pos: usize, b: usize) -> Result<(Vec<u32>, Vec<Proposed>)> {
        let mut block_ids = vec![self.anchor];
        let mut proposed = Vec::new();
        if b > 1 {
            let sampling = &self.req.sampling;
            let drafts = if sampling.speculative_rejection && !sampling.is_greedy() {
                proposed = self.proposer.propose(self.anchor, pos, b, sampling)?;
                proposed.iter().map(|p| p.token).collect()
            } else {
                self.proposer.draft(self.anchor, pos, b)?
            };
            let vocab = self.target.config.vocab_size;
            if drafts.len() != b - 1 || drafts.iter().any(|&d| d as usize >= vocab) {
                return Err(Error::Internal(format!(
                    "the proposer returned {} drafts for a block of {b}",
                    drafts.len()
                )));
            }
            block_ids.extend(drafts);
        }
        Ok((block_ids, proposed))
    }

    /// The accepted drafts and the bonus token of a verified block: exact match against
    /// the position-keyed sample, or rejection sampling against the proposals.
    fn accept(
        &mut self,
        logits: &[f32],
        block_ids: &[u32],
        proposed: &[Proposed],
        pos: usize,
        vocab: usize,
    ) -> (usize, u32) {
        let sampling = &self.req.sampling;
        let b = block_ids.len();
        for j in 0..b {
            let row = &logits[j * vocab..(j + 1) * vocab];
            if !proposed.is_empty() && j + 1 < b {
                // Rejection sampling against the proposal: the committed token has the
                // target's distribution.
                let p = distribution(row, sampling, &self.history);
                match verify(&p, &proposed[j], sampling.seed, (pos + j + 1) as u32) {
                    Verdict::Accept => {
                        self.history.push(block_ids[j + 1]);
                        continue;
                    }
                    Verdict::Reject(t) => return (j, t),
                }
            }
            let t = sample(row, sampling, &self.history, pos + j + 1);
            if j + 1 < b && block_ids[j + 1] == t {
                self.history.push(t);
            } else {
                return (j, t);
            }
        }
        unreachable!("the last row of a block always gives the bonus token")
    }

    /// The result: tokens, text, finish reason, timings and acceptance.
    pub fn finish(self, clock: &dyn Fn() -> f64) -> SpeculativeResult {
        let (t0, t1) = self.times;
        let n = self.req.prompt_ids.len();
        let mut r = self.sink.finish(n, t1 - t0, clock() - t1);
        r.cached_tokens = self.cached_tokens;
        self.blocks.result(r)
    }
}

/// Simulated acceptance (`dflash bench --accept-profile P1,P2,...`): entry j is the
/// probability that the draft at block slot j+1 is right given that the slots before it
/// were; slots past the profile are wrong. Replaying a plain run's own tokens as drafts
/// through the real engine then accepts what the profile says.
#[derive(Debug, Clone, PartialEq)]
pub struct AcceptProfile(pub Vec<f64>);

impl AcceptProfile {
    /// Parses `P1,P2,...`: numbers in [0, 1], at most `max_drafts` (a block's draft
    /// slots) of them.
    pub fn parse(s: &str, max_drafts: usize) -> std::result::Result<Self, String> {
        let mut v = Vec::new();
        for part in s.split(',') {
            let p: f64 = part.trim().parse().map_err(|_| {
                format!("--accept-profile: {part:?} is not a number (want P1,P2,... in [0, 1])")
            })?;
            if !(0.0..=1.0).contains(&p) {
                return Err(format!(
                    "--accept-profile: {p} is outside [0, 1] (each entry is a probability)"
                ));
            }
            v.push(p);
        }
        if v.len() > max_drafts {
            return Err(format!(
                "--accept-profile: {} entries, but a block has {max_drafts} draft slots",
                v.len()
            ));
        }
        Ok(AcceptProfile(v))
    }

    /// Drafts for block slots 1.. : `truth[j]` is the token the target will produce at
    /// slot j+1 if the slots before it are accepted (None: past the run's end). A right
    /// draft is that token; a wrong one any other token below `vocab`.
    pub fn drafts(
        &self,
        truth: &[Option<u32>],
        vocab: usize,
        rng: &mut crate::rng::Rng,
    ) -> Vec<u32> {
        let mut right = true;
        truth
            .iter()
            .enumerate()
            .map(|(j, t)| {
                let p = self.0.get(j).copied().unwrap_or(0.0);
                let u = (rng.uniform() as f64 + 1.0) / 2.0; // [0, 1)
                right &= t.is_some() && u < p;
                match (*t, right) {
                    (Some(t), true) => t,
                    (Some(t), false) if vocab > 1 => {
                        ((t as usize + 1 + rng.below(vocab - 1)) % vocab) as u32
                    }
                    _ => rng.below(vocab) as u32,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod accept_profile_tests {
    use super::AcceptProfile;
    use crate::rng::Rng;

    #[test]
    fn parses_probabilities_and_rejects_the_rest() {
        assert_eq!(
            AcceptProfile::parse("1, 0.5,0", 15).unwrap(),
            AcceptProfile(vec![1.0, 0.5, 0.0])
        );
        for bad in ["1.5", "-0.1", "x", "", "0.5,,1", "NaN", "inf"] {
            assert!(AcceptProfile::parse(bad, 15).is_err(), "{bad}");
        }
        assert!(AcceptProfile::parse("1,1,1", 2).is_err());
    }

    #[test]
    fn drafts_are_right_exactly_as_the_profile_says() {
        let truth: Vec<Option<u32>> = (10..25).map(Some).collect();
        let mut rng = Rng(1);
        let ones = AcceptProfile(vec![1.0; 3]).drafts(&truth, 100, &mut rng);
        assert_eq!(&ones[..3], &[10, 11, 12]);
        assert!(ones[3..]
            .iter()
            .zip(&truth[3..])
            .all(|(&d, t)| Some(d) != *t));
        let zero = AcceptProfile(vec![0.0]).drafts(&truth, 100, &mut rng);
        assert!(zero
            .iter()
            .zip(&truth)
            .all(|(&d, t)| Some(d) != *t && d < 100));
        // Past the run's end nothing is right.
        let end = AcceptProfile(vec![1.0; 3]).drafts(&[Some(4), None, Some(6)], 100, &mut rng);
        assert_eq!(end[0], 4);
        // Half: about half of the first slots are right.
        let hits = (0..2000)
            .filter(|_| AcceptProfile(vec![0.5]).drafts(&truth[..1], 100, &mut rng)[0] == 10)
            .count();
        assert!((850..1150).contains(&hits), "{hits}");
    }
}

#[cfg(test)]
mod settle_tests {
    use super::*;
    use crate::cpu::{CpuKernels, LogitRows};
    use crate::drafter::random::{write_drafter, DrafterSpec};
    use crate::drafter::{CpuDrafter, DrafterPrecision, DrafterWeights};
    use crate::formats::ggml::GgmlType;
    use crate::model_files::load_gguf;
    use crate::testutil::{random_weights, tiny_drafter_target, write_gguf};

    /// `settle(keep)` takes every waiting row but the last `keep` into the drafter's
    /// context (nothing when at most `keep` wait), and the block drafted after it is the
    /// one drafted with every row taken in at once, on both kernels.
    #[test]
    fn settle_takes_in_all_but_the_last_rows_and_drafts_the_same() {
        let c = tiny_drafter_target();
        let t = load_gguf(&write_gguf(&c, &random_weights(&c, 41), GgmlType::Q8_0)).unwrap();
        let files = write_drafter(&c, &DrafterSpec::new(&c, 2, 3));
        let config = std::str::from_utf8(&files["config.json"]).unwrap();
        let safetensors = vec![("model.safetensors", &files["model.safetensors"][..])];
        let w = DrafterWeights::load(config, safetensors, DrafterPrecision::Q8).unwrap();
        let prompt: Vec<u32> = (0..12).map(|i| 7 + 13 * i).collect();
        for kernels in [CpuKernels::Reference, CpuKernels::Quantized] {
            let cpu = CpuModel::with_kernels(&t.weights, kernels);
            let d = CpuDrafter::with_kernels(&w, kernels);
            let mut cache = cpu.new_cache(64);
            let taps = cpu
                .forward(
                    &prompt,
                    &mut cache,
                    LogitRows::None,
                    &w.config.target_layer_ids,
                )
                .unwrap()
                .taps;
            let mut settled = DFlashCpu::new(&d, &cpu).unwrap();
            let mut late = DFlashCpu::new(&d, &cpu).unwrap();
            settled.commit(&taps);
            late.commit(&taps);
            let tap_w = settled.tap_width();
            let held = |p: &DFlashCpu| (p.state.ctx.len, p.state.pending.len() / tap_w);
            settled.settle(3);
            assert_eq!(held(&settled), (9, 3), "{kernels:?}");
            settled.settle(5);
            assert_eq!(held(&settled), (9, 3), "{kernels:?}: only 3 wait");
            assert_eq!(settled.context_rows(), 12);
            let block = settled.draft(5, 12, 4).unwrap();
            assert_eq!(block, late.draft(5, 12, 4).unwrap(), "{kernels:?}");
            assert_eq!(held(&settled), (12, 0));
        }
    }
}
