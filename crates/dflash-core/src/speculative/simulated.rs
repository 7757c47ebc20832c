//! Simulated acceptance for benches (`dflash bench --accept-profile`, the browser's
//! `benchSynthetic`): drafts that are right as often as a profile says, replayed through
//! the real engine, which pays for the real drafter's pass and verifies them as always.

use super::{DFlashCpu, Proposer};
use crate::rng::Rng;

/// Simulated acceptance (`dflash bench --accept-profile P1,P2,...`): entry j is the
/// probability that the draft at block slot j+1 is right given that the slots before it
/// were; slots past the profile are wrong. Replaying a plain run's own tokens as drafts
/// through the real engine then accepts what the profile says.
#[derive(Debug, Clone, PartialEq)]
pub struct AcceptProfile(pub Vec<f64>);

impl AcceptProfile {
    /// Parses `P1,P2,...`: numbers in [0, 1], at most `max_drafts` (a block's draft
    /// slots) of them.
    pub fn parse(s: &str, max_drafts: usize) -> std::result::Result<Self, String> {
        let mut v = Vec::new();
        for part in s.split(',') {
            let p: f64 = part.trim().parse().map_err(|_| {
                format!("--accept-profile: {part:?} is not a number (want P1,P2,... in [0, 1])")
            })?;
            v.push(p);
        }
        Self::new(v, max_drafts).map_err(|e| format!("--accept-profile: {e}"))
    }

    /// The profile `v`: probabilities in [0, 1], at most `max_drafts` of them.
    pub fn new(v: Vec<f64>, max_drafts: usize) -> std::result::Result<Self, String> {
        if let Some(p) = v.iter().find(|p| !(0.0..=1.0).contains(*p)) {
            return Err(format!(
                "{p} is outside [0, 1] (each entry is a probability)"
            ));
        }
        if v.len() > max_drafts {
            return Err(format!(
                "{} entries, but a block has {max_drafts} draft slots",
                v.len()
            ));
        }
        Ok(AcceptProfile(v))
    }

    /// Drafts for block slots 1.. : `truth[j]` is the token the target will produce at
    /// slot j+1 if the slots before it are accepted (None: past the run's end). A right
    /// draft is that token; a wrong one any other token below `vocab`.
    pub fn drafts(&self, truth: &[Option<u32>], vocab: usize, rng: &mut Rng) -> Vec<u32> {
        let mut right = true;
        truth
            .iter()
            .enumerate()
            .map(|(j, t)| {
                let p = self.0.get(j).copied().unwrap_or(0.0);
                let u = (rng.uniform() as f64 + 1.0) / 2.0; // [0, 1)
                right &= t.is_some() && u < p;
                match (*t, right) {
                    (Some(t), true) => t,
                    (Some(t), false) if vocab > 1 => {
                        ((t as usize + 1 + rng.below(vocab - 1)) % vocab) as u32
                    }
                    _ => rng.below(vocab) as u32,
                }
            })
            .collect()
    }
}

/// A proposer that pays for the real drafter's pass and drafts what a profile says: the
/// plain run's tokens, each slot right with the profile's probability given the slots
/// before it were (`AcceptProfile::drafts`).
pub struct Simulated<'a> {
    drafter: DFlashCpu<'a>,
    profile: &'a AcceptProfile,
    /// The prompt, then the plain run's tokens.
    truth: Vec<u32>,
    vocab: usize,
    rng: Rng,
}

impl<'a> Simulated<'a> {
    pub fn new(
        drafter: DFlashCpu<'a>,
        profile: &'a AcceptProfile,
        prompt: &[u32],
        plain: &[u32],
        seed: u64,
    ) -> Self {
        let vocab = drafter.target.config.vocab_size;
        Simulated {
            drafter,
            profile,
            truth: prompt.iter().chain(plain).copied().collect(),
            vocab,
            rng: Rng(seed ^ 0xACCE_7ED0),
        }
    }
}

impl Proposer for Simulated<'_> {
    fn tap_layers(&self) -> Vec<usize> {
        self.drafter.tap_layers()
    }
    fn max_block(&self) -> usize {
        self.drafter.max_block()
    }
    fn block_capacity(&self) -> usize {
        self.drafter.block_capacity()
    }
    fn commit(&mut self, taps: &[f32]) {
        self.drafter.commit(taps)
    }
    fn context_rows(&self) -> usize {
        self.drafter.context_rows()
    }
    fn truncate(&mut self, len: usize) {
        self.drafter.truncate(len)
    }
    fn settle(&mut self, keep: usize) {
        self.drafter.settle(keep)
    }
    fn draft(&mut self, anchor: u32, pos: usize, b: usize) -> crate::Result<Vec<u32>> {
        self.drafter.draft(anchor, pos, b)?;
        let truth: Vec<Option<u32>> = (1..b).map(|j| self.truth.get(pos + j).copied()).collect();
        Ok(self.profile.drafts(&truth, self.vocab, &mut self.rng))
    }
}

#[cfg(test)]
mod accept_profile_tests {
    use super::AcceptProfile;
    use crate::rng::Rng;

    #[test]
    fn parses_probabilities_and_rejects_the_rest() {
        assert_eq!(
            AcceptProfile::parse("1, 0.5,0", 15).unwrap(),
            AcceptProfile(vec![1.0, 0.5, 0.0])
        );
        for bad in ["1.5", "-0.1", "x", "", "0.5,,1", "NaN", "inf"] {
            assert!(AcceptProfile::parse(bad, 15).is_err(), "{bad}");
        }
        assert!(AcceptProfile::parse("1,1,1", 2).is_err());
    }

    #[test]
    fn drafts_are_right_exactly_as_the_profile_says() {
        let truth: Vec<Option<u32>> = (10..25).map(Some).collect();
        let mut rng = Rng(1);
        let ones = AcceptProfile(vec![1.0; 3]).drafts(&truth, 100, &mut rng);
        assert_eq!(&ones[..3], &[10, 11, 12]);
        assert!(ones[3..]
            .iter()
            .zip(&truth[3..])
            .all(|(&d, t)| Some(d) != *t));
        let zero = AcceptProfile(vec![0.0]).drafts(&truth, 100, &mut rng);
        assert!(zero
            .iter()
            .zip(&truth)
            .all(|(&d, t)| Some(d) != *t && d < 100));
        // Past the run's end nothing is right.
        let end = AcceptProfile(vec![1.0; 3]).drafts(&[Some(4), None, Some(6)], 100, &mut rng);
        assert_eq!(end[0], 4);
        // Half: about half of the first slots are right.
        let hits = (0..2000)
            .filter(|_| AcceptProfile(vec![0.5]).drafts(&truth[..1], 100, &mut rng)[0] == 10)
            .count();
        assert!((850..1150).contains(&hits), "{hits}");
    }
}
