//! The dispatches of every op, built the same way: kernel (shader, entry, constants),
//! uniform parameters, bindings, workgroup counts. The model's plans and the op tests
//! use these same builders.
//!
//! Each kernel's uniform is a `#[repr(C)]` struct named and laid out as the WGSL struct
//! it fills (`*Params`; tests/params_layout.rs checks names, offsets and sizes against
//! the shaders with naga). Bindings stay `(index, buffer)` pairs written once, in the one
//! builder that binds the kernel: the WGSL `@binding` declarations are their names,
//! `Dispatch::new` fails on an index the entry point does not bind, and the op tests
//! check what each kernel computes. A Rust constant per binding would repeat the shader
//! at more length, with nothing to check it.

pub mod dp4a;

use crate::context::GpuContext;
use crate::error::Result;
use crate::pipelines::{grid, Dispatch, Kernel, Shader, NO_PARAMS, WORKGROUP_SIZE};
use crate::upload::{work_buffer, GpuMatrix};
use dflash_core::config::RopeStyle;
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

/// `y[r, o] (+)= W x[r]` for `n <= 16` rows, one dispatch per chunk of W.
pub fn gemv(
    ctx: &GpuContext,
    m: &GpuMatrix,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    n: usize,
    accumulate: bool,
) -> Result<Vec<Dispatch>> {
    let fused = GemvFusion {
        accumulate,
        ..Default::default()
    };
    gemv_fused(ctx, m, x, y, n, &fused)
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
    (crate::model::MAX_ROWS * (2 * hidden + 256) * 4) as u64
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

/// The uniform of gemv.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct GemvParams {
    pub n_rows: u32,
    pub k: u32,
    pub m: u32,
    pub out_offset: u32,
    pub out_stride: u32,
    pub wg_x: u32,
    pub eps: f32,
    pub bias_offset: u32,
    pub pair_rows: u32,
    pub part_offset: u32,
    pub n_parts: u32,
    pub tap_offset: u32,
    pub tap_stride: u32,
    pub expert_lo: u32,
    /// 0, which the shader's compiler cannot see: a normalised x (NORM) is XORed with it
    /// before x's sum, so that it is rounded first, as the separate RMSNorm's stored
    /// output is, rather than fused into a multiply-add (the same bits fused or not).
    pub zero: u32,
    /// NORM_SUMS, main_norm_out: the partial sums of squares per row.
    pub norm_parts: u32,
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
fn argmax_rows_per_part(ctx: &GpuContext, m: &GpuMatrix) -> usize {
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

/// The fusions of `f` that one GEMV over `m` can carry together.
fn check_fusion(m: &GpuMatrix, f: &GemvFusion) -> Result<()> {
    if f.pair && f.argmax.is_some() {
        return Err(crate::error::GpuError::Unsupported(
            "a paired GEMV with the greedy head's partials".into(),
        ));
    }
    if f.pair && (m.chunks.len() != 1 || !m.rows.is_multiple_of(2)) {
        return Err(crate::error::GpuError::Unsupported(
            "a paired GEMV over a matrix split into chunks".into(),
        ));
    }
    if f.tap.is_some() && f.argmax.is_some() {
        return Err(crate::error::GpuError::Unsupported(
            "a GEMV with both a tap and the greedy head's partials".into(),
        ));
    }
    if f.norm.is_some() && f.prenormed.is_some() {
        return Err(crate::error::GpuError::Unsupported(
            "a GEMV with both a norm prologue and a prenormed input".into(),
        ));
    }
    if f.norm_out.is_some()
        && (!f.accumulate || f.pair || f.argmax.is_some() || m.chunks.len() != 1)
    {
        return Err(crate::error::GpuError::Unsupported(
            "a next norm's share in the epilogue of a GEMV other than a residual add in one chunk"
                .into(),
        ));
    }
    Ok(())
}

/// The GEMV pipeline's entry and override constants for `n` rows of `m` with `f`.
fn gemv_kernel(ctx: &GpuContext, m: &GpuMatrix, n: usize, f: &GemvFusion) -> Kernel {
    let entry = match (f.argmax, f.tap, f.norm_out) {
        (Some(_), _, _) => "main_argmax",
        (None, Some(_), None) => "main_tap",
        (None, Some(_), Some(_)) => "main_tap_norm_out",
        (None, None, Some(_)) => "main_norm_out",
        (None, None, None) => "main",
    };
    Kernel::new(Shader::Gemv, entry)
        .with("FORMAT", format_id(m.format))
        .with("GROUP", m.group as f64)
        .with("ACCUMULATE", f.accumulate as u8 as f64)
        .with("N_ROWS", n as f64)
        .with("LANES", gemv_lanes(ctx, m) as f64)
        .with("OUTS", gemv_outputs(ctx, m, f.pair) as f64)
        .with("THREADS", gemv_threads(ctx, m) as f64)
        .with("NORM", f.norm.is_some() as u8 as f64)
        .with("NORM_SUMS", f.prenormed.is_some() as u8 as f64)
        .with("BIAS", f.bias.is_some() as u8 as f64)
        .with("PAIR", f.pair as u8 as f64)
}

/// The eps and partial sums per row of a GEMV's norm fusions: the prologue's or the
/// prenormed input's eps; the prenormed input's parts, or `norm_out`'s on `m`.
fn gemv_norm_params(ctx: &GpuContext, m: &GpuMatrix, f: &GemvFusion) -> (f32, usize) {
    let eps = f.norm.map(|(_, e)| e).or(f.prenormed.map(|p| p.eps));
    let parts = match (f.prenormed, f.norm_out) {
        (Some(p), _) => p.parts,
        (None, Some(_)) => norm_out_parts(ctx, m),
        (None, None) => 0,
    };
    (eps.unwrap_or(0.0), parts)
}

/// `y[r, o] (+)= W x[r]` with the fusions of `f`, one dispatch per chunk of W.
pub fn gemv_fused(
    ctx: &GpuContext,
    m: &GpuMatrix,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    n: usize,
    f: &GemvFusion,
) -> Result<Vec<Dispatch>> {
    if dp4a::applies(ctx, m) {
        check_fusion(m, f)?;
        return dp4a::gemv_fused(ctx, m, x, (y, n), f);
    }
    gemv_f32_activations(ctx, m, x, y, n, f)
}

/// `gemv_fused` on f32 activations (gemv.wgsl) whatever the tuning: the profiler's
/// f32 GEMV that the 8-bit one is measured against.
pub fn gemv_f32_activations(
    ctx: &GpuContext,
    m: &GpuMatrix,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    n: usize,
    f: &GemvFusion,
) -> Result<Vec<Dispatch>> {
    check_fusion(m, f)?;
    let k = gemv_kernel(ctx, m, n, f);
    let per = gemv_rows_per_workgroup(ctx, m, f.pair);
    let out_rows = if f.pair { m.rows / 2 } else { m.rows };
    let n_parts = argmax_parts(ctx, m);
    let (eps, norm_parts) = gemv_norm_params(ctx, m, f);
    let mut part_offset = 0;
    let mut out = Vec::new();
    for ch in &m.chunks {
        let rows = if f.pair { ch.rows / 2 } else { ch.rows };
        let (gx, gy) = grid(rows.div_ceil(per) as u32);
        let params = GemvParams {
            n_rows: n as u32,
            k: m.cols as u32,
            m: rows as u32,
            out_offset: (f.out_offset + ch.row_lo) as u32,
            out_stride: if f.out_stride > 0 {
                f.out_stride
            } else {
                out_rows
            } as u32,
            wg_x: gx,
            eps,
            bias_offset: ch.row_lo as u32,
            pair_rows: if f.pair { rows as u32 } else { 0 },
            part_offset: part_offset as u32,
            n_parts: n_parts as u32,
            tap_offset: f.tap.map_or(0, |t| t.offset) as u32,
            tap_stride: f.tap.map_or(0, |t| t.stride) as u32,
            expert_lo: 0,
            norm_parts: norm_parts as u32,
            ..Default::default()
        };
        part_offset += rows.div_ceil(argmax_rows_per_part(ctx, m));
        let norm_w = f.norm.map(|(w, _)| w).or(f.norm_out.map(|o| o.weight));
        let mut bufs = vec![
            (1, x),
            (2, &ch.qs),
            (3, &ch.scales),
            (4, &ch.mins),
            (5, y),
            (6, norm_w.unwrap_or(&ctx.unused)),
            (7, f.bias.unwrap_or(&ctx.unused)),
        ];
        if let Some(b) = f.argmax {
            bufs.push((8, b));
        }
        if let Some(t) = f.tap {
            bufs.push((9, t.buf));
        }
        if let Some(o) = f.norm_out {
            bufs.push((11, o.buf));
        }
        let weights = ch.qs.size() + ch.scales.size() + ch.mins.size();
        let io = 4 * n as u64 * (m.cols + rows * (1 + f.accumulate as usize)) as u64;
        out.push(
            Dispatch::new(ctx, &k, Some(&params), &bufs, [gx, gy, 1])?
                .shaped(shape_name(ch.rows, m.cols, m.format, n), weights + io),
        );
    }
    Ok(out)
}

/// The greedy token of each of `n` rows into `tokens`: the lm_head `lm` over `x` (with
/// `norm`'s fusion) with the first half of the argmax in its epilogue and
/// `argmax_reduce` (`argmax_reduce_mapped` through `id_map`, a draft head's ids); where
/// the lm_head runs on 8-bit activations (`dp4a::applies`), its logits into `logits`
/// and argmax.wgsl over them.
pub fn greedy_head(
    ctx: &GpuContext,
    (lm, x, norm): (&GpuMatrix, &wgpu::Buffer, &GemvFusion),
    (logits, best, tokens): (&wgpu::Buffer, &wgpu::Buffer, &wgpu::Buffer),
    n: usize,
    id_map: Option<&wgpu::Buffer>,
) -> Result<Vec<Dispatch>> {
    if dp4a::applies(ctx, lm) {
        let mut d = gemv_fused(ctx, lm, x, logits, n, norm)?;
        d.push(argmax_mapped(
            ctx,
            logits,
            tokens,
            n,
            (lm.rows, lm.rows),
            id_map,
        )?);
        return Ok(d);
    }
    let f = GemvFusion {
        argmax: Some(best),
        ..*norm
    };
    let mut d = gemv_fused(ctx, lm, x, logits, n, &f)?;
    let parts = argmax_parts(ctx, lm);
    d.push(reduce_partials(ctx, best, tokens, n, parts, id_map)?);
    Ok(d)
}

/// The uniform of argmax.wgsl (`main`; `reduce`: `len` and `stride` count partials).
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ArgmaxParams {
    pub len: u32,
    pub stride: u32,
    pub out_offset: u32,
    pub pad: u32,
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

fn reduce_partials(
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
        pad: 0,
    };
    let kernel = Kernel::new(Shader::Argmax, "reduce").with("MAP", id_map.is_some() as u8 as f64);
    Ok(Dispatch::new(
        ctx,
        &kernel,
        Some(&params),
        &[(2, tokens), (3, best), (4, id_map.unwrap_or(&ctx.unused))],
        [rows as u32, 1, 1],
    )?
    .family("argmax_reduce")
    .shaped(format!("{rows}x{parts}"), 8 * (rows * parts) as u64))
}

/// The heads of one QKV row: query heads, then key/value heads.
pub struct QkvShape {
    pub style: RopeStyle,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub rope_dim: usize,
    /// Epsilon of the per-head RMSNorms (qwen3), where the layer has them.
    pub eps: f32,
    /// Attention's output gate follows v in each row (`q_dim` more floats).
    pub gate: bool,
}

impl QkvShape {
    /// Floats per QKV row.
    pub fn row_stride(&self) -> usize {
        (self.n_heads * (1 + self.gate as usize) + 2 * self.n_kv_heads) * self.head_dim
    }
}

/// The uniform of qkv.wgsl.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct QkvParams {
    pub n_rows: u32,
    pub n_heads: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
    pub rope_dim: u32,
    pub row_stride: u32,
    pub eps: f32,
    pub pad: u32,
}

/// The buffers of `qkv_rope_store`.
pub struct QkvBuffers<'a> {
    pub state: &'a wgpu::Buffer,
    pub table: &'a wgpu::Buffer,
    /// `[n, (n_heads + 2 n_kv_heads) head_dim]`: q, k, v of each row.
    pub qkv: &'a wgpu::Buffer,
    pub qk_norm: Option<[&'a wgpu::Buffer; 2]>,
    pub k_cache: &'a wgpu::Buffer,
    pub v_cache: &'a wgpu::Buffer,
}

/// Per-head norms (where given) and RoPE of q and k of `n` rows at positions
/// `state[0] + row`; q in place, k and v into the KV cache.
pub fn qkv_rope_store(
    ctx: &GpuContext,
    s: &QkvShape,
    b: &QkvBuffers,
    n: usize,
) -> Result<Dispatch> {
    let style = (s.style != RopeStyle::Interleaved) as u8 as f64;
    let k = Kernel::new(Shader::Qkv, "main")
        .with("STYLE", style)
        .with("QK_NORM", b.qk_norm.is_some() as u8 as f64);
    let row = s.row_stride();
    let params = QkvParams {
        n_rows: n as u32,
        n_heads: s.n_heads as u32,
        n_kv_heads: s.n_kv_heads as u32,
        head_dim: s.head_dim as u32,
        rope_dim: s.rope_dim as u32,
        row_stride: row as u32,
        eps: s.eps,
        pad: 0,
    };
    let [qn, kn] = b.qk_norm.unwrap_or([&ctx.unused, &ctx.unused]);
    let bufs = [
        (1, b.state),
        (2, b.table),
        (3, b.qkv),
        (4, qn),
        (5, kn),
        (6, b.k_cache),
        (7, b.v_cache),
    ];
    let kv_elt = if ctx.f16 { 2 } else { 4 };
    let bytes = n * (4 * row + 4 * (s.n_heads + s.n_kv_heads) * s.head_dim)
        + n * 2 * s.n_kv_heads * s.head_dim * kv_elt;
    Ok(Dispatch::new(
        ctx,
        &k,
        Some(&params),
        &bufs,
        [(s.n_heads + s.n_kv_heads) as u32, n as u32, 1],
    )?
    .shaped(
        format!("{}+{}x{} n={n}", s.n_heads, s.n_kv_heads, s.head_dim),
        bytes as u64,
    ))
}

/// The uniform of embedding.wgsl.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct EmbeddingParams {
    pub n_rows: u32,
    pub cols: u32,
    pub row_lo: u32,
    pub row_hi: u32,
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
                    (1, tokens),
                    (2, &ch.qs),
                    (3, &ch.scales),
                    (4, &ch.mins),
                    (5, out),
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
        &[(1, w), (2, x), (3, out)],
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
        &[(1, w), (4, buf)],
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
        &[(1, state), (2, table), (3, buf)],
        [total.div_ceil(WORKGROUP_SIZE), n as u32, 1],
    )?
    .shaped(
        format!("{}x{} n={n}", s.heads, s.head_dim),
        (n * (s.heads * s.rope_dim * 8 + s.rope_dim * 4)) as u64,
    ))
}

