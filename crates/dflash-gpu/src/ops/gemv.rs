//! The GEMV (`shaders/gemv.wgsl`) with the fusions of `GemvFusion` (the RMSNorm
//! prologue, bias, SwiGLU pair, residual add, DFlash tap, the next norm's share, the
//! greedy head's partials; their sizing in `gemv_fusion`), and the greedy head built on
//! it. On 8-bit activations `gemv_fused` hands over to `dp4a`.

use super::argmax::{argmax_mapped, reduce_partials};
use super::dp4a;
use super::gemv_fusion::{
    argmax_parts, argmax_rows_per_part, format_id, gemv_lanes, gemv_norm_params, gemv_outputs,
    gemv_rows_per_workgroup, gemv_threads, shape_name, GemvFusion,
};
use crate::context::GpuContext;
use crate::error::Result;
use crate::pipelines::{bindings, grid, Dispatch, Kernel, Shader};
use crate::upload::GpuMatrix;

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

bindings! {
    /// The `@binding`s of gemv.wgsl.
    GemvBinding(Gemv) {
        X = 1, QS = 2, SCALES = 3, MINS = 4, Y = 5, NORM_W = 6, BIAS = 7, BEST = 8, TAPS = 9,
        ROUTES = 10, PRENORM = 11,
    }
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
            (GemvBinding::X, x),
            (GemvBinding::QS, &ch.qs),
            (GemvBinding::SCALES, &ch.scales),
            (GemvBinding::MINS, &ch.mins),
            (GemvBinding::Y, y),
            (GemvBinding::NORM_W, norm_w.unwrap_or(&ctx.unused)),
            (GemvBinding::BIAS, f.bias.unwrap_or(&ctx.unused)),
        ];
        if let Some(b) = f.argmax {
            bufs.push((GemvBinding::BEST, b));
        }
        if let Some(t) = f.tap {
            bufs.push((GemvBinding::TAPS, t.buf));
        }
        if let Some(o) = f.norm_out {
            bufs.push((GemvBinding::PRENORM, o.buf));
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
