//! Bandwidth measurements on the model's own device, for `dflash bench`: the GEMV over
//! every weight matrix of the model against a plain copy kernel (the roofline), timed
//! as whole submissions on the same adapter.

use crate::context::GpuContext;
use crate::error::Result;
use crate::ops;
use crate::pipelines::Dispatch;
use crate::upload::work_buffer;

/// Seconds (host clock) for `f`; `now` is the host's clock in seconds.
fn timed(ctx: &GpuContext, now: &dyn Fn() -> f64, f: impl FnOnce()) -> Result<f64> {
    let t0 = now();
    f();
    ctx.wait()?;
    Ok(now() - t0)
}

/// GB/s of `dispatches` that read `bytes` per repetition, best of `trials` submissions of
/// `reps` repetitions each (after one warm-up).
pub fn measure(
    ctx: &GpuContext,
    dispatches: &[&Dispatch],
    bytes: u64,
    reps: usize,
    trials: usize,
    now: &dyn Fn() -> f64,
) -> Result<f64> {
    let run = || {
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            for _ in 0..reps {
                for d in dispatches {
                    d.encode(&mut pass);
                }
            }
        }
        ctx.queue.submit([enc.finish()]);
    };
    timed(ctx, now, run)?;
    let mut best = f64::INFINITY;
    for _ in 0..trials {
        best = best.min(timed(ctx, now, run)?);
    }
    Ok(bytes as f64 * reps as f64 / best / 1e9)
}

/// GB/s of the copy kernel over `size` bytes (counting bytes read plus bytes written).
pub fn copy_gbps(
    ctx: &GpuContext,
    size: u64,
    reps: usize,
    trials: usize,
    now: &dyn Fn() -> f64,
) -> Result<f64> {
    let size = size.min(ctx.max_binding()) / 16 * 16;
    let src = work_buffer(ctx, "copy_src", size);
    let dst = work_buffer(ctx, "copy_dst", size);
    let d = ops::copy(ctx, &src, &dst, (size / 16) as usize)?;
    measure(ctx, &[&d], 2 * size, reps, trials, now)
}
