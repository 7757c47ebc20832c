//! The profiler of `dflash bench --profile`: every dispatch of a recorded plan timed on
//! the GPU and summed per op family and shape, and the plan whole in one pass timed at
//! its two ends (what the step costs without timestamps between its dispatches).
//!
//! Timing, best first: timestamps between the dispatches of one pass (native adapters
//! with `TIMESTAMP_QUERY_INSIDE_PASSES`); one pass per dispatch with pass timestamps
//! (WebGPU's `timestamp-query`); the host clock around one submission per dispatch.
//! A dispatch's time is the median over the timed runs, after one warm-up run.

use crate::context::{GpuContext, Timestamps};
use crate::error::{GpuError, Result};
use crate::ops;
use crate::pipelines::{Dispatch, Kernel, OpLabel, Shader, NO_PARAMS};
use crate::upload::{work_buffer, GpuMatrix};
use dflash_core::quant::QFormat;
use serde_json::{json, Value};

/// Copies encoded before every timed run (source, destination, bytes): the state a plan
/// changes (a DFlash step moves the committed length) is put back, so each run repeats
/// the same work.
pub type Restore<'a> = [(&'a wgpu::Buffer, &'a wgpu::Buffer, u64)];

/// Timestamp queries one query set may hold (wgpu's QUERY_SET_MAX_QUERIES).
const MAX_QUERIES: usize = 4096;

/// One dispatch and its measured time.
#[derive(Debug, Clone)]
pub struct DispatchTime {
    pub label: OpLabel,
    pub seconds: f64,
}

/// A timed plan: its dispatches in order, and how they were timed.
#[derive(Debug, Clone)]
pub struct PlanProfile {
    pub name: String,
    pub timing: Timestamps,
    pub dispatches: Vec<DispatchTime>,
    /// The whole plan in one pass timed only at its two ends (the median of the runs,
    /// each after a run of the timed dispatches): what a step costs without the
    /// timestamps between dispatches, which a CPU adapter pays for at every dispatch.
    pub pass_seconds: f64,
    /// Keys each query row sees (for the attention byte model).
    pub keys: usize,
}

impl PlanProfile {
    /// The dispatches' times summed.
    pub fn total_seconds(&self) -> f64 {
        self.dispatches.iter().map(|d| d.seconds).sum()
    }
}

/// Host-side times of one ordinary step, in seconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostTimes {
    /// Creating the encoder, encoding the plan and finishing the command buffer.
    pub encode: f64,
    /// `queue.submit`.
    pub submit: f64,
    /// From the submission to the mapped read-back (GPU work plus map latency).
    pub map: f64,
}

/// The calibration kernels of one adapter.
#[derive(Debug, Clone)]
pub struct Calibration {
    /// GPU time of one dependent one-invocation dispatch (the fixed cost per dispatch).
    pub dispatch_us: f64,
    pub copy_gbps: f64,
    pub stream_gbps: f64,
    pub stream_bytes: u64,
    /// (shape, rows of x, µs per GEMV, GB/s) for each weight shape of the model.
    pub gemv: Vec<(String, usize, f64, f64)>,
    /// The same for the 8-bit-activation GEMV (`ops::dp4a`), where the adapter has
    /// integer dot products, with the µs of quantizing its x: (shape, rows, µs, GB/s,
    /// quantize µs), or why it could not run (an optional prototype: the calibration
    /// goes on without it).
    pub gemv_dp4a: Vec<(String, usize, Dp4aTiming)>,
}

/// One 8-bit-activation GEMV timing: (µs per GEMV, GB/s, µs per quantization of its x),
/// or why it could not run.
pub type Dp4aTiming = std::result::Result<(f64, f64, f64), String>;

fn timestamp_buffers(ctx: &GpuContext, count: usize) -> (wgpu::QuerySet, wgpu::Buffer) {
    let qs = ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
        label: Some("profile"),
        ty: wgpu::QueryType::Timestamp,
        count: count as u32,
    });
    let resolve = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("profile resolve"),
        size: (count * 8) as u64,
        usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    (qs, resolve)
}

