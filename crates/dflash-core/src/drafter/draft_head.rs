//! The greedy drafts of a drafter with a draft vocabulary: its rows of the target's
//! output head, gathered once, and each drafted row's best id among them.

use super::config::DrafterConfig;
use super::draft_vocab::DraftVocab;
use crate::cpu::matrix::Matrix;
use crate::cpu::quant_matmul::in_pool;
use crate::cpu::CpuModel;

/// A target lm_head's rows of a drafter's draft vocabulary (`DraftHead::gather`).
pub struct DraftHead {
    rows: Matrix,
    vocab: DraftVocab,
}

impl DraftHead {
    /// The rows of `target`'s output head for `vocab`.
    pub fn gather(target: &CpuModel, vocab: &DraftVocab) -> Self {
        DraftHead {
            rows: target.head_matrix().gather_rows(vocab.ids()),
            vocab: vocab.clone(),
        }
    }

    /// The draft vocabulary whose rows these are.
    pub fn vocab(&self) -> &DraftVocab {
        &self.vocab
    }

    /// The greedy drafts of `n` normalised drafter rows `x`: each row's largest logit
    /// among the draft vocabulary (as `c` scales and caps draft logits), as a token id.
    pub fn drafts(&self, x: &[f32], n: usize, c: &DrafterConfig) -> Vec<u32> {
        let mut logits = in_pool(|| self.rows.apply(x, n));
        if c.output_multiplier != 1.0 || c.final_logit_softcapping.is_some() {
            logits.iter_mut().for_each(|v| *v = c.draft_logit(*v));
        }
        logits
            .chunks_exact(self.vocab.len())
            .map(|row| self.vocab.argmax(row))
            .collect()
    }
}
