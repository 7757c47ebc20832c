//! copy.wgsl: a buffer copy, the bandwidth roofline; and `submit`, which runs
//! dispatches at once, outside a plan (the profiler, the op tests).

use crate::context::GpuContext;
use crate::error::Result;
use crate::pipelines::{bindings, grid, Dispatch, Kernel, Shader, WORKGROUP_SIZE};

/// The uniform of copy.wgsl.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct CopyParams {
    pub n: u32,
    pub wg_x: u32,
}

bindings! {
    /// The `@binding`s of copy.wgsl.
    CopyBinding(Copy) { SRC = 1, DST = 2 }
}

/// `dst = src` for `n_vec4` 16-byte words: the bandwidth roofline.
pub fn copy(
    ctx: &GpuContext,
    src: &wgpu::Buffer,
    dst: &wgpu::Buffer,
    n_vec4: usize,
) -> Result<Dispatch> {
    let (gx, gy) = grid((n_vec4 as u32).div_ceil(WORKGROUP_SIZE));
    Ok(Dispatch::new(
        ctx,
        &Kernel::new(Shader::Copy, "main"),
        Some(&CopyParams {
            n: n_vec4 as u32,
            wg_x: gx,
        }),
        &[(CopyBinding::SRC, src), (CopyBinding::DST, dst)],
        [gx, gy, 1],
    )?
    .shaped(format!("{} MiB", (n_vec4 * 16) >> 20), 32 * n_vec4 as u64))
}

/// Encodes `dispatches` in one compute pass and submits them.
pub fn submit(ctx: &GpuContext, dispatches: &[&Dispatch]) {
    let mut enc = ctx
        .device
        .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("ops") });
    {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("ops"),
            timestamp_writes: None,
        });
        for d in dispatches {
            d.encode(&mut pass);
        }
    }
    ctx.queue.submit([enc.finish()]);
}
