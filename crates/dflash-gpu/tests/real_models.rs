//! SmolLM2-135M-Instruct on the GPU engine: greedy generation equals the CPU reference
//! token for token on the llama.cpp fixture prompts, and a position's logits are the same
//! bits from a one-row step and from a 16-row pass. Needs scripts/fetch-models.sh
//! (skipped without the model unless DFLASH_REQUIRE_MODELS=1).

mod common;
use common::gpu_context;
use dflash_core::cpu::CpuModel;
use dflash_core::generate::{generate_cpu, GenerateRequest};
use dflash_core::model_files::load_path;
use dflash_gpu::{GpuModel, GpuModelOptions, GpuOptions};
use std::path::PathBuf;

fn smollm2() -> Option<PathBuf> {
    let cache = std::env::var("DFLASH_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/dflash")
        });
    let p = cache.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.exists() {
        return Some(p);
    }
    if std::env::var("DFLASH_REQUIRE_MODELS").as_deref() == Ok("1") {
        panic!("{} is missing: run scripts/fetch-models.sh", p.display());
    }
    eprintln!("skipping: {} not found", p.display());
    None
}

fn fixture_prompts() -> Vec<Vec<u32>> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/llamacpp/smollm2.json");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    v["greedy"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            g["prompt_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        })
        .collect()
}

