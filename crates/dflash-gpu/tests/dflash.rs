//! DFlash on the GPU: the drafter's forward equals the CPU reference, and speculative
//! output equals plain decoding token for token (greedy and sampled) at every block
//! size, with a random drafter and with drafts forced to be accepted.

mod common;
use common::contexts;
use dflash_core::cpu::{CpuModel, LogitRows};
use dflash_core::drafter::{CpuDrafter, DrafterPrecision, DrafterWeights};
use dflash_core::formats::ggml::GgmlType;
use dflash_core::generate::GenerateRequest;
use dflash_core::model_files::{load_gguf, LoadedModel};
use dflash_core::sampling::SamplingParams;
use dflash_core::speculative::BlockSize;
use dflash_core::testutil::{
    random_weights, tiny_drafter_target, write_drafter, write_gguf, DrafterSpec, Rng,
};
use dflash_gpu::model::OutputHead;
use dflash_gpu::speculative::Speculative;
use dflash_gpu::{GpuError, GpuModel, GpuModelOptions};

fn target() -> LoadedModel {
    let c = tiny_drafter_target();
    load_gguf(&write_gguf(&c, &random_weights(&c, 51), GgmlType::Q4_0)).unwrap()
}

/// The target on the GPU with a context of 128 and these tap layers.
fn gpu_target(
    ctx: &std::rc::Rc<dflash_gpu::GpuContext>,
    t: &LoadedModel,
    taps: Vec<usize>,
) -> GpuModel {
    GpuModel::new(
        ctx.clone(),
        &t.weights,
        &GpuModelOptions {
            context: 128,
            taps,
            ..Default::default()
        },
    )
    .unwrap()
}

fn drafter(t: &LoadedModel, seed: u64) -> DrafterWeights {
    drafter_in(t, seed, DrafterPrecision::Q8)
}

fn drafter_in(t: &LoadedModel, seed: u64, precision: DrafterPrecision) -> DrafterWeights {
    let s = DrafterSpec {
        layers: 2,
        block_size: 16,
        target_layer_ids: None,
        block_in_dflash_config: true,
        layer_types: Some(vec!["sliding_attention".into(), "full_attention".into()]),
        sliding_window: 12,
        mask_token_id: t.config().vocab_size as u32 - 1,
        seed,
    };
    let f = write_drafter(t.config(), &s);
    DrafterWeights::load(
        std::str::from_utf8(&f["config.json"]).unwrap(),
        vec![("model.safetensors", &f["model.safetensors"][..])],
        precision,
    )
    .unwrap()
}

/// Greedy decoding and seeded top-p sampling at T = 0.8.
fn greedy_and_seeded() -> [SamplingParams; 2] {
    [
        SamplingParams::default(),
        SamplingParams {
            temperature: 0.8,
            top_p: 0.95,
            seed: 3,
            ..Default::default()
        },
    ]
}

/// DFLASH_QUICK=1 (the SwiftShader pass of CI) runs one prompt and three block sizes (and
/// in the block-size test one kernel variant and 16 tokens).
fn quick() -> bool {
    std::env::var("DFLASH_QUICK").as_deref() == Ok("1")
}

fn prompts() -> Vec<Vec<u32>> {
    let mut r = Rng(88);
    let all: Vec<Vec<u32>> = (0..3)
        .map(|i| (0..6 + 11 * i).map(|_| r.below(260) as u32).collect())
        .collect();
    if quick() {
        all[2..].to_vec()
    } else {
        all
    }
}

fn req(p: &[u32], sp: &SamplingParams) -> GenerateRequest {
    req_n(p, sp, 40)
}

fn req_n(p: &[u32], sp: &SamplingParams, n: usize) -> GenerateRequest {
    GenerateRequest {
        prompt_ids: p.to_vec(),
        max_new_tokens: n,
        sampling: sp.clone(),
        stop_strings: vec![],
        context: 128,
        interrupt: Default::default(),
        grammar: None,
    }
}

fn plain_gpu(
    g: &mut GpuModel,
    p: &[u32],
    sp: &SamplingParams,
    n: usize,
    is_stop: &dyn Fn(u32) -> bool,
) -> Vec<u32> {
    let head = if sp.is_greedy() {
        OutputHead::Argmax
    } else {
        OutputHead::Sample
    };
    g.set_sampling(sp).unwrap();
    g.truncate(0);
    let mut next = g.prefill_with(p, head).unwrap();
    let mut out = vec![];
    while !is_stop(next) && out.len() < n {
        out.push(next);
        if out.len() == n {
            break;
        }
        next = g.step_with(&[next], head).unwrap()[0];
    }
    out
}

