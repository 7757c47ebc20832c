//! dflash-core: model formats, the GPU weight formats, tokenizers, chat templates,
//! sampling and the CPU reference models of dflash-web.

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