pub struct AttentionShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Keys visible before a query (0 = all); non-causal: context rows kept.
    pub window: usize,
    /// Causal (the target) or a block attending to all of [context | block] (the drafter).
    pub causal: bool,
    /// Floats per query row (0: n_heads * head_dim).
    pub q_stride: usize,
}

/// Chunks of keys chunked attention splits a row's keys into, at most.
pub const MAX_ATTENTION_CHUNKS: usize = 32;

/// (keys per chunk, chunks) of chunked attention over a cache of `capacity` positions:
/// the chunk a multiple of the workgroup size, at most [`MAX_ATTENTION_CHUNKS`] chunks. Fixed by the
/// capacity, so a row's chunks depend only on its position.
pub fn attention_chunking(capacity: usize) -> (usize, usize) {
    let wg = WORKGROUP_SIZE as usize;
    let chunk = wg * capacity.div_ceil(wg * MAX_ATTENTION_CHUNKS).max(1);
    (chunk, capacity.div_ceil(chunk).max(1))
}

/// Bytes of the partials of chunked attention: `(max, sum)` and the unnormalised
/// output of each (row, head, chunk), for 16 rows.
pub fn attention_partial_bytes(n_heads: usize, head_dim: usize, capacity: usize) -> (u64, u64) {
    let parts = (16 * n_heads * attention_chunking(capacity).1) as u64;
    (parts * 8, parts * (head_dim * 4) as u64)
}

