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

/// A random z-lab drafter of `layers` layers over `t` on the GPU: speculative output
/// equals plain decoding (16 tokens after `prompt`) token for token at blocks 1, 2, 4,
/// 8, 16 and auto, greedy and seeded T = 0.8.
pub fn assert_dflash_lossless(
    ctx: &Rc<GpuContext>,
    t: &dflash_core::model_files::LoadedModel,
    layers: usize,
    prompt: &[u32],
) {
    use dflash_core::generate::GenerateRequest;
    use dflash_core::sampling::SamplingParams;
    use dflash_core::speculative::BlockSize;
    use dflash_gpu::model::OutputHead;
    use dflash_gpu::{speculative::Speculative, GpuModel, GpuModelOptions};
    let w = random_drafter(t, layers);
    let opts = |taps| GpuModelOptions {
        context: 96,
        taps,
        ..Default::default()
    };
    let mut plain = GpuModel::new(ctx.clone(), &t.weights, &opts(vec![])).unwrap();
    let taps = opts(w.config.target_layer_ids.clone());
    let tm = GpuModel::new(ctx.clone(), &t.weights, &taps).unwrap();
    let mut sp_model = Speculative::new(tm, &w).unwrap();
    let n = 16;
    let seeded = SamplingParams {
        temperature: 0.8,
        top_p: 0.95,
        seed: 3,
        ..Default::default()
    };
    for sp in [SamplingParams::default(), seeded] {
        let head = if sp.is_greedy() {
            OutputHead::Argmax
        } else {
            OutputHead::Sample
        };
        plain.set_sampling(&sp).unwrap();
        plain.truncate(0);
        let mut next = plain.prefill_with(prompt, head).unwrap();
        let mut want = vec![];
        while !t.tokenizer.is_stop(next) && want.len() < n {
            want.push(next);
            if want.len() < n {
                next = plain.step_with(&[next], head).unwrap()[0];
            }
        }
        let blocks = [1, 2, 4, 8, 16].map(BlockSize::Fixed);
        for b in blocks.into_iter().chain([BlockSize::auto_linear(16, 0.05)]) {
            let req = GenerateRequest {
                prompt_ids: prompt.to_vec(),
                max_new_tokens: n,
                sampling: sp.clone(),
                stop_strings: vec![],
                context: 96,
                interrupt: Default::default(),
                grammar: None,
            };
            let r = sp_model
                .generate(&t.tokenizer, &req, &b, &|| 0.0, &mut |_| {})
                .unwrap();
            assert_eq!(r.result.tokens, want, "{b:?} T={}", sp.temperature);
        }
    }
}

/// `n` random token ids below `vocab`, seeded.
pub fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut r = dflash_core::testutil::Rng(seed);
    (0..n).map(|_| r.below(vocab) as u32).collect()
}

/// Each row's token of a greedy pass (`ids`) is the argmax of its logits (`[rows, vocab]`).
pub fn assert_argmax_rows(ids: &[u32], logits: &[f32], vocab: usize) {
    for (r, row) in logits.chunks_exact(vocab).enumerate() {
        let want = dflash_core::cpu::ops::argmax(row);
        assert_eq!(ids[r] as usize, want, "GPU argmax of row {r}");
    }
}

/// A random z-lab drafter of `layers` layers (block 16, 8-bit) for target `t`.
pub fn random_drafter(
    t: &dflash_core::model_files::LoadedModel,
    layers: usize,
) -> dflash_core::drafter::DrafterWeights {
    use dflash_core::drafter::{DrafterPrecision, DrafterWeights};
    use dflash_core::testutil::{write_drafter, DrafterSpec};
    let c = t.config();
    let f = write_drafter(c, &DrafterSpec::new(c, layers, 8));
    DrafterWeights::load(
        std::str::from_utf8(&f["config.json"]).unwrap(),
        vec![("model.safetensors", &f["model.safetensors"][..])],
        DrafterPrecision::Q8,
    )
    .unwrap()
}

/// A context with a GPU's tuning, its decoding pipelined (the next step submitted
/// before the previous one is read) or one step at a time.
pub fn gpu_tuned_context(pipelined: bool) -> Option<Rc<GpuContext>> {
    gpu_context(&GpuOptions {
        tuning: Some(Tuning {
            pipelined_decode: pipelined,
            ..Tuning::gpu()
        }),
        ..Default::default()
    })
}
