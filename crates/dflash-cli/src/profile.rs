//! `dflash bench --profile`: where a step's time goes on this adapter. Every dispatch of
//! a one-row decode step and of a block step (`--profile-block` rows, 16 by default: the
//! DFlash step with `--drafter`, else the target's verify pass of that many rows) timed
//! on the GPU, summed per op family and shape, and each step whole in one pass (its
//! cost without a timestamp between dispatches); the host's encode / submit / map times;
//! and the calibration kernels (dispatch cost, copy, read-only stream, each GEMV shape at
//! 1 and 16 rows).

use crate::CliError;
use dflash_gpu::model::OutputHead;
use dflash_gpu::profile::{self, PlanProfile};
use dflash_gpu::speculative::Speculative;
use dflash_gpu::{GpuContext, GpuModel};
use serde_json::{json, Value};

/// Timed runs per dispatch (the median is kept).
const RUNS: usize = 5;

/// Bytes the copy and stream calibrations move: several times a GPU's L2; smaller on
/// CPU adapters, whose "GPU memory" is the host's.
fn calibration_bytes(ctx: &GpuContext) -> u64 {
    if ctx.summary.device_type == "Cpu" {
        64 << 20
    } else {
        256 << 20
    }
}

/// The one-row and the `rows`-row profile, the host times and the calibration of `g`,
/// whose KV cache holds at least `pos` positions of a real prompt. `spec`: a DFlash pair
/// whose block step is profiled instead of the target's `rows`-row pass.
pub fn profile(
    ctx: &GpuContext,
    g: &mut GpuModel,
    spec: Option<&mut Speculative>,
    (pos, rows): (usize, usize),
    now: &dyn Fn() -> f64,
) -> Result<Value, CliError> {
    let one = g.profile_pass(1, OutputHead::Argmax, pos, RUNS, now)?;
    let block = match spec {
        Some(s) => s.profile_step(rows, RUNS, now)?,
        None => g.profile_pass(rows, OutputHead::Argmax, pos, RUNS, now)?,
    };
    let host = g.host_times(5, now)?;
    let cal = profile::calibrate(ctx, &g.weight_matrices(), calibration_bytes(ctx), now)?;
    let layers = g.config.num_layers;
    Ok(json!({
        "timing": format!("{:?}", ctx.timestamps),
        "dispatches_per_decode_step": one.dispatches.len(),
        "dispatches_aim": 6 * layers + 4,
        "layers": layers,
        "one_row_step": one.to_json(),
        "block_rows": rows,
        "block_step": block.to_json(),
        // The steps as they run (one pass each, timed at its ends), and the ratio of the
        // dispatch sums, which carry a timestamp's cost per dispatch.
        "step_cost_block_over_1": block.pass_seconds / one.pass_seconds.max(1e-12),
        "step_cost_dispatch_sums": block.total_seconds() / one.total_seconds().max(1e-12),
        "families": families(&one, &block),
        "host_ms": {
            "encode": host.encode * 1e3,
            "submit": host.submit * 1e3,
            "map": host.map * 1e3,
        },
        "calibration": cal.to_json(),
    }))
}

/// Per op family: count, µs and share of the one-row and of the block step.
fn families(one: &PlanProfile, block: &PlanProfile) -> Vec<Value> {
    let (t1, tb) = (
        one.total_seconds().max(1e-12),
        block.total_seconds().max(1e-12),
    );
    let a = profile::family_totals(one);
    let b = profile::family_totals(block);
    let mut names: Vec<&String> = a.iter().map(|r| &r.0).collect();
    names.extend(
        b.iter()
            .map(|r| &r.0)
            .filter(|n| !a.iter().any(|r| &r.0 == *n)),
    );
    names
        .into_iter()
        .map(|name| {
            let get = |v: &[(String, usize, f64)]| {
                v.iter()
                    .find(|r| &r.0 == name)
                    .map_or((0, 0.0), |r| (r.1, r.2))
            };
            let (c1, s1) = get(&a);
            let (cb, sb) = get(&b);
            json!({
                "family": name,
                "count_1": c1, "us_1": s1 * 1e6, "share_1": s1 / t1,
                "count_block": cb, "us_block": sb * 1e6, "share_block": sb / tb,
            })
        })
        .collect()
}

/// The profile as tables on stdout.
pub fn print(v: &Value) -> Result<(), crate::CliError> {
    print_steps(v)?;
    print_families(v)?;
    print_shapes(&v["one_row_step"])?;
    print_host_and_calibration(v)
}