/// A full-precision (f32) drafter runs on the CPU engines; the GPU refuses it with a
/// typed error naming the matrix, before anything runs.
#[test]
fn a_full_precision_drafter_is_refused_by_the_gpu() {
    let t = target();
    let w = drafter_in(&t, 7, DrafterPrecision::F32);
    let Some(ctx) = contexts().into_iter().next() else {
        return;
    };
    let tm = gpu_target(&ctx, &t, w.config.target_layer_ids.clone());
    match Speculative::new(tm, &w) {
        Err(GpuError::Unsupported(why)) => assert!(why.contains("f32"), "{why}"),
        Err(e) => panic!("expected Unsupported, got {e}"),
        Ok(_) => panic!("an f32 drafter was accepted by the GPU"),
    }
}

#[test]
fn speculative_equals_plain_on_the_gpu_at_every_block_size() {
    let t = target();
    let w = drafter(&t, 7);
    // The quick pass (SwiftShader, ~25x slower than lavapipe on this step): the variant
    // of a GPU (16 lanes per row), 16 tokens.
    let (n, variants) = if quick() { (16, 1) } else { (40, 2) };
    for ctx in contexts().into_iter().rev().take(variants) {
        let mut plain_model = gpu_target(&ctx, &t, vec![]);
        let taps = w.config.target_layer_ids.clone();
        let tm = gpu_target(&ctx, &t, taps);
        let mut spec = Speculative::new(tm, &w).unwrap();
        for sp in greedy_and_seeded() {
            for p in prompts() {
                let plain = plain_gpu(&mut plain_model, &p, &sp, n, &|x| t.tokenizer.is_stop(x));
                let blocks = if quick() {
                    vec![
                        BlockSize::Fixed(1),
                        BlockSize::Fixed(4),
                        BlockSize::Fixed(16),
                    ]
                } else {
                    vec![
                        BlockSize::Fixed(1),
                        BlockSize::Fixed(2),
                        BlockSize::Fixed(4),
                        BlockSize::Fixed(8),
                        BlockSize::Fixed(16),
                        BlockSize::auto_linear(16, 0.05),
                    ]
                };
                for b in blocks {
                    let r = spec
                        .generate(&t.tokenizer, &req_n(&p, &sp, n), &b, &|| 0.0, &mut |_| {})
                        .unwrap();
                    assert_eq!(
                        r.result.tokens, plain,
                        "{b:?} T={} f16={}",
                        sp.temperature, ctx.f16
                    );
                }
            }
        }
    }
}

/// Host drafts by absolute position: the prompt and its true continuation, corrupted at
/// every `every`th position, then 64 zeros.
fn forced_drafts(prompt: &[u32], continuation: &[u32], every: usize) -> Vec<u32> {
    let seq = [prompt, continuation].concat();
    (0..seq.len() + 64)
        .map(|i| match seq.get(i) {
            Some(&x) if i % every != 0 => x,
            Some(&x) => (x + 1) % 200,
            None => 0,
        })
        .collect()
}

#[test]
fn forced_acceptance_and_rollback_stay_lossless() {
    let t = target();
    let w = drafter(&t, 8);
    for ctx in contexts() {
        let mut plain_model = gpu_target(&ctx, &t, vec![]);
        let tm = gpu_target(&ctx, &t, w.config.target_layer_ids.clone());
        let mut spec = Speculative::new(tm, &w).unwrap();
        for sp in [
            SamplingParams::default(),
            SamplingParams {
                temperature: 1.0,
                seed: 9,
                ..Default::default()
            },
        ] {
            for p in prompts() {
                let plain = plain_gpu(&mut plain_model, &p, &sp, 40, &|x| t.tokenizer.is_stop(x));
                // Drafts: the true continuation, corrupted at every 5th position.
                spec.set_host_drafts(&forced_drafts(&p, &plain, 5));
                let r = spec
                    .generate(
                        &t.tokenizer,
                        &req(&p, &sp),
                        &BlockSize::Fixed(8),
                        &|| 0.0,
                        &mut |_| {},
                    )
                    .unwrap();
                assert_eq!(r.result.tokens, plain, "T={}", sp.temperature);
                if plain.len() == 40 {
                    assert!(
                        r.mean_tau() > 2.0,
                        "forced drafts should be accepted: tau {}",
                        r.mean_tau()
                    );
                }
                spec.host_drafts = false;
            }
        }
        // Auto mode on this device's measured step costs, with and without good drafts.
        let costs = spec.measure_step_costs(8, &clock()).unwrap();
        assert_eq!(costs.len(), 9);
        assert!(
            costs[1..].iter().all(|&c| c.is_finite() && c > 0.0),
            "{costs:?}"
        );
        let auto = BlockSize::Auto { verify_cost: costs };
        for p in prompts() {
            let sp = SamplingParams::default();
            let plain = plain_gpu(&mut plain_model, &p, &sp, 40, &|x| t.tokenizer.is_stop(x));
            let mut seq = p.clone();
            seq.extend(&plain);
            seq.extend([0; 64]);
            spec.set_host_drafts(&seq);
            let r = spec
                .generate(&t.tokenizer, &req(&p, &sp), &auto, &|| 0.0, &mut |_| {})
                .unwrap();
            assert_eq!(r.result.tokens, plain);
            spec.host_drafts = false;
            let r = spec
                .generate(&t.tokenizer, &req(&p, &sp), &auto, &|| 0.0, &mut |_| {})
                .unwrap();
            assert_eq!(r.result.tokens, plain);
        }
    }
}

