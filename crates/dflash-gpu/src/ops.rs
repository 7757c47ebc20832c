//! The dispatches of every op, built the same way: kernel (shader, entry, constants),
//! uniform parameters, bindings, workgroup counts. The model's plans and the op tests
//! use these same builders.

use crate::context::GpuContext;
use crate::error::Result;
use crate::pipelines::{grid, Dispatch, Kernel, Shader};
use crate::upload::GpuMatrix;
use dflash_core::config::RopeStyle;
use dflash_core::quant::QFormat;

/// A matrix shape as the profiler names it: `rows x cols format n=rows_of_x`.
pub fn shape_name(rows: usize, cols: usize, f: QFormat, n: usize) -> String {
    let f = if f == QFormat::Q4 { "q4" } else { "q8" };
    format!("{rows}x{cols} {f} n={n}")
}

fn format_id(f: QFormat) -> f64 {
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
    let k = Kernel::new(Shader::Gemv, "main")
        .with("FORMAT", format_id(m.format))
        .with("GROUP", m.group as f64)
        .with("ACCUMULATE", if accumulate { 1.0 } else { 0.0 })
        .with("N_ROWS", n as f64)
        .with("LANES", ctx.tuning.gemv_lanes as f64);
    let rows_per_wg = 64 / ctx.tuning.gemv_lanes;
    m.chunks
        .iter()
        .map(|ch| {
            let (gx, gy) = grid(ch.rows.div_ceil(rows_per_wg) as u32);
            let params = [
                n as u32,
                m.cols as u32,
                ch.rows as u32,
                ch.row_lo as u32,
                m.rows as u32,
                gx,
            ];
            let weights = ch.qs.size() + ch.scales.size() + ch.mins.size();
            let io = 4 * n as u64 * (m.cols + ch.rows * (1 + accumulate as usize)) as u64;
            Ok(Dispatch::new(
                ctx,
                &k,
                Some(&params),
                &[(1, x), (2, &ch.qs), (3, &ch.scales), (4, &ch.mins), (5, y)],
                [gx, gy, 1],
            )?
            .shaped(shape_name(ch.rows, m.cols, m.format, n), weights + io))
        })
        .collect()
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
            let params = [
                n as u32,
                m.cols as u32,
                ch.row_lo as u32,
                (ch.row_lo + ch.rows) as u32,
            ];
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
                [(m.cols as u32).div_ceil(64), n as u32, 1],
            )
            .map(|d| {
                let row = (m.cols * m.format.bits() / 8 + 4 * m.cols) as u64;
                d.shaped(format!("{}x{} n={n}", ch.rows, m.cols), n as u64 * row)
            })
        })
        .collect()
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
    let params = [len as u32, eps.to_bits()];
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
    let params = [len as u32, eps.to_bits()];
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
    let params = [
        n as u32,
        s.heads as u32,
        s.head_dim as u32,
        s.rope_dim as u32,
        (s.heads * s.head_dim) as u32,
        0,
    ];
    let total = (s.heads * s.rope_dim / 2) as u32;
    Ok(Dispatch::new(
        ctx,
        &k,
        Some(&params),
        &[(1, state), (2, table), (3, buf)],
        [total.div_ceil(64), n as u32, 1],
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
    let scale = 1.0 / (s.head_dim as f32).sqrt();
    let kv_dim = s.n_kv_heads * s.head_dim;
    let params = [
        n as u32,
        s.n_heads as u32,
        (s.n_heads / s.n_kv_heads) as u32,
        s.head_dim as u32,
        kv_dim as u32,
        (s.n_heads * s.head_dim) as u32,
        scale.to_bits(),
        s.window as u32,
        s.causal as u32,
        0,
        0,
        0,
    ];
    let mut d = Dispatch::new(
        ctx,
        &Kernel::new(Shader::Attention, "main"),
        Some(&params),
        &[(1, state), (2, q), (3, kc), (4, vc), (5, out)],
        [s.n_heads as u32, n as u32, 1],
    )?
    .shaped(
        format!("{}/{}x{} n={n}", s.n_heads, s.n_kv_heads, s.head_dim),
        (8 * n * s.n_heads * s.head_dim) as u64,
    );
    d.label.bytes_per_key = (2 * kv_dim * if ctx.f16 { 2 } else { 4 }) as u64;
    Ok(d)
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
        [n as u32, len as u32, 0, 0, 0, 0, 0, 0],
        &[(1, gate), (2, up), (3, out)],
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
        [n as u32, len as u32, 0, len as u32, 0, 0, 0, 0],
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
        [n as u32, len as u32, len as u32, len as u32, 0, 0, 1, 0],
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
        [
            n as u32,
            len as u32,
            len as u32,
            dst_stride as u32,
            0,
            dst_offset as u32,
            0,
            0,
        ],
        &[(1, src), (3, dst), (4, state)],
    )
}

