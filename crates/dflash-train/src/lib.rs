//! dflash-train: turns a supported target into a DFlash drafter (z-lab format).
//! `data` (self-distillation), `train` (block-diffusion drafting loss), `eval` (tau through
//! the engine's speculative loop) and `export` (config.json + bf16 safetensors).
//!
//! The public surface, the four steps of the `dflash-train` binary: [`data::distill`],
//! [`train::train`] with its [`train::TrainConfig`] (resumable from its checkpoint),
//! [`eval::evaluate`] and [`export::export`]; and what they are made of: [`draft_model`]
//! (the candle drafter, the same math as dflash-core's `CpuDrafter`), [`target`] (the
//! frozen target's taps), [`head_loss`], [`nn`], [`optim`], and [`TrainError`].
//!
//! # The pipeline
//!
//! ```text
//! prompts (stdlib docstrings -> coding requests, module questions, arithmetic, writing;
//!    |     --mix general: explanations, role-play, reasoning, rewriting too;
//!    |     --mix self: the target writes each prompt, sampling its template's user turn
//!    |     on the quantized CPU engine, seeded by index: self_prompts.rs;
//!    |     --mix self-code: the same after a system message about Python, answered
//!    |     without it;
//!    |     --mix self-stub: that turn opened at "Complete the following Python function:
//!    |     ```python\ndef", the target writing the function to complete;
//!    |     --mix self-chat: after a system message naming one of 7 kinds of chat
//!    |     request, prompt i taking kind i mod 7, answered without it)
//!    | chat template of the target
//!    v
//! target answers greedily: the quantized CPU engine (`--engine cpu`, the default), or
//!    |   candle's f32 of its weights (`--engine candle`, `--batch` prompts at a time,
//!    |   16)
//!    v   data.jsonl: {id, source, prompt_ids, response_ids}   (appended; resumable)
//! per step: 4 sequences; taps of each whole sequence from the frozen target (no grad)
//!    |  c = hidden_norm(fc(taps))  -> context K/V of every layer at positions 0..L
//!    |  32 random anchors inside the response; blocks [tok@anchor, MASK x (B-1)] at
//!    |  positions anchor..anchor+B-1
//!    |  attention: a block sees context rows < its anchor and itself (no other block):
//!    |  scores against the context (masked) and against the block, one softmax
//!    |  slot k (1..B-1) -> norm -> target lm_head (frozen) -> CE(token at anchor+k),
//!    |  weight exp(-(k-1)/gamma), normalised by the weight sum
//!    |  (--sampled-head N: the softmax over the lm_head rows of every token of the
//!    |  data's responses plus N random ids drawn afresh each step, the whole vocabulary
//!    |  every --full-head-every steps; head_loss::CandidateHead; the log's head_rows
//!    |  marks a sampled step, whose loss and acc are over its rows)
//!    v
//! AdamW (beta 0.9/0.95, wd 0.01 on matrices), grad-norm clip 1, warmup + cosine;
//! checkpoint.safetensors (params + moments) + checkpoint.json every N steps (by rename);
//! a resume must have the run's own settings but the step count (train_config.json; a
//! difference is a Checkpoint error naming each field, and nothing is written); it drops
//! the log lines of steps after the checkpoint (they run again); --stop-at N stops a part
//! at step N while the schedule spans --steps (a run resumed with other --steps is
//! reproduced by its parts)
//!    v
//! export: config.json (DFlashDraftModel, qwen3, dflash_config{mask_token_id,
//! target_layer_ids}, block_size) + model.safetensors (bf16, {"format": "pt"})
//!    -> dflash_core::drafter::load_drafter_dir, vLLM, SGLang
//! ```
//!
//! The mask token is an unused special token of the target's vocabulary, chosen by name
//! (`<empty_output>` for SmolLM2, id 16), or `--mask-token`. The drafter's final norm
//! starts as the target's (it feeds the target's lm_head).
//!
//! # DFlash2
//!
//! DFlash2 (`--arch dflash2`) trains the same way plus:
//!
//! ```text
//! each layer: hn = norm(x); coef = kernel_projection(hn)        [A, B, 2*taps*groups]
//!             hn' = conv(hn, base[0], coef side 0) -> attention
//!                   -> conv(., base[1], coef side 1)
//!             (the same around the MLP with mlp_conv); conv causal inside each block
//! slot rows (normed, detached) -> lm_head top-K (kept by the fused head op)
//!    score[c] = logit[c] + <predecessor[true token at anchor+k-1] * P h, successor[c]>
//!    selector CE over the K, rows whose label is in the top-K, weights exp(-(k-1)/gamma)
//! loss = drafting CE + selector CE; log: selector_acc (teacher-forced walk),
//! top_k_recall, selector_tau_proxy beside the argmax tau_proxy
//! ```
//!
//! Start: convolutions the identity (base tap 0 = 1, projection 0), successor codebook 0
//! (predecessor codebook and hidden projection random, so the successor gets gradients):
//! a DFlash2 run `--init-from` a DFlash drafter begins as that drafter, draft for draft.

pub mod data;
pub mod draft_model;
pub mod eval;
pub mod export;
pub mod head_loss;
pub mod init;
pub mod nn;
pub mod optim;
pub mod params;
pub mod progress;
pub mod prompts;
pub mod self_prompts;
pub mod target;
pub mod train;

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Core(#[from] dflash_core::Error),
    #[error("tensor error: {0}")]
    Candle(#[from] candle_core::Error),
    #[error("i/o: {0}")]
    Io(String),
    #[error("bad data: {0}")]
    Data(String),
    #[error("bad checkpoint: {0}")]
    Checkpoint(String),
    #[error("usage: {0}")]
    Usage(String),
}
