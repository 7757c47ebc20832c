//! DFlash2's selection on the CPU reference: each slot's top-K candidates from the
//! lm_head and the selector's walk over them (greedy, or sampled for rejection sampling).

use super::*;
use crate::cpu::ops::{argmax, dot};

/// DFlash2's candidates of the slots after the anchor and the selector's scores.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidates {
    /// `[slots][K]` token ids, each slot's lm_head top-K (descending, ties by index).
    pub ids: Vec<Vec<u32>>,
    /// `[slots][K]` their logits after `output_multiplier` and soft-capping.
    pub unary: Vec<Vec<f32>>,
}

impl CpuDrafter {
    pub fn is_dflash2(&self) -> bool {
        self.selector.is_some()
    }

    /// The top-K candidates of each slot from its lm_head logits (`[slots, V]`), K the
    /// config's `candidate_count`.
    pub fn candidates(&self, logits: &[f32]) -> Candidates {
        let v = self.config.vocab_size;
        let (mut ids, mut unary) = (Vec::new(), Vec::new());
        for row in logits.chunks(v) {
            let top = top_k(row, self.config.candidate_count());
            ids.push(top.iter().map(|t| t.0).collect());
            unary.push(top.iter().map(|t| self.config.draft_logit(t.1)).collect());
        }
        Candidates { ids, unary }
    }

    /// The selector's projection of the slots' final hidden rows (`[slots, rank]`).
    pub fn selector_projection(&self, hidden: &[f32]) -> Vec<f32> {
        let s = self.selector.as_ref().expect("a DFlash2 drafter");
        s.hidden_projection
            .apply(hidden, hidden.len() / self.config.hidden_size)
    }

    /// Selector scores of slot `l`'s candidates after predecessor token `pred`:
    /// `unary[c] + sum_r A[pred, r] * hp[r] * B[c, r]`, `hp` the slot's projected hidden.
    pub fn edge_scores(&self, cand: &Candidates, l: usize, pred: u32, hp: &[f32]) -> Vec<f32> {
        let s = self.selector.as_ref().expect("a DFlash2 drafter");
        let rank = hp.len();
        let a = &s.predecessor[pred as usize * rank..(pred as usize + 1) * rank];
        let ah: Vec<f32> = a.iter().zip(hp).map(|(x, y)| x * y).collect();
        cand.ids[l]
            .iter()
            .zip(&cand.unary[l])
            .map(|(&c, &u)| {
                u + dot(
                    &ah,
                    &s.successor[c as usize * rank..(c as usize + 1) * rank],
                )
            })
            .collect()
    }

    /// DFlash2's drafts: candidates per slot, then the greedy walk from the anchor, each
    /// slot taking its best-scoring candidate after the previous choice (ties: lowest
    /// candidate index). `hidden` holds the final rows of the slots after the anchor.
    pub fn select(&self, anchor: u32, hidden: &[f32], logits: &[f32]) -> Vec<u32> {
        self.walk(anchor, hidden, logits, |_, ids, scores| {
            let t = ids[argmax(scores)];
            (t, t)
        })
    }

    /// DFlash2's walk at temperature `t` > 0: each slot draws among its candidates from
    /// softmax(scores / t) by Gumbel-max (noise keyed by seed, the slot's absolute
    /// position and the candidate token) and records that distribution as the proposal
    /// q for rejection sampling. `first_position`: the absolute position of slot 1.
    pub fn select_sampled(
        &self,
        anchor: u32,
        hidden: &[f32],
        logits: &[f32],
        t: f32,
        seed: u64,
        first_position: usize,
    ) -> Vec<crate::rejection::Proposed> {
        self.walk(anchor, hidden, logits, |l, ids, scores| {
            let pick =
                crate::rejection::gumbel_pick(ids, scores, t, seed, (first_position + l) as u32);
            (pick.token, pick)
        })
    }

    /// A plain DFlash drafter's proposal at temperature `t` > 0 for rejection sampling:
    /// each slot draws among its candidates from softmax(draft logits / t) by Gumbel-max
    /// (keyed by seed, the slot's absolute position and the token, as DFlash2's walk)
    /// and records that distribution as q. `first_position`: the position of slot 1.
    pub fn sample_plain(
        &self,
        logits: &[f32],
        t: f32,
        seed: u64,
        first_position: usize,
    ) -> Vec<crate::rejection::Proposed> {
        let cand = self.candidates(logits);
        (0..cand.ids.len())
            .map(|l| {
                let pos = (first_position + l) as u32;
                crate::rejection::gumbel_pick(&cand.ids[l], &cand.unary[l], t, seed, pos)
            })
            .collect()
    }

    /// The walk from the anchor: slot by slot, `pick(slot, candidate ids, scores after
    /// the previous choice)` chooses a token.
    fn walk<T>(
        &self,
        anchor: u32,
        hidden: &[f32],
        logits: &[f32],
        mut pick: impl FnMut(usize, &[u32], &[f32]) -> (u32, T),
    ) -> Vec<T> {
        let slots = hidden.len() / self.config.hidden_size;
        let cand = self.candidates(logits);
        let hp = self.selector_projection(hidden);
        let rank = hp.len() / slots.max(1);
        let mut pred = anchor;
        let mut out = Vec::with_capacity(slots);
        for l in 0..slots {
            let scores = self.edge_scores(&cand, l, pred, &hp[l * rank..(l + 1) * rank]);
            let (token, x) = pick(l, &cand.ids[l], &scores);
            pred = token;
            out.push(x);
        }
        out
    }
}