/// The uniform of attention_chunks.wgsl.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct AttentionChunkParams {
    pub n_rows: u32,
    pub n_heads: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
    pub rope_dim: u32,
    pub row_stride: u32,
    pub chunk: u32,
    pub n_chunks: u32,
    pub window: u32,
    pub causal: u32,
    pub scale: f32,
    pub eps: f32,
}

/// The buffers of `attention_chunked`.
pub struct ChunkedAttentionBuffers<'a> {
    /// q, k, v rows, the positions and the RoPE table, the norms and the cache: as
    /// `qkv_rope_store` takes them.
    pub qkv: QkvBuffers<'a>,
    /// The partials (`attention_partial_bytes`).
    pub part_ml: &'a wgpu::Buffer,
    pub part_acc: &'a wgpu::Buffer,
    /// `[n, n_heads * head_dim]`.
    pub out: &'a wgpu::Buffer,
}

/// The query heads one workgroup of chunked attention serves: the largest divisor of
/// the group that is at most 8.
fn group_tile(group: usize) -> usize {
    (1..=group.min(8))
        .rev()
        .find(|&t| group.is_multiple_of(t))
        .unwrap_or(1)
}

/// Rows of a pass one chunked-attention workgroup serves (attention_chunks.wgsl's
/// `ROW_TILE`): as many as its (row, head) query slots and the queries' 2048 floats of
/// workgroup memory hold with `tile` heads of `head_dim`, at most the pass's `n`. It
/// groups rows only: each row's arithmetic is the same in any tile.
pub fn attention_row_tile(tile: usize, head_dim: usize, n: usize) -> usize {
    debug_assert!(
        tile <= 8 && head_dim <= 256,
        "the kernel's query memory holds 2048 floats"
    );
    (16 / tile).min(2048 / (tile * head_dim)).min(n).max(1)
}