fn clock() -> impl Fn() -> f64 {
    let t0 = std::time::Instant::now();
    move || t0.elapsed().as_secs_f64()
}

/// Auto mode refines a size's cost only with steps that follow a step of their own size
/// and did not build their plan: a probe after one-row steps carries their deferred
/// context extension.
#[test]
fn only_steps_in_a_run_of_their_size_refine_the_costs() {
    use dflash_gpu::speculative::{step_seconds, StepResult};
    let step = |built_plan| StepResult {
        accepted: 0,
        tokens: vec![1],
        built_plan,
    };
    assert_eq!(step_seconds(Some(2), 2, &step(false), 0.25), 0.25);
    assert_eq!(step_seconds(Some(1), 1, &step(false), 0.25), 0.25);
    assert_eq!(step_seconds(Some(1), 2, &step(false), 0.25), 0.0);
    assert_eq!(step_seconds(Some(2), 1, &step(false), 0.25), 0.0);
    assert_eq!(step_seconds(None, 1, &step(false), 0.25), 0.0);
    assert_eq!(step_seconds(Some(2), 2, &step(true), 0.25), 0.0);
}

/// measure_step_costs failing midway (a 16-row step does not fit a 20-token context,
/// after the smaller sizes ran) returns the typed error and puts back what it changed:
/// host drafts, an empty cache; the pair then decodes as before.
#[test]
fn step_costs_failing_midway_put_the_state_back() {
    let t = target();
    let w = drafter(&t, 10);
    for ctx in contexts() {
        let opts = GpuModelOptions {
            context: 20,
            taps: w.config.target_layer_ids.clone(),
            ..Default::default()
        };
        let tm = GpuModel::new(ctx.clone(), &t.weights, &opts).unwrap();
        let mut spec = Speculative::new(tm, &w).unwrap();
        spec.host_drafts = true;
        let err = spec.measure_step_costs(16, &clock()).unwrap_err();
        assert!(
            matches!(
                err,
                GpuError::Core(dflash_core::Error::ContextOverflow { .. })
            ),
            "{err:?}"
        );
        assert!(spec.host_drafts);
        assert_eq!(spec.target.len(), 0);
        spec.host_drafts = false;
        let tm = GpuModel::new(ctx.clone(), &t.weights, &opts).unwrap();
        let mut fresh = Speculative::new(tm, &w).unwrap();
        let p = &prompts()[0][..4];
        let outcomes: Vec<(u32, Vec<u32>, usize)> = [&mut spec, &mut fresh]
            .into_iter()
            .map(|s| {
                let anchor = s.prefill(p, OutputHead::Argmax).unwrap();
                let r = s.step(2, OutputHead::Argmax).unwrap();
                (anchor, r.tokens, s.target.len())
            })
            .collect();
        assert_eq!(outcomes[0], outcomes[1]);
    }
}

/// A step whose plan is built for it says so (its wall time includes the build, so auto
/// mode's refinement of the step costs leaves it out); the same step again does not.
#[test]
fn a_step_that_builds_its_plan_says_so() {
    let t = target();
    let w = drafter(&t, 10);
    for ctx in contexts() {
        let tm = gpu_target(&ctx, &t, w.config.target_layer_ids.clone());
        let mut spec = Speculative::new(tm, &w).unwrap();
        spec.prefill(&prompts()[0], OutputHead::Argmax).unwrap();
        let built: Vec<bool> = (0..3)
            .map(|_| spec.step(2, OutputHead::Argmax).unwrap().built_plan)
            .collect();
        // A step of 2 after the prefill, then one after a step of 2: two plans; the
        // third step is the second's plan again.
        assert_eq!(built, [true, true, false]);
    }
}

