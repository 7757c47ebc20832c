//! sample.wgsl: the sampler (one workgroup per row on CPU adapters, chunked on GPUs)
//! and rejection-sampling verification.

use crate::context::GpuContext;
use crate::error::Result;
use crate::pipelines::{bindings, Dispatch, Kernel, Shader, NO_PARAMS};
use crate::upload::work_buffer;

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

bindings! {
    /// The `@binding`s of sample.wgsl.
    SampleBinding(Sample) {
        P = 0, STATE = 1, LOGITS = 2, TOKENS = 3, IDS = 4, Q_IDS = 5, Q_VALS = 6, VERDICT = 7,
        CHUNK_VALS = 8, HIST = 9, SEL = 10,
    }
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
        let bufs = [
            (SampleBinding::P, b.params),
            (SampleBinding::STATE, b.state),
            (SampleBinding::LOGITS, b.logits),
            (SampleBinding::TOKENS, b.tokens),
        ];
        let d = Dispatch::new(ctx, &k("main"), NO_PARAMS, &bufs, [rows as u32, 1, 1])?;
        return Ok(vec![d.shaped(format!("{rows} rows"), 0)]);
    }
    let (chunks, rows32) = (vocab.div_ceil(SAMPLE_CHUNK).max(1) as u32, rows as u32);
    let sc = b.scratch;
    let (p, logits) = (
        (SampleBinding::P, b.params),
        (SampleBinding::LOGITS, b.logits),
    );
    let (vals, hist, sel) = (
        (SampleBinding::CHUNK_VALS, &sc.chunk_vals),
        (SampleBinding::HIST, &sc.hist),
        (SampleBinding::SEL, &sc.sel),
    );
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
    let bufs = [
        p,
        (SampleBinding::STATE, b.state),
        logits,
        (SampleBinding::TOKENS, b.tokens),
        vals,
        sel,
    ];
    d.push(dispatch(&k("draw"), &bufs, [rows32, 1, 1], 0)?);
    Ok(d)
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
        (SampleBinding::P, b.sample_params),
        (SampleBinding::STATE, b.state),
        (SampleBinding::LOGITS, b.logits),
        (SampleBinding::IDS, b.ids),
        (SampleBinding::Q_IDS, b.q_ids),
        (SampleBinding::Q_VALS, b.q_vals),
        (SampleBinding::VERDICT, b.verdict),
    ];
    Dispatch::new(ctx, &k, NO_PARAMS, &bufs, [rows as u32, 1, 1])
}
