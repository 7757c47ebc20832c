//! Weights to the GPU: each matrix split by rows into chunks that fit the adapter's
//! storage-binding limit, values / scales / mins in separate buffers.

use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use dflash_core::quant::{QFormat, QuantMatrix};

/// Buffers are reference-counted handles: a clone shares the same GPU memory.
#[derive(Clone)]
pub struct MatrixChunk {
    pub row_lo: usize,
    pub rows: usize,
    pub qs: wgpu::Buffer,
    pub scales: wgpu::Buffer,
    pub mins: wgpu::Buffer,
}

#[derive(Clone)]
pub struct GpuMatrix {
    pub format: QFormat,
    pub group: usize,
    pub rows: usize,
    pub cols: usize,
    pub chunks: Vec<MatrixChunk>,
    pub n_bytes: u64,
}

/// Rows per chunk such that every buffer of the chunk fits `max_binding` bytes.
pub fn rows_per_chunk(m: &QuantMatrix, max_binding: u64) -> Result<usize> {
    rows_per_chunk_of(m.rows, m.cols, m.format, max_binding)
}

/// `rows_per_chunk` of a `rows x cols` matrix in `format`, from its shape alone.
pub fn rows_per_chunk_of(
    rows: usize,
    cols: usize,
    format: QFormat,
    max_binding: u64,
) -> Result<usize> {
    let row_bytes = (cols * format.bits() / 8) as u64;
    let by_limit = (max_binding / row_bytes.max(1)) as usize;
    if by_limit == 0 {
        return Err(GpuError::LimitExceeded {
            what: format!("one row of a {rows}x{cols} matrix"),
            need: row_bytes,
            limit: max_binding,
            limit_name: "max_storage_buffer_binding_size",
        });
    }
    // Keep chunks a multiple of 4 rows (one gemv workgroup) where possible.
    Ok(if by_limit >= rows {
        rows
    } else {
        (by_limit / 4 * 4).max(1)
    })
}

pub fn storage_buffer(ctx: &GpuContext, label: &str, bytes: &[u8]) -> wgpu::Buffer {
    ctx.buffer_with(
        label,
        bytes,
        wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
    )
}

pub fn f32_buffer(ctx: &GpuContext, label: &str, v: &[f32]) -> wgpu::Buffer {
    storage_buffer(ctx, label, bytemuck::cast_slice(v))
}

/// A zeroed read-write storage buffer of `size` bytes.
pub fn work_buffer(ctx: &GpuContext, label: &str, size: u64) -> wgpu::Buffer {
    ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: size.max(16).div_ceil(16) * 16,
        usage: wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    })
}

fn halves(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|h| h.to_le_bytes()).collect()
}

pub fn upload_matrix(ctx: &GpuContext, name: &str, m: &QuantMatrix) -> Result<GpuMatrix> {
    upload_matrix_chunked(ctx, name, m, rows_per_chunk(m, ctx.max_binding())?)
}

/// A stack of `parts` matrices of equal rows (a mixture's experts) in chunks that
/// never split one of them.
pub fn upload_stack(
    ctx: &GpuContext,
    name: &str,
    m: &QuantMatrix,
    parts: usize,
) -> Result<GpuMatrix> {
    let per = stack_rows_per_chunk(m.rows, m.cols, m.format, parts, ctx.max_binding())?;
    upload_matrix_chunked(ctx, name, m, per)
}

/// `rows_per_chunk_of` for a stack of `parts` matrices: a whole number of them per
/// chunk (`LimitExceeded` where one alone does not fit a binding).
pub fn stack_rows_per_chunk(
    rows: usize,
    cols: usize,
    format: QFormat,
    parts: usize,
    max_binding: u64,
) -> Result<usize> {
    let per = rows_per_chunk_of(rows, cols, format, max_binding)?;
    let per_part = rows / parts.max(1);
    if per >= rows || parts <= 1 || per_part == 0 {
        return Ok(per);
    }
    if per < per_part {
        return Err(GpuError::LimitExceeded {
            what: format!("one of the {parts} stacked {per_part}x{cols} matrices"),
            need: (per_part * cols * format.bits() / 8) as u64,
            limit: max_binding,
            limit_name: "max_storage_buffer_binding_size",
        });
    }
    Ok(per / per_part * per_part)
}

/// Uploads in chunks of `per` rows (the last may be shorter).
pub fn upload_matrix_chunked(
    ctx: &GpuContext,
    name: &str,
    m: &QuantMatrix,
    per: usize,
) -> Result<GpuMatrix> {
    if m.format == QFormat::F32 {
        return Err(GpuError::Unsupported(format!(
            "{name} is an f32 matrix (a full-precision drafter): the GPU kernels read 4- and 8-bit weights; load the drafter in 4 bits (the default) or 8 for the GPU"
        )));
    }
    let words_per_row = m.cols * m.format.bits() / 32;
    let gpr = m.groups_per_row();
    let mut chunks = Vec::new();
    let mut row_lo = 0;
    while row_lo < m.rows {
        let rows = per.min(m.rows - row_lo);
        let qs = &m.qs[row_lo * words_per_row..(row_lo + rows) * words_per_row];
        let g = row_lo * gpr..(row_lo + rows) * gpr;
        chunks.push(MatrixChunk {
            row_lo,
            rows,
            qs: storage_buffer(ctx, name, bytemuck::cast_slice(qs)),
            scales: storage_buffer(ctx, name, &halves(&m.scales[g.clone()])),
            mins: storage_buffer(ctx, name, &halves(&m.mins[g])),
        });
        row_lo += rows;
    }
    Ok(GpuMatrix {
        format: m.format,
        group: m.group,
        rows: m.rows,
        cols: m.cols,
        chunks,
        n_bytes: m.n_bytes() as u64,
    })
}

