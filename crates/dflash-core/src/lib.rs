//! dflash-core: model formats, the GPU weight formats, tokenizers, chat templates,
//! sampling and the CPU reference models of dflash-web.
//!
//! The public surface, by what a host does with it:
//! - Load a target: [`model_files::load_path`] (GGUF, split GGUF or a Hugging Face
//!   folder) into a [`model_files::LoadedModel`] (its [`config::ModelConfig`],
//!   [`weights::ModelWeights`], [`tokenizer::TextTokenizer`], [`chat::ChatTemplate`]).
//! - Load a drafter: [`drafter::DrafterWeights::load`] / [`drafter::load_drafter_dir`];
//!   its file schema is [`drafter_file::DrafterFile`], validated into
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
pub mod drafter_file;
pub mod error;
pub mod formats;
pub mod generate;
pub mod limits;
pub mod model_files;
pub mod prompt_file;
pub mod quant;
pub mod rejection;
pub mod rng;
pub mod sampling;
pub mod speculative;
pub mod synthetic;
#[cfg(any(test, feature = "testutil"))]
pub mod testutil;
pub mod tokenizer;
pub mod weights;

pub use error::{Error, Result};
