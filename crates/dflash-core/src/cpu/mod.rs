//! The CPU reference engine: plain-Rust f32 math, the oracle of every GPU kernel.

pub mod delta_net;
pub(crate) mod layer;
pub mod matrix;
pub mod model;
pub mod ops;
pub mod packed;
pub mod quant_matmul;

pub use model::{CpuKernels, CpuModel, ForwardOutput, KvCache, LogitRows};