/// The drafter's block output on the GPU equals the CPU reference within 1e-3 (f32 cache;
/// 1e-2 with an f16 cache), given the same committed context.
#[test]
fn the_drafter_forward_matches_the_cpu_reference() {
    let t = target();
    let w = drafter(&t, 10);
    let cpu_t = CpuModel::new(&t.weights);
    let cpu_d = CpuDrafter::new(&w);
    for ctx in contexts() {
        let p = prompts().last().unwrap().clone();
        let p = &p;
        let tm = gpu_target(&ctx, &t, w.config.target_layer_ids.clone());
        let mut spec = Speculative::new(tm, &w).unwrap();
        let anchor = spec.prefill(p, OutputHead::Argmax).unwrap();
        let b = 8;
        spec.step(b, OutputHead::Argmax).unwrap();
        let got = spec.read_draft_hidden(b).unwrap();
        // CPU: the same context (the prompt rows) and block.
        let mut cache = cpu_t.new_cache(128);
        let out = cpu_t
            .forward(p, &mut cache, LogitRows::Last, &w.config.target_layer_ids)
            .unwrap();
        assert_eq!(cpu_t.argmax_last(&out.logits), anchor);
        let mut dctx = cpu_d.new_context();
        cpu_d.extend_context(&mut dctx, &out.taps);
        let mut ids = vec![anchor];
        ids.extend(std::iter::repeat_n(w.config.mask_token_id, b - 1));
        let want = cpu_d.forward_block(&mut dctx, &cpu_t.embed(&ids).unwrap());
        let max = want
            .iter()
            .zip(&got)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        eprintln!("drafter GPU vs CPU (f16={}): max error {max:e}", ctx.f16);
        assert!(max < if ctx.f16 { 1e-2 } else { 1e-3 }, "{max}");
        // The drafts (the argmax in the lm_head's epilogue): the argmax of the CPU's
        // lm_head over the GPU's own hidden rows.
        let h = t.config().hidden_size;
        let logits = cpu_t.lm_head_rows(&got[h..], b - 1);
        let v = t.config().vocab_size;
        let want_drafts: Vec<u32> = logits
            .chunks(v)
            .map(|row| dflash_core::cpu::ops::argmax(row) as u32)
            .collect();
        assert_eq!(spec.read_drafts(b).unwrap(), want_drafts, "f16={}", ctx.f16);
    }
}

/// One-row steps after a one-row step defer the drafter's context extension (their taps
/// wait in the taps buffer, 16 rows at most); the next step that drafts extends them all
/// at once. Its block then has the bits of the same block on an engine that prefilled
/// every committed row: the same drafted hidden rows and drafts, after 5 one-row steps
/// (4 deferred) and after 20 (a full taps buffer extended by a one-row step on the way).
#[test]
fn deferred_context_extension_drafts_as_a_full_prefill() {
    let t = target();
    let w = drafter(&t, 14);
    let taps = w.config.target_layer_ids.clone();
    let p = prompts()[0].clone();
    let b = 8;
    for ctx in contexts() {
        for singles in if quick() { vec![5] } else { vec![5, 20] } {
            let mut spec = Speculative::new(gpu_target(&ctx, &t, taps.clone()), &w).unwrap();
            let mut committed = p.clone();
            let mut anchor = spec.prefill(&p, OutputHead::Argmax).unwrap();
            for _ in 0..singles {
                let r = spec.step(1, OutputHead::Argmax).unwrap();
                assert_eq!(r.accepted, 0);
                committed.push(anchor);
                anchor = r.tokens[0];
            }
            spec.step(b, OutputHead::Argmax).unwrap();
            let mut fresh = Speculative::new(gpu_target(&ctx, &t, taps.clone()), &w).unwrap();
            assert_eq!(
                fresh.prefill(&committed, OutputHead::Argmax).unwrap(),
                anchor
            );
            fresh.step(b, OutputHead::Argmax).unwrap();
            let what = format!("{singles} one-row steps, f16={}", ctx.f16);
            let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
            assert_eq!(
                bits(spec.read_draft_hidden(b).unwrap()),
                bits(fresh.read_draft_hidden(b).unwrap()),
                "{what}"
            );
            assert_eq!(
                spec.read_drafts(b).unwrap(),
                fresh.read_drafts(b).unwrap(),
                "{what}"
            );
        }
    }
}

fn dflash2_drafter(t: &LoadedModel, seed: u64) -> DrafterWeights {
    use dflash_core::testutil::{write_dflash2_drafter, DFlash2Spec};
    let s = DrafterSpec {
        layers: 2,
        block_size: 8,
        target_layer_ids: None,
        block_in_dflash_config: true,
        layer_types: None,
        sliding_window: 0,
        mask_token_id: t.config().vocab_size as u32 - 1,
        seed,
    };
    let d = DFlash2Spec {
        output_multiplier: Some(0.8),
        final_logit_softcapping: Some(6.0),
        input_embedding_scale: Some(1.25),
        ..DFlash2Spec::new(2, 16, 32, 8)
    };
    let files = write_dflash2_drafter(t.config(), &s, &d);
    DrafterWeights::load(
        std::str::from_utf8(&files["config.json"]).unwrap(),
        vec![("model.safetensors", &files["model.safetensors"][..])],
        DrafterPrecision::Q8,
    )
    .unwrap()
}

