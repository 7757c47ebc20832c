//! dflash-gpu: the WebGPU engine shared by the browser and the native benchmark.
//! The same Rust and the same WGSL (`shaders/`) on every Vulkan / Metal / DX12 device,
//! on lavapipe in CI and on the browser's WebGPU.
//!
//! The public surface:
//! - [`GpuContext`] (adapter, device, limits; [`GpuOptions`]) and [`GpuModel`] (a target's
//!   weights uploaded as [`GpuWeights`], its KV cache and recorded plans;
//!   [`GpuModelOptions`], [`MemoryPlan`]); [`StreamLoader`] uploads a GGUF as it arrives.
//! - [`generate`]: plain decoding; [`speculative::Speculative`]: DFlash / DFlash2 (the
//!   drafter, the step, its plan cache and step costs); both driven by dflash-core's
//!   shared loop (`BlockLoop`, `TokenSink`).
//! - [`ops`] and [`pipelines`]: the kernels and their typed parameter structs, for tests
//!   and the profiler ([`profile`], native only); [`synthetic`]: random weights of a
//!   named shape for `dflash bench --synthetic`.
//! - Errors: [`GpuError`] and [`Result`].
//!
//! The `testutil` feature adds the tests' hooks (host drafts, read-backs of the last
//! block); neither the CLI nor the wasm package enables it.

pub(crate) mod blocks;
pub mod context;
pub mod error;
pub mod generate;
mod int8_scratch;
mod kernel;
pub mod model;
pub mod ops;
pub mod pipelines;
#[cfg(not(target_arch = "wasm32"))]
pub mod profile;
pub mod speculative;
pub mod stream_load;
pub mod synthetic;
mod tuning;
pub mod upload;

pub use context::{GpuContext, GpuOptions};
pub use error::{GpuError, Result};
pub use model::{GpuModel, GpuModelOptions, GpuWeights, MemoryPlan};
pub use stream_load::{StreamLoader, StreamedModel};
