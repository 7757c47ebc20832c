//! The 8-bit-activation GEMV (`shaders/gemv_dp4a.wgsl`): activations quantized per
//! weight group, each group's product an exact integer dot (`dot4I8Packed`), the CPU
//! engine's arithmetic (`dflash_core::cpu::quant_matmul`). Where the adapter's tuning asks
//! for 8-bit activations (`Tuning::int8_activations`, which needs WGSL's
//! `packed_4x8_integer_dot_product`), `ops::gemv_fused` runs every GEMV over a matrix this
//! kernel reads through `gemv_fused` here: the input quantized (with its RMSNorm where the
//! GEMV would have fused it) into the context's scratch, then this GEMV with the bias,
//! SwiGLU, residual and tap epilogues. The profiler also measures it per weight shape
//! against the f32-activation GEMV (`profile::calibrate`).

use super::gemv_fusion::{format_id, shape_name, GemvFusion};
use crate::context::GpuContext;
use crate::error::{GpuError, Result};
pub use crate::int8_scratch::Int8Scratch;
use crate::pipelines::{bindings, grid, Dispatch, Kernel, Shader, WORKGROUP_SIZE};
use crate::upload::{work_buffer, GpuMatrix};
use dflash_core::quant::QFormat;

/// Lanes per output row: one per accumulator of the CPU engine's row dot.
const LANES: usize = 8;

/// The uniform of gemv_dp4a.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Dp4aParams {
    pub n_rows: u32,
    pub k: u32,
    pub m: u32,
    pub out_offset: u32,
    pub out_stride: u32,
    pub wg_x: u32,
    pub eps: f32,
    pub bias_offset: u32,
    pub pair_rows: u32,
    pub tap_offset: u32,
    pub tap_stride: u32,
    pub pad: u32,
}

bindings! {
    /// The `@binding`s of gemv_dp4a.wgsl.
    Dp4aBinding(GemvDp4a) {
        X = 1, XQ = 2, XS = 3, QS = 4, SCALES = 5, MINS = 6, Y = 7, BIAS = 8, TAPS = 9, NORM_W = 10,
    }
}

/// Rows of activations quantized for one weight format and group size: the bytes
/// (`[rows, k]` bytes as `vec4<u32>`, each group in the weight format's byte order) and each
/// group's (scale, scale * sum(q)).
pub struct QuantizedActivations {
    pub format: QFormat,
    pub group: usize,
    pub rows: usize,
    pub cols: usize,
    pub qs: wgpu::Buffer,
    pub scales_sums: wgpu::Buffer,
}

/// Whether the kernels read `m` with 8-bit activations: a q4 matrix of groups of 32 or
/// a q8 one of groups of 16 or 32.
fn reads(m: &GpuMatrix) -> bool {
    let format = match m.format {
        QFormat::Q4 => m.group == 32,
        QFormat::Q8 => m.group == 16 || m.group == 32,
        QFormat::F32 => false,
    };
    format && m.cols.is_multiple_of(m.group)
}

/// Whether a GEMV over `m` runs on 8-bit activations on this device: the tuning asks for
/// them and the kernels read `m` (f32 matrices keep f32 activations, as on the CPU engine).
pub fn applies(ctx: &GpuContext, m: &GpuMatrix) -> bool {
    ctx.tuning.int8_activations && ctx.summary.packed_int8_dot && reads(m)
}

impl QuantizedActivations {
    /// Buffers for `rows` rows of `cols` values, quantized for weights like `m`.
    pub fn for_matrix(ctx: &GpuContext, m: &GpuMatrix, rows: usize) -> Result<Self> {
        check_matrix(m)?;
        Ok(QuantizedActivations {
            format: m.format,
            group: m.group,
            rows,
            cols: m.cols,
            qs: work_buffer(ctx, "x q8", (rows * m.cols) as u64),
            scales_sums: work_buffer(ctx, "x q8 scales", (rows * m.cols / m.group * 8) as u64),
        })
    }

    /// `for_matrix` in the context's shared scratch (16 rows).
    pub fn scratch(ctx: &GpuContext, m: &GpuMatrix) -> Result<Self> {
        check_matrix(m)?;
        let rows = crate::pipelines::MAX_ROWS;
        reserve_scratch(ctx, m.cols);
        let held = ctx.int8_scratch.borrow();
        let s = held.as_ref().expect("just reserved");
        Ok(QuantizedActivations {
            format: m.format,
            group: m.group,
            rows,
            cols: m.cols,
            qs: s.qs.clone(),
            scales_sums: s.scales_sums.clone(),
        })
    }

