//! Sampling: greedy, temperature, top-k, top-p, min-p, repetition penalty, and a
//! counter-based random generator keyed by (seed, absolute position), so that the draw
//! at a position never depends on how many tokens were computed with it. The generator
//! uses only 32-bit integer operations, so a WGSL kernel computes the same numbers.

use crate::cpu::ops::argmax;
use crate::error::{Error, Result};
use crate::grammar::TokenMask;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 disables.
    pub top_k: usize,
    /// 1 disables.
    pub top_p: f32,
    /// 0 disables.
    pub min_p: f32,
    /// 1 disables. Applied to every token already in the sequence (prompt included).
    pub repetition_penalty: f32,
    /// OpenAI's penalties, 0 disables: a token's logit is lowered by
    /// `frequency_penalty` times its count among the tokens from position
    /// `penalized_from` on and by `presence_penalty` if it occurs there. In [-2, 2].
    #[serde(default)]
    pub frequency_penalty: f32,
    #[serde(default)]
    pub presence_penalty: f32,
    /// Where the frequency and presence penalties start counting: the prompt's length
    /// counts the completion only, as OpenAI and vLLM do (a chat template's many
    /// end-of-turn tokens would otherwise push the stop token down); 0 counts the prompt.
    #[serde(default)]
    pub penalized_from: usize,
    pub seed: u64,
    /// Speculative decoding at T > 0: verify drafts by rejection sampling against the
    /// drafter's proposal distribution (accept with min(1, p/q), else resample from
    /// max(0, p - q)): the output has the target's distribution, with more drafts
    /// accepted, but is not token for token the plain sampler's. Off: a draft is accepted
    /// when it equals the target's own position-keyed sample (bit-identical to plain
    /// sampling).
    pub speculative_rejection: bool,
    /// With `speculative_rejection`: a plain DFlash drafter's drafts are drawn from its
    /// own distribution (each slot among its top 16 draft logits at the temperature, as
    /// z-lab's reference samples drafts) instead of its argmax proposed with certainty.
    /// A DFlash2 drafter always draws through its selector's walk there.
    pub sampled_drafts: bool,
    /// Report each generated token's log-probability (`token_logprob`) with this many
    /// alternatives (at most `MAX_TOP_LOGPROBS`); None reports nothing.
    #[serde(default)]
    pub logprobs: Option<usize>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            penalized_from: 0,
            seed: 0,
            speculative_rejection: false,
            sampled_drafts: false,
            logprobs: None,
        }
    }
}

impl SamplingParams {
    pub fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(Error::BadSampling(m.into()));
        if !(self.temperature >= 0.0) || !self.temperature.is_finite() {
            return bad("temperature must be finite and >= 0");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p must be in (0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p must be in [0, 1]");
        }
        if !(self.repetition_penalty > 0.0) || !self.repetition_penalty.is_finite() {
            return bad("repetition_penalty must be > 0");
        }
        if !(-2.0..=2.0).contains(&self.frequency_penalty) {
            return bad("frequency_penalty must be in [-2, 2]");
        }
        if !(-2.0..=2.0).contains(&self.presence_penalty) {
            return bad("presence_penalty must be in [-2, 2]");
        }
        if self.logprobs.is_some_and(|n| n > MAX_TOP_LOGPROBS) {
            return bad("top_logprobs must be in [0, 20]");
        }
        Ok(())
    }
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
    /// Whether any penalty depends on the tokens so far (the GPU sampler has none).
    pub fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.frequency_penalty != 0.0
            || self.presence_penalty != 0.0
    }
}

/// A 32-bit integer hash (Chris Wellons' "lowbias32"), a bijection with good avalanche.
#[inline]
pub fn hash32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846ca68b);
    x ^= x >> 16;
    x
}

/// The random u32 for (seed, position, stream): a hash chain over the four 32-bit words.
/// `stream` separates independent draws at one position (0 for the target's token).
#[inline]
pub fn random_u32(seed: u64, position: u32, stream: u32) -> u32 {
    let mut h = hash32(seed as u32 ^ 0x9e3779b9);
    h = hash32(h ^ (seed >> 32) as u32);
    h = hash32(h ^ position);
    hash32(h ^ stream.wrapping_mul(0x85ebca6b))
}

