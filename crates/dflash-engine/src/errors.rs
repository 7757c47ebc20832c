//! Every engine error as one typed code: the JS API's `DFlashError.code`, and with its
//! HTTP status the body of `dflash serve`'s error answers.
//!
//! # From bad input to code
//!
//! `dflash_core::Error` (thiserror): one variant per kind of bad input — truncated file,
//! bad magic, unsupported version, absurd header sizes, unknown or unsupported tensor
//! types, tensors outside the file, shape mismatches, missing tensors or tokenizer,
//! unsupported architecture / tokenizer / quantization, prompt past the context, a size
//! past `limits::MAX_*` (`LimitExceeded` names the constant). Loaders are fuzzed with
//! random and corrupted files (`crates/dflash-core/tests/loaders.rs`, `hostile.rs`).
//!
//! `dflash_gpu::GpuError` wraps it with the GPU's own (no adapter, limits, out of memory,
//! device lost, validation). This module gives every variant one code (`error_code`: no
//! catch-all, so a new variant must be given its code) and an HTTP status (`http_status`:
//! 400 for the request's fault, 503 for `Busy`/`Unloaded`, else 500): the JS
//! `DFlashError.code` and the body of `dflash serve`'s error answers. The codes the
//! package knows are listed once in `pkg/protocol.js` (`CODES`) and in `pkg/index.d.ts`;
//! `tests/node/rpc.test.mjs` checks the three agree.

use dflash_core::Error as CoreError;
use dflash_gpu::GpuError;

/// The `code` a JS caller switches on.
pub fn error_code(e: &GpuError) -> &'static str {
    match e {
        GpuError::NoAdapter(_) | GpuError::RequestDevice(_) => "NoWebGPU",
        GpuError::LimitExceeded { .. } => "LimitsExceeded",
        GpuError::Unsupported(_) => "Unsupported",
        GpuError::OverBudget { .. } | GpuError::OutOfMemory(_) => "OutOfMemory",
        GpuError::DeviceLost(_) => "DeviceLost",
        GpuError::Validation(_) | GpuError::Readback(_) => "GpuError",
        GpuError::Core(c) => core_code(c),
    }
}

/// Every core error by name (no catch-all: a new variant must be given its code).
fn core_code(e: &CoreError) -> &'static str {
    match e {
        CoreError::DrafterMismatch { .. } | CoreError::NotADrafter(_) => "DrafterMismatch",
        CoreError::ContextOverflow { .. } => "ContextOverflow",
        CoreError::BadSampling(_)
        | CoreError::EmptyPrompt
        | CoreError::BadRequest(_)
        | CoreError::BadGrammar(_)
        | CoreError::TokenOutOfRange { .. }
        | CoreError::PromptFile { .. }
        | CoreError::ChatTemplate(_) => "BadRequest",
        CoreError::Io { .. } => "NetworkError",
        CoreError::Truncated { .. }
        | CoreError::BadMagic { .. }
        | CoreError::UnsupportedVersion(_)
        | CoreError::AbsurdSize { .. }
        | CoreError::BadMetadata(_)
        | CoreError::UnknownTensorType { .. }
        | CoreError::UnsupportedTensorType { .. }
        | CoreError::TensorOutOfBounds { .. }
        | CoreError::TensorOverlap { .. }
        | CoreError::LimitExceeded { .. }
        | CoreError::BadTensorLayout { .. }
        | CoreError::MissingTensor(_)
        | CoreError::ShapeMismatch { .. }
        | CoreError::UnsupportedArchitecture(_)
        | CoreError::BadConfig(_)
        | CoreError::MissingTokenizer(_)
        | CoreError::UnsupportedTokenizer(_)
        | CoreError::Tokenizer(_)
        | CoreError::SafeTensors { .. }
        | CoreError::UnsupportedQuantization(_)
        | CoreError::NotAModel(_)
        | CoreError::SplitPart { .. } => "BadModelFile",
        CoreError::Internal(_) => "Error",
    }
}

/// The HTTP status of an error `code`: the request's fault (400) or the server's (500).
pub fn http_status(code: &str) -> u16 {
    match code {
        "BadRequest" | "ContextOverflow" | "Unsupported" | "DrafterMismatch" => 400,
        "Busy" | "Unloaded" => 503,
        _ => 500,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failure_has_its_code() {
        let core = |e| error_code(&GpuError::Core(e));
        assert_eq!(error_code(&GpuError::NoAdapter(String::new())), "NoWebGPU");
        assert_eq!(
            error_code(&GpuError::OutOfMemory("x".into())),
            "OutOfMemory"
        );
        assert_eq!(error_code(&GpuError::DeviceLost("x".into())), "DeviceLost");
        assert_eq!(
            error_code(&GpuError::LimitExceeded {
                what: "x".into(),
                need: 2,
                limit: 1,
                limit_name: "y"
            }),
            "LimitsExceeded"
        );
        assert_eq!(
            core(CoreError::DrafterMismatch {
                field: "hidden_size",
                drafter: "1".into(),
                target: "2".into()
            }),
            "DrafterMismatch"
        );
        assert_eq!(
            core(CoreError::ContextOverflow {
                prompt_tokens: 9,
                max_new_tokens: 1,
                context: 8
            }),
            "ContextOverflow"
        );
        assert_eq!(
            core(CoreError::BadMagic {
                expected: "GGUF",
                found: vec![0]
            }),
            "BadModelFile"
        );
        assert_eq!(
            core(CoreError::Truncated {
                offset: 0,
                needed: 1,
                len: 0
            }),
            "BadModelFile"
        );
        assert_eq!(core(CoreError::BadSampling("x".into())), "BadRequest");
        assert_eq!(core(CoreError::EmptyPrompt), "BadRequest");
        assert_eq!(core(CoreError::BadRequest("x".into())), "BadRequest");
        assert_eq!(core(CoreError::Internal("x".into())), "Error");
    }
}