/// Attention of `n` rows at positions `state[0] + row` over a cache of `capacity`
/// positions, in chunks of keys (GPUs): the per-head norms and RoPE of q and k and the
/// KV store of `qkv_rope_store` in its first dispatch, the chunks merged in the second.
pub fn attention_chunked(
    ctx: &GpuContext,
    s: &QkvShape,
    a: &AttentionShape,
    b: &ChunkedAttentionBuffers,
    capacity: usize,
    n: usize,
) -> Result<Vec<Dispatch>> {
    let (chunk, n_chunks) = attention_chunking(capacity);
    let group = s.n_heads / s.n_kv_heads;
    let tile = group_tile(group);
    let row_tile = attention_row_tile(tile, s.head_dim, n);
    let params = AttentionChunkParams {
        n_rows: n as u32,
        n_heads: s.n_heads as u32,
        n_kv_heads: s.n_kv_heads as u32,
        head_dim: s.head_dim as u32,
        rope_dim: s.rope_dim as u32,
        row_stride: s.row_stride() as u32,
        chunk: chunk as u32,
        n_chunks: n_chunks as u32,
        window: a.window as u32,
        causal: a.causal as u32,
        scale: 1.0 / (s.head_dim as f32).sqrt(),
        eps: s.eps,
    };
    let style = (s.style != RopeStyle::Interleaved) as u8 as f64;
    let k = Kernel::new(Shader::AttentionChunks, "partial")
        .with("STYLE", style)
        .with("QK_NORM", b.qkv.qk_norm.is_some() as u8 as f64)
        .with("GROUP_TILE", tile as f64)
        .with("ROW_TILE", row_tile as f64);
    let [qn, kn] = b.qkv.qk_norm.unwrap_or([&ctx.unused, &ctx.unused]);
    let q = &b.qkv;
    let bufs = [
        (1, q.state),
        (2, q.table),
        (3, q.qkv),
        (4, qn),
        (5, kn),
        (6, q.k_cache),
        (7, q.v_cache),
        (8, b.part_ml),
        (9, b.part_acc),
    ];
    let groups = [
        (s.n_kv_heads * group / tile) as u32,
        n.div_ceil(row_tile) as u32,
        n_chunks as u32,
    ];
    let shape = format!("{}/{}x{} n={n}", s.n_heads, s.n_kv_heads, s.head_dim);
    let kv_elt = if ctx.f16 { 2 } else { 4 };
    let kv_dim = s.n_kv_heads * s.head_dim;
    let own = n * (4 * s.n_heads * s.head_dim + 2 * kv_dim * (4 + kv_elt));
    let mut partial = Dispatch::new(ctx, &k, Some(&params), &bufs, groups)?
        .shaped(shape.clone(), own as u64)
        .family("attention");
    partial.label.bytes_per_key = (2 * kv_dim * kv_elt) as u64;
    let k = Kernel::new(Shader::AttentionChunks, "combine");
    let bufs = [(1, q.state), (8, b.part_ml), (9, b.part_acc), (10, b.out)];
    let groups = [s.n_heads as u32, n as u32, 1];
    let combine = Dispatch::new(ctx, &k, Some(&params), &bufs, groups)?
        .shaped(shape, (n * s.n_heads * s.head_dim * 4) as u64)
        .family("attention_combine");
    Ok(vec![partial, combine])
}

