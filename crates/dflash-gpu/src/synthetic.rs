//! Models of a real shape with random weights made directly on the device (`dflash bench
//! --synthetic NAME`): the same repacked q4/q8 buffers, chunked by the same
//! `rows_per_chunk`, and the same `GpuModel` plan as a loaded model, so that a bench on
//! them measures what the real model would cost. Nothing is written to disk and the host
//! never holds more than one 4 MiB piece of a matrix. The layer walk and the values are
//! `dflash_core::synthetic_weights`' (the CPU engines' synthetic models are the same
//! shapes).

use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::model::{plan_buffers, GpuModelOptions, GpuWeights, MemoryPlan};
use crate::speculative::{DrafterPlan, GpuDrafter, GpuDrafterWeights};
use crate::upload::{f32_buffer, stack_rows_per_chunk, GpuMatrix, MatrixChunk};
use dflash_core::quant::QFormat;
use dflash_core::rng::Rng;
use dflash_core::synthetic::{MatrixShape, SyntheticSpec};
use dflash_core::synthetic_weights::{
    drafter_tensors, group_scale_min, target_weights, TensorMaker,
};

/// Bytes the host fills and hands to the queue at a time.
const PIECE: usize = 4 << 20;
/// Bytes written between two waits for the queue (bounds its staging memory).
const FLUSH: usize = 64 << 20;

/// Everything a synthetic bench allocates, checked against the adapter's limits and the
/// budget before anything is allocated: the plain model; with a drafter also the target
/// with taps (its own KV cache and activations, the plain model's weight buffers) and
/// the drafter (weights, context cache, activations).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyntheticPlan {
    pub plain: MemoryPlan,
    pub target: Option<MemoryPlan>,
    pub drafter_weights: u64,
    pub drafter: Option<DrafterPlan>,
}

impl SyntheticPlan {
    /// The sum, split like a model's plan.
    pub fn total(&self) -> MemoryPlan {
        let t = self.target.unwrap_or(MemoryPlan {
            weights: 0,
            kv_cache: 0,
            activations: 0,
        });
        let d = self.drafter.unwrap_or(DrafterPlan {
            context_cache: 0,
            activations: 0,
        });
        MemoryPlan {
            weights: self.plain.weights + self.drafter_weights,
            kv_cache: self.plain.kv_cache + t.kv_cache + d.context_cache,
            activations: self.plain.activations + t.activations + d.activations,
        }
    }
}

/// What a plan holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Planned {
    /// The target alone (a plain bench).
    Plain,
    /// The plain model beside the target with taps and the drafter, sharing the weights
    /// (a DFlash bench).
    PlainAndDFlash,
    /// The target with taps and the drafter (what serving with DFlash takes).
    DFlash,
}

/// The plan of `spec` at `context` tokens: `LimitExceeded` when a buffer would not fit
/// the adapter, `OverBudget` when the total exceeds `budget`. Allocates nothing.
pub fn plan(
    ctx: &GpuContext,
    spec: &SyntheticSpec,
    context: usize,
    what: Planned,
    budget: Option<u64>,
) -> Result<SyntheticPlan> {
    let c = &spec.config;
    let max = ctx.max_binding();
    let with_drafter = what != Planned::Plain;
    let mut matrices = spec.target_matrices();
    if with_drafter {
        matrices.extend(spec.drafter_matrices());
    }
    for m in &matrices {
        stack_rows_per_chunk(m.rows, m.cols, m.format, m.parts, max)?;
    }
    let context = context.min(c.max_position_embeddings).max(1);
    let opts = GpuModelOptions {
        context,
        taps: vec![],
        memory_budget: None,
    };
    let taps = GpuModelOptions {
        taps: spec.drafter.target_layer_ids.clone(),
        ..opts.clone()
    };
    let weights = spec.target_weight_bytes();
    let (plain, target) = match what {
        Planned::Plain => (plan_buffers(ctx, c, weights, &opts)?, None),
        Planned::PlainAndDFlash => (
            plan_buffers(ctx, c, weights, &opts)?,
            Some(plan_buffers(ctx, c, 0, &taps)?),
        ),
        // The target with taps in the place of the plain model.
        Planned::DFlash => (plan_buffers(ctx, c, weights, &taps)?, None),
    };
    let (drafter, drafter_weights) = if with_drafter {
        let d = GpuDrafter::plan(ctx, &spec.drafter, c, context)?;
        (Some(d), spec.drafter_weight_bytes())
    } else {
        (None, 0)
    };
    let p = SyntheticPlan {
        plain,
        target,
        drafter_weights,
        drafter,
    };
    let total = p.total();
    if let Some(budget) = budget {
        if total.total() > budget {
            return Err(GpuError::OverBudget {
                need: total.total(),
                weights: total.weights,
                kv_cache: total.kv_cache,
                activations: total.activations,
                budget,
            });
        }
    }
    Ok(p)
}