/// Resolves `count` timestamps, submits `enc` and returns them in seconds.
fn finish_timestamps(
    ctx: &GpuContext,
    mut enc: wgpu::CommandEncoder,
    qs: &wgpu::QuerySet,
    resolve: &wgpu::Buffer,
    count: usize,
) -> Result<Vec<f64>> {
    enc.resolve_query_set(qs, 0..count as u32, resolve, 0);
    let staging = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("profile staging"),
        size: (count * 8) as u64,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    enc.copy_buffer_to_buffer(resolve, 0, &staging, 0, (count * 8) as u64);
    ctx.queue.submit([enc.finish()]);
    let bytes = ctx.read_mapped(&staging)?;
    let period = ctx.queue.get_timestamp_period() as f64 * 1e-9;
    Ok(bytemuck::cast_slice::<u8, u64>(&bytes)
        .iter()
        .map(|&t| t as f64 * period)
        .collect())
}

fn encoder(ctx: &GpuContext, restore: &Restore) -> wgpu::CommandEncoder {
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    for (src, dst, n) in restore {
        enc.copy_buffer_to_buffer(src, 0, dst, 0, *n);
    }
    enc
}

/// One run of `ds`, each dispatch's seconds.
fn run_once(
    ctx: &GpuContext,
    ds: &[&Dispatch],
    restore: &Restore,
    now: &dyn Fn() -> f64,
) -> Result<Vec<f64>> {
    let n = ds.len();
    match ctx.timestamps {
        Timestamps::InsidePasses => {
            let (qs, resolve) = timestamp_buffers(ctx, n + 1);
            let mut enc = encoder(ctx, restore);
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                for (i, d) in ds.iter().enumerate() {
                    pass.write_timestamp(&qs, i as u32);
                    d.encode(&mut pass);
                }
                pass.write_timestamp(&qs, n as u32);
            }
            let t = finish_timestamps(ctx, enc, &qs, &resolve, n + 1)?;
            Ok(t.windows(2).map(|w| (w[1] - w[0]).max(0.0)).collect())
        }
        Timestamps::Passes => {
            let (qs, resolve) = timestamp_buffers(ctx, 2 * n);
            let mut enc = encoder(ctx, restore);
            for (i, d) in ds.iter().enumerate() {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: None,
                    timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                        query_set: &qs,
                        beginning_of_pass_write_index: Some(2 * i as u32),
                        end_of_pass_write_index: Some(2 * i as u32 + 1),
                    }),
                });
                d.encode(&mut pass);
            }
            let t = finish_timestamps(ctx, enc, &qs, &resolve, 2 * n)?;
            Ok(t.chunks(2).map(|w| (w[1] - w[0]).max(0.0)).collect())
        }
        Timestamps::None => {
            ctx.queue.submit([encoder(ctx, restore).finish()]);
            ctx.wait()?;
            let mut out = Vec::with_capacity(n);
            for d in ds {
                let t0 = now();
                crate::ops::submit(ctx, &[d]);
                ctx.wait()?;
                out.push(now() - t0);
            }
            Ok(out)
        }
    }
}

/// Seconds of one run of `ds` in one pass (after `restore`'s copies): the pass's
/// timestamps where the adapter has them, else the host clock around its submission.
fn pass_once(
    ctx: &GpuContext,
    ds: &[&Dispatch],
    restore: &Restore,
    now: &dyn Fn() -> f64,
) -> Result<f64> {
    if ctx.timestamps == Timestamps::None {
        if !restore.is_empty() {
            ctx.queue.submit([encoder(ctx, restore).finish()]);
            ctx.wait()?;
        }
        let t0 = now();
        ops::submit(ctx, ds);
        ctx.wait()?;
        return Ok((now() - t0).max(1e-9));
    }
    let (qs, resolve) = timestamp_buffers(ctx, 2);
    let mut enc = encoder(ctx, restore);
    {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: None,
            timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                query_set: &qs,
                beginning_of_pass_write_index: Some(0),
                end_of_pass_write_index: Some(1),
            }),
        });
        for d in ds {
            d.encode(&mut pass);
        }
    }
    let t = finish_timestamps(ctx, enc, &qs, &resolve, 2)?;
    Ok((t[1] - t[0]).max(1e-9))
}