/// DFlash2 on the GPU: the block's hidden rows (convolutions around every sublayer,
/// scaled input embeddings) equal the CPU reference within 1e-3 (1e-2 with an f16 cache),
/// and the drafts (top-K candidates, selector walk from the anchor) equal the CPU's.
#[test]
fn the_dflash2_drafter_matches_the_cpu_reference() {
    let t = target();
    let w = dflash2_drafter(&t, 12);
    let cpu_t = CpuModel::new(&t.weights);
    let cpu_d = CpuDrafter::new(&w);
    let h = t.config().hidden_size;
    for ctx in contexts() {
        for p in prompts().into_iter().take(if quick() { 2 } else { 4 }) {
            let tm = gpu_target(&ctx, &t, w.config.target_layer_ids.clone());
            let mut spec = Speculative::new(tm, &w).unwrap();
            let anchor = spec.prefill(&p, OutputHead::Argmax).unwrap();
            let b = 8;
            spec.step(b, OutputHead::Argmax).unwrap();
            let got = spec.read_draft_hidden(b).unwrap();
            let drafts = spec.read_drafts(b).unwrap();
            let mut cache = cpu_t.new_cache(128);
            let out = cpu_t
                .forward(&p, &mut cache, LogitRows::Last, &w.config.target_layer_ids)
                .unwrap();
            let mut dctx = cpu_d.new_context();
            cpu_d.extend_context(&mut dctx, &out.taps);
            let mut ids = vec![anchor];
            ids.extend(std::iter::repeat_n(w.config.mask_token_id, b - 1));
            let want = cpu_d.forward_block(&mut dctx, &cpu_t.embed(&ids).unwrap());
            let max = want
                .iter()
                .zip(&got)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(max < if ctx.f16 { 1e-2 } else { 1e-3 }, "hidden: {max}");
            // Drafts from the GPU's own hidden rows through the CPU selector: equal.
            let logits = cpu_t.lm_head_rows(&got[h..], b - 1);
            assert_eq!(
                drafts,
                cpu_d.select(anchor, &got[h..], &logits),
                "f16={}",
                ctx.f16
            );
        }
    }
}

#[test]
fn dflash2_speculation_equals_plain_decoding_on_the_gpu() {
    let t = target();
    let w = dflash2_drafter(&t, 13);
    for ctx in contexts() {
        let mut plain_model = gpu_target(&ctx, &t, vec![]);
        let tm = gpu_target(&ctx, &t, w.config.target_layer_ids.clone());
        let mut spec = Speculative::new(tm, &w).unwrap();
        for sp in greedy_and_seeded() {
            // (SwiftShader in CI: one prompt, two block sizes)
            for p in prompts().into_iter().take(if quick() { 1 } else { 4 }) {
                let plain = plain_gpu(&mut plain_model, &p, &sp, 40, &|x| t.tokenizer.is_stop(x));
                let blocks = if quick() {
                    vec![BlockSize::Fixed(5), BlockSize::Fixed(8)]
                } else {
                    vec![
                        BlockSize::Fixed(2),
                        BlockSize::Fixed(5),
                        BlockSize::Fixed(8),
                        BlockSize::auto_linear(8, 0.05),
                    ]
                };
                for b in blocks {
                    let r = spec
                        .generate(&t.tokenizer, &req(&p, &sp), &b, &|| 0.0, &mut |_| {})
                        .unwrap();
                    assert_eq!(r.result.tokens, plain, "{b:?} T={}", sp.temperature);
                }
            }
        }
    }
}

/// Rejection-sampling verification on the GPU follows the CPU reference (whose output
/// distribution is tested in dflash-core's tests/rejection.rs): with DFlash and DFlash2
/// drafters, the same seeds give the same tokens (up to rare float near-ties in p, q or
/// the kept mass, which are added in another order on the GPU).
#[test]
fn rejection_sampling_on_the_gpu_follows_the_cpu_reference() {
    use dflash_core::speculative::generate_speculative_cpu;
    let t = target();
    let cpu_t = CpuModel::new(&t.weights);
    // A DFlash drafter proposing its argmax, the same drafting (`sampled_drafts`), and
    // DFlash2 (its walk draws).
    for (w, sampled_drafts) in [
        (drafter(&t, 21), false),
        (drafter(&t, 21), true),
        (dflash2_drafter(&t, 22), false),
    ] {
        let cpu_d = CpuDrafter::new(&w);
        for ctx in contexts().into_iter().take(1) {
            let tm = gpu_target(&ctx, &t, w.config.target_layer_ids.clone());
            let mut spec = Speculative::new(tm, &w).unwrap();
            let (mut same, mut total, mut accepted) = (0, 0, 0);
            for seed in 0..(if quick() { 4 } else { 12 }) {
                let sp = SamplingParams {
                    temperature: 1.0,
                    top_k: 8,
                    seed,
                    speculative_rejection: true,
                    sampled_drafts,
                    ..Default::default()
                };
                let p = &prompts()[seed as usize % prompts().len()];
                let r = req(p, &sp);
                let g = spec
                    .generate(&t.tokenizer, &r, &BlockSize::Fixed(4), &|| 0.0, &mut |_| {})
                    .unwrap();
                let c = generate_speculative_cpu(
                    &cpu_t,
                    &cpu_d,
                    &t.tokenizer,
                    &r,
                    &BlockSize::Fixed(4),
                    &|| 0.0,
                    &mut |_| {},
                )
                .unwrap();
                total += 1;
                same += (g.result.tokens == c.result.tokens) as usize;
                accepted += g.taus.iter().map(|x| x - 1).sum::<usize>();
            }
            eprintln!(
                "{} (sampled drafts {sampled_drafts}): {same}/{total} sequences equal, {accepted} drafts accepted on the GPU",
                w.config.architecture
            );
            assert!(same * 4 >= total * 3, "{same} of {total} equal");
        }
    }
}

