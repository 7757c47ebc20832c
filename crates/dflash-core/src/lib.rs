//! dflash-core: model formats, the GPU weight formats, tokenizers, chat templates,
//! sampling and the CPU reference models of dflash-web.
//!
//! The public surface, by what a host does with it:
//! - Load a target: [`model_files::load_path`] (GGUF, split GGUF or a Hugging Face
//!   folder) into a [`model_files::LoadedModel`] (its [`config::ModelConfig`],
//!   [`weights::ModelWeights`], [`tokenizer::TextTokenizer`], [`chat::ChatTemplate`]).
//! - Load a drafter: [`drafter::DrafterWeights::load`] / [`drafter::load_drafter_dir`];
//!   its file schema is [`drafter::file::DrafterFile`], validated into
//!   [`drafter::DrafterConfig`].
//! - Generate on the CPU reference: [`generate::generate_cpu`] (plain) and
//!   [`speculative::generate_speculative_cpu`] (DFlash), or step by step with
//!   [`generate::CpuGeneration`] / [`speculative::SpeculativeGeneration`] in a
//!   [`generate::CpuSession`]; a request is a [`generate::GenerateRequest`] with
//!   [`sampling::SamplingParams`] and a [`speculative::BlockSize`].
//! - What every engine shares: the decode loop's bookkeeping
//!   ([`speculative::BlockLoop`]), the token sink ([`generate::TokenSink`]), sampling and
//!   rejection ([`sampling`], [`rejection`]), the quantized formats ([`quant`]), the
//!   named shapes and memory plans ([`synthetic`]) and the input limits ([`limits`]).
//! - Errors: [`Error`] (one variant per meaning) and [`Result`].
//!
//! `testutil` (tiny models, fixture writers) is behind the `testutil` feature, for tests.

pub mod chat;
pub mod config;
pub mod cpu;
pub mod drafter;
pub mod error;
pub mod formats;
pub mod generate;
pub mod grammar;
pub mod limits;
pub mod math;
pub mod model_files;
pub mod model_meta;
pub mod prompt_file;
pub mod quant;
pub mod rejection;
pub mod rng;
pub mod sampling;
pub mod speculative;
pub mod synthetic;
pub mod synthetic_weights;
#[cfg(any(test, feature = "testutil"))]
pub mod testutil;
pub mod tokenizer;
pub mod tools;
pub mod weights;

pub use error::{Error, Result};

/// Keeps freed memory in the process (glibc): an engine step allocates and frees buffers
/// of hundreds of KB to hundreds of MB (a 16-row pass's products, the lm_head's logits,
/// training's tensors), and glibc would otherwise map each one fresh and return it to
/// the kernel on free, page-faulting zeroed pages back in every time (measured: a 16-row
/// product of a 1536 x 576 matrix at 38 against 49 multiply-adds per cycle). Call it at
/// the start of `main`, before any threads start.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn keep_freed_memory() {
    extern "C" {
        fn mallopt(param: i32, value: i32) -> i32;
    }
    const M_TRIM_THRESHOLD: i32 = -1;
    const M_MMAP_MAX: i32 = -4;
    // SAFETY: mallopt only changes allocator tunables; called before any threads start.
    unsafe {
        mallopt(M_MMAP_MAX, 0);
        mallopt(M_TRIM_THRESHOLD, i32::MAX);
    }
}

/// Elsewhere the allocator's own policy stands.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn keep_freed_memory() {}