/// The uniform of attention.wgsl.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct AttentionParams {
    pub n_rows: u32,
    pub n_heads: u32,
    pub group: u32,
    pub head_dim: u32,
    pub kv_dim: u32,
    pub q_stride: u32,
    pub scale: f32,
    pub window: u32,
    pub causal: u32,
    pub pad0: u32,
    pub pad1: u32,
    pub pad2: u32,
}

/// The query heads one workgroup of attention.wgsl serves (its `HEADS`): the largest
/// divisor of the group (query heads per KV head) up to the kernel's `MAX_HEADS`, so
/// that every workgroup's heads share one KV head.
pub fn attention_heads_per_workgroup(group: usize) -> usize {
    const MAX_HEADS: usize = 8;
    (1..=group.clamp(1, MAX_HEADS))
        .rev()
        .find(|h| group.is_multiple_of(*h))
        .unwrap_or(1)
}

/// Causal attention of `n` query rows (positions `state[0] + row`) over a KV cache.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    ctx: &GpuContext,
    s: &AttentionShape,
    state: &wgpu::Buffer,
    q: &wgpu::Buffer,
    kc: &wgpu::Buffer,
    vc: &wgpu::Buffer,
    out: &wgpu::Buffer,
    n: usize,
) -> Result<Dispatch> {
    let kv_dim = s.n_kv_heads * s.head_dim;
    let params = AttentionParams {
        n_rows: n as u32,
        n_heads: s.n_heads as u32,
        group: (s.n_heads / s.n_kv_heads) as u32,
        head_dim: s.head_dim as u32,
        kv_dim: kv_dim as u32,
        q_stride: if s.q_stride > 0 {
            s.q_stride
        } else {
            s.n_heads * s.head_dim
        } as u32,
        scale: 1.0 / (s.head_dim as f32).sqrt(),
        window: s.window as u32,
        causal: s.causal as u32,
        pad0: 0,
        pad1: 0,
        pad2: 0,
    };
    if !s.head_dim.is_multiple_of(4) || s.head_dim > 4 * WORKGROUP_SIZE as usize {
        return Err(crate::error::GpuError::Unsupported(format!(
            "attention over heads of {} dimensions (a multiple of 4, at most {})",
            s.head_dim,
            4 * WORKGROUP_SIZE
        )));
    }
    let heads = attention_heads_per_workgroup(s.n_heads / s.n_kv_heads);
    let mut d = Dispatch::new(
        ctx,
        &Kernel::new(Shader::Attention, "main").with("HEADS", heads as f64),
        Some(&params),
        &[(1, state), (2, q), (3, kc), (4, vc), (5, out)],
        [(s.n_heads / heads) as u32, n as u32, 1],
    )?
    .shaped(
        format!("{}/{}x{} n={n}", s.n_heads, s.n_kv_heads, s.head_dim),
        (8 * n * s.n_heads * s.head_dim) as u64,
    );
    d.label.bytes_per_key = (2 * kv_dim * if ctx.f16 { 2 } else { 4 }) as u64;
    Ok(d)
}

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
        &[(1, gate), (2, up), (3, out)],
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
        &[(1, qkv), (3, att)],
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
        &[(1, bias), (3, buf)],
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
        &[(1, src), (4, state), (5, cache)],
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
        &[(1, src), (3, dst), (4, state)],
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
fn argmax_mapped(
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
        pad: 0,
    };
    let kernel = Kernel::new(Shader::Argmax, "main").with("MAP", id_map.is_some() as u8 as f64);
    Ok(Dispatch::new(
        ctx,
        &kernel,
        Some(&params),
        &[(1, logits), (2, tokens), (4, id_map.unwrap_or(&ctx.unused))],
        [rows as u32, 1, 1],
    )?
    .shaped(format!("{rows}x{len}"), 4 * (rows * len) as u64))
}

/// The uniform of the sampler (sample.wgsl's `Params`; dflash2.wgsl's walk reads it
/// as `SampleParams`).
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct SampleParams {
    pub len: u32,
    pub stride: u32,
    pub top_k: u32,
    pub pos_offset: u32,
    pub inv_temp: f32,
    pub top_p: f32,
    pub min_p: f32,
    pub seed_lo: u32,
    pub seed_hi: u32,
    pub out_offset: u32,
    pub pad0: u32,
    pub pad1: u32,
}

