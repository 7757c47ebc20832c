//! How many rows each step verifies: a fixed block, or auto mode choosing the block
//! that maximises expected tokens per unit of cost from the running acceptance rates
//! (`Acceptance`) and the device's step costs (a prior, `StepCostPrior`, refined from the
//! steps' own times, `StepCosts`).
//!
//! # Auto mode
//!
//! `BlockSize::Auto` picks each step's block from the running per-position acceptance and
//! the measured cost of verifying b rows on the device: measured by the bench
//! (`Speculative::measure_step_costs`, `crates/dflash-gpu/src/speculative/costs.rs`:
//! context extension, drafting and verification of b rows against a one-row step that
//! drafts nothing); elsewhere a prior, `StepCostPrior`, fitted to the costs measured on a
//! GPU, a CPU adapter and the CPU engine, so that no request waits. Either way the costs
//! are refined by the running steps, `StepCosts`: in the GPU engine only by a step that
//! follows a step of its own size and did not build its plan
//! (`speculative::step_seconds`: a probe after k one-row steps carries their k deferred
//! rows of context extension, and builds and compiles that extension's plan the first
//! time, which on lavapipe had refined the 2-row cost to 1.7-2.2 one-row steps against a
//! measured 1.5); in the CPU loop (`SpeculativeGeneration::step`) the proposer takes that
//! backlog, and the prompt's, into its context before a drafting step's clock starts
//! (`Proposer::settle`), keeping back only the last step's rows (on the CPU engine a
//! probe had refined the 2-row cost to 1.95 against 1.35-1.40). The refined costs are
//! kept for the next request: by the engine (`dflash_engine::policy::StepCostMemory`, so
//! `dflash serve` and the browser engine; the first auto request of an engine starts from
//! `Runner::step_cost_prior`) and by the bench.
//!
//! Refinement scales the sizes that have not run by the ones that have, so a generation
//! whose timed drafting steps pay less than `speculative::BASELINE_MARGIN` (1.5x) plain
//! decoding times its own one-row steps before drafting again, the baseline every cost is
//! relative to. Auto mode picks b = 1, no drafter work at all, while drafts do not pay,
//! and probes a drafting step after `speculative::probe_interval` idle steps: at least
//! 16, and as many as keep the probes' extra cost within 2% of the time, so where rows
//! are dear, as on lavapipe, a drafter that cannot pay costs at most that, besides the
//! backlog of drafter context a probe takes in (on the CPU engine outside its clock,
//! about what the idle steps would have paid for it as they went).
//!
//! # A request's block
//!
//! A request's `block` (a number of rows, or `"auto"`, the default) becomes a `BlockSize`
//! in `crates/dflash-engine/src/policy.rs` (`block_policy`; 0 rows or another name is
//! `BadRequest`); a fixed block may exceed the drafter's own, as in z-lab's reference,
//! and the engine clamps it to what its step holds (16 rows on the GPU).

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
    /// The quantized CPU engine, for a target that reads this many weight bytes per
    /// token: rows are dearer beside a small model's stream than beside a large one's.
    /// Measured (`measure_step_costs`, avx512-vnni, 2 threads, d482f5a-03988e8):
    /// SmolLM2-135M Q4_1 (98 MB) 1.49 at b = 2, 1.84 at 4, 2.83 at 8; synthetic
    /// qwen3-4b Q4_K_M (3.4 GB) 1.38, 1.50, 2.21. Between them the fit is interpolated
    /// on the logarithm of the bytes.
    CpuEngine { weight_bytes: u64 },
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
            StepCostPrior::CpuEngine { weight_bytes } => cpu_engine_fit(weight_bytes),
        };
        (0..=max.max(1))
            .map(|b| match b {
                0 | 1 => 1.0,
                _ => 1.0 + fixed + slope * (b - 1) as f64,
            })
            .collect()
    }
}

/// `(fixed, slope)` of the CPU engine's prior (see `StepCostPrior::CpuEngine`): each
/// measured shape's line through b = 2 and b = 8 (the costs bend upward, so b = 4 lies
/// up to 0.16 below it and b = 16 above it), interpolated between the shapes on
/// log(bytes) and held past them.
fn cpu_engine_fit(weight_bytes: u64) -> (f64, f64) {
    const SMALL: (f64, f64, f64) = (98e6, 0.2667, 0.2233);
    const LARGE: (f64, f64, f64) = (3.4e9, 0.2417, 0.1383);
    let x = ((weight_bytes.max(1) as f64).ln() - SMALL.0.ln()) / (LARGE.0.ln() - SMALL.0.ln());
    let t = x.clamp(0.0, 1.0);
    (
        SMALL.1 + t * (LARGE.1 - SMALL.1),
        SMALL.2 + t * (LARGE.2 - SMALL.2),
    )
}

