//! The 8-bit-activation GEMV (`shaders/gemv_dp4a.wgsl`): activations quantized per
//! weight group, each group's product an exact integer dot (`dot4I8Packed`), the CPU
//! engine's arithmetic (`dflash_core::cpu::quant_matmul`). Not in any model's plan yet:
//! the profiler measures it per weight shape against the f32-activation GEMV
//! (`profile::calibrate`), where the adapter has WGSL's `packed_4x8_integer_dot_product`.

use super::{format_id, shape_name};
use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::pipelines::{grid, Dispatch, Kernel, Shader, WORKGROUP_SIZE};
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
    pub pad1: u32,
    pub pad2: u32,
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

impl QuantizedActivations {
    /// Buffers for `rows` rows of `cols` values, quantized for weights like `m`.
    pub fn for_matrix(ctx: &GpuContext, m: &GpuMatrix, rows: usize) -> Result<Self> {
        let kernel_reads = match m.format {
            QFormat::Q4 => m.group == 32,
            QFormat::Q8 => m.group == 16 || m.group == 32,
            QFormat::F32 => false,
        };
        if !kernel_reads || !m.cols.is_multiple_of(m.group) {
            return Err(GpuError::Unsupported(format!(
                "8-bit activations for a {:?} matrix of groups of {}",
                m.format, m.group
            )));
        }
        Ok(QuantizedActivations {
            format: m.format,
            group: m.group,
            rows,
            cols: m.cols,
            qs: work_buffer(ctx, "x q8", (rows * m.cols) as u64),
            scales_sums: work_buffer(ctx, "x q8 scales", (rows * m.cols / m.group * 8) as u64),
        })
    }

    fn kernel(&self, entry: &'static str) -> Kernel {
        Kernel::new(Shader::GemvDp4a, entry)
            .with("FORMAT", format_id(self.format))
            .with("GROUP", self.group as f64)
    }
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
    check_adapter(ctx)?;
    let groups = q.rows * q.cols / q.group;
    let (gx, gy) = grid(groups.div_ceil(WORKGROUP_SIZE as usize) as u32);
    let params = Dp4aParams {
        n_rows: q.rows as u32,
        k: q.cols as u32,
        wg_x: gx,
        ..Default::default()
    };
    let bufs = [(1, x), (2, &q.qs), (3, &q.scales_sums)];
    let bytes = (q.rows * q.cols * 5 + groups * 8) as u64;
    Ok(Dispatch::new(
        ctx,
        &q.kernel("quantize"),
        Some(&params),
        &bufs,
        [gx, gy, 1],
    )?
    .shaped(format!("{}x{}", q.rows, q.cols), bytes)
    .family("quantize_q8"))
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
    check_adapter(ctx)?;
    if (x.format, x.group, x.cols) != (m.format, m.group, m.cols) || n > x.rows.min(16) {
        return Err(GpuError::Unsupported(format!(
            "{n} rows of activations quantized for {:?}/{} x {} against a {:?}/{} x {} matrix",
            x.format, x.group, x.cols, m.format, m.group, m.cols
        )));
    }
    let outputs = outputs.clamp(1, 4);
    let k = x
        .kernel("main")
        .with("N_ROWS", n as f64)
        .with("OUTS", outputs as f64);
    let per = outputs * WORKGROUP_SIZE as usize / LANES;
    let mut out = Vec::new();
    for ch in &m.chunks {
        let (gx, gy) = grid(ch.rows.div_ceil(per) as u32);
        let params = Dp4aParams {
            n_rows: n as u32,
            k: m.cols as u32,
            m: ch.rows as u32,
            out_offset: ch.row_lo as u32,
            out_stride: m.rows as u32,
            wg_x: gx,
            ..Default::default()
        };
        let bufs = [
            (2, &x.qs),
            (3, &x.scales_sums),
            (4, &ch.qs),
            (5, &ch.scales),
            (6, &ch.mins),
            (7, y),
        ];
        let weights = ch.qs.size() + ch.scales.size() + ch.mins.size();
        let io = (n * m.cols + n * m.cols / m.group * 8 + 4 * n * ch.rows) as u64;
        out.push(
            Dispatch::new(ctx, &k, Some(&params), &bufs, [gx, gy, 1])?
                .shaped(shape_name(ch.rows, m.cols, m.format, n), weights + io)
                .family("gemv_dp4a"),
        );
    }
    Ok(out)
}