#[test]
fn smollm2_greedy_on_the_gpu_equals_the_cpu_reference() {
    let Some(path) = smollm2() else { return };
    let Some(ctx) = gpu_context(&GpuOptions {
        no_f16: true,
        ..Default::default()
    }) else {
        return;
    };
    let m = load_path(&path).unwrap();
    let cpu = CpuModel::new(&m.weights);
    let mut g = GpuModel::new(
        ctx,
        &m.weights,
        &GpuModelOptions {
            context: 512,
            ..Default::default()
        },
    )
    .unwrap();
    let n_new = std::env::var("DFLASH_GPU_TOKENS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(32);
    for prompt in fixture_prompts() {
        let req = GenerateRequest {
            prompt_ids: prompt.clone(),
            max_new_tokens: n_new,
            sampling: Default::default(),
            stop_strings: vec![],
            context: 512,
            interrupt: Default::default(),
        };
        let want = generate_cpu(&cpu, &m.tokenizer, &req, &|| 0.0, &mut |_| {})
            .unwrap()
            .tokens;
        let got = g
            .generate_greedy(&prompt, n_new, &|t| m.tokenizer.is_stop(t))
            .unwrap();
        eprintln!(
            "{} tokens: {:?}",
            got.len(),
            m.tokenizer.decode(&got, true).unwrap()
        );
        assert_eq!(got, want);
    }
}

#[test]
fn smollm2_logits_are_bit_identical_in_one_row_steps_and_a_16_row_pass() {
    let Some(path) = smollm2() else { return };
    for ctx in common::contexts() {
        let m = load_path(&path).unwrap();
        let v = m.config().vocab_size;
        let mut g = GpuModel::new(
            ctx,
            &m.weights,
            &GpuModelOptions {
                context: 256,
                ..Default::default()
            },
        )
        .unwrap();
        let prompt = &fixture_prompts()[0];
        let ctx_len = prompt.len() - 16;
        g.prefill(&prompt[..ctx_len]).unwrap();
        g.step(&prompt[ctx_len..]).unwrap();
        let multi = g.read_logits(16).unwrap();
        g.truncate(ctx_len);
        for (i, &t) in prompt[ctx_len..].iter().enumerate() {
            g.step(&[t]).unwrap();
            let one = g.read_logits(1).unwrap();
            assert!(
                one.iter()
                    .zip(&multi[i * v..(i + 1) * v])
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "position {} (f16={})",
                ctx_len + i,
                g.ctx.f16
            );
        }
    }
}

/// DFlash on SmolLM2: output equals plain GPU decoding token for token, greedy and
/// sampled, at two block sizes (the CI subset of scripts/sweep-lossless.sh). Returns the
/// mean tau of the greedy runs. DFLASH_SPEC_TOKENS sets the tokens per prompt (10).
fn dflash_is_lossless_on_smollm2(
    drafter: impl Fn(&dflash_core::config::ModelConfig) -> dflash_core::drafter::DrafterWeights,
) -> Option<f64> {
    use dflash_core::generate::GenerateRequest;
    use dflash_core::sampling::SamplingParams;
    use dflash_core::speculative::BlockSize;
    use dflash_gpu::dflash::Speculative;
    use dflash_gpu::model::Head;
    let path = smollm2()?;
    let ctx = gpu_context(&GpuOptions::default())?;
    let m = load_path(&path).unwrap();
    let w = drafter(m.config());
    let n = std::env::var("DFLASH_SPEC_TOKENS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let mut plain = GpuModel::new(
        ctx.clone(),
        &m.weights,
        &GpuModelOptions {
            context: 256,
            ..Default::default()
        },
    )
    .unwrap();
    let tm = GpuModel::new(
        ctx,
        &m.weights,
        &GpuModelOptions {
            context: 256,
            taps: w.config.target_layer_ids.clone(),
            ..Default::default()
        },
    )
    .unwrap();
    let mut s = Speculative::new(tm, &w).unwrap();
    let (mut taus, mut steps) = (0usize, 0usize);
    for sp in [
        SamplingParams::default(),
        SamplingParams {
            temperature: 0.8,
            top_p: 0.95,
            seed: 7,
            ..Default::default()
        },
    ] {
        for prompt in fixture_prompts().into_iter().take(2) {
            let head = if sp.is_greedy() {
                Head::Argmax
            } else {
                Head::Sample
            };
            plain.set_sampling(&sp).unwrap();
            let mut want = vec![plain.prefill_with(&prompt, head).unwrap()];
            while want.len() < n && !m.tokenizer.is_stop(*want.last().unwrap()) {
                let next = plain.step_with(&[*want.last().unwrap()], head).unwrap()[0];
                want.push(next);
            }
            if m.tokenizer.is_stop(*want.last().unwrap()) {
                want.pop();
            }
            for b in [BlockSize::Fixed(4), BlockSize::Fixed(16)] {
                let req = GenerateRequest {
                    prompt_ids: prompt.clone(),
                    max_new_tokens: n,
                    sampling: sp.clone(),
                    stop_strings: vec![],
                    context: 256,
                    interrupt: Default::default(),
                };
                let r = s
                    .generate(&m.tokenizer, &req, &b, &|| 0.0, &mut |_| {})
                    .unwrap();
                assert_eq!(r.result.tokens, want, "{b:?} T={}", sp.temperature);
                if sp.is_greedy() {
                    taus += r.taus.iter().sum::<usize>();
                    steps += r.steps;
                }
            }
        }
    }
    Some(taus as f64 / steps.max(1) as f64)
}

#[test]
fn smollm2_dflash_with_a_random_drafter_is_lossless() {
    use dflash_core::drafter::{DrafterPrecision, DrafterWeights};
    use dflash_core::testutil::{write_drafter, DrafterSpec};
    dflash_is_lossless_on_smollm2(|c| {
        let spec = DrafterSpec {
            layers: 2,
            block_size: 16,
            target_layer_ids: None,
            block_in_dflash_config: true,
            layer_types: None,
            sliding_window: 0,
            mask_token_id: c.vocab_size as u32 - 1,
            seed: 1,
        };
        let f = write_drafter(c, &spec);
        DrafterWeights::load(
            std::str::from_utf8(&f["config.json"]).unwrap(),
            vec![("model.safetensors", &f["model.safetensors"][..])],
            DrafterPrecision::Q8,
        )
        .unwrap()
    });
}

/// A DFlash2 drafter (random convolutions, selector and codebooks) on the default model:
/// the path its walk picks is verified as one chain, and the output is plain decoding's.
#[test]
fn smollm2_dflash2_with_a_random_drafter_is_lossless() {
    use dflash_core::drafter::{DrafterPrecision, DrafterWeights};
    use dflash_core::testutil::{write_dflash2_drafter, Dflash2Spec, DrafterSpec};
    dflash_is_lossless_on_smollm2(|c| {
        let spec = DrafterSpec {
            layers: 1,
            block_size: 16,
            target_layer_ids: None,
            block_in_dflash_config: true,
            layer_types: None,
            sliding_window: 0,
            mask_token_id: c.vocab_size as u32 - 1,
            seed: 3,
        };
        let d = Dflash2Spec {
            conv_kernel_size: 2,
            conv_group_size: 16,
            selector_rank: 32,
            selector_top_k: 16,
            output_multiplier: None,
            final_logit_softcapping: None,
            input_embedding_scale: None,
        };
        let f = write_dflash2_drafter(c, &spec, &d);
        let w = DrafterWeights::load(
            std::str::from_utf8(&f["config.json"]).unwrap(),
            vec![("model.safetensors", &f["model.safetensors"][..])],
            DrafterPrecision::Q8,
        )
        .unwrap();
        assert!(w.config.dflash2.is_some());
        w
    });
}

/// The committed trained drafter: lossless too, and it gets drafts accepted (so the
/// rollback of partly accepted blocks is exercised on the real model).
#[test]
fn smollm2_dflash_with_the_trained_drafter_is_lossless_and_accepts_drafts() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../drafters/smollm2-135m-instruct-dflash-b16");
    // The quick pass (SwiftShader in CI) leaves this to the lavapipe pass.
    if !dir.join("model.safetensors").exists()
        || std::env::var("DFLASH_QUICK").is_ok_and(|v| v == "1")
    {
        return;
    }
    let tau = dflash_is_lossless_on_smollm2(|_| {
        dflash_core::drafter::load_drafter_dir(&dir, dflash_core::drafter::DrafterPrecision::Q8)
            .unwrap()
    });
    if let Some(tau) = tau {
        eprintln!("trained drafter: mean tau {tau:.2} (greedy, blocks 4 and 16)");
        assert!(
            tau > 1.05,
            "the trained drafter accepted almost nothing: tau {tau}"
        );
    }
}