/// The sampler's uniform for `sp` over rows of `vocab` logits `stride` apart.
pub fn sample_params(
    vocab: usize,
    stride: usize,
    sp: &dflash_core::sampling::SamplingParams,
    pos_offset: u32,
) -> SampleParams {
    SampleParams {
        len: vocab as u32,
        stride: stride as u32,
        top_k: sp.top_k as u32,
        pos_offset,
        inv_temp: 1.0 / sp.temperature,
        top_p: sp.top_p,
        min_p: sp.min_p,
        seed_lo: sp.seed as u32,
        seed_hi: (sp.seed >> 32) as u32,
        out_offset: 0,
        pad0: 0,
        pad1: 0,
    }
}

/// Ids per chunk of the chunked sampler (sample.wgsl's `CHUNK`).
pub const SAMPLE_CHUNK: usize = 1024;
/// Words of the chunked sampler's per-row selection state (sample.wgsl's `SEL`).
const SAMPLE_SEL_WORDS: usize = 8;

/// The chunked sampler's scratch for up to `rows` rows of `vocab` logits: each chunk's
/// max or kept mass, each chunk's 256 bins of a radix round, each row's selection.
pub struct SampleScratch {
    chunk_vals: wgpu::Buffer,
    hist: wgpu::Buffer,
    sel: wgpu::Buffer,
}

impl SampleScratch {
    pub fn new(ctx: &GpuContext, rows: usize, vocab: usize) -> Self {
        let [chunk_vals, hist, sel] = sample_scratch_sizes(ctx, rows, vocab);
        SampleScratch {
            chunk_vals: work_buffer(ctx, "sample_chunks", chunk_vals),
            hist: work_buffer(ctx, "sample_hist", hist),
            sel: work_buffer(ctx, "sample_sel", sel),
        }
    }
}

/// Bytes of `SampleScratch`'s three buffers (16 each where the adapter samples in one
/// workgroup per row).
fn sample_scratch_sizes(ctx: &GpuContext, rows: usize, vocab: usize) -> [u64; 3] {
    if !ctx.tuning.chunked_sampler {
        return [16; 3];
    }
    let chunks = vocab.div_ceil(SAMPLE_CHUNK).max(1) as u64;
    let rows = rows as u64;
    let sel = (4 * SAMPLE_SEL_WORDS) as u64 * rows;
    [4 * rows * chunks, 8 * 256 * rows * chunks, sel]
}

/// Bytes of the sampler's scratch for `rows` rows of `vocab` logits.
pub fn sample_scratch_bytes(ctx: &GpuContext, rows: usize, vocab: usize) -> u64 {
    sample_scratch_sizes(ctx, rows, vocab).iter().sum()
}

/// The sampler's input and output buffers.
pub struct SampleBuffers<'a> {
    /// A uniform buffer holding `sample_params` (written per request, so the plan is
    /// built once).
    pub params: &'a wgpu::Buffer,
    pub state: &'a wgpu::Buffer,
    pub logits: &'a wgpu::Buffer,
    pub tokens: &'a wgpu::Buffer,
    pub scratch: &'a SampleScratch,
}

/// `tokens[r]` = a sample of row `r` of `logits` (`vocab` of them) by the rule of
/// `sampling::sample`, with the random number of position `state[0] + r + pos_offset`.
/// GPUs (`Tuning::chunked_sampler`) run sample.wgsl's chunked kernels: 20 dispatches of
/// many workgroups per row; CPU adapters its one workgroup per row.
pub fn sample(
    ctx: &GpuContext,
    b: &SampleBuffers,
    rows: usize,
    vocab: usize,
) -> Result<Vec<Dispatch>> {
    let k = |entry| Kernel::new(Shader::Sample, entry);
    if !ctx.tuning.chunked_sampler {
        let bufs = [(0, b.params), (1, b.state), (2, b.logits), (3, b.tokens)];
        let d = Dispatch::new(ctx, &k("main"), NO_PARAMS, &bufs, [rows as u32, 1, 1])?;
        return Ok(vec![d.shaped(format!("{rows} rows"), 0)]);
    }
    let (chunks, rows32) = (vocab.div_ceil(SAMPLE_CHUNK).max(1) as u32, rows as u32);
    let sc = b.scratch;
    let (p, logits) = ((0, b.params), (2, b.logits));
    let (vals, hist, sel) = ((8, &sc.chunk_vals), (9, &sc.hist), (10, &sc.sel));
    let shape = format!("{rows}x{vocab}");
    let logit_bytes = 4 * (rows * vocab) as u64;
    let dispatch = |k: &Kernel, bufs: &[(u32, &wgpu::Buffer)], groups, bytes| {
        Ok::<_, crate::error::GpuError>(
            Dispatch::new(ctx, k, NO_PARAMS, bufs, groups)?.shaped(shape.clone(), bytes),
        )
    };
    let mut d = vec![
        dispatch(
            &k("chunk_max"),
            &[p, logits, vals],
            [chunks, rows32, 1],
            logit_bytes,
        )?,
        dispatch(&k("prepare"), &[p, vals, sel], [rows32, 1, 1], 0)?,
    ];
    for mode in [0.0, 1.0] {
        for _ in 0..4 {
            let h = k("histogram").with("MODE", mode);
            d.push(dispatch(
                &h,
                &[p, logits, hist, sel],
                [chunks, rows32, 1],
                logit_bytes,
            )?);
            let s = k("select_byte").with("MODE", mode);
            d.push(dispatch(&s, &[p, hist, sel], [rows32, 1, 1], 0)?);
        }
    }
    let cm = k("chunk_mass");
    d.push(dispatch(
        &cm,
        &[p, logits, vals, sel],
        [chunks, rows32, 1],
        logit_bytes,
    )?);
    let bufs = [p, (1, b.state), logits, (3, b.tokens), vals, sel];
    d.push(dispatch(&k("draw"), &bufs, [rows32, 1, 1], 0)?);
    Ok(d)
}

