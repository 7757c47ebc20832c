//! Rejection-sampling verification keeps the target's distribution. Test: Pearson's
//! chi-square goodness of fit of the committed tokens against the exact target
//! distribution, cells with expected count below 5 pooled, p-value by the
//! Wilson-Hilferty approximation; the test passes when p > 0.001. Each test also shows
//! the statistic has power: the drafts alone (distributed as q, not p) fail it.

use dflash_core::cpu::{CpuModel, LogitRows};
use dflash_core::drafter::{CpuDrafter, DrafterPrecision, DrafterWeights};
use dflash_core::formats::ggml::GgmlType;
use dflash_core::generate::GenerateRequest;
use dflash_core::model_files::load_gguf;
use dflash_core::rejection::{verify, Proposed, Verdict};
use dflash_core::sampling::{distribution, inverse_cdf, random_uniform, SamplingParams};
use dflash_core::speculative::{generate_speculative_cpu, BlockSize};
use dflash_core::testutil::{
    random_weights, tiny_drafter_target, write_dflash2_drafter, write_drafter, write_gguf,
    DFlash2Spec, DrafterSpec, Rng,
};

fn erfc(x: f64) -> f64 {
    // Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7), extended to x < 0.
    let t = 1.0 / (1.0 + 0.3275911 * x.abs());
    let y = t
        * (0.254829592
            + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
        * (-x * x).exp();
    if x >= 0.0 {
        y
    } else {
        2.0 - y
    }
}

/// Chi-square statistic, degrees of freedom and upper-tail p-value of `counts` against
/// `expected` (same total), small cells pooled.
fn chi_square(counts: &[f64], expected: &[f64]) -> (f64, usize, f64) {
    let (mut x2, mut cells) = (0.0, 0usize);
    let (mut pool_o, mut pool_e) = (0.0, 0.0);
    for (&o, &e) in counts.iter().zip(expected) {
        if e >= 5.0 {
            x2 += (o - e) * (o - e) / e;
            cells += 1;
        } else {
            pool_o += o;
            pool_e += e;
        }
    }
    if pool_e > 0.0 {
        x2 += (pool_o - pool_e) * (pool_o - pool_e) / pool_e.max(1e-9);
        cells += 1;
    }
    let k = (cells - 1) as f64;
    let z = ((x2 / k).powf(1.0 / 3.0) - (1.0 - 2.0 / (9.0 * k))) / (2.0 / (9.0 * k)).sqrt();
    (x2, cells - 1, 0.5 * erfc(z / std::f64::consts::SQRT_2))
}

fn softmax(x: &[f32]) -> Vec<f32> {
    let m = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f32> = x.iter().map(|v| (v - m).exp()).collect();
    let s: f32 = e.iter().sum();
    e.iter().map(|v| v / s).collect()
}

#[test]
fn one_position_keeps_the_target_distribution() {
    let mut rng = Rng(5);
    let n = 200_000u64;
    for case in 0..3 {
        let p = softmax(&rng.vec(12, 2.0));
        // A proposal unlike p; case 2 proposes with certainty (an argmax drafter).
        let q: Vec<f32> = if case == 2 {
            (0..12).map(|i| if i == 4 { 1.0 } else { 0.0 }).collect()
        } else {
            softmax(&rng.vec(12, 2.0))
        };
        let qs: Vec<(u32, f32)> = q
            .iter()
            .enumerate()
            .filter(|x| *x.1 > 0.0)
            .map(|(i, &x)| (i as u32, x))
            .collect();
        let (mut out, mut drafts) = (vec![0f64; 12], vec![0f64; 12]);
        let mut accepted = 0;
        for s in 0..n {
            let d = inverse_cdf(&q, random_uniform(s, 0, 7));
            drafts[d as usize] += 1.0;
            let t = match verify(
                &p,
                &Proposed {
                    token: d,
                    q: qs.clone(),
                },
                s,
                0,
            ) {
                Verdict::Accept => {
                    accepted += 1;
                    d
                }
                Verdict::Reject(t) => t,
            };
            out[t as usize] += 1.0;
        }
        let expected: Vec<f64> = p.iter().map(|&x| x as f64 * n as f64).collect();
        let (x2, df, pv) = chi_square(&out, &expected);
        eprintln!(
            "case {case}: chi2 {x2:.1} df {df} p {pv:.3}, accepted {:.3}",
            accepted as f64 / n as f64
        );
        assert!(
            pv > 1e-3,
            "case {case}: the output is not distributed as p (chi2 {x2}, p {pv})"
        );
        let (_, _, pv_q) = chi_square(&drafts, &expected);
        assert!(
            pv_q < 1e-6,
            "case {case}: the test should reject the drafts' distribution (p {pv_q})"
        );
        // The acceptance rate is sum_x min(p, q).
        let want: f32 = p.iter().zip(&q).map(|(a, b)| a.min(*b)).sum();
        assert!(
            (accepted as f32 / n as f32 - want).abs() < 0.01,
            "acceptance {} vs {want}",
            accepted as f64 / n as f64
        );
    }
}

/// A DFlash2 drafter (the selector's walk proposes) and a plain DFlash drafter (each
/// slot drawn among its top candidates) for the tiny target, through the file format.
fn drafters(c: &dflash_core::config::ModelConfig) -> Vec<(&'static str, DrafterWeights)> {
    let spec = DrafterSpec {
        layers: 1,
        block_size: 4,
        target_layer_ids: None,
        block_in_dflash_config: true,
        layer_types: None,
        sliding_window: 0,
        mask_token_id: c.vocab_size as u32 - 1,
        seed: 3,
    };
    let d2 = DFlash2Spec::new(2, 16, 32, 16);
    let load = |files: std::collections::BTreeMap<String, Vec<u8>>| {
        DrafterWeights::load(
            std::str::from_utf8(&files["config.json"]).unwrap(),
            vec![("model.safetensors", &files["model.safetensors"][..])],
            DrafterPrecision::Q8,
        )
        .unwrap()
    };
    vec![
        ("DFlash2", load(write_dflash2_drafter(c, &spec, &d2))),
        ("DFlash", load(write_drafter(c, &spec))),
    ]
}

/// Speculative sampling commits tokens distributed as the target's (the first two new
/// tokens' joint distribution, chi-square) with every proposal: DFlash2's walk, a plain
/// drafter's argmax proposed with certainty, and its drafts sampled among its top
/// candidates at the request's temperature (`sampled_drafts`).
#[test]
fn speculative_sampling_keeps_the_target_distribution() {
    let c = tiny_drafter_target();
    let t = load_gguf(&write_gguf(&c, &random_weights(&c, 41), GgmlType::Q8_0)).unwrap();
    let cpu = CpuModel::new(&t.weights);
    for (name, w) in drafters(&c) {
        for sampled in [true, false] {
            if name == "DFlash2" && !sampled {
                continue; // its walk always draws
            }
            joint_of_two_tokens_is_the_targets(&cpu, &t, &w, name, sampled);
        }
    }
}

fn joint_of_two_tokens_is_the_targets(
    cpu: &CpuModel,
    t: &dflash_core::model_files::LoadedModel,
    w: &DrafterWeights,
    name: &str,
    sampled_drafts: bool,
) {
    let c = &cpu.config;
    let d = CpuDrafter::new(w);
    let v = c.vocab_size;
    let prompt: Vec<u32> = vec![17, 99, 4, 250, 31];
    // top-k 6 keeps the joint support small (36 cells) so that every cell is tested.
    let sp = |seed| SamplingParams {
        temperature: 1.0,
        top_k: 6,
        seed,
        speculative_rejection: true,
        sampled_drafts,
        ..Default::default()
    };
    // Exact joint distribution of the first two new tokens: p(t1) p(t2 | t1).
    let mut cache = cpu.new_cache(16);
    let out = cpu
        .forward(&prompt, &mut cache, LogitRows::Last, &[])
        .unwrap();
    let p1 = distribution(&out.logits, &sp(0), &prompt);
    let n = 10_000u64;
    let mut expected = vec![0f64; v * v];
    for t1 in 0..v {
        if (p1[t1] as f64) * (n as f64) < 0.01 {
            continue;
        }
        let mut ids = prompt.clone();
        ids.push(t1 as u32);
        let mut cache = cpu.new_cache(16);
        let o = cpu.forward(&ids, &mut cache, LogitRows::Last, &[]).unwrap();
        let p2 = distribution(&o.logits, &sp(0), &ids);
        for t2 in 0..v {
            expected[t1 * v + t2] = p1[t1] as f64 * p2[t2] as f64 * n as f64;
        }
    }
    let mut counts = vec![0f64; v * v];
    let (mut steps, mut accepted) = (0usize, 0usize);
    for s in 0..n {
        let req = GenerateRequest {
            prompt_ids: prompt.clone(),
            max_new_tokens: 2,
            sampling: sp(s),
            stop_strings: vec![],
            context: 32,
            interrupt: Default::default(),
            grammar: None,
        };
        let r = generate_speculative_cpu(
            cpu,
            &d,
            &t.tokenizer,
            &req,
            &BlockSize::Fixed(4),
            &|| 0.0,
            &mut |_| {},
        )
        .unwrap();
        if r.result.tokens.len() == 2 {
            counts[r.result.tokens[0] as usize * v + r.result.tokens[1] as usize] += 1.0;
        }
        steps += r.taus.len();
        accepted += r.taus.iter().map(|t| t - 1).sum::<usize>();
    }
    // Draws that stopped after one token (a stop id) are outside the pairs: rescale.
    let total: f64 = counts.iter().sum();
    let exp_total: f64 = expected.iter().sum();
    let expected: Vec<f64> = expected.iter().map(|e| e * total / exp_total).collect();
    let (x2, df, pv) = chi_square(&counts, &expected);
    eprintln!("{name} rejection sampling (sampled drafts {sampled_drafts}): chi2 {x2:.1} df {df} p {pv:.3}; {accepted} drafts accepted in {steps} steps");
    assert!(
        accepted > 100,
        "{name}: the test should exercise accepted drafts too ({accepted})"
    );
    assert!(
        pv > 1e-3,
        "{name}: speculative samples are not distributed as the target's (chi2 {x2}, df {df}, p {pv})"
    );
}
