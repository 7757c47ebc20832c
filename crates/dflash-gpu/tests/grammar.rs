//! Grammars on the GPU engine: the masked head (the logits a grammar refuses -inf before
//! the argmax or the sampler) gives the CPU reference's constrained tokens, greedy and
//! seeded, under JSON schema, regex, Lark and `json_object` grammars; DFlash under a
//! grammar equals constrained plain decoding; logprobs from the GPU's rows are the
//! CPU reference's within 1e-3 and the same bits with DFlash as without.

use dflash_core::cpu::CpuModel;
use dflash_core::formats::ggml::GgmlType;
use dflash_core::generate::{generate_cpu, GenerateRequest};
use dflash_core::grammar::{GrammarSpec, Grammars};
use dflash_core::model_files::{load_gguf, LoadedModel};
use dflash_core::sampling::SamplingParams;
use dflash_core::testutil::{
    grammar_specs, lossless_samplings, random_weights, tiny_drafter_target, write_gguf,
};
use dflash_gpu::{GpuModel, GpuModelOptions};
mod common;

fn tiny() -> LoadedModel {
    let c = tiny_drafter_target();
    load_gguf(&write_gguf(&c, &random_weights(&c, 41), GgmlType::Q8_0)).unwrap()
}

fn req(m: &LoadedModel, g: &Grammars, spec: &GrammarSpec, sp: &SamplingParams) -> GenerateRequest {
    GenerateRequest {
        prompt_ids: m.tokenizer.encode("the answer", true).unwrap(),
        max_new_tokens: 32,
        sampling: sp.clone(),
        stop_strings: vec![],
        context: 256,
        interrupt: Default::default(),
        grammar: Some(g.compile(spec).unwrap()),
    }
}

#[test]
fn the_masked_gpu_head_gives_the_cpu_references_constrained_tokens() {
    let m = tiny();
    let g = Grammars::new(&m.tokenizer, m.config().vocab_size).unwrap();
    let cpu = CpuModel::new(&m.weights);
    for ctx in common::contexts() {
        let opts = GpuModelOptions {
            context: 256,
            ..Default::default()
        };
        let mut gpu = GpuModel::new(ctx.clone(), &m.weights, &opts).unwrap();
        for spec in grammar_specs() {
            for sp in lossless_samplings() {
                let r = req(&m, &g, &spec, &sp);
                let want = generate_cpu(&cpu, &m.tokenizer, &r, &|| 0.0, &mut |_| {}).unwrap();
                gpu.forget_cached();
                let got = gpu
                    .generate(&m.tokenizer, &r, &|| 0.0, &mut |_| {})
                    .unwrap();
                let label = format!("{} {spec:?} T={}", ctx.summary.name, sp.temperature);
                assert_eq!(got.tokens, want.tokens, "{label}");
                assert_eq!(got.finish_reason, want.finish_reason, "{label}");
            }
        }
        // The unmasked heads after the masked ones: plain decoding is unchanged.
        let plain = GenerateRequest {
            grammar: None,
            ..req(&m, &g, &grammar_specs()[0], &SamplingParams::default())
        };
        let want = generate_cpu(&cpu, &m.tokenizer, &plain, &|| 0.0, &mut |_| {}).unwrap();
        gpu.forget_cached();
        let got = gpu
            .generate(&m.tokenizer, &plain, &|| 0.0, &mut |_| {})
            .unwrap();
        assert_eq!(got.tokens, want.tokens);
    }
}

/// DFlash and DFlash2 under a grammar on the GPU (two submissions a step: the drafts,
/// then the verify rows under their masks) equal the GPU's constrained plain decoding, at
/// blocks 1, 4, 16 and auto, greedy and seeded, with a random drafter: its drafts are
/// cut where the grammar refuses them and made the forced token where the grammar allows
/// one only, so steps both roll back and accept.
#[test]
fn constrained_dflash_on_the_gpu_equals_constrained_plain_decoding() {
    use dflash_core::drafter::{DrafterPrecision, DrafterWeights};
    use dflash_core::testutil::{write_dflash2_drafter, DFlash2Spec, DrafterSpec};
    let Some(ctx) = common::gpu_context(&Default::default()) else {
        return;
    };
    let m = tiny();
    let c = m.config();
    let f = write_dflash2_drafter(
        c,
        &DrafterSpec::new(c, 1, 6),
        &DFlash2Spec::new(2, 16, 32, 8),
    );
    let cfg = std::str::from_utf8(&f["config.json"]).unwrap();
    let weights = vec![("model.safetensors", &f["model.safetensors"][..])];
    let dflash2 = DrafterWeights::load(cfg, weights, DrafterPrecision::Q8).unwrap();
    for drafter in [common::random_drafter(&m, 2), dflash2] {
        let accepted = constrained_dflash_equals_plain(&ctx, &m, &drafter);
        // The drafts a grammar forces (JSON's keys and punctuation) are accepted.
        assert!(accepted > 0, "drafts accepted under grammars");
    }
}