/// Plain generation keeps one step in flight (the token stays on the GPU as the next
/// input; the host reads it while the next step runs): its tokens are those of one
/// blocking step at a time, greedy and sampled, at a budget, and after a stop string
/// that ends generation with a step in flight (that step's row is dropped, so the next
/// generation on the same model is unchanged).
#[test]
fn pipelined_plain_generation_equals_step_by_step_decoding() {
    let t = target();
    for ctx in contexts() {
        let mut g = gpu_target(&ctx, &t, vec![]);
        let sampled = SamplingParams {
            temperature: 0.8,
            top_p: 0.95,
            seed: 3,
            ..Default::default()
        };
        for sp in [SamplingParams::default(), sampled] {
            for p in prompts() {
                let want = plain_gpu(&mut g, &p, &sp, 40, &|x| t.tokenizer.is_stop(x));
                let run = |g: &mut GpuModel, r: &GenerateRequest| {
                    g.generate(&t.tokenizer, r, &|| 0.0, &mut |_| {})
                        .unwrap()
                        .tokens
                };
                assert_eq!(run(&mut g, &req(&p, &sp)), want, "f16={}", ctx.f16);
                let short = GenerateRequest {
                    max_new_tokens: 5,
                    ..req(&p, &sp)
                };
                assert_eq!(run(&mut g, &short), want[..5.min(want.len())]);
                // A stop string: the text of a whole-character token after the second.
                let text = |i: usize| t.tokenizer.decode(&want[i..i + 1], false).unwrap();
                let at = (2..want.len().saturating_sub(1))
                    .find(|&i| !text(i).trim().is_empty() && !text(i).contains('\u{FFFD}'));
                if let Some(i) = at {
                    let stop = GenerateRequest {
                        stop_strings: vec![text(i)],
                        ..req(&p, &sp)
                    };
                    let got = run(&mut g, &stop);
                    assert!(got.len() <= i + 1, "stopped at {:?}: {got:?}", text(i));
                    assert_eq!(got, want[..got.len()]);
                }
                assert_eq!(run(&mut g, &req(&p, &sp)), want, "after a stop");
            }
        }
    }
}

/// DFlash generation keeps the next step in flight on GPUs (its block chosen before the
/// step before is read, wherever that step's outcome cannot change it): its tokens, each
/// step's tau, the drafts tried per slot (so the blocks) and the rows reused are those
/// of one step at a time, at fixed blocks, a budget that ends inside a block, a stop
/// string that ends generation with a step in flight (dropped, so the next turn, which
/// reuses the cache, is unchanged too), and drafts forced to the true continuation on a
/// prompt that runs into the context (most drafts accepted, the context's room decides
/// near the end).
#[test]
fn pipelined_dflash_equals_one_step_at_a_time() {
    let t = target();
    let w = drafter(&t, 7);
    let taps = w.config.target_layer_ids.clone();
    let pair = |pipelined| {
        let ctx = common::gpu_tuned_context(pipelined)?;
        Some(Speculative::new(gpu_target(&ctx, &t, taps.clone()), &w).unwrap())
    };
    let (Some(mut piped), Some(mut stepped)) = (pair(true), pair(false)) else {
        return;
    };
    let mut both = |r: &GenerateRequest, b: usize, forced: Option<&[u32]>| {
        let run = |s: &mut Speculative| {
            if let Some(drafts) = forced {
                s.set_host_drafts(drafts);
            }
            let x = s.generate(&t.tokenizer, r, &BlockSize::Fixed(b), &|| 0.0, &mut |_| {});
            s.host_drafts = false;
            let x = x.unwrap();
            let reused = x.result.cached_tokens;
            (x.result.tokens, x.taus, x.acceptance, reused)
        };
        let (got, want) = (run(&mut piped), run(&mut stepped));
        assert_eq!(got, want, "block {b} T={}", r.sampling.temperature);
        got.0
    };
    let blocks = if quick() { vec![4] } else { vec![4, 16] };
    for sp in greedy_and_seeded() {
        for p in prompts().into_iter().rev().take(2) {
            for &b in &blocks {
                let whole = both(&req(&p, &sp), b, None);
                both(&req_n(&p, &sp, 7), b, None);
                // A stop string: a whole-character token's text after the second token.
                let text = |i: usize| t.tokenizer.decode(&whole[i..i + 1], false).unwrap();
                let at = (2..whole.len().saturating_sub(1))
                    .find(|&i| !text(i).trim().is_empty() && !text(i).contains('\u{FFFD}'));
                let reply = match at {
                    Some(i) => {
                        let stop = vec![text(i)];
                        let r = GenerateRequest {
                            stop_strings: stop,
                            ..req(&p, &sp)
                        };
                        both(&r, b, None)
                    }
                    None => whole,
                };
                // The next turn: this turn's prompt and reply, then more.
                let next: Vec<u32> = p.iter().chain(&reply).chain(&p[..4]).copied().collect();
                both(&req_n(&next, &sp, 12), b, None);
            }
        }
        // 110 prompt tokens leave 18 of the context of 128.
        let long: Vec<u32> = prompts().concat().into_iter().cycle().take(110).collect();
        let plain = both(&req(&long, &sp), 1, None);
        let forced = forced_drafts(&long, &plain, 7);
        for &b in &blocks {
            both(&req(&long, &sp), b, Some(&forced));
        }
    }
    assert!(piped.steps_queued_ahead > 0 && piped.steps_dropped > 0);
    assert_eq!(stepped.steps_queued_ahead, 0);
}

