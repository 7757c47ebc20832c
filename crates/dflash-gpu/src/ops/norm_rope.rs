//! The embedding lookup (embedding.wgsl), RMSNorm (rmsnorm.wgsl) and RoPE (rope.wgsl).

use super::gemv_fusion::format_id;
use crate::context::GpuContext;
use crate::error::Result;
use crate::pipelines::{bindings, Dispatch, Kernel, Shader, WORKGROUP_SIZE};
use crate::upload::GpuMatrix;
use dflash_core::config::RopeStyle;

/// The uniform of embedding.wgsl.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct EmbeddingParams {
    pub n_rows: u32,
    pub cols: u32,
    pub row_lo: u32,
    pub row_hi: u32,
}

bindings! {
    /// The `@binding`s of embedding.wgsl.
    EmbeddingBinding(Embedding) { TOKENS = 1, QS = 2, SCALES = 3, MINS = 4, OUT = 5 }
}

/// `out[r] = table[tokens[r]]`, dequantized; one dispatch per chunk of the table.
pub fn embedding(
    ctx: &GpuContext,
    m: &GpuMatrix,
    tokens: &wgpu::Buffer,
    out: &wgpu::Buffer,
    n: usize,
) -> Result<Vec<Dispatch>> {
    let k = Kernel::new(Shader::Embedding, "main")
        .with("FORMAT", format_id(m.format))
        .with("GROUP", m.group as f64);
    m.chunks
        .iter()
        .map(|ch| {
            let params = EmbeddingParams {
                n_rows: n as u32,
                cols: m.cols as u32,
                row_lo: ch.row_lo as u32,
                row_hi: (ch.row_lo + ch.rows) as u32,
            };
            Dispatch::new(
                ctx,
                &k,
                Some(&params),
                &[
                    (EmbeddingBinding::TOKENS, tokens),
                    (EmbeddingBinding::QS, &ch.qs),
                    (EmbeddingBinding::SCALES, &ch.scales),
                    (EmbeddingBinding::MINS, &ch.mins),
                    (EmbeddingBinding::OUT, out),
                ],
                [(m.cols as u32).div_ceil(WORKGROUP_SIZE), n as u32, 1],
            )
            .map(|d| {
                let row = (m.cols * m.format.bits() / 8 + 4 * m.cols) as u64;
                d.shaped(format!("{}x{} n={n}", ch.rows, m.cols), n as u64 * row)
            })
        })
        .collect()
}

/// The uniform of rmsnorm.wgsl.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct RmsNormParams {
    pub len: u32,
    pub eps: f32,
}

bindings! {
    /// The `@binding`s of rmsnorm.wgsl.
    RmsNormBinding(RmsNorm) { W = 1, X = 2, OUT = 3, BUF = 4 }
}

/// RMSNorm of `rows` rows of `len` from `x` to `out`.
pub fn rmsnorm(
    ctx: &GpuContext,
    eps: f32,
    w: &wgpu::Buffer,
    x: &wgpu::Buffer,
    out: &wgpu::Buffer,
    rows: usize,
    len: usize,
) -> Result<Dispatch> {
    let params = RmsNormParams {
        len: len as u32,
        eps,
    };
    Ok(Dispatch::new(
        ctx,
        &Kernel::new(Shader::RmsNorm, "main"),
        Some(&params),
        &[
            (RmsNormBinding::W, w),
            (RmsNormBinding::X, x),
            (RmsNormBinding::OUT, out),
        ],
        [rows as u32, 1, 1],
    )?
    .shaped(format!("{rows}x{len}"), 4 * (len + 2 * rows * len) as u64))
}

/// RMSNorm in place (per-head q/k norms).
pub fn rmsnorm_inplace(
    ctx: &GpuContext,
    eps: f32,
    w: &wgpu::Buffer,
    buf: &wgpu::Buffer,
    rows: usize,
    len: usize,
) -> Result<Dispatch> {
    let params = RmsNormParams {
        len: len as u32,
        eps,
    };
    Ok(Dispatch::new(
        ctx,
        &Kernel::new(Shader::RmsNorm, "main_inplace"),
        Some(&params),
        &[(RmsNormBinding::W, w), (RmsNormBinding::BUF, buf)],
        [rows as u32, 1, 1],
    )?
    .family("rmsnorm_inplace")
    .shaped(format!("{rows}x{len}"), 4 * (len + 2 * rows * len) as u64))
}

pub struct RopeShape {
    pub style: RopeStyle,
    pub heads: usize,
    pub head_dim: usize,
    pub rope_dim: usize,
}

/// The uniform of rope.wgsl.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct RopeParams {
    pub n_rows: u32,
    pub n_heads: u32,
    pub head_dim: u32,
    pub rope_dim: u32,
    pub row_stride: u32,
    pub col_offset: u32,
}

bindings! {
    /// The `@binding`s of rope.wgsl.
    RopeBinding(Rope) { STATE = 1, TABLE = 2, BUF = 3 }
}

/// RoPE in place on `n` rows of `heads` heads at positions `state[0] + row`.
pub fn rope(
    ctx: &GpuContext,
    s: &RopeShape,
    state: &wgpu::Buffer,
    table: &wgpu::Buffer,
    buf: &wgpu::Buffer,
    n: usize,
) -> Result<Dispatch> {
    let style = if s.style == RopeStyle::Interleaved {
        0.0
    } else {
        1.0
    };
    let k = Kernel::new(Shader::Rope, "main").with("STYLE", style);
    let params = RopeParams {
        n_rows: n as u32,
        n_heads: s.heads as u32,
        head_dim: s.head_dim as u32,
        rope_dim: s.rope_dim as u32,
        row_stride: (s.heads * s.head_dim) as u32,
        col_offset: 0,
    };
    let total = (s.heads * s.rope_dim / 2) as u32;
    Ok(Dispatch::new(
        ctx,
        &k,
        Some(&params),
        &[
            (RopeBinding::STATE, state),
            (RopeBinding::TABLE, table),
            (RopeBinding::BUF, buf),
        ],
        [total.div_ceil(WORKGROUP_SIZE), n as u32, 1],
    )?
    .shaped(
        format!("{}x{} n={n}", s.heads, s.head_dim),
        (n * (s.heads * s.rope_dim * 8 + s.rope_dim * 4)) as u64,
    ))
}