/// The median of `v` (sorted in place).
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Times every dispatch of `ds` and the whole pass: `runs` timed runs of each, taken in
/// turn (so that a busy host slows both alike) after a warm-up, the median of each.
pub fn profile_plan(
    ctx: &GpuContext,
    name: &str,
    ds: &[&Dispatch],
    restore: &Restore,
    keys: usize,
    runs: usize,
    now: &dyn Fn() -> f64,
) -> Result<PlanProfile> {
    if ds.len() * 2 > MAX_QUERIES {
        return Err(GpuError::Unsupported(format!(
            "profiling a plan of {} dispatches (at most {})",
            ds.len(),
            MAX_QUERIES / 2
        )));
    }
    run_once(ctx, ds, restore, now)?;
    pass_once(ctx, ds, restore, now)?;
    let mut per: Vec<Vec<f64>> = vec![Vec::new(); ds.len()];
    let mut passes = Vec::new();
    for _ in 0..runs.max(1) {
        for (i, t) in run_once(ctx, ds, restore, now)?.into_iter().enumerate() {
            per[i].push(t);
        }
        passes.push(pass_once(ctx, ds, restore, now)?);
    }
    Ok(PlanProfile {
        name: name.into(),
        timing: ctx.timestamps,
        pass_seconds: median(&mut passes),
        dispatches: ds
            .iter()
            .zip(per.iter_mut())
            .map(|(d, t)| DispatchTime {
                label: d.label.clone(),
                seconds: median(t),
            })
            .collect(),
        keys,
    })
}

/// Seconds of one pass holding `ds` (pass timestamps where the adapter has them, else
/// the host clock around the submission): the best of `trials` after a warm-up.
pub fn time_pass(
    ctx: &GpuContext,
    ds: &[&Dispatch],
    trials: usize,
    now: &dyn Fn() -> f64,
) -> Result<f64> {
    pass_once(ctx, ds, &[], now)?;
    let mut best = f64::INFINITY;
    for _ in 0..trials.max(1) {
        best = best.min(pass_once(ctx, ds, &[], now)?);
    }
    Ok(best)
}

/// GB/s of `ds` repeated `reps` times in one pass, by their modelled bytes.
pub fn gbps(
    ctx: &GpuContext,
    ds: &[&Dispatch],
    reps: usize,
    trials: usize,
    now: &dyn Fn() -> f64,
) -> Result<f64> {
    let bytes: u64 = ds.iter().map(|d| d.label.bytes).sum();
    let all: Vec<&Dispatch> = (0..reps).flat_map(|_| ds.iter().copied()).collect();
    let s = time_pass(ctx, &all, trials, now)?;
    Ok(bytes as f64 * reps as f64 / s / 1e9)
}

/// The fixed cost of a dispatch: `n` dependent one-invocation dispatches in one pass.
pub fn dispatch_cost_us(ctx: &GpuContext, n: usize, now: &dyn Fn() -> f64) -> Result<f64> {
    let buf = work_buffer(ctx, "touch", 16);
    let d = Dispatch::new(
        ctx,
        &Kernel::new(Shader::Copy, "touch"),
        NO_PARAMS,
        &[(2, &buf)],
        [1, 1, 1],
    )?;
    let all: Vec<&Dispatch> = (0..n).map(|_| &d).collect();
    Ok(time_pass(ctx, &all, 3, now)? / n as f64 * 1e6)
}

/// A read-only stream over `size` bytes (bytes counted once).
pub fn stream_gbps(ctx: &GpuContext, size: u64, now: &dyn Fn() -> f64) -> Result<f64> {
    let size = size.min(ctx.max_binding()) / 16 * 16;
    let src = work_buffer(ctx, "stream_src", size);
    let dst = work_buffer(ctx, "stream_dst", 16);
    let n = (size / 16) as u32;
    let (gx, gy) = crate::pipelines::grid(n.div_ceil(crate::pipelines::WORKGROUP_SIZE));
    let d = Dispatch::new(
        ctx,
        &Kernel::new(Shader::Copy, "stream"),
        Some(&ops::CopyParams { n, wg_x: gx }),
        &[(1, &src), (2, &dst)],
        [gx, gy, 1],
    )?
    .shaped(format!("{} MiB", size >> 20), size);
    gbps(ctx, &[&d], 2, 3, now)
}

