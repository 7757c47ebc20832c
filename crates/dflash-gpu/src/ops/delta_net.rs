//! delta_net.wgsl: a Gated DeltaNet layer's convolution and recurrence, and the
//! snapshot and restore of its states around a verify pass.

use crate::context::GpuContext;
use crate::error::Result;
use crate::pipelines::{bindings, grid, Dispatch, Kernel, Shader, WORKGROUP_SIZE};

/// A Gated DeltaNet layer's sizes (`dflash_core::config::HybridConfig`).
#[derive(Debug, Clone, Copy)]
pub struct DeltaNetShape {
    pub conv_dim: usize,
    pub kernel: usize,
    pub key_heads: usize,
    pub value_heads: usize,
    pub key_head_dim: usize,
    pub value_head_dim: usize,
    pub eps: f32,
    /// Value heads in llama.cpp's tiled order (`HybridConfig::tiled_value_heads`).
    pub tiled: bool,
}

impl DeltaNetShape {
    /// Floats per row of the input projection: q, k, v, z, b, a.
    pub fn proj_stride(&self) -> usize {
        self.conv_dim + self.value_heads * (self.value_head_dim + 2)
    }
}

/// The uniform of delta_net.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct DeltaNetParams {
    pub n_rows: u32,
    pub conv_dim: u32,
    pub kernel: u32,
    pub proj_stride: u32,
    pub key_heads: u32,
    pub value_heads: u32,
    pub key_head_dim: u32,
    pub value_head_dim: u32,
    pub eps: f32,
    pub tiled: u32,
    pub pad1: u32,
    pub pad2: u32,
}

bindings! {
    /// The `@binding`s of delta_net.wgsl.
    DeltaNetBinding(DeltaNet) {
        PROJ = 1, CONV_W = 2, CONV_STATE = 3, MIXED = 4, S_STATE = 5, DT_BIAS = 6, DECAY = 7,
        NORM_W = 8, READOUT = 9, POSITION = 10, PASS_START = 11, CONV_PRE = 12, S_PRE = 13,
    }
}

/// A DeltaNet layer's buffers: its weights' vectors, its states and their copies from
/// before a verify pass, the pass's work rows, the pass state (`position[0]`) and where
/// the last verify pass began.
pub struct DeltaNetBuffers<'a> {
    pub proj: &'a wgpu::Buffer,
    pub conv_pre: &'a wgpu::Buffer,
    pub s_pre: &'a wgpu::Buffer,
    pub position: &'a wgpu::Buffer,
    pub pass_start: &'a wgpu::Buffer,
    pub conv_w: &'a wgpu::Buffer,
    pub conv_state: &'a wgpu::Buffer,
    pub mixed: &'a wgpu::Buffer,
    pub s_state: &'a wgpu::Buffer,
    pub dt_bias: &'a wgpu::Buffer,
    pub decay: &'a wgpu::Buffer,
    pub norm_w: &'a wgpu::Buffer,
    pub read: &'a wgpu::Buffer,
}

