//! Quick GEMV bandwidth probe on a synthetic q4 matrix:
//! `[LANES=L] [OUTS=O] cargo run --release --example gemv_probe -- ROWS COLS N`.
use dflash_core::formats::ggml::{quantize, GgmlType};
use dflash_core::quant::QuantMatrix;
use dflash_core::testutil::Rng;
use dflash_gpu::upload::upload_matrix;
use dflash_gpu::{GpuContext, GpuOptions};
use std::time::Instant;

fn main() {
    let a: Vec<usize> = std::env::args()
        .skip(1)
        .map(|s| s.parse().unwrap())
        .collect();
    let (rows, cols, n) = (
        a.first().copied().unwrap_or(4096),
        a.get(1).copied().unwrap_or(1024),
        a.get(2).copied().unwrap_or(1),
    );
    let env = |name| std::env::var(name).ok().map(|s: String| s.parse().unwrap());
    let (lanes, outs): (Option<usize>, Option<usize>) = (env("LANES"), env("OUTS"));
    let tuning = (lanes.is_some() || outs.is_some()).then(|| {
        dflash_gpu::context::Tuning::gpu()
            .with_uniform_lanes(lanes.unwrap_or(16), outs.unwrap_or(1))
    });
    let ctx = GpuContext::new(&GpuOptions {
        tuning,
        ..Default::default()
    })
    .unwrap();
    let mut rng = Rng(1);
    let x = rng.vec(rows * cols, 1.0);
    let m = QuantMatrix::from_ggml("w", GgmlType::Q4_0, &quantize::q4_0(&x), rows, cols).unwrap();
    let g = upload_matrix(&ctx, "w", &m).unwrap();
    let t0 = Instant::now();
    let now = move || t0.elapsed().as_secs_f64();
    let (us, gb) = dflash_gpu::profile::gemv_shape(&ctx, &g, n, &now).unwrap();
    let cp = dflash_gpu::profile::copy_gbps(&ctx, 4 * m.n_bytes() as u64, &now).unwrap();
    println!(
        "rows {rows} cols {cols} n {n}: gemv {us:.1} us, {gb:.3} GB/s, copy {cp:.3} GB/s, ratio {:.3}",
        gb / cp
    );
}
