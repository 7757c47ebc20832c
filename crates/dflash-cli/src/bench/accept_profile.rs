//! The bench's simulated acceptance (`--accept-profile`): drafts that are right as
//! often as a profile says, replayed through the real engine.

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
            if !(0.0..=1.0).contains(&p) {
                return Err(format!(
                    "--accept-profile: {p} is outside [0, 1] (each entry is a probability)"
                ));
            }
            v.push(p);
        }
        if v.len() > max_drafts {
            return Err(format!(
                "--accept-profile: {} entries, but a block has {max_drafts} draft slots",
                v.len()
            ));
        }
        Ok(AcceptProfile(v))
    }

    /// Drafts for block slots 1.. : `truth[j]` is the token the target will produce at
    /// slot j+1 if the slots before it are accepted (None: past the run's end). A right
    /// draft is that token; a wrong one any other token below `vocab`.
    pub fn drafts(
        &self,
        truth: &[Option<u32>],
        vocab: usize,
        rng: &mut dflash_core::rng::Rng,
    ) -> Vec<u32> {
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

#[cfg(test)]
mod accept_profile_tests {
    use super::AcceptProfile;
    use dflash_core::rng::Rng;

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