/// The drafts accepted over every grammar, sampling and block, each run's tokens
/// checked against the GPU's constrained plain decoding.
fn constrained_dflash_equals_plain(
    ctx: &std::rc::Rc<dflash_gpu::GpuContext>,
    m: &LoadedModel,
    drafter: &dflash_core::drafter::DrafterWeights,
) -> usize {
    use dflash_core::speculative::BlockSize;
    use dflash_gpu::speculative::Speculative;
    let g = Grammars::new(&m.tokenizer, m.config().vocab_size).unwrap();
    let opts = GpuModelOptions {
        context: 256,
        taps: drafter.config.target_layer_ids.clone(),
        ..Default::default()
    };
    let mut plain = GpuModel::new(ctx.clone(), &m.weights, &opts).unwrap();
    let target = GpuModel::new(ctx.clone(), &m.weights, &opts).unwrap();
    let mut spec = Speculative::new(target, drafter).unwrap();
    let d2 = drafter.config.dflash2.is_some();
    let mut accepted = 0;
    for spec_g in grammar_specs() {
        for sp in &lossless_samplings()[..2] {
            let r = req(m, &g, &spec_g, sp);
            plain.forget_cached();
            let want = plain
                .generate(&m.tokenizer, &r, &|| 0.0, &mut |_| {})
                .unwrap();
            for b in [
                BlockSize::Fixed(1),
                BlockSize::Fixed(4),
                BlockSize::Fixed(16),
                BlockSize::auto_linear(16, 0.05),
            ] {
                spec.target.forget_cached();
                let got = spec
                    .generate(&m.tokenizer, &r, &b, &|| 0.0, &mut |_| {})
                    .unwrap();
                let label = format!("DFlash2 {d2} {spec_g:?} {b:?} T={}", sp.temperature);
                assert_eq!(got.result.tokens, want.tokens, "{label}");
                assert_eq!(got.result.finish_reason, want.finish_reason, "{label}");
                accepted += got.taus.iter().map(|t| t - 1).sum::<usize>();
            }
        }
    }
    accepted
}

/// A token, its log-probability's bits, its alternatives' ids and bits.
type LogprobBits = (u32, u32, Vec<(u32, u32)>);

/// Logprobs on the GPU (argmax.wgsl `logprobs` over the rows' masked logits): within
/// 1e-3 of the CPU reference's, alternatives most likely first and never a refused id,
/// and the same bits from DFlash's verify rows as from plain decoding's, with and
/// without a grammar.
#[test]
fn gpu_logprobs_follow_the_cpu_reference_and_dflash_gives_the_same_bits() {
    use dflash_core::speculative::BlockSize;
    use dflash_gpu::speculative::Speculative;
    let Some(ctx) = common::gpu_context(&Default::default()) else {
        return;
    };
    let m = tiny();
    let g = Grammars::new(&m.tokenizer, m.config().vocab_size).unwrap();
    let cpu = CpuModel::new(&m.weights);
    let drafter = common::random_drafter(&m, 2);
    let opts = GpuModelOptions {
        context: 256,
        taps: drafter.config.target_layer_ids.clone(),
        ..Default::default()
    };
    let mut plain = GpuModel::new(ctx.clone(), &m.weights, &opts).unwrap();
    let target = GpuModel::new(ctx.clone(), &m.weights, &opts).unwrap();
    let mut spec = Speculative::new(target, &drafter).unwrap();
    let bits = |r: &dflash_core::generate::GenerateResult| -> Vec<LogprobBits> {
        r.logprobs
            .iter()
            .map(|l| {
                (
                    l.token,
                    l.logprob.to_bits(),
                    l.top
                        .iter()
                        .map(|a| (a.token, a.logprob.to_bits()))
                        .collect(),
                )
            })
            .collect()
    };
    for grammar in [None, Some(grammar_specs().remove(0))] {
        for sp in &lossless_samplings()[..2] {
            let sp = SamplingParams {
                logprobs: Some(4),
                ..sp.clone()
            };
            let mut r = req(&m, &g, &grammar_specs()[0], &sp);
            r.grammar = grammar.as_ref().map(|s| g.compile(s).unwrap());
            let want = generate_cpu(&cpu, &m.tokenizer, &r, &|| 0.0, &mut |_| {}).unwrap();
            plain.forget_cached();
            let got = plain
                .generate(&m.tokenizer, &r, &|| 0.0, &mut |_| {})
                .unwrap();
            assert_eq!(got.tokens, want.tokens);
            assert_eq!(got.logprobs.len(), got.tokens.len());
            for (a, b) in got.logprobs.iter().zip(&want.logprobs) {
                assert_eq!(a.token, b.token);
                assert!((a.logprob - b.logprob).abs() < 1e-3, "{a:?} {b:?}");
                let ids = |l: &dflash_core::generate::SpelledLogprob| {
                    l.top.iter().map(|x| x.token).collect::<Vec<_>>()
                };
                assert_eq!(ids(a), ids(b), "the same alternatives");
            }
            for b in [BlockSize::Fixed(4), BlockSize::auto_linear(16, 0.05)] {
                spec.target.forget_cached();
                let s = spec
                    .generate(&m.tokenizer, &r, &b, &|| 0.0, &mut |_| {})
                    .unwrap();
                assert_eq!(
                    bits(&s.result),
                    bits(&got),
                    "{grammar:?} {b:?} T={}",
                    sp.temperature
                );
            }
        }
    }
}