/// Uniform in [0, 1) with 24 bits: exactly representable in f32.
#[inline]
pub fn random_uniform(seed: u64, position: u32, stream: u32) -> f32 {
    (random_u32(seed, position, stream) >> 8) as f32 * (1.0 / 16_777_216.0)
}

/// Applies the penalties: first the repetition penalty of CTRL / transformers over every
/// token of `history` (for each distinct one a positive logit is divided by it, a
/// negative one multiplied), then OpenAI's frequency and presence penalties over the
/// tokens from `penalized_from` on (`count * frequency + presence` subtracted).
pub fn apply_penalties(logits: &mut [f32], history: &[u32], params: &SamplingParams) {
    if !params.has_penalties() {
        return;
    }
    let penalty = params.repetition_penalty;
    if penalty != 1.0 {
        let seen: std::collections::HashSet<u32> = history.iter().copied().collect();
        for t in seen {
            if let Some(l) = logits.get_mut(t as usize) {
                *l = if *l > 0.0 { *l / penalty } else { *l * penalty };
            }
        }
    }
    if params.frequency_penalty == 0.0 && params.presence_penalty == 0.0 {
        return;
    }
    let mut counts = std::collections::HashMap::new();
    for &t in &history[params.penalized_from.min(history.len())..] {
        *counts.entry(t).or_insert(0u32) += 1;
    }
    for (t, n) in counts {
        if let Some(l) = logits.get_mut(t as usize) {
            *l -= n as f32 * params.frequency_penalty + params.presence_penalty;
        }
    }
}

/// Order-preserving map of floats to u32 (NaN maps to 0 and is never kept); the WGSL
/// sampler uses the same.
#[inline]
pub fn order_key(v: f32) -> u32 {
    if v.is_nan() {
        return 0;
    }
    let b = v.to_bits();
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// Chooses the token at absolute `position` from `logits` (the model's output for the
/// previous position). `history` is every token before `position`.
///
/// With z = logit / T, the kept tokens are those with z at or above a threshold, the
/// largest of: the k-th largest z (top-k); max z + ln(min_p) (min-p); the largest value
/// whose upper set still holds top_p of the softmax mass of what the others keep
/// (top-p). Then u = uniform(seed, position) times the kept mass, and the token is the
/// first id, in id order, at which the running mass exceeds u. The GPU sampler
/// (shaders/sample.wgsl) implements the same rule.
pub fn sample(logits: &[f32], params: &SamplingParams, history: &[u32], position: usize) -> u32 {
    sample_masked(logits, params, history, position, None)
}

/// `sample` under a grammar's mask: the logits a grammar refuses at this position are
/// -inf after the penalties and before the temperature and the filters (the definition
/// of constrained decoding, `crate::grammar`).
pub fn sample_masked(
    logits: &[f32],
    params: &SamplingParams,
    history: &[u32],
    position: usize,
    mask: Option<&TokenMask>,
) -> u32 {
    if params.is_greedy() {
        return argmax(&adjusted_logits(logits, params, history, mask)) as u32;
    }
    let (w, total) = kept_weights_masked(logits, params, history, mask);
    let u = random_uniform(params.seed, position as u32, 0) * total;
    inverse_cdf(&w, u)
}

/// The logits the sampler's filters start from: penalties applied, then the mask.
pub fn adjusted_logits(
    logits: &[f32],
    params: &SamplingParams,
    history: &[u32],
    mask: Option<&TokenMask>,
) -> Vec<f32> {
    let mut l = logits.to_vec();
    apply_penalties(&mut l, history, params);
    if let Some(m) = mask {
        m.apply(&mut l);
    }
    l
}

/// A committed token's log-probability and the most likely alternatives at its position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    /// The `top` most likely tokens, most likely first (ties: lower id first), leaving
    /// out those of probability 0 (refused by a grammar).
    pub top: Vec<(u32, f32)>,
}