/// Bytes of a matrix's value words and of its f16 scale (or min) array.
fn part_bytes(m: &GpuMatrix) -> (u64, u64) {
    let words = m.cols * m.format.bits() / 32;
    let groups = m.rows * (m.cols / m.group);
    ((m.rows * words * 4) as u64, (groups * 2) as u64)
}

/// The rows of `parts` stacked into one matrix by copies on the GPU (no host round
/// trip, so streamed weights stack too), or None where they cannot share one set of
/// buffers: other formats, groups or widths, a part split into chunks, a scale array
/// that does not end on a 4-byte boundary, or a result over the binding limit.
pub fn concat_rows(ctx: &GpuContext, label: &str, parts: &[&GpuMatrix]) -> Option<GpuMatrix> {
    let first = parts.first()?;
    let same = |m: &&GpuMatrix| {
        m.chunks.len() == 1
            && m.format == first.format
            && m.group == first.group
            && m.cols == first.cols
    };
    if !parts.iter().all(same) {
        return None;
    }
    let sizes: Vec<(u64, u64)> = parts.iter().map(|m| part_bytes(m)).collect();
    if sizes[..sizes.len() - 1].iter().any(|s| s.1 % 4 != 0) {
        return None;
    }
    let (qs_total, sc_total) = sizes.iter().fold((0, 0), |(a, b), s| (a + s.0, b + s.1));
    if qs_total > ctx.max_binding() {
        return None;
    }
    let qs = work_buffer(ctx, label, qs_total);
    let scales = work_buffer(ctx, label, sc_total);
    let mins = work_buffer(ctx, label, sc_total);
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    let (mut at_q, mut at_s) = (0, 0);
    for (m, (nq, ns)) in parts.iter().zip(&sizes) {
        let ch = &m.chunks[0];
        enc.copy_buffer_to_buffer(&ch.qs, 0, &qs, at_q, *nq);
        enc.copy_buffer_to_buffer(&ch.scales, 0, &scales, at_s, ns.div_ceil(4) * 4);
        enc.copy_buffer_to_buffer(&ch.mins, 0, &mins, at_s, ns.div_ceil(4) * 4);
        at_q += nq;
        at_s += ns;
    }
    ctx.queue.submit([enc.finish()]);
    let rows = parts.iter().map(|m| m.rows).sum();
    Some(GpuMatrix {
        format: first.format,
        group: first.group,
        rows,
        cols: first.cols,
        chunks: vec![MatrixChunk {
            row_lo: 0,
            rows,
            qs,
            scales,
            mins,
        }],
        n_bytes: parts.iter().map(|m| m.n_bytes).sum(),
    })
}

/// f32 vectors (buffer, length) concatenated by copies on the GPU.
pub fn concat_f32(ctx: &GpuContext, label: &str, parts: &[(&wgpu::Buffer, usize)]) -> wgpu::Buffer {
    let total: usize = parts.iter().map(|p| p.1).sum();
    let out = work_buffer(ctx, label, 4 * total as u64);
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    let mut at = 0;
    for (b, len) in parts {
        enc.copy_buffer_to_buffer(b, 0, &out, 4 * at as u64, 4 * *len as u64);
        at += len;
    }
    ctx.queue.submit([enc.finish()]);
    out
}

/// Rows `ids` (ascending) of `m` as a matrix of their own, by copies on the GPU (a
/// drafter's draft head out of the target's lm_head, streamed or not), or None where a
/// row's scales do not fill whole 4-byte words (copies move words) or the result does
/// not fit one binding. Consecutive ids are copied as one run.
pub fn gather_rows(ctx: &GpuContext, label: &str, m: &GpuMatrix, ids: &[u32]) -> Option<GpuMatrix> {
    let row_q = (m.cols * m.format.bits() / 8) as u64;
    let row_s = (m.cols / m.group * 2) as u64;
    let n = ids.len() as u64;
    if !row_s.is_multiple_of(4) || n * row_q > ctx.max_binding() || ids.is_empty() {
        return None;
    }
    let qs = work_buffer(ctx, label, n * row_q);
    let scales = work_buffer(ctx, label, n * row_s);
    let mins = work_buffer(ctx, label, n * row_s);
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    let mut i = 0;
    while i < ids.len() {
        let id = ids[i] as usize;
        let ch = m
            .chunks
            .iter()
            .find(|c| (c.row_lo..c.row_lo + c.rows).contains(&id))?;
        let mut run = 1;
        while i + run < ids.len()
            && ids[i + run] as usize == id + run
            && id + run < ch.row_lo + ch.rows
        {
            run += 1;
        }
        let (src, dst, len) = ((id - ch.row_lo) as u64, i as u64, run as u64);
        enc.copy_buffer_to_buffer(&ch.qs, src * row_q, &qs, dst * row_q, len * row_q);
        enc.copy_buffer_to_buffer(&ch.scales, src * row_s, &scales, dst * row_s, len * row_s);
        enc.copy_buffer_to_buffer(&ch.mins, src * row_s, &mins, dst * row_s, len * row_s);
        i += run;
    }
    ctx.queue.submit([enc.finish()]);
    Some(GpuMatrix {
        format: m.format,
        group: m.group,
        rows: ids.len(),
        cols: m.cols,
        chunks: vec![MatrixChunk {
            row_lo: 0,
            rows: ids.len(),
            qs,
            scales,
            mins,
        }],
        n_bytes: n * (row_q + 2 * row_s),
    })
}
