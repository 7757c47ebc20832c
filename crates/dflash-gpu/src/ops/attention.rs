//! Attention: the per-head norms, RoPE and KV store of a QKV row (qkv.wgsl), attention
//! over the KV cache (attention.wgsl) and chunked attention, which does both in two
//! dispatches (attention_chunks.wgsl).

use crate::context::GpuContext;
use crate::error::Result;
use crate::pipelines::{bindings, Dispatch, Kernel, Shader, WORKGROUP_SIZE};
use dflash_core::config::RopeStyle;

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

bindings! {
    /// The `@binding`s of qkv.wgsl.
    QkvBinding(Qkv) {
        STATE = 1, TABLE = 2, QKV = 3, Q_NORM = 4, K_NORM = 5, K_CACHE = 6, V_CACHE = 7,
    }
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
        (QkvBinding::STATE, b.state),
        (QkvBinding::TABLE, b.table),
        (QkvBinding::QKV, b.qkv),
        (QkvBinding::Q_NORM, qn),
        (QkvBinding::K_NORM, kn),
        (QkvBinding::K_CACHE, b.k_cache),
        (QkvBinding::V_CACHE, b.v_cache),
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

bindings! {
    /// The `@binding`s of attention_chunks.wgsl.
    AttentionChunkBinding(AttentionChunks) {
        STATE = 1, TABLE = 2, QKV = 3, Q_NORM = 4, K_NORM = 5, K_CACHE = 6, V_CACHE = 7,
        PART_ML = 8, PART_ACC = 9, OUT = 10,
    }
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
        (AttentionChunkBinding::STATE, q.state),
        (AttentionChunkBinding::TABLE, q.table),
        (AttentionChunkBinding::QKV, q.qkv),
        (AttentionChunkBinding::Q_NORM, qn),
        (AttentionChunkBinding::K_NORM, kn),
        (AttentionChunkBinding::K_CACHE, q.k_cache),
        (AttentionChunkBinding::V_CACHE, q.v_cache),
        (AttentionChunkBinding::PART_ML, b.part_ml),
        (AttentionChunkBinding::PART_ACC, b.part_acc),
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
    let bufs = [
        (AttentionChunkBinding::STATE, q.state),
        (AttentionChunkBinding::PART_ML, b.part_ml),
        (AttentionChunkBinding::PART_ACC, b.part_acc),
        (AttentionChunkBinding::OUT, b.out),
    ];
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

bindings! {
    /// The `@binding`s of attention.wgsl.
    AttentionBinding(Attention) { STATE = 1, Q = 2, KC = 3, VC = 4, OUT = 5 }
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
        &[
            (AttentionBinding::STATE, state),
            (AttentionBinding::Q, q),
            (AttentionBinding::KC, kc),
            (AttentionBinding::VC, vc),
            (AttentionBinding::OUT, out),
        ],
        [(s.n_heads / heads) as u32, n as u32, 1],
    )?
    .shaped(
        format!("{}/{}x{} n={n}", s.n_heads, s.n_kv_heads, s.head_dim),
        (8 * n * s.n_heads * s.head_dim) as u64,
    );
    d.label.bytes_per_key = (2 * kv_dim * if ctx.f16 { 2 } else { 4 }) as u64;
    Ok(d)
}