/// Most alternatives `logprobs` reports per position (OpenAI's bound).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// The log-probability of `token` and the `top` most likely tokens at a position: the
/// log-softmax of the logits after the penalties and the grammar's mask, before the
/// temperature and the filters (so the same whatever the sampler's settings; a masked
/// token is -inf). The sum runs in id order, so a position's values depend on its
/// logits only: speculative and plain decoding give the same bits.
pub fn token_logprob(
    logits: &[f32],
    params: &SamplingParams,
    history: &[u32],
    mask: Option<&TokenMask>,
    token: u32,
    top: usize,
) -> TokenLogprob {
    let l = adjusted_logits(logits, params, history, mask);
    let m = l
        .iter()
        .cloned()
        .filter(|v| !v.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = l
        .iter()
        .filter(|v| !v.is_nan())
        .map(|&v| crate::math::exp(v - m))
        .sum();
    let log_z = m + crate::math::ln(sum);
    let lp = |t: u32| l.get(t as usize).map_or(f32::NEG_INFINITY, |&v| v - log_z);
    let mut ids: Vec<u32> = (0..l.len() as u32).collect();
    let n = top.min(MAX_TOP_LOGPROBS).min(ids.len());
    if n > 0 {
        let key = |&t: &u32| (std::cmp::Reverse(order_key(l[t as usize])), t);
        ids.select_nth_unstable_by_key(n - 1, key);
        ids.truncate(n);
        ids.sort_unstable_by_key(key);
    }
    TokenLogprob {
        token,
        logprob: lp(token),
        // Tokens the mask refuses (probability 0) are no alternatives.
        top: ids
            .iter()
            .take(n)
            .map(|&t| (t, lp(t)))
            .filter(|x| x.1 > f32::NEG_INFINITY)
            .collect(),
    }
}

/// The first id, in id order, at which the running sum of `w` exceeds `u` (the last
/// id with weight when rounding leaves `u` above the sum).
pub fn inverse_cdf(w: &[f32], u: f32) -> u32 {
    let mut cum = 0f32;
    let mut last = 0;
    for (i, &x) in w.iter().enumerate() {
        if x > 0.0 {
            cum += x;
            last = i;
            if u < cum {
                return i as u32;
            }
        }
    }
    last as u32
}

/// The sampler's unnormalised weights over the vocabulary (`exp(z - max z)` for the kept
/// tokens, 0 for the others) and their sum: `sample`'s distribution is `w / total`.
pub fn kept_weights(logits: &[f32], params: &SamplingParams, history: &[u32]) -> (Vec<f32>, f32) {
    kept_weights_masked(logits, params, history, None)
}

/// `kept_weights` under a grammar's mask (refused tokens weigh 0).
pub fn kept_weights_masked(
    logits: &[f32],
    params: &SamplingParams,
    history: &[u32],
    mask: Option<&TokenMask>,
) -> (Vec<f32>, f32) {
    let l = adjusted_logits(logits, params, history, mask);
    let inv_t = 1.0 / params.temperature;
    let z: Vec<f32> = l.iter().map(|v| v * inv_t).collect();
    let m = z
        .iter()
        .cloned()
        .filter(|v| !v.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    let n = z.len();
    let mut thr = 0u32;
    if params.top_k > 0 && params.top_k < n {
        let mut keys: Vec<u32> = z.iter().map(|&v| order_key(v)).collect();
        keys.sort_unstable_by(|a, b| b.cmp(a));
        thr = keys[params.top_k - 1];
    }
    if params.min_p > 0.0 {
        thr = thr.max(order_key(m + crate::math::ln(params.min_p)));
    }
    if params.top_p < 1.0 {
        let mut kept: Vec<(u32, f32)> = z
            .iter()
            .filter(|&&v| order_key(v) >= thr)
            .map(|&v| (order_key(v), crate::math::exp(v - m)))
            .collect();
        let target = kept.iter().map(|k| k.1).sum::<f32>() * params.top_p;
        kept.sort_unstable_by_key(|a| std::cmp::Reverse(a.0));
        let mut cum = 0f32;
        for (k, e) in kept {
            cum += e;
            if cum >= target {
                thr = thr.max(k);
                break;
            }
        }
    }
    let w: Vec<f32> = z
        .iter()
        .map(|&v| {
            if order_key(v) >= thr {
                crate::math::exp(v - m)
            } else {
                0.0
            }
        })
        .collect();
    let total = w.iter().sum();
    (w, total)
}

/// The sampler's distribution at a position (T > 0): `kept_weights` normalised.
pub fn distribution(logits: &[f32], params: &SamplingParams, history: &[u32]) -> Vec<f32> {
    let (w, total) = kept_weights(logits, params, history);
    w.iter().map(|x| x / total).collect()
}