/// The target's weights (and the drafter's when `with_drafter`), random, on the device.
/// Call [`plan`] first: this allocates.
pub fn build(
    ctx: &GpuContext,
    spec: &SyntheticSpec,
    seed: u64,
    with_drafter: bool,
) -> Result<(GpuWeights, Option<GpuDrafterWeights>)> {
    let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
    let mut filler = Filler::new(ctx, seed);
    let r = (|| {
        let w = target_weights(&mut filler, spec)?;
        let d = if with_drafter {
            Some(drafter_tensors(&mut filler, spec)?)
        } else {
            None
        };
        Ok::<_, GpuError>((w, d))
    })();
    ctx.queue.submit([]);
    #[cfg(not(target_arch = "wasm32"))]
    if let Some(e) = pollster::block_on(scope.pop()) {
        return Err(GpuError::OutOfMemory(format!("synthetic weights: {e}")));
    }
    #[cfg(target_arch = "wasm32")]
    drop(scope);
    ctx.check_lost()?;
    r
}

/// Fills buffers piece by piece from a seeded generator, waiting for the queue every
/// [`FLUSH`] bytes so that its staging memory stays bounded.
struct Filler<'a> {
    ctx: &'a GpuContext,
    rng: Rng,
    scratch: Vec<u8>,
    pending: usize,
}

impl<'a> Filler<'a> {
    fn new(ctx: &'a GpuContext, seed: u64) -> Self {
        Filler {
            ctx,
            rng: Rng(seed ^ 0x5EED_5EED_5EED_5EED),
            scratch: Vec::with_capacity(PIECE),
            pending: 0,
        }
    }

    fn buffer(&self, label: &str, len: usize) -> wgpu::Buffer {
        self.ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: (len.max(16) as u64).div_ceil(16) * 16,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// Writes the scratch piece at `offset` (padded to 4 bytes) and flushes when due.
    fn write(&mut self, buf: &wgpu::Buffer, offset: usize) {
        while !self.scratch.len().is_multiple_of(4) {
            self.scratch.push(0);
        }
        self.ctx
            .queue
            .write_buffer(buf, offset as u64, &self.scratch);
        self.pending += self.scratch.len();
        if self.pending >= FLUSH {
            self.ctx.queue.submit([]);
            let _ = self.ctx.device.poll(wgpu::PollType::wait_indefinitely());
            self.pending = 0;
        }
    }

    fn vector(&mut self, label: &str, len: usize, centre: f32) -> wgpu::Buffer {
        let v: Vec<f32> = (0..len)
            .map(|_| centre + 0.1 * self.rng.uniform())
            .collect();
        f32_buffer(self.ctx, label, &v)
    }

    /// A random matrix in the repacked layout, chunked as `upload_matrix` chunks.
    fn matrix(&mut self, label: &str, m: &MatrixShape) -> Result<GpuMatrix> {
        let per = stack_rows_per_chunk(m.rows, m.cols, m.format, m.parts, self.ctx.max_binding())?;
        if m.format == QFormat::F32 {
            return Err(GpuError::Unsupported(format!(
                "{label}: the GPU has no f32 matrices"
            )));
        }
        let gpr = m.cols / m.group;
        let mut chunks = Vec::new();
        let mut row_lo = 0;
        while row_lo < m.rows {
            let rows = per.min(m.rows - row_lo);
            let qs_len = rows * m.cols * m.format.bits() / 8;
            let groups = rows * gpr;
            let qs = self.buffer(label, qs_len);
            let scales = self.buffer(label, groups * 2);
            let mins = self.buffer(label, groups * 2);
            let mut off = 0;
            while off < qs_len {
                let n = PIECE.min(qs_len - off);
                self.scratch.clear();
                while self.scratch.len() < n {
                    self.scratch
                        .extend_from_slice(&self.rng.next_u64().to_le_bytes());
                }
                self.scratch.truncate(n);
                self.write(&qs, off);
                off += n;
            }
            let per_piece = PIECE / 2;
            let mut g = 0;
            let mut min_piece = Vec::with_capacity(per_piece.min(groups) * 2);
            while g < groups {
                let n = per_piece.min(groups - g);
                self.scratch.clear();
                min_piece.clear();
                for _ in 0..n {
                    let (s16, min) = group_scale_min(m.format, m.cols, self.rng.uniform())
                        .expect("not f32 (checked above)");
                    self.scratch.extend_from_slice(&s16.to_le_bytes());
                    min_piece.extend_from_slice(&min.to_le_bytes());
                }
                self.write(&scales, 2 * g);
                std::mem::swap(&mut self.scratch, &mut min_piece);
                self.write(&mins, 2 * g);
                std::mem::swap(&mut self.scratch, &mut min_piece);
                g += n;
            }
            chunks.push(MatrixChunk {
                row_lo,
                rows,
                qs,
                scales,
                mins,
            });
            row_lo += rows;
        }
        Ok(GpuMatrix {
            format: m.format,
            group: m.group,
            rows: m.rows,
            cols: m.cols,
            chunks,
            n_bytes: m.n_bytes(),
        })
    }
}

impl TensorMaker for Filler<'_> {
    type Matrix = GpuMatrix;
    type Vector = wgpu::Buffer;
    type Error = GpuError;

    fn matrix(&mut self, name: &str, shape: &MatrixShape) -> Result<GpuMatrix> {
        Filler::matrix(self, name, shape)
    }

    fn vector(&mut self, name: &str, len: usize, centre: f32) -> wgpu::Buffer {
        Filler::vector(self, name, len, centre)
    }
}