    fn kernel(&self, entry: &'static str) -> Kernel {
        Kernel::new(Shader::GemvDp4a, entry)
            .with("FORMAT", format_id(self.format))
            .with("GROUP", self.group as f64)
    }
}

/// Grows the context's shared scratch to inputs of `cols` values where it is narrower.
/// A model reserves its widest input at assembly: the plans built before a growth keep
/// the narrower buffers alive, so growing width by width would hold them all.
pub fn reserve_scratch(ctx: &GpuContext, cols: usize) {
    let rows = crate::pipelines::MAX_ROWS;
    let mut held = ctx.int8_scratch.borrow_mut();
    if held.as_ref().is_none_or(|s| s.cols < cols) {
        // Groups of 16 at least: 8 bytes of (scale, sum) per 16 values at most.
        *held = Some(Int8Scratch {
            cols,
            qs: work_buffer(ctx, "x q8 scratch", (rows * cols) as u64),
            scales_sums: work_buffer(ctx, "x q8 scales scratch", (rows * cols / 2) as u64),
        });
    }
}

/// Bytes of the shared scratch for inputs of at most `cols` values (`scratch`).
pub fn scratch_bytes(cols: usize) -> u64 {
    (crate::pipelines::MAX_ROWS * cols * 3 / 2) as u64
}

fn check_matrix(m: &GpuMatrix) -> Result<()> {
    if reads(m) {
        return Ok(());
    }
    Err(GpuError::Unsupported(format!(
        "8-bit activations for a {:?} matrix of groups of {}",
        m.format, m.group
    )))
}

fn check_adapter(ctx: &GpuContext) -> Result<()> {
    if ctx.summary.packed_int8_dot {
        return Ok(());
    }
    Err(GpuError::Unsupported(
        "integer dot products (WGSL packed_4x8_integer_dot_product) on this adapter".into(),
    ))
}

/// Quantizes `x` (`[q.rows, q.cols]` f32) into `q`: one thread per row and group.
pub fn quantize(ctx: &GpuContext, x: &wgpu::Buffer, q: &QuantizedActivations) -> Result<Dispatch> {
    quantize_rows(ctx, x, q, q.rows, None)
}

/// Quantizes the first `n` rows of `x` into `q`, each RMS-normalised by `norm` (weight,
/// eps) first where given (one workgroup per row), else one thread per row and group.
pub fn quantize_rows(
    ctx: &GpuContext,
    x: &wgpu::Buffer,
    q: &QuantizedActivations,
    n: usize,
    norm: Option<(&wgpu::Buffer, f32)>,
) -> Result<Dispatch> {
    check_adapter(ctx)?;
    let groups = n * q.cols / q.group;
    let (entry, (gx, gy)) = match norm {
        Some(_) => ("quantize_norm", (n as u32, 1)),
        None => (
            "quantize",
            grid(groups.div_ceil(WORKGROUP_SIZE as usize) as u32),
        ),
    };
    let params = Dp4aParams {
        n_rows: n as u32,
        k: q.cols as u32,
        wg_x: gx,
        eps: norm.map_or(0.0, |(_, eps)| eps),
        ..Default::default()
    };
    let w = norm.map_or(&ctx.unused, |(w, _)| w);
    let bufs = [
        (Dp4aBinding::X, x),
        (Dp4aBinding::XQ, &q.qs),
        (Dp4aBinding::XS, &q.scales_sums),
        (Dp4aBinding::NORM_W, w),
    ];
    let bytes = (n * q.cols * 5 + groups * 8) as u64;
    Ok(
        Dispatch::new(ctx, &q.kernel(entry), Some(&params), &bufs, [gx, gy, 1])?
            .shaped(format!("{}x{}", n, q.cols), bytes)
            .family("quantize_q8"),
    )
}

/// `y[r, o] = W x[r]` for the `n <= 16` quantized rows of `x`, one dispatch per chunk of
/// W; `outputs` output rows per thread (1, 2 or 4).
pub fn gemv(
    ctx: &GpuContext,
    m: &GpuMatrix,
    x: &QuantizedActivations,
    y: &wgpu::Buffer,
    n: usize,
    outputs: usize,
) -> Result<Vec<Dispatch>> {
    gemv_epilogue(ctx, m, x, (y, n), outputs, &GemvFusion::default())
}

