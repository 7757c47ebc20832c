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

/// `toks` through `g` one row at a time, in passes of 16 rows, and the first `prefill`
/// of them in prefill: asserts that each position's logits are the same bits every way.
pub fn assert_batch_invariant(g: &mut dflash_gpu::GpuModel, toks: &[u32], prefill: usize) {
    let v = g.config.vocab_size;
    let mut single = Vec::new();
    for t in toks {
        g.step(&[*t]).unwrap();
        single.extend(g.read_logits(1).unwrap());
    }
    g.truncate(0);
    let mut multi = Vec::new();
    for ch in toks.chunks(16) {
        g.step(ch).unwrap();
        multi.extend(g.read_logits(ch.len()).unwrap());
    }
    // Prefill: 16-row chunks without lm_head, then the rest.
    g.truncate(0);
    g.prefill(&toks[..prefill]).unwrap();
    let last_pass = g.read_logits(prefill % 16).unwrap();
    let prefill_last = &last_pass[(prefill % 16 - 1) * v..];
    assert_eq!(single.len(), toks.len() * v);
    let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    let f16 = g.ctx.f16;
    assert!(
        same(&single, &multi),
        "one-row steps vs 16-row passes differ (f16={f16})"
    );
    assert!(
        same(&single[(prefill - 1) * v..prefill * v], prefill_last),
        "prefill differs (f16={f16})"
    );
}
