//! The engine behind every host: the browser worker (`dflash-web`), `dflash serve` and
//! `dflash generate` load a model into an [`Engine`] and hand it requests; what a request
//! means, which engine runs it, how DFlash's block is chosen, what the answer looks like
//! and which typed error a failure is, is decided here once.
//!
//! - [`request`]: the OpenAI-style chat and completion requests, parsed and checked, and
//!   turned into the core's `GenerateRequest`.
//! - [`policy`]: the block policy (a fixed block or auto mode) and the step costs auto
//!   mode remembers across requests.
//! - [`runner`]: the loaded model as it runs: {GPU, CPU} x {plain, DFlash}, with the KV
//!   rows and drafter context kept for the next request of a conversation.
//! - [`engine`]: [`Engine`], one entry point for a request, streaming text pieces to a
//!   callback and ending in an [`Answer`]; [`Host`] is what a host provides (a clock, and a
//!   pause between steps for an event loop).
//! - [`response`]: OpenAI's response objects and stream chunks.
//! - [`errors`]: every failure as one typed code and HTTP status.
//! - `device` (native): opening a device and building the engine on it, the CPU engine
//!   where the only adapter is a software one.

pub mod engine;
pub mod errors;
pub mod policy;
pub mod request;
pub mod response;
pub mod runner;
pub mod synthetic_bench;

#[cfg(not(target_arch = "wasm32"))]
pub mod device;

pub use engine::{Answer, Engine, Host, Job};
pub use runner::Runner;

/// The engine's error: the GPU engine's, which holds the core's.
pub type Error = dflash_gpu::GpuError;
