//! Typed errors of the whole core: every bad input maps to one of these, never a panic.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    #[error("I/O error on {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("file is truncated: needed {needed} bytes at offset {offset}, file has {len}")]
    Truncated { offset: u64, needed: u64, len: u64 },
    #[error("bad magic: expected {expected}, found {found:02x?}")]
    BadMagic {
        expected: &'static str,
        found: Vec<u8>,
    },
    #[error("unsupported GGUF version {0} (supported: 2, 3)")]
    UnsupportedVersion(u32),
    #[error("header field {field} = {value} is larger than the file allows ({limit})")]
    AbsurdSize {
        field: &'static str,
        value: u64,
        limit: u64,
    },
    #[error("{what} = {value} is over the limit {limit} = {max}")]
    LimitExceeded {
        what: String,
        value: u64,
        /// The constant of `dflash_core::limits`.
        limit: &'static str,
        max: u64,
    },
    #[error("invalid metadata: {0}")]
    BadMetadata(String),
    #[error("unknown tensor type id {type_id} for tensor {tensor}")]
    UnknownTensorType { tensor: String, type_id: u32 },
    #[error("tensor type {dtype} of tensor {tensor} is not supported")]
    UnsupportedTensorType { tensor: String, dtype: String },
    #[error("tensor {tensor}: data [{start}, {end}) lies outside the file (size {file_len})")]
    TensorOutOfBounds {
        tensor: String,
        start: u64,
        end: u64,
        file_len: u64,
    },
    #[error(
        "tensors {first} [{first_start}, {first_end}) and {second} (from {second_start}) overlap"
    )]
    TensorOverlap {
        first: String,
        first_start: u64,
        first_end: u64,
        second: String,
        second_start: u64,
    },
    #[error("tensor {tensor}: bad layout: {reason}")]
    BadTensorLayout { tensor: String, reason: String },
    #[error("missing tensor {0}")]
    MissingTensor(String),
    #[error("tensor {tensor}: shape {found:?} does not match the config, expected {expected:?}")]
    ShapeMismatch {
        tensor: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("unsupported architecture {0:?} (supported: llama, qwen2, qwen3)")]
    UnsupportedArchitecture(String),
    #[error("invalid config: {0}")]
    BadConfig(String),
    #[error("missing tokenizer: {0}")]
    MissingTokenizer(String),
    #[error("unsupported tokenizer: {0}")]
    UnsupportedTokenizer(String),
    #[error("tokenizer error: {0}")]
    Tokenizer(String),
    #[error("chat template error: {0}")]
    ChatTemplate(String),
    #[error("safetensors error in {file}: {reason}")]
    SafeTensors { file: String, reason: String },
    #[error("unsupported quantization: {0}")]
    UnsupportedQuantization(String),
    #[error("prompt has {prompt_tokens} tokens; with {max_new_tokens} new tokens this exceeds the context of {context} tokens")]
    ContextOverflow {
        prompt_tokens: usize,
        max_new_tokens: usize,
        context: usize,
    },
    #[error("token id {id} is outside the vocabulary of {vocab} tokens")]
    TokenOutOfRange { id: u32, vocab: usize },
    #[error("invalid sampling parameters: {0}")]
    BadSampling(String),
    #[error("the prompt is empty: generation needs at least one token")]
    EmptyPrompt,
    #[error("invalid request: {0}")]
    BadRequest(String),
    /// A request's JSON schema, Lark grammar, regex or tool schema that does not compile
    /// (the message names the place).
    #[error("invalid grammar: {0}")]
    BadGrammar(String),
    #[error("internal error (a broken invariant, not bad input): {0}")]
    Internal(String),
    #[error("prompt file line {line}: {reason}")]
    PromptFile { line: usize, reason: String },
    #[error("not a model: {0}")]
    NotAModel(String),
    /// A model split in several GGUF files (llama.cpp's `gguf-split`) whose parts do not
    /// add up: one missing, out of order, from another model, or a tensor in two.
    #[error("split GGUF, part {part} of {count}: {reason}")]
    SplitPart {
        part: usize,
        count: usize,
        reason: String,
    },
    #[error("not a DFlash drafter: {0}")]
    NotADrafter(String),
    #[error("the drafter does not match the target: {field} is {drafter} in the drafter but {target} in the target")]
    DrafterMismatch {
        field: &'static str,
        drafter: String,
        target: String,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// `value` of `what` is over `limit` (a constant of `dflash_core::limits`) = `max`.
    pub fn over_limit(what: impl Into<String>, value: u64, limit: &'static str, max: u64) -> Self {
        Error::LimitExceeded {
            what: what.into(),
            value,
            limit,
            max,
        }
    }
}
