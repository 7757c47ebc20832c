//! Typed errors of the GPU engine.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum GpuError {
    #[error("no GPU adapter found{0}")]
    NoAdapter(String),
    #[error("could not open the GPU device: {0}")]
    RequestDevice(String),
    #[error("{what} needs {need} bytes but the adapter allows {limit} ({limit_name})")]
    LimitExceeded {
        what: String,
        need: u64,
        limit: u64,
        limit_name: &'static str,
    },
    #[error("the model needs {need} bytes of GPU memory (weights {weights}, KV cache {kv_cache}, activations {activations}); the budget is {budget}")]
    OverBudget {
        need: u64,
        weights: u64,
        kv_cache: u64,
        activations: u64,
        budget: u64,
    },
    #[error("the adapter does not meet a requirement: {0}")]
    Unsupported(String),
    #[error("out of GPU memory while allocating {0}")]
    OutOfMemory(String),
    #[error("the GPU device was lost: {0}")]
    DeviceLost(String),
    #[error("GPU validation error: {0}")]
    Validation(String),
    #[error("reading back from the GPU failed: {0}")]
    Readback(String),
    #[error("{0}")]
    Core(#[from] dflash_core::Error),
}

pub type Result<T> = std::result::Result<T, GpuError>;