/// The uniform of copy.wgsl.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct CopyParams {
    pub n: u32,
    pub wg_x: u32,
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
        &[(1, src), (2, dst)],
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
        &[(4, buf)],
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
        &[(1, x), (2, coef), (3, base), (4, out)],
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
        &[(5, logits), (6, ids), (7, vals)],
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
        (8, b.hp),
        (9, b.predecessor),
        (10, b.successor),
        (11, b.state),
        (12, b.drafts),
        (13, b.ids),
        (14, b.vals),
        (15, b.sample_params),
        (16, b.q_vals),
    ];
    Dispatch::new(
        ctx,
        &Kernel::new(Shader::DFlash2, "walk"),
        Some(&params),
        &bufs,
        [1, 1, 1],
    )
}

/// The buffers of rejection-sampling verification.
pub struct RejectionBuffers<'a> {
    pub sample_params: &'a wgpu::Buffer,
    pub state: &'a wgpu::Buffer,
    pub logits: &'a wgpu::Buffer,
    /// The block's tokens: `[anchor, drafts...]`.
    pub ids: &'a wgpu::Buffer,
    /// The proposal per row: `qk` (token, q) pairs (unused when `qk` is 0: certain drafts).
    pub q_ids: &'a wgpu::Buffer,
    pub q_vals: &'a wgpu::Buffer,
    pub verdict: &'a wgpu::Buffer,
}

/// Rejection-sampling verdicts of the `rows` drafted rows of a block (sample.wgsl).
pub fn verify_rejection(
    ctx: &GpuContext,
    b: &RejectionBuffers,
    rows: usize,
    qk: usize,
) -> Result<Dispatch> {
    let k = Kernel::new(Shader::Sample, "verify_rejection").with("QK", qk as f64);
    let bufs = [
        (0, b.sample_params),
        (1, b.state),
        (2, b.logits),
        (4, b.ids),
        (5, b.q_ids),
        (6, b.q_vals),
        (7, b.verdict),
    ];
    Dispatch::new(ctx, &k, NO_PARAMS, &bufs, [rows as u32, 1, 1])
}

/// A mixture of experts' sizes (`dflash_core::config::MoeConfig`).
#[derive(Debug, Clone, Copy)]
pub struct ExpertShape {
    pub n_experts: usize,
    /// Experts each row uses.
    pub k: usize,
    pub normalize: bool,
    pub hidden: usize,
}

/// The uniform of moe.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct MoeParams {
    pub n_rows: u32,
    pub n_experts: u32,
    pub normalize: u32,
    pub hidden: u32,
    pub tap_offset: u32,
    pub tap_stride: u32,
    pub pad0: u32,
    pub pad1: u32,
}

/// Each of `n` rows' experts and weights from its router `scores` (`[n, n_experts]`):
/// `routes` (u32) and `weights` (f32), `[n, k]` each.
pub fn route_experts(
    ctx: &GpuContext,
    s: &ExpertShape,
    scores: &wgpu::Buffer,
    (routes, weights): (&wgpu::Buffer, &wgpu::Buffer),
    n: usize,
) -> Result<Dispatch> {
    let k = Kernel::new(Shader::Moe, "route").with("EXPERT_K", s.k as f64);
    let params = MoeParams {
        n_rows: n as u32,
        n_experts: s.n_experts as u32,
        normalize: s.normalize as u32,
        ..Default::default()
    };
    let bufs = [(1, scores), (2, routes), (3, weights)];
    Ok(Dispatch::new(ctx, &k, Some(&params), &bufs, [1, 1, 1])?
        .shaped(format!("{} experts k={} n={n}", s.n_experts, s.k), 0))
}

/// `x[r] += sum_j weights[r, j] * expert_out[r, j]` over `n` rows, plus
/// `sigmoid(gate[r]) * out[r]` of the shared expert's `(out, gate)` where given (and the
/// new x into `tap` where given).
pub fn combine_experts(
    ctx: &GpuContext,
    s: &ExpertShape,
    (weights, expert_out): (&wgpu::Buffer, &wgpu::Buffer),
    shared: Option<(&wgpu::Buffer, &wgpu::Buffer)>,
    x: &wgpu::Buffer,
    tap: Option<GemvTap>,
    n: usize,
) -> Result<Dispatch> {
    let entry = if tap.is_some() {
        "combine_tap"
    } else {
        "combine"
    };
    let k = Kernel::new(Shader::Moe, entry)
        .with("EXPERT_K", s.k as f64)
        .with("SHARED", shared.is_some() as u8 as f64);
    let params = MoeParams {
        n_rows: n as u32,
        hidden: s.hidden as u32,
        tap_offset: tap.map_or(0, |t| t.offset) as u32,
        tap_stride: tap.map_or(0, |t| t.stride) as u32,
        ..Default::default()
    };
    let mut bufs = vec![(3, weights), (4, expert_out), (5, x)];
    if let Some(t) = tap {
        bufs.push((6, t.buf));
    }
    let (out, gate) = shared.unwrap_or((&ctx.unused, &ctx.unused));
    bufs.extend([(7, out), (8, gate)]);
    let groups = (n * s.hidden).div_ceil(WORKGROUP_SIZE as usize) as u32;
    let io = 4 * (n * s.hidden * (s.k + 2)) as u64;
    Ok(
        Dispatch::new(ctx, &k, Some(&params), &bufs, [groups, 1, 1])?
            .shaped(format!("{}x{} k={} n={n}", n, s.hidden, s.k), io),
    )
}

