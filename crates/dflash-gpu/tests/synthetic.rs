//! Synthetic models (`dflash bench --synthetic`): random weights of a real shape made on
//! the device run through the same plan as a loaded model with finite activations; the
//! memory plan refuses a shape that does not fit before anything is allocated; a
//! simulated acceptance replays the plain tokens through the real DFlash step.

mod common;

use dflash_core::rng::Rng;
use dflash_core::synthetic::{spec, NAMES};
use dflash_gpu::model::OutputHead;
use dflash_gpu::speculative::Speculative;
use dflash_gpu::synthetic::{build, plan, Planned};
use dflash_gpu::{GpuError, GpuModel, GpuModelOptions, GpuOptions};
use std::time::Instant;

/// A dense shape and a mixture of experts (16 experts, 4 per token, expert stacks kept
/// whole in their buffers).
#[test]
fn a_tiny_synthetic_model_decodes_finite_logits() {
    let Some(ctx) = common::gpu_context(&GpuOptions::default()) else {
        return;
    };
    for name in ["test-tiny", "test-moe-tiny", "test-hybrid-tiny"] {
        decodes_finite_logits(&ctx, name);
    }
}

fn decodes_finite_logits(ctx: &std::rc::Rc<dflash_gpu::GpuContext>, name: &str) {
    let s = spec(name).unwrap();
    let p = plan(ctx, &s, 64, Planned::Plain, None).unwrap();
    let (w, d) = build(ctx, &s, 7, false).unwrap();
    assert!(d.is_none());
    let opts = GpuModelOptions {
        context: 64,
        ..Default::default()
    };
    let mut g = GpuModel::from_gpu_weights(ctx.clone(), w, &opts).unwrap();
    // The plan sized exactly what was built.
    assert_eq!(g.memory, p.plain);
    assert_eq!(g.memory.weights, s.target_weight_bytes());
    let vocab = s.config.vocab_size;
    let mut rng = Rng(3);
    let prompt: Vec<u32> = (0..20).map(|_| rng.below(vocab) as u32).collect();
    let mut next = g.prefill(&prompt).unwrap();
    let mut tokens = vec![next];
    for _ in 0..8 {
        next = g.step(&[next]).unwrap()[0];
        tokens.push(next);
        let logits = g.read_logits(1).unwrap();
        assert!(logits.iter().all(|x| x.is_finite()), "{logits:?}");
        let (lo, hi) = logits
            .iter()
            .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &x| {
                (a.min(x), b.max(x))
            });
        // Unit-scale logits: neither collapsed nor blown up.
        assert!(
            hi - lo > 0.1 && hi.abs() < 1e3 && lo.abs() < 1e3,
            "{lo} {hi}"
        );
    }
    assert!(tokens.iter().all(|&t| (t as usize) < vocab));
    // The same seed makes the same model.
    let (w2, _) = build(ctx, &s, 7, false).unwrap();
    let mut g2 = GpuModel::from_gpu_weights(ctx.clone(), w2, &opts).unwrap();
    assert_eq!(g2.generate_greedy(&prompt, 9, &|_| false).unwrap(), tokens);
}

#[test]
fn a_shape_that_does_not_fit_is_refused_before_allocation() {
    let Some(ctx) = common::gpu_context(&GpuOptions::default()) else {
        return;
    };
    // Every named shape plans (or states the limit it exceeds) without allocating.
    for &n in NAMES {
        let s = spec(n).unwrap();
        match plan(&ctx, &s, 2048, Planned::PlainAndDFlash, None) {
            Ok(p) => assert!(p.total().weights > s.target_weight_bytes()),
            Err(GpuError::LimitExceeded { .. }) => {}
            Err(e) => panic!("{n}: {e}"),
        }
    }
    let s = spec("qwen2.5-32b").unwrap();
    let t = Instant::now();
    match plan(&ctx, &s, 2048, Planned::PlainAndDFlash, Some(1 << 30)) {
        Err(GpuError::OverBudget {
            need,
            weights,
            kv_cache,
            activations,
            budget,
        }) => {
            assert_eq!(need, weights + kv_cache + activations);
            assert!(weights > 18_000_000_000, "{weights}");
            assert_eq!(budget, 1 << 30);
        }
        other => panic!("expected OverBudget, got {other:?}"),
    }
    assert!(
        t.elapsed().as_secs_f64() < 1.0,
        "planning must not allocate"
    );
    // At its full context one layer's KV cache exceeds a 128 MiB binding (f32 cache).
    let c = &s.config;
    let elt = if ctx.f16 { 2 } else { 4 };
    let kv_layer = (c.max_position_embeddings * c.kv_dim() * elt) as u64;
    match plan(&ctx, &s, c.max_position_embeddings, Planned::Plain, None) {
        Err(GpuError::LimitExceeded { need, limit, .. }) => {
            assert!(need > limit);
            assert!(kv_layer > ctx.max_binding());
        }
        Ok(_) => assert!(kv_layer <= ctx.max_binding()),
        Err(e) => panic!("{e}"),
    }
}

