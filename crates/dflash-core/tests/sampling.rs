//! Sampling: the position-keyed generator, each filter, and the sampled distribution.

use dflash_core::cpu::ops::softmax;
use dflash_core::sampling::{random_uniform, sample, SamplingParams};

fn params(t: f32) -> SamplingParams {
    SamplingParams {
        temperature: t,
        seed: 1234,
        ..Default::default()
    }
}

/// Empirical frequencies of `sample` over `n` positions.
fn frequencies(logits: &[f32], p: &SamplingParams, n: usize) -> Vec<f64> {
    let mut f = vec![0f64; logits.len()];
    for pos in 0..n {
        f[sample(logits, p, &[], pos) as usize] += 1.0 / n as f64;
    }
    f
}

#[test]
fn the_generator_is_keyed_by_seed_and_position_only() {
    assert_eq!(random_uniform(7, 100, 0), random_uniform(7, 100, 0));
    assert_ne!(random_uniform(7, 100, 0), random_uniform(7, 101, 0));
    assert_ne!(random_uniform(7, 100, 0), random_uniform(8, 100, 0));
    assert_ne!(random_uniform(7, 100, 0), random_uniform(7, 100, 1));
    // Uniformity: 16 buckets over 160k positions, chi-square with 15 d.o.f. < 37.7 (p=0.001).
    let n = 160_000;
    let mut b = [0f64; 16];
    for p in 0..n {
        let u = random_uniform(42, p, 0);
        assert!((0.0..1.0).contains(&u));
        b[(u * 16.0) as usize] += 1.0;
    }
    let e = n as f64 / 16.0;
    let chi2: f64 = b.iter().map(|o| (o - e) * (o - e) / e).sum();
    assert!(chi2 < 37.7, "chi2 {chi2}");
}

#[test]
fn greedy_takes_the_lowest_index_among_ties() {
    assert_eq!(sample(&[1.0, 3.0, 3.0, 2.0], &params(0.0), &[], 0), 1);
}

#[test]
fn temperature_sampling_follows_the_softmax() {
    let logits = [1.0f32, 2.0, 0.5, 1.5, -1.0];
    for t in [1.0f32, 0.5] {
        let mut want: Vec<f32> = logits.iter().map(|l| l / t).collect();
        softmax(&mut want);
        let f = frequencies(&logits, &params(t), 40_000);
        for (a, b) in f.iter().zip(&want) {
            assert!((a - *b as f64).abs() < 0.012, "T={t}: {f:?} vs {want:?}");
        }
    }
}

#[test]
fn top_k_top_p_and_min_p_restrict_the_candidates() {
    let logits = [0.1f32, 2.0, 1.9, -3.0, 1.0];
    let mut p = params(1.0);
    p.top_k = 2;
    let f = frequencies(&logits, &p, 5000);
    assert!(
        f[0] == 0.0 && f[3] == 0.0 && f[4] == 0.0 && f[1] > 0.4 && f[2] > 0.4,
        "{f:?}"
    );
    let mut p = params(1.0);
    p.top_p = 0.5; // the top token alone has ~0.43: the two best are kept
    let f = frequencies(&logits, &p, 5000);
    assert!(
        f[0] + f[3] + f[4] == 0.0 && f[1] > 0.0 && f[2] > 0.0,
        "{f:?}"
    );
    let mut p = params(1.0);
    p.min_p = 0.5; // keeps tokens with p >= 0.5 * p_max: 2.0 and 1.9 (1.0 has 0.37 of p_max)
    let f = frequencies(&logits, &p, 5000);
    assert!(f[0] + f[3] + f[4] == 0.0, "{f:?}");
    let mut p = params(5.0);
    p.top_k = 1;
    assert!((0..500).all(|pos| sample(&logits, &p, &[], pos) == 1));
}