/// One projection of every expert a row chose, over `n` rows (gemv.wgsl
/// `main_experts`): `m` stacks the experts' rows (`rows_per_expert` each, no expert
/// split between chunks), `y[(r * k + j) * rows_per_expert + o]` for row r's slot j;
/// `x_slots`: row r's input for slot j is x row `r * k + j` (the down projection), else
/// x row r (with the norm of `f` where given). `f.pair`: `m` is `[gate; up]` of every
/// expert and y gets SwiGLU of the two.
#[allow(clippy::too_many_arguments)]
pub fn gemv_experts(
    ctx: &GpuContext,
    m: &GpuMatrix,
    s: &ExpertShape,
    routes: &wgpu::Buffer,
    (x, y): (&wgpu::Buffer, &wgpu::Buffer),
    x_slots: bool,
    f: &GemvFusion,
    n: usize,
) -> Result<Vec<Dispatch>> {
    let halves = if f.pair { 2 } else { 1 };
    let rows_per_expert = m.rows / s.n_experts / halves;
    let whole = |r: usize| r.is_multiple_of(rows_per_expert * halves);
    if f.norm_out.is_some() {
        return Err(crate::error::GpuError::Unsupported(
            "a next norm's share in an expert GEMV's epilogue".into(),
        ));
    }
    if rows_per_expert == 0
        || rows_per_expert * s.n_experts * halves != m.rows
        || (f.pair && m.chunks.len() != 1)
        || m.chunks.iter().any(|c| !whole(c.row_lo) || !whole(c.rows))
    {
        return Err(crate::error::GpuError::Unsupported(format!(
            "an expert stack of {} rows for {} experts, split between buffers",
            m.rows, s.n_experts
        )));
    }
    let k = Kernel::new(Shader::Gemv, "main_experts")
        .with("FORMAT", format_id(m.format))
        .with("GROUP", m.group as f64)
        .with("N_ROWS", n as f64)
        .with("LANES", gemv_lanes(ctx, m) as f64)
        .with("OUTS", gemv_outputs(ctx, m, f.pair) as f64)
        .with("THREADS", gemv_threads(ctx, m) as f64)
        .with("NORM", f.norm.is_some() as u8 as f64)
        .with("NORM_SUMS", f.prenormed.is_some() as u8 as f64)
        .with("PAIR", f.pair as u8 as f64)
        .with("EXPERT_K", s.k as f64)
        .with("X_SLOTS", x_slots as u8 as f64);
    let tiles = rows_per_expert.div_ceil(gemv_rows_per_workgroup(ctx, m, f.pair));
    let (eps, norm_parts) = gemv_norm_params(ctx, m, f);
    let mut out = Vec::new();
    for ch in &m.chunks {
        let experts = ch.rows / rows_per_expert / halves;
        let (gx, gy) = grid((experts * tiles) as u32);
        let params = GemvParams {
            n_rows: n as u32,
            k: m.cols as u32,
            m: rows_per_expert as u32,
            out_stride: rows_per_expert as u32,
            wg_x: gx,
            eps,
            pair_rows: if f.pair { (ch.rows / 2) as u32 } else { 0 },
            expert_lo: (ch.row_lo / rows_per_expert / halves) as u32,
            norm_parts: norm_parts as u32,
            ..Default::default()
        };
        let bufs = [
            (1, x),
            (2, &ch.qs),
            (3, &ch.scales),
            (4, &ch.mins),
            (5, y),
            (6, f.norm.map_or(&ctx.unused, |(w, _)| w)),
            (7, &ctx.unused),
            (10, routes),
        ];
        // What a pass reads at most: every expert some row chose, once.
        let chosen = (n * s.k).min(experts) as u64;
        let per_expert = (ch.qs.size() + ch.scales.size() + ch.mins.size()) / experts as u64;
        let io = 4 * (n * (m.cols + rows_per_expert * halves * s.k)) as u64;
        out.push(
            Dispatch::new(ctx, &k, Some(&params), &bufs, [gx, gy, 1])?.shaped(
                format!(
                    "experts {}",
                    shape_name(rows_per_expert * halves, m.cols, m.format, n)
                ),
                chosen * per_expert + io,
            ),
        );
    }
    Ok(out)
}

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
    let at = [(10, b.position), (11, b.pass_start)];
    let conv_bufs = [
        (1, b.proj),
        (2, b.conv_w),
        (3, b.conv_state),
        (4, b.mixed),
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
        (1, b.proj),
        (4, b.mixed),
        (5, b.s_state),
        (6, b.dt_bias),
        (7, b.decay),
        (8, b.norm_w),
        (9, b.read),
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
        (3, b.conv_state),
        (5, b.s_state),
        (12, b.conv_pre),
        (13, b.s_pre),
    ];
    if !restore {
        bufs.extend([(10, b.position), (11, b.pass_start)]);
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
