//! Limits on what an input file or request may ask the engine to allocate or run, stated
//! once: every check uses these, and an input over one says which limit and its value
//! (`Error::LimitExceeded` names the constant).
//!
//! Each is far above what real models use (noted per limit), so only a corrupt or
//! hostile input meets them.

/// Bytes of a GGUF header (magic to the end of the tensor table). Real files: a few MB
/// (Gemma 3's 262k-token vocabulary, the largest known, about 7 MB). The streaming
/// loader buffers at most this much before the header parses.
pub const MAX_GGUF_HEADER_BYTES: u64 = 128 << 20;

/// Bytes of one GGUF metadata string (key, value or array item). Real files: chat
/// templates of tens of KB.
pub const MAX_GGUF_STRING_BYTES: u64 = 16 << 20;

/// Items of all GGUF metadata arrays together (nested items included). Each item takes
/// a `Value` (32 bytes) in memory whatever its size in the file, so this bounds the
/// header's memory: 4 Mi items are 128 MiB. Real files: under 1.5 M (vocabulary,
/// scores, token types and merges).
pub const MAX_GGUF_ARRAY_ITEMS: u64 = 1 << 22;

/// Metadata key-value pairs of a GGUF file. Real files: about 50.
pub const MAX_GGUF_KEYS: u64 = 1 << 16;

/// Tensors of a GGUF file. Real files: about 10 per layer (experts are stacked in one
/// tensor), so a few thousand at most.
pub const MAX_GGUF_TENSORS: u64 = 1 << 16;

/// Merges derived from a SentencePiece vocabulary (every split of a piece into two
/// pieces). Each is held as a JSON pair while the tokenizer builds, so this bounds that
/// memory. A piece of n characters has at most n - 1 splits; this allows 32 per piece of
/// a 262k vocabulary (Gemma 3's), whose pieces are mostly a few characters long.
pub const MAX_SPM_MERGES: u64 = 1 << 23;

/// Fuel of one chat template rendering (minijinja instructions). A real template over a
/// long conversation uses tens of thousands; a runaway loop ends in well under a second.
pub const CHAT_TEMPLATE_FUEL: u64 = 20_000_000;

/// Bytes of one rendered chat prompt. Real prompts are bounded by the context (at most a
/// few MB of text).
pub const MAX_CHAT_PROMPT_BYTES: usize = 64 << 20;

/// Bytes of one tensor the streaming loader assembles: the largest allocation wasm32
/// can make (`isize::MAX` there). Real tensors: up to about 1 GB (an 8B model's F16
/// embedding).
pub const MAX_STREAM_TENSOR_BYTES: u64 = (1 << 31) - 1;

/// Rows of a drafter's block. z-lab's drafters use 16 and 8; the GPU engine drafts at
/// most 16 rows, the CPU engines any block up to this.
pub const MAX_BLOCK_SIZE: u64 = 256;

/// Tokens of a context: a model's `max_position_embeddings` and a request's KV cache
/// capacity. Real models: up to 1M (Qwen2.5-1M).
pub const MAX_CONTEXT_TOKENS: u64 = 1 << 24;

/// Model dimensions, of targets and drafters alike. Real models: hidden 16384 and
/// intermediate 53248 (Llama 3.1 405B), 126 layers, 128 heads, head_dim 256, a 262k
/// vocabulary (Gemma 3).
pub const MAX_HIDDEN_SIZE: u64 = 1 << 16;
pub const MAX_INTERMEDIATE_SIZE: u64 = 1 << 18;
pub const MAX_LAYERS: u64 = 1024;
pub const MAX_HEADS: u64 = 1024;
pub const MAX_HEAD_DIM: u64 = 1024;
pub const MAX_VOCAB_SIZE: u64 = 1 << 22;
/// Experts of a mixture-of-experts layer, and those each token uses. Real models: 512
/// experts (Qwen3-Next / Qwen3.5), 8 to 10 per token; the GPU's router keeps a row's
/// choices in registers.
pub const MAX_EXPERTS: u64 = 1 << 12;
pub const MAX_EXPERTS_PER_TOKEN: u64 = 16;

/// `Err(LimitExceeded)` naming the constant when `value > $limit`.
#[macro_export]
macro_rules! check_limit {
    ($what:expr, $value:expr, $limit:ident) => {{
        let value = $value as u64;
        if value > $crate::limits::$limit {
            return Err($crate::Error::over_limit(
                $what,
                value,
                stringify!($limit),
                $crate::limits::$limit,
            )
            .into());
        }
    }};
}

/// Bytes of one request's grammar: a JSON schema (serialized), a Lark grammar or a
/// regex, tools' parameter schemas included. Real schemas: up to a few hundred KB
/// (JSONSchemaBench's largest); llguidance's own fuel limits bound the work beyond.
pub const MAX_GRAMMAR_BYTES: u64 = 1 << 20;

/// Nesting depth of a request's JSON schema (objects and arrays within each other).
/// Real schemas: under 20.
pub const MAX_SCHEMA_DEPTH: u64 = 64;

/// Bytes of one token of a vocabulary that a grammar masks (llguidance walks its token
/// trie one level per byte). Real vocabularies: under 256 (long runs of spaces).
pub const MAX_TOKEN_BYTES: u64 = 4096;
