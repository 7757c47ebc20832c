//! Shared by the GPU test binaries.
#![allow(dead_code)]

use dflash_gpu::{GpuContext, GpuOptions};
use std::rc::Rc;

/// A context on the default adapter (lavapipe in CI). Without one the test is skipped,
/// unless DFLASH_REQUIRE_GPU=1 (CI) makes that a failure.
pub fn gpu_context(opts: &GpuOptions) -> Option<Rc<GpuContext>> {
    match GpuContext::new(opts) {
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

/// Both storage modes the adapter offers: f32 always, f16 where it has shader-f16.
pub fn contexts() -> Vec<Rc<GpuContext>> {
    let mut v = Vec::new();
    if let Some(c) = gpu_context(&GpuOptions { no_f16: true, ..Default::default() }) {
        v.push(c);
    }
    if let Some(c) = gpu_context(&GpuOptions::default()) {
        if c.f16 {
            v.push(c);
        }
    }
    v
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}