/// One turn of a conversation on `spec`'s GPU engine: DFlash at block 4, or plain
/// decoding on its target (as the browser worker runs a request with `dflash: false`).
fn gpu_turn(
    spec: &mut Speculative,
    t: &LoadedModel,
    r: &GenerateRequest,
    dflash: bool,
) -> (dflash_core::generate::GenerateResult, Vec<usize>) {
    match dflash {
        true => {
            let s = spec
                .generate(&t.tokenizer, r, &BlockSize::Fixed(4), &|| 0.0, &mut |_| {})
                .unwrap();
            (s.result, s.taus)
        }
        false => {
            let g = spec.target.generate(&t.tokenizer, r, &|| 0.0, &mut |_| {});
            (g.unwrap(), vec![])
        }
    }
}

/// Multi-turn KV reuse on the GPU: five turns on one engine, each prompt the last prompt,
/// its reply and three new tokens, give the tokens of an engine that forgets its cache
/// before every turn, with DFlash switched on and off between turns, greedy and seeded
/// sampling; each turn after a turn of the same kind keeps the last prompt and its reply
/// (all but the last token); an edit keeps exactly the rows before it; `forget_cached`
/// keeps none.
#[test]
fn a_conversation_that_reuses_its_kv_rows_equals_one_prefilled_every_turn() {
    if quick() {
        // The SwiftShader pass: its pipelines compile for every new row count, which this
        // test makes many of (8 minutes there, 31 s on lavapipe); the reuse logic is the
        // host's and the kernels are those the other tests run there.
        return;
    }
    let t = target();
    let w = drafter(&t, 7);
    // DFlash after DFlash, plain after DFlash, plain after plain, DFlash after plain.
    let patterns = [[true, true, false, false, true]];
    for ctx in contexts() {
        let taps = w.config.target_layer_ids.clone();
        let mut spec = Speculative::new(gpu_target(&ctx, &t, taps.clone()), &w).unwrap();
        let mut fresh = Speculative::new(gpu_target(&ctx, &t, taps), &w).unwrap();
        for sp in greedy_and_seeded() {
            for dflash in &patterns {
                spec.target.forget_cached();
                let mut rng = Rng(19);
                let mut prompt: Vec<u32> = (0..7).map(|_| rng.below(260) as u32).collect();
                for (turn, &on) in dflash.iter().enumerate() {
                    let mut r = req(&prompt, &sp);
                    r.max_new_tokens = 8;
                    fresh.target.forget_cached();
                    let (want, want_taus) = gpu_turn(&mut fresh, &t, &r, on);
                    let (got, taus) = gpu_turn(&mut spec, &t, &r, on);
                    let what = format!(
                        "T={} turn {turn} dflash {dflash:?} f16={}",
                        sp.temperature, ctx.f16
                    );
                    assert_eq!(got.tokens, want.tokens, "{what}");
                    // The same drafts: the drafter's kept context is the one it rebuilds.
                    assert_eq!(taus, want_taus, "{what}");
                    if on {
                        let drafts = spec.read_drafts(4).unwrap();
                        assert_eq!(drafts, fresh.read_drafts(4).unwrap(), "{what}");
                    }
                    assert_eq!(want.cached_tokens, 0, "{what}");
                    let kept_at_least = match turn {
                        0 => 0,
                        _ if on != dflash[turn - 1] => 0,
                        _ => prompt.len() - 4 - usize::from(on) * 4,
                    };
                    let kept = got.cached_tokens;
                    assert!(kept >= kept_at_least, "{what}: {kept} < {kept_at_least}");
                    assert!(kept < prompt.len(), "{what}");
                    prompt.extend(&got.tokens);
                    prompt.extend((0..3).map(|_| rng.below(260) as u32));
                }
                let mut edited = prompt.clone();
                edited[4] = (edited[4] + 1) % 260;
                let r = req(&edited, &sp);
                fresh.target.forget_cached();
                let (want, want_taus) = gpu_turn(&mut fresh, &t, &r, dflash[4]);
                let (got, taus) = gpu_turn(&mut spec, &t, &r, dflash[4]);
                assert_eq!(got.tokens, want.tokens);
                assert_eq!(taus, want_taus);
                assert_eq!(got.cached_tokens, 4);
                spec.target.forget_cached();
                assert_eq!(gpu_turn(&mut spec, &t, &r, false).0.cached_tokens, 0);
            }
        }
    }
}

