//! dflash-train: turns a supported target into a DFlash drafter (z-lab format).
//! `data` (self-distillation), `train` (block-diffusion drafting loss), `eval` (tau through
//! the engine's speculative loop) and `export` (config.json + bf16 safetensors).
//!
//! The public surface, the four steps of the `dflash-train` binary: [`data::distill`],
//! [`train::train`] with its [`train::TrainConfig`] (resumable from its checkpoint),
//! [`eval::evaluate`] and [`export::export`]; and what they are made of: [`draft_model`]
//! (the candle drafter, the same math as dflash-core's `CpuDrafter`), [`target`] (the
//! frozen target's taps), [`head_loss`], [`nn`], [`optim`], and [`TrainError`].

pub mod data;
pub mod draft_model;
pub mod eval;
pub mod export;
pub mod head_loss;
pub mod init;
pub mod nn;
pub mod optim;
pub mod params;
pub mod progress;
pub mod prompts;
pub mod self_prompts;
pub mod target;
pub mod train;

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Core(#[from] dflash_core::Error),
    #[error("tensor error: {0}")]
    Candle(#[from] candle_core::Error),
    #[error("i/o: {0}")]
    Io(String),
    #[error("bad data: {0}")]
    Data(String),
    #[error("bad checkpoint: {0}")]
    Checkpoint(String),
    #[error("usage: {0}")]
    Usage(String),
}
