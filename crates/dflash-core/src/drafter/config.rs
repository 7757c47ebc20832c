//! A drafter's configuration as the engines use it (`DrafterConfig`, validated from the
//! file's schema, `super::file::DrafterFile`), and its checks against the target.

use crate::config::{ModelConfig, Rope};
use crate::error::{Error, Result};

/// A plain DFlash drafter's sampled proposal (rejection sampling at T > 0) draws each
/// slot among its top this many draft logits, at the request's temperature.
pub const PLAIN_DRAFT_CANDIDATES: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    Full,
    Sliding,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DrafterConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    /// NEOX pairs over whole heads (`dim` = `head_dim`).
    pub rope: Rope,
    pub vocab_size: usize,
    pub layer_kinds: Vec<LayerKind>,
    /// The window of sliding layers: a block row at position q sees keys at p with
    /// `q - p < sliding_window` (and, where the layer is not causal, `p - q <` it too).
    pub sliding_window: usize,
    /// The file's `is_causal`, for every layer; None: sliding layers are causal inside
    /// the block and full layers see the whole block (the reference's default).
    pub is_causal: Option<bool>,
    pub num_target_layers: usize,
    pub block_size: usize,
    pub mask_token_id: u32,
    pub target_layer_ids: Vec<usize>,
    /// "DFlashDraftModel" or "DFlash2DraftModel".
    pub architecture: String,
    /// Multiplies the block's input embeddings (1: off).
    pub input_embedding_scale: f32,
    /// Multiplies the draft logits before soft-capping (positive; 1: off).
    pub output_multiplier: f32,
    /// `tanh(x / cap) * cap` on the draft logits (None: off).
    pub final_logit_softcapping: Option<f32>,
    /// The DFlash2 extras (grouped dynamic convolution, candidate selector).
    pub dflash2: Option<DFlash2Config>,
}

/// DFlash2's fields (`dflash_config` or top level); the trainer's run config keeps them
/// too.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DFlash2Config {
    /// Causal taps of each dynamic convolution.
    pub conv_kernel_size: usize,
    /// Channels sharing one dynamic kernel delta.
    pub conv_group_size: usize,
    pub selector_rank: usize,
    /// Candidates kept per slot from the lm_head.
    pub selector_top_k: usize,
}

impl DFlash2Config {
    pub fn num_groups(&self, hidden: usize) -> usize {
        hidden / self.conv_group_size
    }
    /// Outputs of a convolution's kernel projection: `2 * taps * groups`.
    pub fn projection_rows(&self, hidden: usize) -> usize {
        2 * self.conv_kernel_size * self.num_groups(hidden)
    }
}

impl DrafterConfig {
    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }
    pub fn n_taps(&self) -> usize {
        self.target_layer_ids.len()
    }

    /// Whether a layer of this kind is causal inside the block.
    pub fn is_causal(&self, kind: LayerKind) -> bool {
        self.is_causal.unwrap_or(kind == LayerKind::Sliding)
    }

    /// The window of a layer of this kind (None on full layers).
    pub fn window(&self, kind: LayerKind) -> Option<usize> {
        (kind == LayerKind::Sliding).then_some(self.sliding_window)
    }

    /// The candidates a sampled proposal draws among per slot (rejection sampling at
    /// T > 0): DFlash2's `selector_top_k`, a plain drafter's top
    /// [`PLAIN_DRAFT_CANDIDATES`] draft logits.
    pub fn candidate_count(&self) -> usize {
        self.dflash2
            .as_ref()
            .map_or(PLAIN_DRAFT_CANDIDATES, |d| d.selector_top_k)
            .min(self.vocab_size)
    }

    /// A draft logit as the reference's `compute_logits` gives it: times
    /// `output_multiplier`, then soft-capped.
    pub fn draft_logit(&self, x: f32) -> f32 {
        let x = x * self.output_multiplier;
        match self.final_logit_softcapping {
            Some(cap) => crate::math::tanh(x / cap) * cap,
            None => x,
        }
    }

    /// The default tap layers: one draft layer taps the middle target layer; otherwise
    /// `n` ids spread evenly from 1 to N-3, rounded.
    pub fn default_target_layer_ids(n_draft: usize, n_target: usize) -> Vec<usize> {
        if n_draft == 1 {
            return vec![n_target / 2];
        }
        let (lo, hi) = (1.0f64, n_target as f64 - 3.0);
        (0..n_draft)
            .map(|i| {
                // Python's round, as z-lab's `build_target_layer_ids`: ties to even.
                (lo + i as f64 * (hi - lo) / (n_draft - 1) as f64)
                    .round_ties_even()
                    .max(0.0) as usize
            })
            .collect()
    }

    /// Checks the drafter against its target: one typed error per mismatch.
    pub fn validate_against(&self, t: &ModelConfig) -> Result<()> {
        let mismatch = |field: &'static str, d: String, t: String| {
            Err(Error::DrafterMismatch {
                field,
                drafter: d,
                target: t,
            })
        };
        if self.hidden_size != t.hidden_size {
            return mismatch(
                "hidden_size",
                self.hidden_size.to_string(),
                t.hidden_size.to_string(),
            );
        }
        if self.vocab_size != t.vocab_size {
            return mismatch(
                "vocab_size",
                self.vocab_size.to_string(),
                t.vocab_size.to_string(),
            );
        }
        if self.num_target_layers != t.num_layers {
            return mismatch(
                "num_target_layers",
                self.num_target_layers.to_string(),
                t.num_layers.to_string(),
            );
        }
        if let Some(&bad) = self.target_layer_ids.iter().find(|&&i| i >= t.num_layers) {
            return mismatch(
                "target_layer_ids",
                format!("{:?} (layer {bad})", self.target_layer_ids),
                format!("{} layers", t.num_layers),
            );
        }
        if self.mask_token_id as usize >= t.vocab_size {
            return mismatch(
                "mask_token_id",
                self.mask_token_id.to_string(),
                format!("a vocabulary of {}", t.vocab_size),
            );
        }
        if !(self.rope.theta > 0.0) || self.head_dim > 256 {
            return mismatch(
                "rope settings",
                format!("rope_theta {} head_dim {}", self.rope.theta, self.head_dim),
                "positive theta, head_dim <= 256".into(),
            );
        }
        Ok(())
    }

    pub fn rope_inv_freq(&self) -> Vec<f32> {
        self.rope.inv_freq()
    }
}