/// `ops::gemv_fused` on 8-bit activations: `x`'s first `n` rows quantized into the
/// context's scratch (RMS-normalised first where `f` has the norm), then the GEMV with
/// `f`'s bias, SwiGLU, residual and tap epilogues. The greedy head's partials and the
/// split norm (`prenormed`, `norm_out`) are not among them: a plan that asks for 8-bit
/// activations leaves them out (`ops::greedy_head`, `Tuning::int8_activations`).
pub fn gemv_fused(
    ctx: &GpuContext,
    m: &GpuMatrix,
    x: &wgpu::Buffer,
    (y, n): (&wgpu::Buffer, usize),
    f: &GemvFusion,
) -> Result<Vec<Dispatch>> {
    if f.argmax.is_some() || f.prenormed.is_some() || f.norm_out.is_some() {
        return Err(GpuError::Unsupported(
            "the greedy head's partials or a split norm on 8-bit activations".into(),
        ));
    }
    let q = QuantizedActivations::scratch(ctx, m)?;
    let outputs = super::gemv_fusion::gemv_outputs(ctx, m, f.pair);
    let mut d = vec![quantize_rows(ctx, x, &q, n, f.norm)?];
    d.extend(gemv_epilogue(ctx, m, &q, (y, n), outputs, f)?);
    Ok(d)
}

/// The GEMV of `gemv` with `f`'s epilogues (bias, pair, accumulate, tap, the output's
/// offset and stride).
fn gemv_epilogue(
    ctx: &GpuContext,
    m: &GpuMatrix,
    x: &QuantizedActivations,
    (y, n): (&wgpu::Buffer, usize),
    outputs: usize,
    f: &GemvFusion,
) -> Result<Vec<Dispatch>> {
    check_adapter(ctx)?;
    if (x.format, x.group, x.cols) != (m.format, m.group, m.cols) || n > x.rows.min(16) {
        return Err(GpuError::Unsupported(format!(
            "{n} rows of activations quantized for {:?}/{} x {} against a {:?}/{} x {} matrix",
            x.format, x.group, x.cols, m.format, m.group, m.cols
        )));
    }
    if f.pair && (m.chunks.len() != 1 || !m.rows.is_multiple_of(2)) {
        return Err(GpuError::Unsupported(
            "a paired GEMV over a matrix split into chunks".into(),
        ));
    }
    // A paired GEMV's up rows share the thread's 64 accumulators: 2 pairs at most.
    let most = if f.pair { 2 } else { 4 };
    let outputs = outputs.clamp(1, most).next_power_of_two().min(most);
    let k = x
        .kernel(if f.tap.is_some() { "main_tap" } else { "main" })
        .with("N_ROWS", n as f64)
        .with("OUTS", outputs as f64)
        .with("ACCUMULATE", f.accumulate as u8 as f64)
        .with("BIAS", f.bias.is_some() as u8 as f64)
        .with("PAIR", f.pair as u8 as f64);
    let per = outputs * WORKGROUP_SIZE as usize / LANES;
    let out_rows = if f.pair { m.rows / 2 } else { m.rows };
    let mut out = Vec::new();
    for ch in &m.chunks {
        let rows = if f.pair { ch.rows / 2 } else { ch.rows };
        let (gx, gy) = grid(rows.div_ceil(per) as u32);
        let params = Dp4aParams {
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
            bias_offset: ch.row_lo as u32,
            pair_rows: if f.pair { rows as u32 } else { 0 },
            tap_offset: f.tap.map_or(0, |t| t.offset) as u32,
            tap_stride: f.tap.map_or(0, |t| t.stride) as u32,
            ..Default::default()
        };
        let mut bufs = vec![
            (Dp4aBinding::XQ, &x.qs),
            (Dp4aBinding::XS, &x.scales_sums),
            (Dp4aBinding::QS, &ch.qs),
            (Dp4aBinding::SCALES, &ch.scales),
            (Dp4aBinding::MINS, &ch.mins),
            (Dp4aBinding::Y, y),
            (Dp4aBinding::BIAS, f.bias.unwrap_or(&ctx.unused)),
        ];
        if let Some(t) = f.tap {
            bufs.push((Dp4aBinding::TAPS, t.buf));
        }
        let weights = ch.qs.size() + ch.scales.size() + ch.mins.size();
        let io = (n * m.cols + n * m.cols / m.group * 8 + 4 * n * rows) as u64;
        out.push(
            Dispatch::new(ctx, &k, Some(&params), &bufs, [gx, gy, 1])?
                .shaped(shape_name(ch.rows, m.cols, m.format, n), weights + io)
                .family("gemv_dp4a"),
        );
    }
    Ok(out)
}
