//! What drafts a block (`Proposer`), and DFlash's drafter on the CPU engines
//! (`DFlashCpu`), whose context (`DraftState`) a host keeps between requests.

use super::policy::*;
use crate::cpu::ops::argmax;
use crate::cpu::{CpuModel, LogitRows};
use crate::drafter::CpuDrafter;
use crate::error::Result;
use crate::rejection::Proposed;
use crate::sampling::SamplingParams;

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
    head: Option<std::sync::Arc<crate::drafter::DraftHead>>,
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
            state.head =
                wanted.map(|v| std::sync::Arc::new(crate::drafter::DraftHead::gather(target, v)));
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
    fn context(&mut self) -> &mut crate::drafter::DraftContext {
        let st = &mut self.state;
        if !st.pending.is_empty() {
            self.drafter.extend_context(&mut st.ctx, &st.pending);
            st.pending.clear();
        }
        &mut st.ctx
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
        let ctx = self.context();
        debug_assert_eq!(ctx.len, pos, "the block follows the committed rows");
        Ok(drafter.forward_block(ctx, &embeds))
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