fn elementwise(
    ctx: &GpuContext,
    entry: &'static str,
    params: [u32; 8],
    bufs: &[(u32, &wgpu::Buffer)],
) -> Result<Dispatch> {
    let (rows, len) = (params[0], params[1]);
    // Each element read once per input and written once.
    let bytes = 4 * (rows * len) as u64 * bufs.len().min(3) as u64;
    Ok(Dispatch::new(
        ctx,
        &Kernel::new(Shader::Elementwise, entry),
        Some(&params),
        bufs,
        [len.div_ceil(64), rows, 1],
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
    let params = [len as u32, stride as u32, 0, 0];
    Ok(Dispatch::new(
        ctx,
        &Kernel::new(Shader::Argmax, "main"),
        Some(&params),
        &[(1, logits), (2, tokens)],
        [rows as u32, 1, 1],
    )?
    .shaped(format!("{rows}x{len}"), 4 * (rows * len) as u64))
}

/// The uniform of the sampler: 12 words (see shaders/sample.wgsl).
pub fn sample_params(
    vocab: usize,
    stride: usize,
    sp: &dflash_core::sampling::SamplingParams,
    pos_offset: u32,
) -> [u32; 12] {
    [
        vocab as u32,
        stride as u32,
        sp.top_k as u32,
        pos_offset,
        (1.0 / sp.temperature).to_bits(),
        sp.top_p.to_bits(),
        sp.min_p.to_bits(),
        sp.seed as u32,
        (sp.seed >> 32) as u32,
        0,
        0,
        0,
    ]
}

/// `tokens[r]` = a sample of row `r` of `logits` by the rule of `sampling::sample`, with
/// the random number of position `state[0] + r + pos_offset`. `params` is a uniform
/// buffer holding `sample_params` (written per request, so the plan is built once).
pub fn sample(
    ctx: &GpuContext,
    params: &wgpu::Buffer,
    state: &wgpu::Buffer,
    logits: &wgpu::Buffer,
    tokens: &wgpu::Buffer,
    rows: usize,
) -> Result<Dispatch> {
    Ok(Dispatch::new(
        ctx,
        &Kernel::new(Shader::Sample, "main"),
        None,
        &[(0, params), (1, state), (2, logits), (3, tokens)],
        [rows as u32, 1, 1],
    )?
    .shaped(format!("{rows} rows"), 0))
}

/// `dst = src` for `n_vec4` 16-byte words: the bandwidth roofline.
pub fn copy(
    ctx: &GpuContext,
    src: &wgpu::Buffer,
    dst: &wgpu::Buffer,
    n_vec4: usize,
) -> Result<Dispatch> {
    let (gx, gy) = grid((n_vec4 as u32).div_ceil(64));
    Ok(Dispatch::new(
        ctx,
        &Kernel::new(Shader::Copy, "main"),
        Some(&[n_vec4 as u32, gx]),
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

/// DFlash2: `buf *= scale` over `n` floats (the block's input embeddings).
pub fn scale(ctx: &GpuContext, buf: &wgpu::Buffer, n: usize, scale: f32) -> Result<Dispatch> {
    let params = [n as u32, scale.to_bits(), 0, 0, 0, 0, 0, 0];
    Dispatch::new(
        ctx,
        &Kernel::new(Shader::DFlash2, "scale"),
        Some(&params),
        &[(4, buf)],
        [(n as u32).div_ceil(64), 1, 1],
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
    let params = [
        n as u32,
        s.hidden as u32,
        s.taps as u32,
        s.group as u32,
        (2 * s.taps * groups) as u32,
        (s.side * s.taps * groups) as u32,
        (s.side * s.taps * s.hidden) as u32,
        accumulate as u32,
    ];
    Dispatch::new(
        ctx,
        &Kernel::new(Shader::DFlash2, "conv"),
        Some(&params),
        &[(1, x), (2, coef), (3, base), (4, out)],
        [(s.hidden as u32).div_ceil(64), n as u32, 1],
    )
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
    let params = [
        vocab as u32,
        vocab as u32,
        k as u32,
        first as u32,
        multiplier.to_bits(),
        cap.to_bits(),
        0,
        0,
    ];
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
    let params = [
        slots as u32,
        k as u32,
        rank as u32,
        hp_first as u32,
        sampled as u32,
        0,
        0,
        0,
    ];
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
    Dispatch::new(ctx, &k, None, &bufs, [rows as u32, 1, 1])
}