/// The copy kernel over `size` bytes (read + written counted).
pub fn copy_gbps(ctx: &GpuContext, size: u64, now: &dyn Fn() -> f64) -> Result<f64> {
    let size = size.min(ctx.max_binding()) / 16 * 16;
    let src = work_buffer(ctx, "copy_src", size);
    let dst = work_buffer(ctx, "copy_dst", size);
    let d = ops::copy(ctx, &src, &dst, (size / 16) as usize)?;
    gbps(ctx, &[&d], 2, 3, now)
}

/// One GEMV shape at `n` rows, repeated into independent outputs (no dependency, so
/// no barrier, between repeats): (µs per GEMV, GB/s).
pub fn gemv_shape(
    ctx: &GpuContext,
    m: &GpuMatrix,
    n: usize,
    now: &dyn Fn() -> f64,
) -> Result<(f64, f64)> {
    let reps = ((64u64 << 20) / m.n_bytes.max(1)).clamp(4, 64) as usize;
    let x = work_buffer(ctx, "gemv_x", (n * m.cols * 4) as u64);
    let ys: Vec<wgpu::Buffer> = (0..reps)
        .map(|_| work_buffer(ctx, "gemv_y", (n * m.rows * 4) as u64))
        .collect();
    let mut ds = Vec::new();
    for y in &ys {
        let plain = ops::GemvFusion::default();
        ds.extend(ops::gemv_f32_activations(ctx, m, &x, y, n, &plain)?);
    }
    let refs: Vec<&Dispatch> = ds.iter().collect();
    let bytes: u64 = ds.iter().map(|d| d.label.bytes).sum();
    let s = time_pass(ctx, &refs, 3, now)?;
    Ok((s / reps as f64 * 1e6, bytes as f64 / s / 1e9))
}

/// The 8-bit-activation GEMV of one shape at `n` rows as `gemv_shape` times the f32
/// one, and the quantization of its x alone: (µs per GEMV, GB/s, µs per quantization).
pub fn gemv_dp4a_shape(
    ctx: &GpuContext,
    m: &GpuMatrix,
    n: usize,
    now: &dyn Fn() -> f64,
) -> Result<(f64, f64, f64)> {
    let reps = ((64u64 << 20) / m.n_bytes.max(1)).clamp(4, 64) as usize;
    let x = work_buffer(ctx, "gemv_x", (n * m.cols * 4) as u64);
    let q = ops::dp4a::QuantizedActivations::for_matrix(ctx, m, n)?;
    let quantize = ops::dp4a::quantize(ctx, &x, &q)?;
    let quantize_s = time_pass(ctx, &[&quantize], 3, now)?;
    let ys: Vec<wgpu::Buffer> = (0..reps)
        .map(|_| work_buffer(ctx, "gemv_y", (n * m.rows * 4) as u64))
        .collect();
    let outputs = ctx.tuning.gemv_outputs(m.rows, m.cols);
    let mut ds = Vec::new();
    for y in &ys {
        ds.extend(ops::dp4a::gemv(ctx, m, &q, y, n, outputs)?);
    }
    let refs: Vec<&Dispatch> = ds.iter().collect();
    let bytes: u64 = ds.iter().map(|d| d.label.bytes).sum();
    let s = time_pass(ctx, &refs, 3, now)?;
    Ok((
        s / reps as f64 * 1e6,
        bytes as f64 / s / 1e9,
        quantize_s * 1e6,
    ))
}

/// Dispatch times summed per (op family, shape), largest total first.
pub fn by_family(p: &PlanProfile) -> Vec<Value> {
    let mut rows: Vec<(String, String, usize, f64, u64)> = Vec::new();
    for d in &p.dispatches {
        let bytes = d.label.bytes + d.label.bytes_per_key * p.keys as u64;
        match rows
            .iter_mut()
            .find(|r| r.0 == d.label.family && r.1 == d.label.shape)
        {
            Some(r) => {
                r.2 += 1;
                r.3 += d.seconds;
                r.4 += bytes;
            }
            None => rows.push((
                d.label.family.clone(),
                d.label.shape.clone(),
                1,
                d.seconds,
                bytes,
            )),
        }
    }
    rows.sort_by(|a, b| b.3.total_cmp(&a.3));
    let total = p.total_seconds().max(1e-12);
    rows.into_iter()
        .map(|(family, shape, count, s, bytes)| {
            json!({
                "family": family,
                "shape": shape,
                "count": count,
                "total_us": s * 1e6,
                "mean_us": s * 1e6 / count as f64,
                "bytes": bytes,
                "gbps": if bytes > 0 { bytes as f64 / s.max(1e-12) / 1e9 } else { 0.0 },
                "share": s / total,
            })
        })
        .collect()
}

