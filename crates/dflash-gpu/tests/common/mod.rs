//! Shared by the GPU test binaries.
#![allow(dead_code)]

use dflash_gpu::context::Tuning;
use dflash_gpu::{GpuContext, GpuOptions};
use std::rc::Rc;

/// A context on the default adapter (lavapipe in CI). Without one the test is skipped,
/// unless DFLASH_REQUIRE_GPU=1 (CI) makes that a failure.
/// DFLASH_BROWSER_LIMITS=1 runs every GPU test within the browser's WebGPU limits.
pub fn gpu_context(opts: &GpuOptions) -> Option<Rc<GpuContext>> {
    let mut opts = opts.clone();
    opts.browser_limits |= std::env::var("DFLASH_BROWSER_LIMITS").as_deref() == Ok("1");
    match GpuContext::new(&opts) {
        Ok(c) => Some(Rc::new(c)),
        Err(e) => {
            if std::env::var("DFLASH_REQUIRE_GPU").as_deref() == Ok("1") {
                panic!("no GPU adapter: {e}");
            }
            eprintln!("skipping: {e}");
            None
        }
    }
}

/// The variants to test on this adapter: the f32 path with this adapter's own tuning,
/// and the f16 path (where the adapter has shader-f16) with the GPU tuning of 16 GEMV
/// lanes per row, so that both kernel shapes run whatever the adapter.
pub fn contexts() -> Vec<Rc<GpuContext>> {
    let mut v = Vec::new();
    if let Some(c) = gpu_context(&GpuOptions {
        no_f16: true,
        ..Default::default()
    }) {
        v.push(c);
    }
    if let Some(c) = gpu_context(&GpuOptions {
        tuning: Some(Tuning::gpu()),
        ..Default::default()
    }) {
        v.push(c);
    }
    v
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}
