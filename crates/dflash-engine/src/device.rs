//! Native hosts' engine: a loaded model (and drafter) built on the device a user asked
//! for, or chosen: the GPU engine on a hardware adapter, else the quantized CPU engine.
//! A software adapter (lavapipe, SwiftShader, WARP) runs the same math on the same CPU
//! slower than the CPU engine does, so auto mode passes it over, as the browser does.

use crate::engine::{Engine, Result};
use crate::runner::Runner;
use dflash_core::cpu::{CpuKernels, CpuModel};
use dflash_core::drafter::{CpuDrafter, DrafterWeights};
use dflash_core::model_files::LoadedModel;
use dflash_gpu::{GpuContext, GpuModel, GpuModelOptions, GpuOptions};
use std::rc::Rc;

/// Where a model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceChoice {
    /// The GPU engine on a hardware adapter, else the quantized CPU engine.
    Auto,
    /// The GPU engine on the chosen adapter, software ones included.
    Gpu,
    /// A CPU engine.
    Cpu(CpuKernels),
}

/// Whether an adapter is the CPU itself (wgpu's `DeviceType::Cpu`: lavapipe, SwiftShader,
/// WARP).
pub fn is_software(ctx: &GpuContext) -> bool {
    ctx.summary.device_type == "Cpu"
}

/// The GPU device for `choice`, or None for a CPU engine; `note` says why auto mode
/// passed the GPU over.
pub fn open_device(
    choice: DeviceChoice,
    opts: &GpuOptions,
    note: &mut dyn FnMut(&str),
) -> Result<Option<Rc<GpuContext>>> {
    match choice {
        DeviceChoice::Cpu(_) => Ok(None),
        DeviceChoice::Gpu => Ok(Some(Rc::new(GpuContext::new(opts)?))),
        DeviceChoice::Auto => match GpuContext::new(opts) {
            Ok(c) if is_software(&c) => {
                note(&format!(
                    "the only adapter, {}, is a software one; using the CPU engine (--device gpu to use it)",
                    c.summary.name
                ));
                Ok(None)
            }
            Ok(c) => Ok(Some(Rc::new(c))),
            Err(e) => {
                note(&format!("no GPU adapter ({e}); using the CPU engine"));
                Ok(None)
            }
        },
    }
}

/// The target on the GPU for `context` tokens, with the taps its drafter reads.
pub fn gpu_target(
    ctx: Rc<GpuContext>,
    m: &LoadedModel,
    drafter: Option<&DrafterWeights>,
    context: usize,
) -> Result<GpuModel> {
    let options = GpuModelOptions {
        context,
        taps: drafter
            .map(|d| d.config.target_layer_ids.clone())
            .unwrap_or_default(),
        ..Default::default()
    };
    GpuModel::new(ctx, &m.weights, &options)
}

impl Engine {
    /// The engine of `model` (and `drafter`, checked against it) on `choice`'s device,
    /// for `context` tokens or the model's own limit where that is less; `note` hears why
    /// auto mode chose the CPU.
    pub fn on_device(
        model: LoadedModel,
        drafter: Option<&DrafterWeights>,
        choice: DeviceChoice,
        opts: &GpuOptions,
        context: usize,
        note: &mut dyn FnMut(&str),
    ) -> Result<Engine> {
        let context = context.min(model.config().max_position_embeddings);
        if let Some(d) = drafter {
            d.config.validate_against(model.config())?;
        }
        let (runner, device) = match open_device(choice, opts, note)? {
            Some(ctx) => {
                let name = ctx.summary.name.clone();
                let target = gpu_target(ctx, &model, drafter, context)?;
                (Runner::gpu(target, drafter)?, name)
            }
            None => {
                let kernels = match choice {
                    DeviceChoice::Cpu(k) => k,
                    _ => CpuKernels::Quantized,
                };
                let drafter = drafter.map(|w| CpuDrafter::with_kernels(w, kernels));
                let target = CpuModel::from_weights(model.weights, kernels);
                (
                    Runner::cpu(target, drafter),
                    kernels.device_name().to_string(),
                )
            }
        };
        Ok(Engine::new(
            runner,
            model.tokenizer,
            model.chat_template,
            context,
            device,
        ))
    }
}

/// A native host: the process's clock from `start`, a seed from the time, no pause.
pub struct NativeHost {
    start: std::time::Instant,
}

impl Default for NativeHost {
    fn default() -> Self {
        NativeHost {
            start: std::time::Instant::now(),
        }
    }
}

impl crate::engine::Host for NativeHost {
    fn now_s(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    fn random_seed(&self) -> u64 {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        t ^ NEXT.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
    }

    async fn pause(&self) -> Result<()> {
        Ok(())
    }
}

impl Engine {
    /// `answer` on a native host's thread, to its end.
    pub fn answer_blocking(
        &mut self,
        req: &crate::request::Request,
        interrupt: &dflash_core::generate::Interrupt,
        host: &NativeHost,
        on_piece: &mut dflash_core::generate::OnPiece<'_>,
    ) -> Result<crate::engine::Answer> {
        pollster::block_on(self.answer(req, interrupt, host, on_piece))
    }

    /// `generate` on a native host's thread, to its end.
    pub fn generate_blocking(
        &mut self,
        job: &crate::engine::Job<'_>,
        host: &NativeHost,
        on_piece: &mut dflash_core::generate::OnPiece<'_>,
    ) -> Result<crate::engine::Answer> {
        pollster::block_on(self.generate(job, host, on_piece))
    }
}
