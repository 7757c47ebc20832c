//! DFlash's block policy: a request's `block` (a number of rows, or auto) as the core's
//! `BlockSize`, and the step costs auto mode remembers from one request to the next.

use crate::request::BlockArg;
use dflash_core::speculative::BlockSize;
use dflash_core::Error;

/// Auto mode's cost of verifying 1..=n rows: the device's prior at the first auto
/// request, then as each auto request's steps refined it (no request waits on a
/// measurement).
#[derive(Debug, Clone, Default)]
pub struct StepCostMemory(Option<Vec<f64>>);

impl StepCostMemory {
    /// The costs so far, `prior()` (the device's) before any.
    fn get_or_prior(&mut self, prior: impl FnOnce() -> Vec<f64>) -> Vec<f64> {
        self.0.get_or_insert_with(prior).clone()
    }

    /// The costs so far.
    pub fn get(&self) -> Option<&[f64]> {
        self.0.as_deref()
    }

    /// Keeps the costs an auto run refined.
    pub fn remember(&mut self, refined: Option<&Vec<f64>>) {
        if let Some(c) = refined {
            self.0 = Some(c.clone());
        }
    }
}

/// The request's block policy and its label in `usage`: `block` rows, or auto mode (no
/// block, or "auto") from the remembered step costs, `prior` at first. `BadRequest` for
/// 0 rows or any other name. A fixed block may exceed the drafter's own, as in z-lab's
/// reference; the engine clamps it to what its step holds.
pub fn block_policy(
    block: Option<&BlockArg>,
    memory: &mut StepCostMemory,
    prior: impl FnOnce() -> Vec<f64>,
) -> Result<(BlockSize, String), Error> {
    match block {
        Some(BlockArg::Rows(0)) => Err(Error::BadRequest("`block` must be at least 1".into())),
        Some(BlockArg::Rows(n)) => Ok((BlockSize::Fixed(*n), n.to_string())),
        Some(BlockArg::Named(s)) if s != "auto" => Err(Error::BadRequest(format!(
            "block must be a number or \"auto\", not {s:?}"
        ))),
        _ => {
            let verify_cost = memory.get_or_prior(prior);
            Ok((BlockSize::Auto { verify_cost }, "auto".to_string()))
        }
    }
}

impl BlockArg {
    /// A command line's `--block N|auto`.
    pub fn parse(arg: &str) -> Option<BlockArg> {
        match arg.parse::<usize>() {
            Ok(n) if n >= 1 => Some(BlockArg::Rows(n)),
            _ if arg == "auto" => Some(BlockArg::Named(arg.into())),
            _ => None,
        }
    }
}
