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

pub mod block_loop;
pub mod cpu_loop;
pub mod policy;
pub mod proposer;

pub use block_loop::*;
pub use cpu_loop::*;
pub use policy::*;
pub use proposer::*;
