//! What a GEMV does around its product (`GemvFusion` and its parts) and how it is sized
//! on this adapter (`Tuning::gemv`): shared by the f32-activation GEMV (`gemv`), the
//! 8-bit one (`dp4a`) and the experts' (`moe`), so that neither GEMV file needs the other's.

use crate::context::GpuContext;
use crate::upload::GpuMatrix;
use dflash_core::quant::QFormat;

/// A matrix shape as the profiler names it: `rows x cols format n=rows_of_x`.
pub fn shape_name(rows: usize, cols: usize, f: QFormat, n: usize) -> String {
    let f = match f {
        QFormat::Q4 => "q4",
        QFormat::Q8 => "q8",
        QFormat::F32 => "f32",
    };
    format!("{rows}x{cols} {f} n={n}")
}

pub(crate) fn format_id(f: QFormat) -> f64 {
    if f == QFormat::Q4 {
        0.0
    } else {
        1.0
    }
}

/// What a GEMV does around its product (shaders/gemv.wgsl): each the same arithmetic as
/// the separate kernel it replaces.
#[derive(Default, Clone, Copy)]
pub struct GemvFusion<'a> {
    /// `y += result` (residual adds).
    pub accumulate: bool,
    /// RMSNorm of x by these weights and eps, in the prologue.
    pub norm: Option<(&'a wgpu::Buffer, f32)>,
    /// `y = result + bias[o]`.
    pub bias: Option<&'a wgpu::Buffer>,
    /// SwiGLU of the matrix's two row halves (`[gate; up]`): y has half its rows.
    pub pair: bool,
    /// Each workgroup's best (value, index) per row into this buffer, `argmax_parts`
    /// per row (the greedy head; `argmax_reduce` finishes it).
    pub argmax: Option<&'a wgpu::Buffer>,
    /// First column of this matrix's rows in y, and y's row length (0: the rows).
    pub out_offset: usize,
    pub out_stride: usize,
    /// The stored rows also into these taps (a DFlash tap after a layer).
    pub tap: Option<GemvTap<'a>>,
    /// x is the output of a residual GEMV's `norm_out` (x is then that buffer): the
    /// RMSNorm's 1/rms from its partial sums, applied to the sums at the end.
    pub prenormed: Option<Prenormed<'a>>,
    /// With `accumulate`: the next RMSNorm's x * weight and partial sums of squares
    /// into a buffer (`Tuning::norm_in_residual`), for a GEMV with `prenormed`.
    pub norm_out: Option<NormOut<'a>>,
}

/// A residual stream's RMSNorm, half done by the GEMV that wrote it (`NormOut`):
/// `buf` holds x * weight (`[16, hidden]`) then `parts` partial sums of x^2 per row.
#[derive(Clone, Copy)]
pub struct Prenormed<'a> {
    pub buf: &'a wgpu::Buffer,
    pub parts: usize,
    pub eps: f32,
}

/// The next RMSNorm's share in a residual GEMV's epilogue: x * `weight` and each
/// row-owning thread's sum of x^2 into `buf` (`prenorm_bytes` of it).
#[derive(Clone, Copy)]
pub struct NormOut<'a> {
    pub weight: &'a wgpu::Buffer,
    pub buf: &'a wgpu::Buffer,
}

/// Bytes of a buffer for `NormOut` over a residual stream of `hidden` values per row:
/// 16 rows of x * weight and at most `hidden + 256` partial sums per row.
pub fn prenorm_bytes(hidden: usize) -> u64 {
    (crate::pipelines::MAX_ROWS * (2 * hidden + 256) * 4) as u64
}

/// The partial sums per row that `NormOut` on `m` leaves: one per row-owning thread of
/// the grid (a matrix in one chunk), padded with zeros to a multiple of 4.
pub fn norm_out_parts(ctx: &GpuContext, m: &GpuMatrix) -> usize {
    let per = gemv_rows_per_workgroup(ctx, m, false);
    let owners = m.rows.div_ceil(per) * (gemv_threads(ctx, m) / gemv_lanes(ctx, m));
    owners.next_multiple_of(4)
}

/// Where a GEMV's epilogue also writes what it stores: `buf[r * stride + offset + o]`.
#[derive(Clone, Copy)]
pub struct GemvTap<'a> {
    pub buf: &'a wgpu::Buffer,
    pub offset: usize,
    pub stride: usize,
}

/// Threads per output row of a GEMV over `m` on this adapter (`Tuning::gemv`).
pub fn gemv_lanes(ctx: &GpuContext, m: &GpuMatrix) -> usize {
    ctx.tuning.gemv_lanes(m.rows, m.cols)
}

/// Output rows each thread of a GEMV over `m` owns on this adapter; a paired GEMV
/// (gate and up) owns half as many pairs, each two rows.
pub fn gemv_outputs(ctx: &GpuContext, m: &GpuMatrix, pair: bool) -> usize {
    let outputs = ctx.tuning.gemv_outputs(m.rows, m.cols);
    if pair {
        (outputs / 2).max(1)
    } else {
        outputs
    }
}

/// Threads per workgroup of a GEMV over `m` on this adapter.
pub fn gemv_threads(ctx: &GpuContext, m: &GpuMatrix) -> usize {
    ctx.tuning.gemv_threads(m.rows, m.cols)
}

/// Output rows (pairs, when `pair`) one GEMV workgroup over `m` covers on this adapter.
pub fn gemv_rows_per_workgroup(ctx: &GpuContext, m: &GpuMatrix, pair: bool) -> usize {
    gemv_outputs(ctx, m, pair) * gemv_threads(ctx, m) / gemv_lanes(ctx, m)
}

/// Output rows behind one partial of the fused greedy head: a workgroup's, or one row
/// where a thread owns a row (LANES = 1: no barrier on CPU adapters).
pub(super) fn argmax_rows_per_part(ctx: &GpuContext, m: &GpuMatrix) -> usize {
    if gemv_lanes(ctx, m) == 1 {
        1
    } else {
        gemv_rows_per_workgroup(ctx, m, false)
    }
}

/// Partials per row of the fused greedy head over `m`.
pub fn argmax_parts(ctx: &GpuContext, m: &GpuMatrix) -> usize {
    let per = argmax_rows_per_part(ctx, m);
    m.chunks.iter().map(|c| c.rows.div_ceil(per)).sum()
}

/// The eps and partial sums per row of a GEMV's norm fusions: the prologue's or the
/// prenormed input's eps; the prenormed input's parts, or `norm_out`'s on `m`.
pub(super) fn gemv_norm_params(ctx: &GpuContext, m: &GpuMatrix, f: &GemvFusion) -> (f32, usize) {
    let eps = f.norm.map(|(_, e)| e).or(f.prenormed.map(|p| p.eps));
    let parts = match (f.prenormed, f.norm_out) {
        (Some(p), _) => p.parts,
        (None, Some(_)) => norm_out_parts(ctx, m),
        (None, None) => 0,
    };
    (eps.unwrap_or(0.0), parts)
}
