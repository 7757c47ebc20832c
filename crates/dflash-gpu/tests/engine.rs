//! The GPU engine against the CPU reference on tiny synthetic models in the real formats,
//! and its batch invariance: a position's logits are the same bits alone, inside a
//! 16-row pass, and in prefill.

use dflash_core::config::Arch;
use dflash_core::cpu::{CpuModel, LogitRows};
use dflash_core::formats::ggml::GgmlType;
use dflash_core::model_files::load_gguf;
use dflash_core::testutil::{random_weights, tiny_config, write_gguf};
use dflash_core::weights::ModelWeights;
use dflash_gpu::{GpuModel, GpuModelOptions, GpuOptions};
mod common;
use common::gpu_context;

fn tiny(arch: Arch, t: GgmlType, seed: u64) -> ModelWeights {
    let c = tiny_config(arch);
    load_gguf(&write_gguf(&c, &random_weights(&c, seed), t))
        .unwrap()
        .weights
}

use common::tokens;

#[test]
fn logits_match_the_cpu_reference() {
    for ctx in common::contexts() {
        logits_match_on(&ctx);
    }
}

/// The Intel Xe2 entry of the tuning table (4 GEMV lanes on these narrow matrices,
/// chunked attention) on whatever adapter runs the tests: GPU == CPU and batch
/// invariance hold for its kernel shapes too.
#[test]
fn the_intel_xe2_tuning_matches_the_cpu_reference_and_is_batch_invariant() {
    let opts = GpuOptions {
        tuning: Some(dflash_gpu::context::Tuning::intel_xe2()),
        ..Default::default()
    };
    if let Some(ctx) = gpu_context(&opts) {
        logits_match_on(&ctx);
        batch_invariance_on(&ctx);
    }
}

/// The norm split between residual GEMVs and the GEMVs after them
/// (`Tuning::norm_in_residual`, the CPU adapters' default, which the other tests run
/// there) with a GPU's 16 lanes per row: GPU == CPU and batch invariance hold with it.
#[test]
fn the_norm_split_with_a_gpus_lanes_matches_the_cpu_reference_and_is_batch_invariant() {
    use dflash_gpu::context::Tuning;
    let opts = GpuOptions {
        tuning: Some(Tuning {
            norm_in_residual: true,
            ..Tuning::gpu()
        }),
        ..Default::default()
    };
    if let Some(ctx) = gpu_context(&opts) {
        logits_match_on(&ctx);
        batch_invariance_on(&ctx);
    }
}

fn logits_match_on(ctx: &std::rc::Rc<dflash_gpu::GpuContext>) {
    {
        for (arch, t) in [
            (Arch::Llama, GgmlType::Q4_0),
            (Arch::Qwen2, GgmlType::Q8_0),
            (Arch::Qwen3, GgmlType::Q4_1),
            (Arch::Llama, GgmlType::F16),
        ] {
            let f16 = ctx.f16;
            let w = tiny(arch, t, 31);
            let cpu = CpuModel::new(&w);
            let toks = tokens(12, w.config.vocab_size, 3);
            let mut cache = cpu.new_cache(64);
            let want = cpu
                .forward(&toks, &mut cache, LogitRows::All, &[])
                .unwrap()
                .logits;
            let mut g = GpuModel::new(
                ctx.clone(),
                &w,
                &GpuModelOptions {
                    context: 64,
                    ..Default::default()
                },
            )
            .unwrap();
            let ids = g.step(&toks).unwrap();
            let got = g.read_logits(toks.len()).unwrap();
            let max = want
                .iter()
                .zip(&got)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            let scale = want.iter().map(|a| a.abs()).fold(0f32, f32::max);
            eprintln!(
                "{arch:?} {t:?} f16-kv={f16}: max |gpu - cpu| = {max:e} (logit scale {scale})"
            );
            // f32 path: summation order only. f16 KV: plus f16 rounding of K and V.
            let tol = if f16 { 5e-3 } else { 5e-5 } * scale.max(1.0);
            assert!(max <= tol, "{arch:?} {t:?}: {max} > {tol}");
            common::assert_argmax_rows(&ids, &got, w.config.vocab_size);
        }
    }
}

