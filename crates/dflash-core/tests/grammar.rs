//! Grammars (`dflash_core::grammar`): the token table spells every token's bytes, the
//! output of constrained decoding keeps to its grammar (and ends with `length`, never
//! claimed whole, when the budget runs out first), bad grammars get a typed error, and
//! constrained speculative decoding equals constrained plain decoding token for token,
//! greedy and seeded, at every block size and in auto mode, on both CPU engines, with
//! a random drafter, an oracle that drafts the answer with mistakes, and the committed
//! SmolLM2 drafter on the real model.

use dflash_core::cpu::{CpuKernels, CpuModel};
use dflash_core::drafter::{load_drafter_dir, CpuDrafter, DrafterPrecision, DrafterWeights};
use dflash_core::formats::ggml::GgmlType;
use dflash_core::generate::{generate_cpu, FinishReason, GenerateRequest, GenerateResult};
use dflash_core::grammar::{token_bytes, GrammarSpec, Grammars};
use dflash_core::model_files::{load_gguf, load_path, LoadedModel};
use dflash_core::sampling::SamplingParams;
use dflash_core::speculative::{
    generate_speculative_cpu, generate_speculative_with, BlockSize, Proposer,
};
use dflash_core::testutil::{cached_model, grammar_specs, lossless_samplings, DrafterSpec};
use dflash_core::testutil::{random_weights, tiny_drafter_target, write_drafter, write_gguf};
use dflash_core::Error;
use serde_json::json;
use std::collections::BTreeMap;

fn tiny() -> LoadedModel {
    let c = tiny_drafter_target();
    load_gguf(&write_gguf(&c, &random_weights(&c, 41), GgmlType::Q8_0)).unwrap()
}

fn grammars(m: &LoadedModel) -> Grammars {
    Grammars::new(&m.tokenizer, m.config().vocab_size).unwrap()
}

fn req(m: &LoadedModel, prompt: &str, sp: &SamplingParams, g: &GrammarSpec) -> GenerateRequest {
    GenerateRequest {
        prompt_ids: m.tokenizer.encode(prompt, true).unwrap(),
        max_new_tokens: 40,
        sampling: sp.clone(),
        stop_strings: vec![],
        context: 256,
        interrupt: Default::default(),
        grammar: Some(grammars(m).compile(g).unwrap()),
    }
}

fn blocks() -> Vec<BlockSize> {
    vec![
        BlockSize::Fixed(1),
        BlockSize::Fixed(2),
        BlockSize::Fixed(4),
        BlockSize::Fixed(16),
        BlockSize::auto_linear(16, 0.05),
    ]
}

/// Whether `text` is a whole sentence of `g` (checked without llguidance).
fn keeps_to(g: &GrammarSpec, text: &str) -> bool {
    match g {
        GrammarSpec::JsonSchema { .. } => {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(text) else {
                return false;
            };
            let o = v.as_object().unwrap();
            o.len() == 3
                && o["name"].as_str().is_some_and(|s| s.chars().count() <= 6)
                && o["n"].as_u64().is_some_and(|n| n <= 999)
                && o["ok"].is_boolean()
        }
        GrammarSpec::JsonObject => {
            serde_json::from_str::<serde_json::Value>(text).is_ok_and(|v| v.is_object())
        }
        GrammarSpec::Regex(_) => {
            let Some((words, digits)) = text.rsplit_once(' ') else {
                return false;
            };
            (2..=4).contains(&digits.len())
                && digits.bytes().all(|b| b.is_ascii_digit())
                && !words.is_empty()
                && words
                    .replace("ab", "")
                    .replace("cd", "")
                    .replace("the", "")
                    .is_empty()
        }
        GrammarSpec::Lark(_) => text
            .strip_prefix('[')
            .and_then(|t| t.strip_suffix(']'))
            .is_some_and(|t| {
                t.split(", ").all(|w| {
                    (1..=3).contains(&w.len()) && w.bytes().all(|b| b.is_ascii_lowercase())
                })
            }),
    }
}

/// A whole answer keeps to its grammar; one the budget cut is a prefix of one.
fn check_output(g: &GrammarSpec, r: &GenerateResult) {
    match r.finish_reason {
        FinishReason::Stop => assert!(keeps_to(g, &r.text), "{g:?}: {:?}", r.text),
        FinishReason::Length => assert_eq!(r.tokens.len(), 40, "{:?}", r.text),
        FinishReason::Interrupted => panic!("nothing interrupts"),
    }
}

fn plain(cpu: &CpuModel, m: &LoadedModel, rq: &GenerateRequest) -> GenerateResult {
    generate_cpu(cpu, &m.tokenizer, rq, &|| 0.0, &mut |_| {}).unwrap()
}

