//! Speculative sampling by rejection (Leviathan et al.; Chen et al.): a draft `d` drawn
//! from the drafter's proposal `q` is accepted with probability `min(1, p(d) / q(d))`,
//! `p` the target's sampling distribution at that position; on rejection the token is
//! drawn from `max(0, p - q)` normalised, and the block ends. The committed token then
//! has exactly the distribution `p`. The uniforms are keyed by (seed, position, stream),
//! like the plain sampler's (stream 0), so a run is reproducible.

use crate::sampling::{inverse_cdf, random_u32, random_uniform};

/// The uniform deciding acceptance at a position.
pub const STREAM_ACCEPT: u32 = 1;
/// The uniform of the residual draw after a rejection.
pub const STREAM_RESIDUAL: u32 = 2;
/// Gumbel noise of a proposal's candidate `c` uses stream `STREAM_GUMBEL + c`.
pub const STREAM_GUMBEL: u32 = 16;

/// A draft and the proposal distribution it was drawn from (sparse: the tokens with
/// q > 0; `token` is among them).
#[derive(Debug, Clone, PartialEq)]
pub struct Proposed {
    pub token: u32,
    pub q: Vec<(u32, f32)>,
}

impl Proposed {
    /// A draft proposed with certainty (an argmax drafter): q is one-hot.
    pub fn certain(token: u32) -> Self {
        Proposed {
            token,
            q: vec![(token, 1.0)],
        }
    }
    fn q_of(&self, t: u32) -> f32 {
        self.q.iter().filter(|x| x.0 == t).map(|x| x.1).sum()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Accept,
    /// Rejected; the token drawn from the residual instead.
    Reject(u32),
}

/// The verdict on draft `d` at absolute `position`, `p` the target's distribution there.
pub fn verify(p: &[f32], d: &Proposed, seed: u64, position: u32) -> Verdict {
    let (pd, qd) = (
        p.get(d.token as usize).copied().unwrap_or(0.0),
        d.q_of(d.token),
    );
    let u = random_uniform(seed, position, STREAM_ACCEPT);
    if qd > 0.0 && u * qd < pd {
        return Verdict::Accept;
    }
    let mut r = p.to_vec();
    for &(t, q) in &d.q {
        if let Some(x) = r.get_mut(t as usize) {
            *x = (*x - q).max(0.0);
        }
    }
    let total: f32 = r.iter().sum();
    let u2 = random_uniform(seed, position, STREAM_RESIDUAL);
    // p == q leaves no residual (and rejection then has probability 0): draw from p.
    Verdict::Reject(if total > 0.0 {
        inverse_cdf(&r, u2 * total)
    } else {
        inverse_cdf(p, u2 * p.iter().sum::<f32>())
    })
}

/// Gumbel noise for candidate token `c` at a position: `-ln(-ln(u))`, u in (0, 1).
pub fn gumbel(seed: u64, position: u32, c: u32) -> f32 {
    let u = ((random_u32(seed, position, STREAM_GUMBEL.wrapping_add(c)) >> 8) as f32 + 0.5)
        * (1.0 / 16_777_216.0);
    -crate::math::ln(-crate::math::ln(u))
}

/// Samples one of `scores` (logits over candidates `ids`) at temperature `t` by the
/// Gumbel-max trick, and returns it with the distribution it was drawn from
/// (softmax(scores / t)).
pub fn gumbel_pick(ids: &[u32], scores: &[f32], t: f32, seed: u64, position: u32) -> Proposed {
    let inv_t = 1.0 / t; // as the GPU, which gets 1/T
    let z: Vec<f32> = scores.iter().map(|s| s * inv_t).collect();
    let m = z.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f32> = z.iter().map(|v| crate::math::exp(v - m)).collect();
    let sum: f32 = e.iter().sum();
    let mut best = 0;
    let mut best_v = f32::MIN;
    for (i, (&zi, &c)) in z.iter().zip(ids).enumerate() {
        let v = zi + gumbel(seed, position, c);
        if v > best_v {
            best_v = v;
            best = i;
        }
    }
    Proposed {
        token: ids[best],
        q: ids.iter().zip(&e).map(|(&c, &x)| (c, x / sum)).collect(),
    }
}
