//! dflash-train: turns a supported target into a DFlash drafter (z-lab format).
//! `data` (self-distillation), `train` (block-diffusion drafting loss), `eval` (tau through
//! the engine's speculative loop) and `export` (config.json + bf16 safetensors).

pub mod data;
pub mod draft_model;
pub mod eval;
pub mod export;
pub mod head_loss;
pub mod nn;
pub mod optim;
pub mod prompts;
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
