//! argmax.wgsl: the argmax of logit rows, and the reduction that finishes the greedy
//! head's per-workgroup partials (`gemv::greedy_head`).

use crate::context::GpuContext;
use crate::error::Result;
use crate::pipelines::{bindings, Dispatch, Kernel, Shader};

/// The uniform of argmax.wgsl (`main`; `reduce`: `len` and `stride` count partials).
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ArgmaxParams {
    pub len: u32,
    pub stride: u32,
    pub out_offset: u32,
    /// `logprobs`: alternatives per row.
    pub top: u32,
}

bindings! {
    /// The `@binding`s of argmax.wgsl.
    ArgmaxBinding(Argmax) { LOGITS = 1, TOKENS = 2, PARTS = 3, ID_MAP = 4, LP_VALS = 5, LP_IDS = 6 }
}

/// `tokens[r]` = the best of row r's `parts` workgroup partials (the fused greedy head).
pub fn argmax_reduce(
    ctx: &GpuContext,
    best: &wgpu::Buffer,
    tokens: &wgpu::Buffer,
    rows: usize,
    parts: usize,
) -> Result<Dispatch> {
    reduce_partials(ctx, best, tokens, rows, parts, None)
}

pub(super) fn reduce_partials(
    ctx: &GpuContext,
    best: &wgpu::Buffer,
    tokens: &wgpu::Buffer,
    rows: usize,
    parts: usize,
    id_map: Option<&wgpu::Buffer>,
) -> Result<Dispatch> {
    let params = ArgmaxParams {
        len: parts as u32,
        stride: parts as u32,
        out_offset: 0,
        top: 0,
    };
    let kernel = Kernel::new(Shader::Argmax, "reduce").with("MAP", id_map.is_some() as u8 as f64);
    Ok(Dispatch::new(
        ctx,
        &kernel,
        Some(&params),
        &[
            (ArgmaxBinding::TOKENS, tokens),
            (ArgmaxBinding::PARTS, best),
            (ArgmaxBinding::ID_MAP, id_map.unwrap_or(&ctx.unused)),
        ],
        [rows as u32, 1, 1],
    )?
    .family("argmax_reduce")
    .shaped(format!("{rows}x{parts}"), 8 * (rows * parts) as u64))
}

/// `tokens[out_offset + r] = argmax(logits[r, ..len])` for `rows` rows of `stride`.
pub fn argmax(
    ctx: &GpuContext,
    logits: &wgpu::Buffer,
    tokens: &wgpu::Buffer,
    rows: usize,
    len: usize,
    stride: usize,
) -> Result<Dispatch> {
    argmax_mapped(ctx, logits, tokens, rows, (len, stride), None)
}

/// `argmax`, each token mapped through `id_map` where given (a draft head's rows).
pub(super) fn argmax_mapped(
    ctx: &GpuContext,
    logits: &wgpu::Buffer,
    tokens: &wgpu::Buffer,
    rows: usize,
    (len, stride): (usize, usize),
    id_map: Option<&wgpu::Buffer>,
) -> Result<Dispatch> {
    let params = ArgmaxParams {
        len: len as u32,
        stride: stride as u32,
        out_offset: 0,
        top: 0,
    };
    let kernel = Kernel::new(Shader::Argmax, "main").with("MAP", id_map.is_some() as u8 as f64);
    Ok(Dispatch::new(
        ctx,
        &kernel,
        Some(&params),
        &[
            (ArgmaxBinding::LOGITS, logits),
            (ArgmaxBinding::TOKENS, tokens),
            (ArgmaxBinding::ID_MAP, id_map.unwrap_or(&ctx.unused)),
        ],
        [rows as u32, 1, 1],
    )?
    .shaped(format!("{rows}x{len}"), 4 * (rows * len) as u64))
}

/// Alternatives `logprobs` reports per row at most (argmax.wgsl's `LP_TOP`).
pub const LOGPROB_TOP: usize = 20;

/// Each of `rows` rows' log-probability of its token in `tokens` and its `top` most
/// likely ids (argmax.wgsl `logprobs`) into `vals` (`[row][1 + LOGPROB_TOP]`) and `ids`
/// (`[row][LOGPROB_TOP]`).
pub fn logprobs(
    ctx: &GpuContext,
    (logits, tokens): (&wgpu::Buffer, &wgpu::Buffer),
    (vals, ids): (&wgpu::Buffer, &wgpu::Buffer),
    rows: usize,
    vocab: usize,
    top: usize,
) -> Result<Dispatch> {
    let params = ArgmaxParams {
        len: vocab as u32,
        stride: vocab as u32,
        out_offset: 0,
        top: top.min(LOGPROB_TOP) as u32,
    };
    Ok(Dispatch::new(
        ctx,
        &Kernel::new(Shader::Argmax, "logprobs"),
        Some(&params),
        &[
            (ArgmaxBinding::LOGITS, logits),
            (ArgmaxBinding::TOKENS, tokens),
            (ArgmaxBinding::LP_VALS, vals),
            (ArgmaxBinding::LP_IDS, ids),
        ],
        [rows as u32, 1, 1],
    )?
    .shaped(
        format!("{rows}x{vocab}"),
        4 * (rows * vocab) as u64 * (2 + top as u64),
    ))
}