/// A drafter with a draft vocabulary (every third id left out) on the GPU: its drafts are
/// those of the CPU's draft head over the GPU's own hidden rows (the lm_head's rows of
/// the list gathered on the GPU, the argmax mapped back to token ids), and speculation
/// stays equal to plain decoding at blocks 4 and 16, greedy and seeded.
#[test]
fn a_draft_vocabulary_on_the_gpu_drafts_as_the_cpu_and_stays_lossless() {
    let t = target();
    let v = t.config().vocab_size;
    let ids: Vec<u32> = (0..v as u32).filter(|i| i % 3 != 1).collect();
    let mut w = drafter(&t, 10);
    w.draft_vocab = Some(dflash_core::drafter::DraftVocab::new(ids, v).unwrap());
    let cpu_t = CpuModel::new(&t.weights);
    let head = dflash_core::drafter::DraftHead::gather(&cpu_t, w.draft_vocab.as_ref().unwrap());
    let n = if quick() { 16 } else { 32 };
    for ctx in contexts()
        .into_iter()
        .rev()
        .take(if quick() { 1 } else { 2 })
    {
        let mut plain_model = gpu_target(&ctx, &t, vec![]);
        let tm = gpu_target(&ctx, &t, w.config.target_layer_ids.clone());
        let mut spec = Speculative::new(tm, &w).unwrap();
        assert_eq!(
            spec.drafter.draft_head_ids(),
            Some(w.draft_vocab.as_ref().unwrap().len())
        );
        let p = prompts().last().unwrap().clone();
        spec.prefill(&p, OutputHead::Argmax).unwrap();
        let b = 8;
        spec.step(b, OutputHead::Argmax).unwrap();
        let hidden = spec.read_draft_hidden(b).unwrap();
        let h = t.config().hidden_size;
        let want = head.drafts(&hidden[h..], b - 1, &w.config);
        assert_eq!(spec.read_drafts(b).unwrap(), want, "f16={}", ctx.f16);
        for sp in greedy_and_seeded() {
            for p in prompts().into_iter().take(2) {
                let plain = plain_gpu(&mut plain_model, &p, &sp, n, &|x| t.tokenizer.is_stop(x));
                for b in [BlockSize::Fixed(4), BlockSize::Fixed(16)] {
                    let r = spec
                        .generate(&t.tokenizer, &req_n(&p, &sp, n), &b, &|| 0.0, &mut |_| {})
                        .unwrap();
                    assert_eq!(r.result.tokens, plain, "{b:?} T={}", sp.temperature);
                }
            }
        }
    }
}

/// GEMVs on 8-bit activations (`Tuning::int8_activations`: the target's and the drafter's
/// q4 / q8 products, the greedy heads through logits and argmax.wgsl, the drafts mapped
/// through a draft vocabulary) keep speculation equal to plain decoding on the same
/// engine, greedy and seeded, at block 16 (the 16-row verify the 8-bit path is for; one
/// drafter and 16 tokens, as each kernel variant costs CPU adapters seconds to compile).
#[test]
fn eight_bit_activations_stay_lossless() {
    let Some(ctx) = common::gpu_context(&dflash_gpu::GpuOptions {
        int8_activations: Some(true),
        ..Default::default()
    }) else {
        return;
    };
    let t = target();
    let v = t.config().vocab_size;
    let ids: Vec<u32> = (0..v as u32).filter(|i| i % 3 != 1).collect();
    let mut w = drafter(&t, 10);
    w.draft_vocab = Some(dflash_core::drafter::DraftVocab::new(ids, v).unwrap());
    let mut plain_model = gpu_target(&ctx, &t, vec![]);
    let tm = gpu_target(&ctx, &t, w.config.target_layer_ids.clone());
    let mut spec = Speculative::new(tm, &w).unwrap();
    let p = prompts().last().unwrap().clone();
    for sp in greedy_and_seeded() {
        let plain = plain_gpu(&mut plain_model, &p, &sp, 16, &|x| t.tokenizer.is_stop(x));
        let r = spec
            .generate(
                &t.tokenizer,
                &req_n(&p, &sp, 16),
                &BlockSize::Fixed(16),
                &|| 0.0,
                &mut |_| {},
            )
            .unwrap();
        assert_eq!(r.result.tokens, plain, "T={}", sp.temperature);
    }
}