#[test]
fn token_bytes_spell_every_token_of_the_tiny_vocabulary() {
    let m = tiny();
    let words = token_bytes(&m.tokenizer, m.config().vocab_size).unwrap();
    assert_eq!(words.len(), m.config().vocab_size);
    for text in ["the cat", "héllo wörld", " \n\t{\"a\": [1, 2]}", "日本語 ✓"] {
        let ids = m.tokenizer.encode(text, false).unwrap();
        let spelled: Vec<u8> = ids
            .iter()
            .flat_map(|&i| words[i as usize].clone())
            .collect();
        assert_eq!(spelled, text.as_bytes(), "{text:?} as {ids:?}");
    }
    let end = m.tokenizer.token_to_id("<|im_end|>").unwrap();
    assert_eq!(
        words[end as usize], b"\xff<|im_end|>",
        "special tokens are marked"
    );
}

#[test]
fn constrained_plain_decoding_keeps_to_the_grammar_or_ends_with_length() {
    let m = tiny();
    for kernels in [CpuKernels::Reference, CpuKernels::Quantized] {
        let cpu = CpuModel::with_kernels(&m.weights, kernels);
        for g in grammar_specs() {
            for sp in lossless_samplings() {
                let r = plain(&cpu, &m, &req(&m, "the answer", &sp, &g));
                check_output(&g, &r);
            }
        }
    }
    // The tiny random model finishes the bounded grammars at T = 0.
    let cpu = CpuModel::new(&m.weights);
    let regex = &grammar_specs()[1];
    let r = plain(&cpu, &m, &req(&m, "x", &SamplingParams::default(), regex));
    assert_eq!(r.finish_reason, FinishReason::Stop, "{:?}", r.text);
}

#[test]
fn a_grammar_that_cannot_finish_within_the_budget_ends_with_length() {
    let m = tiny();
    let cpu = CpuModel::new(&m.weights);
    let g = GrammarSpec::Regex("a{60}".into());
    for sp in lossless_samplings() {
        let r = plain(&cpu, &m, &req(&m, "x", &sp, &g));
        assert_eq!(r.finish_reason, FinishReason::Length);
        assert_eq!(r.text, "a".repeat(40));
    }
}

#[test]
fn bad_grammars_get_typed_errors() {
    let m = tiny();
    let gs = grammars(&m);
    let deep = (0..70).fold(
        json!({"type": "string"}),
        |s, _| json!({"type": "array", "items": s}),
    );
    let big = json!({"type": "string", "description": "x".repeat(2 << 20)});
    let bad = [
        GrammarSpec::Regex("(ab".into()),
        GrammarSpec::Lark("start: foo".into()),
        GrammarSpec::Lark("start: \"a\" (".into()),
        GrammarSpec::JsonSchema {
            schema: json!({"type": 5}),
            strict: true,
        },
        GrammarSpec::JsonSchema {
            schema: json!("object"),
            strict: false,
        },
        GrammarSpec::JsonSchema {
            schema: json!({"type": "integer", "minimum": 5, "maximum": 1}),
            strict: true,
        },
    ];
    for g in bad {
        match gs.compile(&g) {
            Err(Error::BadGrammar(msg)) => assert!(!msg.is_empty()),
            other => panic!("{g:?}: {other:?}"),
        }
    }
    for (g, limit) in [(deep, "MAX_SCHEMA_DEPTH"), (big, "MAX_GRAMMAR_BYTES")] {
        let spec = GrammarSpec::JsonSchema {
            schema: g,
            strict: true,
        };
        match gs.compile(&spec) {
            Err(Error::LimitExceeded { limit: l, .. }) => assert_eq!(l, limit),
            other => panic!("{limit}: {other:?}"),
        }
    }
}

fn drafter(m: &LoadedModel) -> DrafterWeights {
    load_files(write_drafter(
        m.config(),
        &DrafterSpec::new(m.config(), 2, 5),
    ))
}

/// A random DFlash2 drafter (its selector's walk drafts).
fn dflash2_drafter(m: &LoadedModel) -> DrafterWeights {
    let d2 = dflash_core::testutil::DFlash2Spec::new(2, 16, 32, 8);
    let spec = DrafterSpec::new(m.config(), 1, 6);
    load_files(dflash_core::testutil::write_dflash2_drafter(
        m.config(),
        &spec,
        &d2,
    ))
}

fn load_files(files: BTreeMap<String, Vec<u8>>) -> DrafterWeights {
    DrafterWeights::load(
        std::str::from_utf8(&files["config.json"]).unwrap(),
        vec![("model.safetensors", &files["model.safetensors"][..])],
        DrafterPrecision::Q8,
    )
    .unwrap()
}