/// With 8-bit activations (`Tuning::int8_activations`) the GPU computes the CPU engine's
/// quantized products (`CpuKernels::Quantized`), not the f32 reference's: its logits
/// are within 2e-3 of the logit scale of that engine's (an activation's byte may round
/// the other way where the two engines' inputs differ in their last bits: a step of
/// amax / 127 in one product term; on lavapipe they are 7e-7 apart, summation order
/// only), and at least ten times closer to them than to the f32 reference's (3e-2); the greedy head (logits, then argmax.wgsl) picks each row's argmax;
/// and a position's logits are the same bits alone, in a 16-row pass and in prefill.
#[test]
fn eight_bit_activations_follow_the_quantized_cpu_engine_and_are_batch_invariant() {
    use dflash_core::cpu::CpuKernels;
    let Some(ctx) = gpu_context(&GpuOptions {
        no_f16: true,
        int8_activations: Some(true),
        ..Default::default()
    }) else {
        return;
    };
    for (arch, t) in [
        (Arch::Llama, GgmlType::Q4_0),
        (Arch::Qwen2, GgmlType::Q8_0),
        (Arch::Qwen3, GgmlType::Q4_1),
    ] {
        let w = tiny(arch, t, 31);
        let toks = tokens(12, w.config.vocab_size, 3);
        let logits = |kernels| {
            let cpu = CpuModel::with_kernels(&w, kernels);
            let mut cache = cpu.new_cache(64);
            cpu.forward(&toks, &mut cache, LogitRows::All, &[])
                .unwrap()
                .logits
        };
        let (quantized, reference) = (logits(CpuKernels::Quantized), logits(CpuKernels::Reference));
        let opts = GpuModelOptions {
            context: 64,
            ..Default::default()
        };
        let mut g = GpuModel::new(ctx.clone(), &w, &opts).unwrap();
        // The shared scratch is sized once, for the widest input (the MLP's down
        // projection here), before any plan: no plan holds a narrower one.
        let c = &w.config;
        let widest = [c.hidden_size, c.q_dim(), c.intermediate_size];
        let reserved = ctx.int8_scratch_cols();
        assert!(
            reserved >= *widest.iter().max().unwrap(),
            "{arch:?}: {reserved}"
        );
        let ids = g.step(&toks).unwrap();
        assert_eq!(ctx.int8_scratch_cols(), reserved, "{arch:?}: grew");
        let got = g.read_logits(toks.len()).unwrap();
        let (to_quantized, to_reference) = (
            common::max_abs_diff(&got, &quantized),
            common::max_abs_diff(&got, &reference),
        );
        let scale = quantized.iter().map(|a| a.abs()).fold(0f32, f32::max);
        eprintln!("{arch:?} {t:?}: |gpu - quantized| {to_quantized:e}, |gpu - f32| {to_reference:e} (scale {scale})");
        assert!(
            to_quantized <= 2e-3 * scale.max(1.0),
            "{arch:?} {t:?}: {to_quantized}"
        );
        assert!(10.0 * to_quantized <= to_reference, "{arch:?} {t:?}");
        common::assert_argmax_rows(&ids, &got, w.config.vocab_size);
    }
    batch_invariance_on(&ctx);
    // The quantize kernel takes the RMSNorm: a norm apart or in the residual GEMVs asked
    // for beside 8-bit activations is refused, not silently replaced.
    for (fuse_norm, norm_in_residual) in [(Some(false), None), (None, Some(true))] {
        let e = dflash_gpu::GpuContext::new(&GpuOptions {
            int8_activations: Some(true),
            fuse_norm,
            norm_in_residual,
            ..Default::default()
        })
        .err()
        .expect("conflicting options accepted");
        assert!(
            matches!(&e, dflash_gpu::GpuError::Unsupported(m) if m.contains("RMSNorm")),
            "{e}"
        );
    }
}

#[test]
fn a_position_is_bit_identical_alone_in_a_16_row_pass_and_in_prefill() {
    for ctx in common::contexts() {
        batch_invariance_on(&ctx);
    }
}

