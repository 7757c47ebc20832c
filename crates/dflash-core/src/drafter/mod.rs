//! DFlash drafters in the z-lab format (config.json + safetensors): loading, validation
//! against the target, and the CPU reference of the drafter's forward pass.
//!
//! The drafter conditions on the target's hidden states: committed rows of taps
//! (`target_layer_ids`, concatenated) go through `hidden_norm(fc(.))` into a persistent
//! per-layer context K/V cache; a block `[anchor, MASK x (B-1)]` at absolute positions
//! attends to `[context | block]` (full layers without a mask; sliding layers causal in
//! the block and within their window, as z-lab's reference masks them; `is_causal`
//! overrides); the target's lm_head reads the block.

pub mod config;
mod cpu;
mod dflash2;
mod draft_head;
pub mod draft_vocab;
pub mod file;
pub mod random;
mod weights;
pub use config::*;
pub use cpu::{grouped_conv, top_k, CpuDrafter, DraftContext, Probe};
pub use dflash2::Candidates;
pub use draft_head::DraftHead;
pub use draft_vocab::{DraftVocab, D2T_FILE, DRAFT_VOCAB_FILE};
pub use file::DrafterFile;
#[cfg(not(target_arch = "wasm32"))]
pub use weights::load_drafter_dir;
pub use weights::{
    DrafterLayer, DrafterPrecision, DrafterWeights, GroupedConv, LayerConvs, Selector,
};
