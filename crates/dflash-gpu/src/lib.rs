//! dflash-gpu: the WebGPU engine shared by the browser and the native benchmark.
//! The same Rust and the same WGSL (`shaders/`) on every Vulkan / Metal / DX12 device,
//! on lavapipe in CI and on the browser's WebGPU.

pub(crate) mod blocks;
pub mod context;
pub mod dflash;
pub mod error;
pub mod generate;
pub mod model;
pub mod ops;
pub mod pipelines;
#[cfg(not(target_arch = "wasm32"))]
pub mod profile;
pub mod stream_load;
pub mod synthetic;
pub mod upload;

pub use context::{GpuContext, GpuOptions};
pub use error::{GpuError, Result};
pub use model::{GpuModel, GpuModelOptions, GpuWeights, MemoryPlan};
pub use stream_load::{StreamLoader, StreamedModel};
