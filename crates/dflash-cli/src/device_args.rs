//! `--device`, `--adapter` and `--no-f16`, shared by the commands that run a model, as
//! the engine's device choice and GPU options.

use crate::Device;
use dflash_core::cpu::CpuKernels;
use dflash_engine::device::DeviceChoice;
use dflash_gpu::GpuOptions;

/// Where a model runs: `--device`, `--adapter`, `--no-f16`.
#[derive(clap::Args)]
pub struct DeviceArgs {
    /// gpu, cpu or reference. Default: the GPU engine on a hardware adapter, else the
    /// quantized CPU engine (a software adapter such as lavapipe only with `gpu`).
    #[arg(long, value_enum)]
    pub device: Option<Device>,
    /// Choose the GPU adapter whose name contains this.
    #[arg(long)]
    pub adapter: Option<String>,
    /// Keep the KV cache in f32 even where the adapter has shader-f16.
    #[arg(long)]
    pub no_f16: bool,
}

impl DeviceArgs {
    /// The engine's device choice.
    pub fn choice(&self) -> DeviceChoice {
        match self.device {
            None => DeviceChoice::Auto,
            Some(Device::Gpu) => DeviceChoice::Gpu,
            Some(d) => DeviceChoice::Cpu(d.cpu_kernels().unwrap_or(CpuKernels::Quantized)),
        }
    }

    pub fn gpu_options(&self) -> GpuOptions {
        GpuOptions {
            adapter: self.adapter.clone(),
            no_f16: self.no_f16,
            ..Default::default()
        }
    }
}