/// Per-position acceptance: `accepted[j]` of `tried[j]` drafts at block slot j+1, and
/// `reached[j]` of those tried after every slot before was accepted (the steps that tell
/// slot j+1's conditional rate).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Acceptance {
    pub accepted: Vec<u64>,
    pub tried: Vec<u64>,
    pub reached: Vec<u64>,
}

impl Acceptance {
    /// Records a step that proposed `drafts` drafts and accepted `acc`.
    pub fn record_step(&mut self, drafts: usize, acc: usize) {
        if self.tried.len() < drafts {
            self.tried.resize(drafts, 0);
            self.accepted.resize(drafts, 0);
            self.reached.resize(drafts, 0);
        }
        for j in 0..drafts {
            self.tried[j] += 1;
            if j <= acc {
                self.reached[j] += 1;
            }
            if j < acc {
                self.accepted[j] += 1;
            }
        }
    }
    /// Conditional acceptance rate of slot j+1 given slot j was accepted: its counts
    /// (accepted of reached) with a prior of weight [`NEIGHBOUR_WEIGHT`] whose mean is
    /// the slot before's rate (0.5 for the first slot). A slot no step has reached takes its
    /// neighbour's rate: drafts right in the first slots are likely right a little
    /// further on, so auto mode tries a longer block and measures it instead of
    /// settling on the slots it has seen.
    fn conditional(&self, j: usize) -> f64 {
        let mut rate = 0.5;
        for slot in 0..=j {
            let reached = self.reached.get(slot).copied().unwrap_or(0);
            let acc = self.accepted.get(slot).copied().unwrap_or(0);
            let w = NEIGHBOUR_WEIGHT;
            rate = (acc as f64 + w * rate) / (reached as f64 + w);
        }
        rate
    }
    /// Adds another run's counts (per-prompt results into a whole benchmark's).
    pub fn add(&mut self, other: &Acceptance) {
        let n = self.tried.len().max(other.tried.len());
        self.tried.resize(n, 0);
        self.accepted.resize(n, 0);
        self.reached.resize(n, 0);
        for (j, &t) in other.tried.iter().enumerate() {
            self.accepted[j] += other.accepted.get(j).copied().unwrap_or(0);
            self.tried[j] += t;
            self.reached[j] += other.reached.get(j).copied().unwrap_or(0);
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

/// How many steps the neighbour's rate counts for in a slot's estimate: few enough that
/// a slot's own counts soon decide, enough that one unlucky step at a slot seldom
/// reached does not cut the block short. Simulated at a flat 0.8656 per slot with
/// qwen3-4b's CPU step costs (2.24 one-row steps at 8 rows), 128-token generations:
/// weight 2 reached 2.06 tokens per unit of cost, 4 reached 2.22 (the best fixed block,
/// 8: 2.27); a decaying profile, a cliff after 3 slots and SmolLM2's low rates were as
/// good or better.
pub const NEIGHBOUR_WEIGHT: f64 = 4.0;

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
pub(crate) fn block_values(
    verify_cost: &[f64],
    acc: &Acceptance,
    max_block: usize,
) -> Vec<(usize, f64)> {
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

pub(crate) fn best_of(values: impl Iterator<Item = (usize, f64)>) -> Option<usize> {
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
/// drafting does not pay for itself, with a probe before any draft has been tried and
/// after [`probe_interval`] idle steps.
pub fn choose_block(policy: &BlockSize, acc: &Acceptance, max_block: usize, idle: usize) -> usize {
    match policy {
        BlockSize::Fixed(b) => (*b).clamp(1, max_block),
        BlockSize::Auto { verify_cost } => {
            let values = block_values(verify_cost, acc, max_block);
            let best = best_of(values.iter().copied()).unwrap_or(1);
            // Before any draft is tried, a probe at once: the prior's rates are a guess.
            let fresh = acc.tried.is_empty();
            if best == 1 && (fresh || idle >= PROBE_EVERY) {
                let probe = best_of(values.into_iter().filter(|&(b, _)| b > 1)).unwrap_or(1);
                if probe > 1 && (fresh || idle >= probe_interval(verify_cost, probe)) {
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
pub(crate) fn marginal(verify_cost: &[f64], acc: &Acceptance, b: usize) -> bool {
    let values = block_values(verify_cost, acc, b);
    match (values.first(), values.last()) {
        (Some(&(1, plain)), Some(&(last, value))) if last == b => value < BASELINE_MARGIN * plain,
        _ => false,
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