#[test]
fn constrained_speculation_with_a_random_drafter_equals_constrained_plain_decoding() {
    let m = tiny();
    for (w, kernels) in [
        (drafter(&m), CpuKernels::Reference),
        (drafter(&m), CpuKernels::Quantized),
        (dflash2_drafter(&m), CpuKernels::Quantized),
    ] {
        let cpu = CpuModel::with_kernels(&m.weights, kernels);
        let d = CpuDrafter::with_kernels(&w, kernels);
        for g in grammar_specs() {
            for sp in lossless_samplings() {
                let want = plain(&cpu, &m, &req(&m, "the answer", &sp, &g));
                for b in blocks() {
                    let s = generate_speculative_cpu(
                        &cpu,
                        &d,
                        &m.tokenizer,
                        &req(&m, "the answer", &sp, &g),
                        &b,
                        &|| 0.0,
                        &mut |_| {},
                    )
                    .unwrap();
                    let d2 = w.config.dflash2.is_some();
                    let label =
                        format!("{kernels:?} DFlash2 {d2} {g:?} {b:?} T={}", sp.temperature);
                    assert_eq!(s.result.tokens, want.tokens, "{label}");
                    assert_eq!(s.result.finish_reason, want.finish_reason, "{label}");
                }
            }
        }
    }
}

/// Drafts the constrained answer for the first `good` drafts of a block and, after
/// them, tokens the grammar refuses or a wrong allowed one, by turns: steps accept drafts,
/// cut drafts and roll back the rest.
struct Oracle {
    answer: Vec<u32>,
    good: Vec<usize>,
    step: usize,
    vocab: u32,
}

impl Proposer for Oracle {
    fn tap_layers(&self) -> Vec<usize> {
        vec![1]
    }
    fn max_block(&self) -> usize {
        8
    }
    fn commit(&mut self, _taps: &[f32]) {}
    fn draft(&mut self, _anchor: u32, pos: usize, b: usize) -> dflash_core::Result<Vec<u32>> {
        let good = self.good[self.step % self.good.len()];
        self.step += 1;
        Ok((1..b)
            .map(|j| {
                let truth = self.answer.get(pos + j).copied().unwrap_or(0);
                match j <= good {
                    true => truth,
                    false if self.step.is_multiple_of(2) => (truth + 1) % self.vocab,
                    false => truth ^ 1,
                }
            })
            .collect())
    }
}

#[test]
fn constrained_speculation_accepting_drafts_equals_constrained_plain_decoding() {
    let m = tiny();
    let cpu = CpuModel::new(&m.weights);
    for g in grammar_specs() {
        for sp in lossless_samplings() {
            let rq = req(&m, "the answer", &sp, &g);
            let want = plain(&cpu, &m, &rq);
            let mut answer = rq.prompt_ids.clone();
            answer.extend(&want.tokens);
            for b in [BlockSize::Fixed(8), BlockSize::Fixed(3)] {
                let mut o = Oracle {
                    answer: answer.clone(),
                    good: vec![7, 0, 3, 5, 1],
                    step: 0,
                    vocab: m.config().vocab_size as u32,
                };
                let s = generate_speculative_with(
                    &cpu,
                    &mut o,
                    &m.tokenizer,
                    &req(&m, "the answer", &sp, &g),
                    &b,
                    &|| 0.0,
                    &mut |_| {},
                )
                .unwrap();
                assert_eq!(
                    s.result.tokens, want.tokens,
                    "{g:?} {b:?} T={}",
                    sp.temperature
                );
                if want.tokens.len() > 20 && b == BlockSize::Fixed(8) {
                    assert!(s.mean_tau() > 2.0, "{g:?}: tau {}", s.mean_tau());
                }
            }
        }
    }
}

