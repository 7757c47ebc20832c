//! The CPU reference engine: plain-Rust f32 math, the oracle of every GPU kernel.

pub mod model;
pub mod ops;

pub use model::{CpuModel, ForwardOutput, KvCache, LogitRows};