/// Summed per op family alone (all shapes together).
pub fn family_totals(p: &PlanProfile) -> Vec<(String, usize, f64)> {
    let mut rows: Vec<(String, usize, f64)> = Vec::new();
    for d in &p.dispatches {
        match rows.iter_mut().find(|r| r.0 == d.label.family) {
            Some(r) => {
                r.1 += 1;
                r.2 += d.seconds;
            }
            None => rows.push((d.label.family.clone(), 1, d.seconds)),
        }
    }
    rows.sort_by(|a, b| b.2.total_cmp(&a.2));
    rows
}

impl PlanProfile {
    pub fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "timing": format!("{:?}", self.timing),
            "dispatches": self.dispatches.len(),
            "total_us": self.total_seconds() * 1e6,
            "pass_us": self.pass_seconds * 1e6,
            "keys": self.keys,
            "by_shape": by_family(self),
        })
    }
}

impl Calibration {
    pub fn to_json(&self) -> Value {
        json!({
            "dispatch_us": self.dispatch_us,
            "copy_gbps": self.copy_gbps,
            "stream_gbps": self.stream_gbps,
            "stream_bytes": self.stream_bytes,
            "gemv": self.gemv.iter().map(|(shape, n, us, gb)| json!({
                "shape": shape, "rows": n, "us": us, "gbps": gb,
                "copy_ratio": gb / self.copy_gbps.max(1e-12),
            })).collect::<Vec<_>>(),
            "gemv_dp4a": self.gemv_dp4a.iter().map(|(shape, n, r)| {
                let f32_us = self.gemv.iter().find(|g| &g.0 == shape).map(|g| g.2);
                match r {
                    Ok((us, gb, quantize_us)) => json!({
                        "shape": shape, "rows": n, "us": us, "gbps": gb,
                        "copy_ratio": gb / self.copy_gbps.max(1e-12),
                        "quantize_us": quantize_us,
                        "speedup_over_f32": f32_us.map(|f| f / (us + quantize_us)),
                    }),
                    Err(e) => json!({ "shape": shape, "rows": n, "error": e }),
                }
            }).collect::<Vec<_>>(),
        })
    }
}

/// The calibration kernels: the dispatch chain, the stream and the copy at `size` bytes,
/// and every distinct GEMV shape of `mats` at 1 and 16 rows (with 8-bit activations
/// too where the adapter has integer dot products).
pub fn calibrate(
    ctx: &GpuContext,
    mats: &[&GpuMatrix],
    size: u64,
    now: &dyn Fn() -> f64,
) -> Result<Calibration> {
    let mut gemv = Vec::new();
    let mut gemv_dp4a = Vec::new();
    let mut seen = Vec::new();
    for m in mats {
        let key = (m.rows, m.cols, m.format);
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        for n in [1, 16] {
            let (us, gb) = gemv_shape(ctx, m, n, now)?;
            let shape = ops::shape_name(m.rows, m.cols, m.format, n);
            gemv.push((shape.clone(), n, us, gb));
            if ctx.summary.packed_int8_dot && m.format != QFormat::F32 {
                let r = gemv_dp4a_shape(ctx, m, n, now).map_err(|e| e.to_string());
                gemv_dp4a.push((shape, n, r));
            }
        }
    }
    Ok(Calibration {
        dispatch_us: dispatch_cost_us(ctx, 500, now)?,
        copy_gbps: copy_gbps(ctx, size, now)?,
        stream_gbps: stream_gbps(ctx, size, now)?,
        stream_bytes: size.min(ctx.max_binding()) / 16 * 16,
        gemv,
        gemv_dp4a,
    })
}
