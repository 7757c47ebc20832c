//! The loaded model as it runs: the GPU engine alone or with its DFlash drafter, or a CPU
//! engine (quantized or the reference) with its drafter, each keeping the KV rows (and
//! the drafter's context) of the last request for the next one of the conversation.

use dflash_core::cpu::CpuModel;
use dflash_core::drafter::CpuDrafter;
use dflash_core::generate::CpuSession;
use dflash_core::speculative::{DraftState, StepCostPrior};
use dflash_gpu::speculative::Speculative;
use dflash_gpu::{GpuContext, GpuModel};
use std::rc::Rc;

pub enum Runner {
    /// The GPU engine alone.
    Gpu(Box<GpuModel>),
    /// The GPU engine with its DFlash drafter (`dflash: false` runs its target alone).
    Spec(Box<Speculative>),
    /// A CPU engine, with its drafter.
    Cpu(Box<CpuRunner>),
}

pub struct CpuRunner {
    pub target: CpuModel,
    pub drafter: Option<CpuDrafter>,
    /// The KV rows kept for the next request of the conversation.
    pub session: CpuSession,
    /// The drafter's context kept beside them.
    pub draft: DraftState,
}

impl Runner {
    /// A CPU engine with a fresh conversation.
    pub fn cpu(target: CpuModel, drafter: Option<CpuDrafter>) -> Self {
        Runner::Cpu(Box::new(CpuRunner {
            target,
            drafter,
            session: CpuSession::default(),
            draft: DraftState::default(),
        }))
    }

    /// The GPU engine, with DFlash where there is a drafter.
    pub fn gpu(
        model: GpuModel,
        drafter: Option<&dflash_core::drafter::DrafterWeights>,
    ) -> Result<Self, crate::Error> {
        Ok(match drafter {
            Some(w) => Runner::Spec(Box::new(Speculative::new(model, w)?)),
            None => Runner::Gpu(Box::new(model)),
        })
    }

    /// Forgets the KV rows and drafter context kept for the next request: it prefills
    /// its whole prompt.
    pub fn forget_conversation(&mut self) {
        match self {
            Runner::Gpu(m) => m.forget_cached(),
            Runner::Spec(s) => s.target.forget_cached(),
            Runner::Cpu(c) => {
                c.session.reset();
                c.draft = DraftState::default();
            }
        }
    }

    /// The GPU device, where the engine is on one.
    pub fn gpu_context(&self) -> Option<&Rc<GpuContext>> {
        match self {
            Runner::Gpu(m) => Some(&m.ctx),
            Runner::Spec(s) => Some(&s.target.ctx),
            Runner::Cpu(_) => None,
        }
    }

    /// The width of the target's logits (its vocabulary, padded).
    pub fn vocab_size(&self) -> usize {
        match self {
            Runner::Gpu(m) => m.config.vocab_size,
            Runner::Spec(s) => s.target.config.vocab_size,
            Runner::Cpu(c) => c.target.config.vocab_size,
        }
    }

    /// Whether requests decode speculatively unless they say `"dflash": false`.
    pub fn has_drafter(&self) -> bool {
        match self {
            Runner::Gpu(_) => false,
            Runner::Spec(_) => true,
            Runner::Cpu(c) => c.drafter.is_some(),
        }
    }

    /// The device's prior cost of verifying 1..=n rows (auto mode's start) up to the
    /// drafter's block, or None without a drafter.
    pub fn step_cost_prior(&self) -> Option<Vec<f64>> {
        match self {
            Runner::Gpu(_) => None,
            Runner::Spec(s) => {
                let a = &s.target.ctx.summary;
                Some(StepCostPrior::for_adapter(&a.device_type, &a.name).costs(s.max_block()))
            }
            Runner::Cpu(c) => c.drafter.as_ref().map(|d| {
                let weight_bytes = c.target.weight_bytes_per_token();
                StepCostPrior::CpuEngine { weight_bytes }.costs(d.config.block_size)
            }),
        }
    }
}
