//! dflash2.wgsl: DFlash2's input scale, grouped dynamic convolution, top-K of logit
//! rows and the candidate selector's walk.

use crate::context::GpuContext;
use crate::error::Result;
use crate::pipelines::{bindings, Dispatch, Kernel, Shader, WORKGROUP_SIZE};

bindings! {
    /// The `@binding`s of dflash2.wgsl (each entry point binds its own uniform at 0).
    DFlash2Binding(DFlash2) {
        X = 1, COEF = 2, BASE = 3, OUT = 4, LOGITS = 5, CAND_IDS = 6, CAND_VALS = 7, HP = 8,
        PRED_CB = 9, SUCC_CB = 10, STATE = 11, DRAFTS = 12, SEL_IDS = 13, SEL_VALS = 14, SP = 15,
        Q_VALS = 16,
    }
}

/// The uniform of dflash2.wgsl's `scale`.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ScaleParams {
    pub n: u32,
    pub scale: f32,
}

/// DFlash2: `buf *= scale` over `n` floats (the block's input embeddings).
pub fn scale(ctx: &GpuContext, buf: &wgpu::Buffer, n: usize, scale: f32) -> Result<Dispatch> {
    let params = ScaleParams { n: n as u32, scale };
    Dispatch::new(
        ctx,
        &Kernel::new(Shader::DFlash2, "scale"),
        Some(&params),
        &[(DFlash2Binding::OUT, buf)],
        [(n as u32).div_ceil(WORKGROUP_SIZE), 1, 1],
    )
}

/// The shape of one side of a DFlash2 grouped convolution.
pub struct ConvShape {
    pub hidden: usize,
    pub taps: usize,
    pub group: usize,
    /// Side 0 (before the sublayer) or 1 (after).
    pub side: usize,
}

/// The uniform of dflash2.wgsl's `conv`.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ConvParams {
    pub n_rows: u32,
    pub hidden: u32,
    pub taps: u32,
    pub group: u32,
    pub coef_stride: u32,
    pub coef_offset: u32,
    pub base_offset: u32,
    pub accumulate: u32,
}

/// DFlash2's grouped dynamic convolution over `n` block rows: `out (+)= conv(x)` with
/// this side's base kernel and the rows' coefficients (`[n, 2, taps, groups]`).
#[allow(clippy::too_many_arguments)]
pub fn grouped_conv(
    ctx: &GpuContext,
    s: &ConvShape,
    x: &wgpu::Buffer,
    coef: &wgpu::Buffer,
    base: &wgpu::Buffer,
    out: &wgpu::Buffer,
    n: usize,
    accumulate: bool,
) -> Result<Dispatch> {
    let groups = s.hidden / s.group;
    let params = ConvParams {
        n_rows: n as u32,
        hidden: s.hidden as u32,
        taps: s.taps as u32,
        group: s.group as u32,
        coef_stride: (2 * s.taps * groups) as u32,
        coef_offset: (s.side * s.taps * groups) as u32,
        base_offset: (s.side * s.taps * s.hidden) as u32,
        accumulate: accumulate as u32,
    };
    Dispatch::new(
        ctx,
        &Kernel::new(Shader::DFlash2, "conv"),
        Some(&params),
        &[
            (DFlash2Binding::X, x),
            (DFlash2Binding::COEF, coef),
            (DFlash2Binding::BASE, base),
            (DFlash2Binding::OUT, out),
        ],
        [(s.hidden as u32).div_ceil(WORKGROUP_SIZE), n as u32, 1],
    )
}

/// The uniform of dflash2.wgsl's `topk`.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct TopKParams {
    pub vocab: u32,
    pub stride: u32,
    pub k: u32,
    pub first_row: u32,
    pub multiplier: f32,
    pub cap: f32,
}

/// The top-K of logit rows `first..first + n` (value descending, ties by index), their
/// values times `multiplier` and soft-capped (`cap` 0: off).
#[allow(clippy::too_many_arguments)]
pub fn top_k(
    ctx: &GpuContext,
    logits: &wgpu::Buffer,
    ids: &wgpu::Buffer,
    vals: &wgpu::Buffer,
    first: usize,
    n: usize,
    vocab: usize,
    k: usize,
    multiplier: f32,
    cap: f32,
) -> Result<Dispatch> {
    let params = TopKParams {
        vocab: vocab as u32,
        stride: vocab as u32,
        k: k as u32,
        first_row: first as u32,
        multiplier,
        cap,
    };
    Dispatch::new(
        ctx,
        &Kernel::new(Shader::DFlash2, "topk"),
        Some(&params),
        &[
            (DFlash2Binding::LOGITS, logits),
            (DFlash2Binding::CAND_IDS, ids),
            (DFlash2Binding::CAND_VALS, vals),
        ],
        [n as u32, 1, 1],
    )
}

/// The buffers of DFlash2's candidate selector walk.
pub struct WalkBuffers<'a> {
    pub ids: &'a wgpu::Buffer,
    pub vals: &'a wgpu::Buffer,
    pub hp: &'a wgpu::Buffer,
    pub predecessor: &'a wgpu::Buffer,
    pub successor: &'a wgpu::Buffer,
    pub state: &'a wgpu::Buffer,
    pub drafts: &'a wgpu::Buffer,
    /// The sampler's uniform (temperature, seed) and the proposal q it records.
    pub sample_params: &'a wgpu::Buffer,
    pub q_vals: &'a wgpu::Buffer,
}

/// The uniform of dflash2.wgsl's `walk`.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct WalkParams {
    pub slots: u32,
    pub k: u32,
    pub rank: u32,
    pub hp_first: u32,
    pub sampled: u32,
}

/// The selector's walk over `slots` slots of `k` candidates from the anchor
/// (`state[2]`): drafts `1..=slots`. `hp_first`: the row of `hp` of the first slot.
/// `sampled`: draw at the sampler's temperature and record q (rejection sampling).
#[allow(clippy::too_many_arguments)]
pub fn selector_walk(
    ctx: &GpuContext,
    b: &WalkBuffers,
    slots: usize,
    k: usize,
    rank: usize,
    hp_first: usize,
    sampled: bool,
) -> Result<Dispatch> {
    let params = WalkParams {
        slots: slots as u32,
        k: k as u32,
        rank: rank as u32,
        hp_first: hp_first as u32,
        sampled: sampled as u32,
    };
    let bufs = [
        (DFlash2Binding::HP, b.hp),
        (DFlash2Binding::PRED_CB, b.predecessor),
        (DFlash2Binding::SUCC_CB, b.successor),
        (DFlash2Binding::STATE, b.state),
        (DFlash2Binding::DRAFTS, b.drafts),
        (DFlash2Binding::SEL_IDS, b.ids),
        (DFlash2Binding::SEL_VALS, b.vals),
        (DFlash2Binding::SP, b.sample_params),
        (DFlash2Binding::Q_VALS, b.q_vals),
    ];
    Dispatch::new(
        ctx,
        &Kernel::new(Shader::DFlash2, "walk"),
        Some(&params),
        &bufs,
        [1, 1, 1],
    )
}