/// The one-row and block steps whole.
fn print_steps(v: &Value) -> Result<(), crate::CliError> {
    let f = |x: &Value| x.as_f64().unwrap_or(0.0);
    let one = &v["one_row_step"];
    let block = &v["block_step"];
    outln!(
        "profile ({} timing): one-row step {:.1} us in one pass, {:.1} us over its {} dispatches (aim <= {})",
        v["timing"].as_str().unwrap_or(""),
        f(&one["pass_us"]),
        f(&one["total_us"]),
        one["dispatches"],
        v["dispatches_aim"],
    )?;
    outln!(
        "{} {:.1} us in one pass, {:.1} us over its {} dispatches: {:.2} one-row steps ({:.2} by the dispatch sums)",
        block["name"].as_str().unwrap_or(""),
        f(&block["pass_us"]),
        f(&block["total_us"]),
        block["dispatches"],
        f(&v["step_cost_block_over_1"]),
        f(&v["step_cost_dispatch_sums"]),
    )?;
    Ok(())
}

/// Each op family's count, time and share of both steps.
fn print_families(v: &Value) -> Result<(), crate::CliError> {
    let f = |x: &Value| x.as_f64().unwrap_or(0.0);
    let n = format!("n({})", v["block_rows"]);
    let us = format!("us({})", v["block_rows"]);
    let share = format!("%({})", v["block_rows"]);
    outln!(
        "{:<22} {:>6} {:>10} {:>7} {:>6} {:>10} {:>7}",
        "family",
        "n(1)",
        "us(1)",
        "%(1)",
        n,
        us,
        share
    )?;
    for r in v["families"].as_array().into_iter().flatten() {
        outln!(
            "{:<22} {:>6} {:>10.1} {:>6.1}% {:>6} {:>10.1} {:>6.1}%",
            r["family"].as_str().unwrap_or(""),
            r["count_1"],
            f(&r["us_1"]),
            100.0 * f(&r["share_1"]),
            r["count_block"],
            f(&r["us_block"]),
            100.0 * f(&r["share_block"]),
        )?;
    }
    Ok(())
}

/// The one-row step by matrix shape.
fn print_shapes(one: &Value) -> Result<(), crate::CliError> {
    let f = |x: &Value| x.as_f64().unwrap_or(0.0);
    outln!("one-row step by shape:")?;
    for r in one["by_shape"].as_array().into_iter().flatten() {
        outln!(
            "  {:<18} {:<28} {:>4} x {:>8.1} us = {:>9.1} us {:>5.1}% {:>8.2} GB/s",
            r["family"].as_str().unwrap_or(""),
            r["shape"].as_str().unwrap_or(""),
            r["count"],
            f(&r["mean_us"]),
            f(&r["total_us"]),
            100.0 * f(&r["share"]),
            f(&r["gbps"]),
        )?;
    }
    Ok(())
}

/// The host's times per step and the calibration kernels.
fn print_host_and_calibration(v: &Value) -> Result<(), crate::CliError> {
    let f = |x: &Value| x.as_f64().unwrap_or(0.0);
    let h = &v["host_ms"];
    outln!(
        "host per step: encode {:.3} ms, submit {:.3} ms, map {:.3} ms",
        f(&h["encode"]),
        f(&h["submit"]),
        f(&h["map"])
    )?;
    let c = &v["calibration"];
    outln!(
        "calibration: {:.2} us per dispatch; copy {:.2} GB/s; read-only stream {:.2} GB/s",
        f(&c["dispatch_us"]),
        f(&c["copy_gbps"]),
        f(&c["stream_gbps"])
    )?;
    for r in c["gemv"].as_array().into_iter().flatten() {
        outln!(
            "  gemv {:<28} {:>9.1} us {:>8.2} GB/s ({:.3} of copy)",
            r["shape"].as_str().unwrap_or(""),
            f(&r["us"]),
            f(&r["gbps"]),
            f(&r["copy_ratio"]),
        )?;
    }
    for r in c["gemv_dp4a"].as_array().into_iter().flatten() {
        if let Some(e) = r["error"].as_str() {
            outln!(
                "  gemv_dp4a {:<23} failed: {e}",
                r["shape"].as_str().unwrap_or("")
            )?;
            continue;
        }
        outln!(
            "  gemv_dp4a {:<23} {:>9.1} us {:>8.2} GB/s ({:.3} of copy; + quantize {:.1} us: {:.2}x the f32 gemv)",
            r["shape"].as_str().unwrap_or(""),
            f(&r["us"]),
            f(&r["gbps"]),
            f(&r["copy_ratio"]),
            f(&r["quantize_us"]),
            f(&r["speedup_over_f32"]),
        )?;
    }
    Ok(())
}