fn batch_invariance_on(ctx: &std::rc::Rc<dflash_gpu::GpuContext>) {
    {
        let w = tiny(Arch::Qwen2, GgmlType::Q4_0, 32);
        let v = w.config.vocab_size;
        // 80 positions: on GPUs (chunked attention, chunks of 64 keys at this context)
        // the later rows' keys span two chunks.
        let toks = tokens(80, v, 4);
        let mut g = GpuModel::new(
            ctx.clone(),
            &w,
            &GpuModelOptions {
                context: 128,
                ..Default::default()
            },
        )
        .unwrap();
        common::assert_batch_invariant(&mut g, &toks, 70);
    }
}

#[test]
fn greedy_generation_equals_the_cpu_reference() {
    let Some(ctx) = gpu_context(&GpuOptions {
        no_f16: true,
        ..Default::default()
    }) else {
        return;
    };
    let w = tiny(Arch::Llama, GgmlType::Q8_0, 33);
    let m = load_gguf(&write_gguf(
        &tiny_config(Arch::Llama),
        &random_weights(&tiny_config(Arch::Llama), 33),
        GgmlType::Q8_0,
    ))
    .unwrap();
    let cpu = CpuModel::new(&w);
    let prompt = tokens(21, w.config.vocab_size, 5);
    let req = dflash_core::generate::GenerateRequest {
        prompt_ids: prompt.clone(),
        max_new_tokens: 40,
        sampling: Default::default(),
        stop_strings: vec![],
        context: 128,
        interrupt: Default::default(),
        grammar: None,
    };
    let want = dflash_core::generate::generate_cpu(&cpu, &m.tokenizer, &req, &|| 0.0, &mut |_| {})
        .unwrap()
        .tokens;
    let mut g = GpuModel::new(
        ctx,
        &w,
        &GpuModelOptions {
            context: 128,
            ..Default::default()
        },
    )
    .unwrap();
    let got = g
        .generate_greedy(&prompt, 40, &|t| m.tokenizer.is_stop(t))
        .unwrap();
    assert_eq!(got, want);
    // A second model over the same weight buffers (its own KV cache) decodes the same,
    // and the first is untouched by it.
    let opts = GpuModelOptions {
        context: 64,
        ..Default::default()
    };
    let mut shared = g.sharing_weights(&opts).unwrap();
    assert_eq!(shared.memory.weights, 0);
    let stop = |t| m.tokenizer.is_stop(t);
    assert_eq!(shared.generate_greedy(&prompt, 40, &stop).unwrap(), want);
    assert_eq!(g.generate_greedy(&prompt, 40, &stop).unwrap(), want);
}

#[test]
fn taps_match_the_cpu_reference() {
    let Some(ctx) = gpu_context(&GpuOptions {
        no_f16: true,
        ..Default::default()
    }) else {
        return;
    };
    let w = tiny(Arch::Qwen3, GgmlType::Q8_0, 34);
    let cpu = CpuModel::new(&w);
    let toks = tokens(7, w.config.vocab_size, 6);
    let taps = vec![2, 0];
    let mut cache = cpu.new_cache(32);
    let want = cpu
        .forward(&toks, &mut cache, LogitRows::None, &taps)
        .unwrap()
        .taps;
    let mut g = GpuModel::new(
        ctx,
        &w,
        &GpuModelOptions {
            context: 32,
            taps,
            ..Default::default()
        },
    )
    .unwrap();
    g.step(&toks).unwrap();
    let got = g.read_taps(toks.len()).unwrap();
    let max = want
        .iter()
        .zip(&got)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(max < 1e-3, "taps differ by {max}");
}