/// The real model and its committed drafter: JSON answers that validate, and DFlash
/// under the grammar equal to plain constrained decoding, with drafts accepted.
#[test]
fn smollm2_json_under_dflash_equals_plain_and_validates() {
    let Some(path) = cached_model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../drafters/smollm2-135m-instruct-dflash-b16");
    let m = load_path(&path).unwrap();
    let words = token_bytes(&m.tokenizer, m.config().vocab_size).unwrap();
    let text = "Hello, world! {\"key\": [1, 2.5e3]}\n\tdéjà vu";
    let ids = m.tokenizer.encode(text, false).unwrap();
    let spelled: Vec<u8> = ids
        .iter()
        .flat_map(|&i| words[i as usize].clone())
        .collect();
    assert_eq!(spelled, text.as_bytes());
    let w = load_drafter_dir(&dir, DrafterPrecision::Q8).unwrap();
    let cpu = CpuModel::with_kernels(&m.weights, CpuKernels::Quantized);
    let d = CpuDrafter::with_kernels(&w, CpuKernels::Quantized);
    let prompt = m
        .chat_template
        .as_ref()
        .unwrap()
        .render(
            &[dflash_core::chat::Message::new(
                "user",
                "Describe a cat as JSON with its name, age and whether it is indoor.",
            )],
            true,
        )
        .unwrap();
    let g = grammar_specs().remove(0);
    let mut accepted = 0;
    for sp in &lossless_samplings()[..2] {
        let rq = req(&m, &prompt, sp, &g);
        let want = plain(&cpu, &m, &rq);
        check_output(&g, &want);
        for b in [
            BlockSize::Fixed(4),
            BlockSize::Fixed(16),
            BlockSize::auto_linear(16, 0.3),
        ] {
            let s = generate_speculative_cpu(&cpu, &d, &m.tokenizer, &rq, &b, &|| 0.0, &mut |_| {})
                .unwrap();
            assert_eq!(s.result.tokens, want.tokens, "{b:?} T={}", sp.temperature);
            accepted += s.taus.iter().map(|t| t - 1).sum::<usize>();
        }
    }
    assert!(
        accepted > 0,
        "the trained drafter had drafts accepted under the grammar"
    );
}

/// A token, its log-probability's bits, its alternatives' ids and bits.
type LogprobBits = (u32, u32, Vec<(u32, u32)>);

/// Log-probabilities (log-softmax after the penalties and the mask, before the
/// temperature) from DFlash's verify rows equal plain decoding's bit for bit, with and
/// without a grammar; a grammar's refused tokens are never alternatives, and the
/// alternatives come most likely first.
#[test]
fn logprobs_under_dflash_equal_plain_decodings_bit_for_bit() {
    let m = tiny();
    let w = drafter(&m);
    let cpu = CpuModel::with_kernels(&m.weights, CpuKernels::Quantized);
    let d = CpuDrafter::with_kernels(&w, CpuKernels::Quantized);
    let bits = |r: &GenerateResult| -> Vec<LogprobBits> {
        r.logprobs
            .iter()
            .map(|l| {
                let top = l
                    .top
                    .iter()
                    .map(|a| (a.token, a.logprob.to_bits()))
                    .collect();
                (l.token, l.logprob.to_bits(), top)
            })
            .collect()
    };
    for g in [
        None,
        Some(grammar_specs().remove(0)),
        Some(grammar_specs().remove(1)),
    ] {
        for sp in lossless_samplings() {
            let sp = SamplingParams {
                logprobs: Some(5),
                ..sp
            };
            let mut rq = req(&m, "the answer", &sp, &GrammarSpec::JsonObject);
            rq.grammar = g.as_ref().map(|g| grammars(&m).compile(g).unwrap());
            let want = plain(&cpu, &m, &rq);
            assert_eq!(want.logprobs.len(), want.tokens.len());
            for (l, &t) in want.logprobs.iter().zip(&want.tokens) {
                assert_eq!(l.token, t);
                assert!(l.logprob <= 0.0 && l.logprob.is_finite(), "{l:?}");
                assert!(!l.top.is_empty() && l.top.len() <= 5);
                assert!(l.top.windows(2).all(|p| p[0].logprob >= p[1].logprob));
                if sp.temperature == 0.0 {
                    assert_eq!(l.top[0].token, t, "greedy takes the most likely");
                }
            }
            for b in [BlockSize::Fixed(4), BlockSize::auto_linear(16, 0.05)] {
                let s =
                    generate_speculative_cpu(&cpu, &d, &m.tokenizer, &rq, &b, &|| 0.0, &mut |_| {})
                        .unwrap();
                assert_eq!(
                    bits(&s.result),
                    bits(&want),
                    "{g:?} {b:?} T={}",
                    sp.temperature
                );
            }
        }
    }
}

/// Rejection sampling under a grammar (drafts cut where the grammar refuses them, none
/// forced: the proposals keep their drafter's distribution): answers keep to the
/// grammar.
#[test]
fn rejection_sampling_under_a_grammar_keeps_to_it() {
    let m = tiny();
    let cpu = CpuModel::with_kernels(&m.weights, CpuKernels::Quantized);
    for w in [drafter(&m), dflash2_drafter(&m)] {
        let d = CpuDrafter::with_kernels(&w, CpuKernels::Quantized);
        for g in grammar_specs() {
            let sp = SamplingParams {
                temperature: 0.9,
                seed: 21,
                speculative_rejection: true,
                ..Default::default()
            };
            let r = req(&m, "the answer", &sp, &g);
            let s = generate_speculative_cpu(
                &cpu,
                &d,
                &m.tokenizer,
                &r,
                &BlockSize::Fixed(8),
                &|| 0.0,
                &mut |_| {},
            )
            .unwrap();
            check_output(&g, &s.result);
        }
    }
}