#[test]
fn repetition_penalty_lowers_seen_tokens() {
    let logits = [2.0f32, 1.9, -1.0];
    let mut p = params(0.0);
    assert_eq!(sample(&logits, &p, &[0], 5), 0);
    p.repetition_penalty = 1.2;
    assert_eq!(sample(&logits, &p, &[0, 0], 5), 1);
}

#[test]
fn a_position_draws_the_same_token_whatever_else_is_computed() {
    let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
    let p = SamplingParams {
        temperature: 0.8,
        top_p: 0.95,
        seed: 9,
        ..Default::default()
    };
    let a: Vec<u32> = (0..64).map(|pos| sample(&logits, &p, &[], pos)).collect();
    let b: Vec<u32> = (0..64)
        .rev()
        .map(|pos| sample(&logits, &p, &[], pos))
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    assert_eq!(a, b);
}

#[test]
fn bad_parameters_are_typed_errors() {
    for p in [
        SamplingParams {
            temperature: f32::NAN,
            ..Default::default()
        },
        SamplingParams {
            temperature: -1.0,
            ..Default::default()
        },
        SamplingParams {
            top_p: 0.0,
            ..Default::default()
        },
        SamplingParams {
            min_p: 1.5,
            ..Default::default()
        },
        SamplingParams {
            repetition_penalty: 0.0,
            ..Default::default()
        },
    ] {
        assert!(
            matches!(p.validate(), Err(dflash_core::Error::BadSampling(_))),
            "{p:?}"
        );
    }
}

#[test]
fn frequency_and_presence_penalties_follow_openai_and_compose_with_repetition() {
    use dflash_core::sampling::{apply_penalties, kept_weights};
    let logits = [2.0f32, -1.0, 0.5, 3.0];
    let history = [0u32, 0, 0, 1, 3];
    let p = SamplingParams {
        frequency_penalty: 0.5,
        presence_penalty: 0.25,
        ..params(0.0)
    };
    let mut l = logits.to_vec();
    apply_penalties(&mut l, &history, &p);
    // logit - count * 0.5 - 0.25 for tokens that occur; token 2 untouched.
    assert_eq!(
        l,
        vec![2.0 - 1.5 - 0.25, -1.0 - 0.5 - 0.25, 0.5, 3.0 - 0.5 - 0.25]
    );
    // Counting from position 3 on (the completion after a 3-token prompt): tokens 1 and
    // 3 once each, token 0 not at all.
    let mut l3 = logits.to_vec();
    apply_penalties(
        &mut l3,
        &history,
        &SamplingParams {
            penalized_from: 3,
            ..p.clone()
        },
    );
    assert_eq!(l3, vec![2.0, -1.0 - 0.75, 0.5, 3.0 - 0.75]);
    // The repetition penalty first (2 / 2, -1 * 2, 3 / 2), then the others.
    let p2 = SamplingParams {
        repetition_penalty: 2.0,
        ..p.clone()
    };
    let mut l2 = logits.to_vec();
    apply_penalties(&mut l2, &history, &p2);
    assert_eq!(l2, vec![1.0 - 1.75, -2.0 - 0.75, 0.5, 1.5 - 0.75]);
    // Greedy and sampled paths both see them: token 3 (the argmax) loses to token 0
    // when its count grows, and the sampler's weights change the same way.
    let heavy = SamplingParams {
        frequency_penalty: 2.0,
        ..params(0.0)
    };
    assert_eq!(sample(&logits, &params(0.0), &[3, 3], 9), 3);
    assert_eq!(sample(&logits, &heavy, &[3, 3], 9), 0);
    let (w, _) = kept_weights(
        &logits,
        &SamplingParams {
            temperature: 1.0,
            ..heavy.clone()
        },
        &[3, 3],
    );
    assert!(w[3] < w[0]);
    // Out of OpenAI's range: a typed error.
    for bad in [2.5f32, -2.5, f32::NAN] {
        let q = SamplingParams {
            presence_penalty: bad,
            ..params(0.0)
        };
        assert!(q.validate().is_err(), "{bad}");
    }
}
