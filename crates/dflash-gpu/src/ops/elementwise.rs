//! elementwise.wgsl: SwiGLU, attention's output gate, bias adds, the KV-cache store
//! and row copies, each one thread per element.

use crate::context::GpuContext;
use crate::error::Result;
use crate::pipelines::{bindings, Dispatch, Kernel, Shader, WORKGROUP_SIZE};

/// The uniform of elementwise.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ElementwiseParams {
    pub n_rows: u32,
    pub len: u32,
    pub src_stride: u32,
    pub dst_stride: u32,
    pub src_offset: u32,
    pub dst_offset: u32,
    pub use_state: u32,
    pub pad: u32,
}

bindings! {
    /// The `@binding`s of elementwise.wgsl.
    ElementwiseBinding(Elementwise) { A = 1, B = 2, OUT = 3, STATE = 4, KV_OUT = 5 }
}

/// `out = silu(gate) * up` over `n` rows of `len`.
pub fn swiglu(
    ctx: &GpuContext,
    gate: &wgpu::Buffer,
    up: &wgpu::Buffer,
    out: &wgpu::Buffer,
    n: usize,
    len: usize,
) -> Result<Dispatch> {
    elementwise(
        ctx,
        "swiglu",
        ElementwiseParams {
            n_rows: n as u32,
            len: len as u32,
            ..Default::default()
        },
        &[
            (ElementwiseBinding::A, gate),
            (ElementwiseBinding::B, up),
            (ElementwiseBinding::OUT, out),
        ],
    )
}

/// Attention's output gate: `att[r, i] *= sigmoid(qkv[r, offset + i])` over `n` rows
/// of `len` (`qkv` rows of `stride`).
pub fn sigmoid_gate(
    ctx: &GpuContext,
    qkv: &wgpu::Buffer,
    (offset, stride): (usize, usize),
    att: &wgpu::Buffer,
    n: usize,
    len: usize,
) -> Result<Dispatch> {
    elementwise(
        ctx,
        "sigmoid_gate",
        ElementwiseParams {
            n_rows: n as u32,
            len: len as u32,
            src_stride: stride as u32,
            src_offset: offset as u32,
            ..Default::default()
        },
        &[(ElementwiseBinding::A, qkv), (ElementwiseBinding::OUT, att)],
    )
}

/// `buf[r, i] += bias[i]` over `n` rows of `len`.
pub fn add_bias(
    ctx: &GpuContext,
    bias: &wgpu::Buffer,
    buf: &wgpu::Buffer,
    n: usize,
    len: usize,
) -> Result<Dispatch> {
    elementwise(
        ctx,
        "add_bias",
        ElementwiseParams {
            n_rows: n as u32,
            len: len as u32,
            dst_stride: len as u32,
            ..Default::default()
        },
        &[
            (ElementwiseBinding::A, bias),
            (ElementwiseBinding::OUT, buf),
        ],
    )
}

/// KV-cache store: `cache[state[0] + r] = src[r]` (converted to the cache type).
pub fn store_kv(
    ctx: &GpuContext,
    src: &wgpu::Buffer,
    state: &wgpu::Buffer,
    cache: &wgpu::Buffer,
    n: usize,
    len: usize,
) -> Result<Dispatch> {
    elementwise(
        ctx,
        "store_kv",
        ElementwiseParams {
            n_rows: n as u32,
            len: len as u32,
            src_stride: len as u32,
            dst_stride: len as u32,
            use_state: 1,
            ..Default::default()
        },
        &[
            (ElementwiseBinding::A, src),
            (ElementwiseBinding::STATE, state),
            (ElementwiseBinding::KV_OUT, cache),
        ],
    )
}

/// `dst[r, dst_offset + i] = src[r, i]` for rows of `len`, destination rows of `dst_stride`.
#[allow(clippy::too_many_arguments)]
pub fn copy_rows(
    ctx: &GpuContext,
    src: &wgpu::Buffer,
    dst: &wgpu::Buffer,
    state: &wgpu::Buffer,
    n: usize,
    len: usize,
    dst_stride: usize,
    dst_offset: usize,
) -> Result<Dispatch> {
    elementwise(
        ctx,
        "copy_rows",
        ElementwiseParams {
            n_rows: n as u32,
            len: len as u32,
            src_stride: len as u32,
            dst_stride: dst_stride as u32,
            dst_offset: dst_offset as u32,
            ..Default::default()
        },
        &[
            (ElementwiseBinding::A, src),
            (ElementwiseBinding::OUT, dst),
            (ElementwiseBinding::STATE, state),
        ],
    )
}

/// Bytes of the grammar masks of `MAX_ROWS` rows over `vocab` ids (a bit per id).
pub fn mask_bytes(vocab: usize) -> u64 {
    (crate::pipelines::MAX_ROWS * vocab.div_ceil(32) * 4) as u64
}

/// A grammar's masks over `n` rows of `vocab` logits (rows `vocab` apart): the logits
/// of refused ids become -inf. `mask` holds a row of `vocab.div_ceil(32)` words per
/// row, or with `broadcast` one row that every row takes.
pub fn mask_logits(
    ctx: &GpuContext,
    mask: &wgpu::Buffer,
    logits: &wgpu::Buffer,
    n: usize,
    vocab: usize,
    broadcast: bool,
) -> Result<Dispatch> {
    let words = vocab.div_ceil(32) as u32;
    elementwise(
        ctx,
        "mask_logits",
        ElementwiseParams {
            n_rows: n as u32,
            len: vocab as u32,
            src_stride: if broadcast { 0 } else { words },
            dst_stride: vocab as u32,
            ..Default::default()
        },
        &[
            (ElementwiseBinding::STATE, mask),
            (ElementwiseBinding::OUT, logits),
        ],
    )
}

fn elementwise(
    ctx: &GpuContext,
    entry: &'static str,
    params: ElementwiseParams,
    bufs: &[(u32, &wgpu::Buffer)],
) -> Result<Dispatch> {
    let (rows, len) = (params.n_rows, params.len);
    // Each element read once per input and written once.
    let bytes = 4 * (rows * len) as u64 * bufs.len().min(3) as u64;
    Ok(Dispatch::new(
        ctx,
        &Kernel::new(Shader::Elementwise, entry),
        Some(&params),
        bufs,
        [len.div_ceil(WORKGROUP_SIZE), rows, 1],
    )?
    .shaped(format!("{rows}x{len}"), bytes))
}