/// The pair's memory plan counts the drafter byte for byte as built: its matrices and
/// norms, the context pass's stacked `[wk; wv]`, and a draft vocabulary's rows of the
/// head (`--synthetic-draft-vocab`) with their ids.
#[test]
fn the_plan_counts_the_drafter_as_built_with_its_draft_vocabulary() {
    let Some(ctx) = common::gpu_context(&GpuOptions::default()) else {
        return;
    };
    let whole = spec("test-tiny").unwrap();
    let s = dflash_core::synthetic::SyntheticSpec {
        draft_vocab: Some(100),
        ..whole.clone()
    };
    let p = plan(&ctx, &s, 64, Planned::PlainAndDFlash, None).unwrap();
    let p_whole = plan(&ctx, &whole, 64, Planned::PlainAndDFlash, None).unwrap();
    assert_eq!(
        p.drafter_weights - p_whole.drafter_weights,
        s.draft_head_bytes(100)
    );
    assert!(s.draft_head_bytes(100) > 0);
    let (w, d) = build(&ctx, &s, 1, true).unwrap();
    let opts = GpuModelOptions {
        context: 64,
        taps: s.drafter.target_layer_ids.clone(),
        ..Default::default()
    };
    let target = GpuModel::from_gpu_weights(ctx.clone(), w, &opts).unwrap();
    let ids = dflash_core::drafter::DraftVocab::new((0..100).collect(), s.config.vocab_size);
    let spec_ =
        Speculative::from_gpu_drafter(target, &s.drafter, d.unwrap(), Some(&ids.unwrap())).unwrap();
    assert_eq!(spec_.drafter.draft_head_ids(), Some(100));
    assert_eq!(spec_.drafter.n_bytes, p.drafter_weights);
}

#[test]
fn simulated_acceptance_replays_plain_tokens_through_the_real_step() {
    let Some(ctx) = common::gpu_context(&GpuOptions::default()) else {
        return;
    };
    let s = spec("test-tiny").unwrap();
    plan(&ctx, &s, 128, Planned::PlainAndDFlash, None).unwrap();
    let (w, d) = build(&ctx, &s, 1, true).unwrap();
    let opts = GpuModelOptions {
        context: 128,
        ..Default::default()
    };
    let mut plain = GpuModel::from_gpu_weights(ctx.clone(), w.clone(), &opts).unwrap();
    let target = GpuModel::from_gpu_weights(
        ctx.clone(),
        w,
        &GpuModelOptions {
            taps: s.drafter.target_layer_ids.clone(),
            ..opts
        },
    )
    .unwrap();
    let mut spec_ = Speculative::from_gpu_drafter(target, &s.drafter, d.unwrap(), None).unwrap();
    let prompt: Vec<u32> = (0..12).map(|i| (i * 37 % 512) as u32).collect();
    let truth = plain.generate_greedy(&prompt, 30, &|_| false).unwrap();
    // The drafter's own drafts (random weights): lossless.
    let anchor = spec_.prefill(&prompt, OutputHead::Argmax).unwrap();
    let mut got = vec![anchor];
    while got.len() < truth.len() {
        got.extend(spec_.step(8, OutputHead::Argmax).unwrap().tokens);
    }
    got.truncate(truth.len());
    assert_eq!(got, truth);
    // Host drafts with the drafter pass still running: the first three slots right.
    spec_.simulate = true;
    let anchor = spec_.prefill(&prompt, OutputHead::Argmax).unwrap();
    let mut got = vec![anchor];
    let mut taus = Vec::new();
    while got.len() < truth.len() {
        let start = spec_.target.len();
        let drafts: Vec<u32> = (1..8)
            .map(|i| match truth.get(start + i - prompt.len()) {
                Some(&t) if i <= 3 => t,
                Some(&t) => (t + 1) % 512,
                None => 0,
            })
            .collect();
        spec_.set_host_drafts_at(start + 1, &drafts);
        let r = spec_.step(8, OutputHead::Argmax).unwrap();
        taus.push(r.accepted + 1);
        got.extend(r.tokens);
    }
    got.truncate(truth.len());
    assert_eq!(got, truth);
    assert!(taus[..taus.len() - 1].iter().all(|&t| t == 4), "{taus:?}");
}
