//! DFlash speculative decoding, shared by every engine: prefill with taps, draft a block
//! in one drafter pass, verify it in one target pass, accept the longest prefix the
//! target agrees with, take the target's own next token as the bonus, roll the KV cache
//! back and feed the committed rows' taps to the drafter. Because the target's token at
//! each position is drawn exactly as plain decoding draws it (same logits bits, same
//! position-keyed random number), the output equals plain decoding token for token.
//!
//! - [`policy`]: how many rows a step verifies (a fixed block, or auto mode from the
//!   acceptance rates and the device's step costs), and the costs' priors.
//! - [`block_loop`]: the bookkeeping of one step every engine's driver shares
//!   (`BlockLoop`), and the result with its per-step tau.
//! - [`proposer`]: what drafts a block (`Proposer`), and DFlash's drafter on the CPU.
//! - [`cpu_loop`]: the CPU engines' driver, whole or a step at a time.
//!
//! # The CPU reference's loop
//!
//! The CPU reference (`dflash_core::speculative`, `crates/dflash-core/src/speculative/`)
//! runs the same loop as the GPU engine's DFlash step
//! (`crates/dflash-gpu/src/speculative/`) with any `Proposer` (`proposer.rs`: the DFlash
//! drafter `DFlashCpu`, or test proposers that force acceptance patterns; driven by
//! `cpu_loop.rs`); the bookkeeping the loops share (each step's block under the policy,
//! auto mode's refined step costs and probes, the acceptance and taus) is one
//! `speculative::BlockLoop` (`block_loop.rs`) that the CPU reference, the GPU engine and
//! the benchmark's by-id loop drive. Auto mode is described in `policy.rs`'s module docs;
//! one step's data path is drawn in `docs/data-path.md`.
//!
//! # Multi-turn KV reuse
//!
//! A request's prompt keeps the KV rows of its longest common prefix with the tokens the
//! cache holds from the last request, less its last token (whose pass gives the first new
//! token's logits), and prefills only the rest. The GPU model records the token of each
//! committed row (`GpuModel::kv_ids`; a pipelined step's input is filled in when its
//! token is read back) and how many leading rows the drafter's context also holds
//! (`drafted`: a DFlash step extends that context only up to the step's anchor); the CPU
//! engine keeps a `generate::CpuSession` (cache and ids) beside the drafter's
//! `speculative::DraftState`, both held by `dflash_engine::runner::CpuRunner`, so every
//! host (`dflash serve`, the wasm `Engine`) reuses them the same way. With DFlash the
//! kept prefix is also capped by `drafted`, and the drafter's context is truncated to it
//! (`Proposer::truncate`). Every kernel being batch invariant, kept rows are the bits a
//! whole prefill would write: the identity tests run a five-turn conversation on one
//! engine against one that forgets its cache every turn (tokens and drafts equal).
//! `forget_cached` / `CpuSession::reset` (`Runner::forget_conversation`; `resetChat()` in
//! JS) forget; measuring step costs forgets too.

pub mod block_loop;
pub mod cpu_loop;
pub mod policy;
pub mod proposer;
pub mod simulated;

pub use block_loop::*;
pub use cpu_loop::*;
pub use policy::*;
pub use proposer::*;
pub use simulated::*;