#[test]
fn a_model_that_cannot_fit_is_refused_before_allocating() {
    use dflash_gpu::GpuError;
    let Some(ctx) = gpu_context(&GpuOptions::default()) else {
        return;
    };
    let w = tiny(Arch::Llama, GgmlType::Q8_0, 35);
    // A KV-cache layer larger than any binding the adapter allows.
    let huge = (ctx.max_binding() / (w.config.kv_dim() as u64 * 2) + 1) as usize;
    let mut big = w.clone();
    big.config.max_position_embeddings = huge * 2;
    match GpuModel::new(
        ctx.clone(),
        &big,
        &GpuModelOptions {
            context: huge * 2,
            ..Default::default()
        },
    ) {
        Err(GpuError::LimitExceeded { limit_name, .. }) => {
            assert_eq!(limit_name, "max_storage_buffer_binding_size")
        }
        other => panic!("expected LimitExceeded, got {:?}", other.err()),
    }
    // A memory budget below the plan.
    match GpuModel::new(
        ctx.clone(),
        &w,
        &GpuModelOptions {
            context: 64,
            memory_budget: Some(1 << 16),
            ..Default::default()
        },
    ) {
        Err(GpuError::OverBudget {
            need,
            weights,
            kv_cache,
            activations,
            budget,
        }) => {
            assert_eq!(need, weights + kv_cache + activations);
            assert_eq!(budget, 1 << 16);
        }
        other => panic!("expected OverBudget, got {:?}", other.err()),
    }
    // The plan states the split before anything is allocated.
    let plan = dflash_gpu::model::plan_memory(
        &ctx,
        &w,
        &GpuModelOptions {
            context: 64,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(plan.weights, w.n_bytes() as u64);
    assert_eq!(
        plan.kv_cache,
        64 * w.config.kv_dim() as u64
            * if ctx.f16 { 2 } else { 4 }
            * 2
            * w.config.num_layers as u64
    );
}

#[test]
fn bad_tokens_a_full_context_and_an_empty_prompt_are_errors() {
    use dflash_gpu::GpuError;
    let Some(ctx) = gpu_context(&GpuOptions::default()) else {
        return;
    };
    let w = tiny(Arch::Qwen2, GgmlType::Q8_0, 36);
    let mut g = GpuModel::new(
        ctx,
        &w,
        &GpuModelOptions {
            context: 20,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(matches!(
        g.step(&[1, 99_999]),
        Err(GpuError::Core(dflash_core::Error::TokenOutOfRange { .. }))
    ));
    g.prefill(&tokens(16, w.config.vocab_size, 7)).unwrap();
    assert!(matches!(
        g.step(&tokens(5, w.config.vocab_size, 8)),
        Err(GpuError::Core(dflash_core::Error::ContextOverflow { .. }))
    ));
    assert_eq!(g.len(), 16, "a refused step changes nothing");
    assert!(matches!(
        g.prefill(&[]),
        Err(GpuError::Core(dflash_core::Error::EmptyPrompt))
    ));
}

#[test]
fn a_lost_device_is_an_error_not_a_hang() {
    use dflash_gpu::GpuError;
    let Some(ctx) = gpu_context(&GpuOptions::default()) else {
        return;
    };
    let w = tiny(Arch::Llama, GgmlType::Q4_0, 37);
    let mut g = GpuModel::new(
        ctx.clone(),
        &w,
        &GpuModelOptions {
            context: 32,
            ..Default::default()
        },
    )
    .unwrap();
    g.step(&[1, 2, 3]).unwrap();
    ctx.destroy_device();
    let r = g.step(&[4]);
    assert!(
        matches!(r, Err(GpuError::DeviceLost(_))),
        "got {:?}",
        r.err()
    );
    // The same with a plan that was already built, and loading a model on the lost device.
    assert!(matches!(g.step(&[5, 6, 7]), Err(GpuError::DeviceLost(_))));
    assert!(matches!(
        GpuModel::new(
            ctx,
            &w,
            &GpuModelOptions {
                context: 32,
                ..Default::default()
            }
        ),
        Err(GpuError::DeviceLost(_))
    ));
}

#[test]
fn the_gpu_sampler_refuses_penalties_it_does_not_have() {
    let Some(ctx) = gpu_context(&GpuOptions::default()) else {
        return;
    };
    let w = tiny(Arch::Qwen2, GgmlType::Q8_0, 4);
    let g = GpuModel::new(ctx, &w, &GpuModelOptions::default()).unwrap();
    use dflash_core::sampling::SamplingParams;
    for sp in [
        SamplingParams {
            repetition_penalty: 1.1,
            ..Default::default()
        },
        SamplingParams {
            frequency_penalty: 0.5,
            ..Default::default()
        },
        SamplingParams {
            presence_penalty: -0.5,
            temperature: 0.7,
            ..Default::default()
        },
    ] {
        let e = g.set_sampling(&sp).unwrap_err();
        assert!(matches!(e, dflash_gpu::GpuError::Unsupported(_)), "{e}");
    }
    assert!(g.set_sampling(&SamplingParams::default()).is_ok());
}