/// The convolution and the recurrence of `n` rows (delta_net.wgsl `conv`, `recur`); with
/// `replay`, of the rows acceptance kept of the last verify pass (over its `proj`).
pub fn delta_net(
    ctx: &GpuContext,
    s: &DeltaNetShape,
    b: &DeltaNetBuffers,
    n: usize,
    replay: bool,
) -> Result<[Dispatch; 2]> {
    if s.key_head_dim.max(s.value_head_dim) > 256 {
        return Err(crate::error::GpuError::Unsupported(format!(
            "linear attention head dims {}/{} > 256",
            s.key_head_dim, s.value_head_dim
        )));
    }
    let params = DeltaNetParams {
        n_rows: n as u32,
        conv_dim: s.conv_dim as u32,
        kernel: s.kernel as u32,
        proj_stride: s.proj_stride() as u32,
        key_heads: s.key_heads as u32,
        value_heads: s.value_heads as u32,
        key_head_dim: s.key_head_dim as u32,
        value_head_dim: s.value_head_dim as u32,
        eps: s.eps,
        tiled: s.tiled as u32,
        ..Default::default()
    };
    let kernel = |entry| Kernel::new(Shader::DeltaNet, entry).with("REPLAY", replay as u8 as f64);
    let at = [
        (DeltaNetBinding::POSITION, b.position),
        (DeltaNetBinding::PASS_START, b.pass_start),
    ];
    let conv_bufs = [
        (DeltaNetBinding::PROJ, b.proj),
        (DeltaNetBinding::CONV_W, b.conv_w),
        (DeltaNetBinding::CONV_STATE, b.conv_state),
        (DeltaNetBinding::MIXED, b.mixed),
        at[0],
        at[1],
    ];
    let groups = s.conv_dim.div_ceil(WORKGROUP_SIZE as usize) as u32;
    let conv = Dispatch::new(
        ctx,
        &kernel("conv"),
        Some(&params),
        &conv_bufs,
        [groups, 1, 1],
    )?
    .shaped(
        format!("conv {}x{} n={n}", s.conv_dim, s.kernel),
        4 * (2 * n * s.conv_dim) as u64,
    );
    let recur_bufs = [
        (DeltaNetBinding::PROJ, b.proj),
        (DeltaNetBinding::MIXED, b.mixed),
        (DeltaNetBinding::S_STATE, b.s_state),
        (DeltaNetBinding::DT_BIAS, b.dt_bias),
        (DeltaNetBinding::DECAY, b.decay),
        (DeltaNetBinding::NORM_W, b.norm_w),
        (DeltaNetBinding::READOUT, b.read),
        at[0],
        at[1],
    ];
    let state = (s.value_heads * s.key_head_dim * s.value_head_dim) as u64;
    let recur = Dispatch::new(
        ctx,
        &kernel("recur"),
        Some(&params),
        &recur_bufs,
        [s.value_heads as u32, 1, 1],
    )?
    .shaped(
        format!(
            "recur {}x{}x{} n={n}",
            s.value_heads, s.key_head_dim, s.value_head_dim
        ),
        4 * 2 * n as u64 * state,
    );
    Ok([conv, recur])
}

/// Before a verify pass (`restore: false`): the layer's states and the pass's first
/// position kept; after acceptance (`restore: true`): the states put back, for the
/// replay of the accepted rows (`delta_net` with `replay`).
pub fn delta_net_states(
    ctx: &GpuContext,
    s: &DeltaNetShape,
    b: &DeltaNetBuffers,
    restore: bool,
) -> Result<Dispatch> {
    let params = DeltaNetParams {
        conv_dim: s.conv_dim as u32,
        kernel: s.kernel as u32,
        key_heads: s.key_heads as u32,
        value_heads: s.value_heads as u32,
        key_head_dim: s.key_head_dim as u32,
        value_head_dim: s.value_head_dim as u32,
        ..Default::default()
    };
    let len = ((s.kernel - 1) * s.conv_dim).max(s.value_heads * s.key_head_dim * s.value_head_dim);
    let mut bufs = vec![
        (DeltaNetBinding::CONV_STATE, b.conv_state),
        (DeltaNetBinding::S_STATE, b.s_state),
        (DeltaNetBinding::CONV_PRE, b.conv_pre),
        (DeltaNetBinding::S_PRE, b.s_pre),
    ];
    if !restore {
        bufs.extend([
            (DeltaNetBinding::POSITION, b.position),
            (DeltaNetBinding::PASS_START, b.pass_start),
        ]);
    }
    let entry = if restore { "restore" } else { "snapshot" };
    let (gx, gy) = grid(len.div_ceil(WORKGROUP_SIZE as usize) as u32);
    if gy > 1 {
        return Err(crate::error::GpuError::Unsupported(format!(
            "a linear-attention state of {len} floats"
        )));
    }
    Ok(Dispatch::new(
        ctx,
        &Kernel::new(Shader::DeltaNet, entry),
        Some(&params),
        &bufs,
        [gx, 1, 1],
    )?
    .shaped(format!("{entry} {len}"), 8 * len as u64))
}
