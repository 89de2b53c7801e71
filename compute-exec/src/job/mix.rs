//! A weighted mixture's epoch: which source each position of the
//! epoch's global sequence reads, and which of that source's samples.
//! A pure function of the sources' sizes, their weights, the epoch rule,
//! the shuffle and the epoch — so a mixture resumes (elastically too)
//! exactly as one dataset does (see `crate::job::order`).
//!
//! ```text
//!  source j: samples 0..n_j, its own order per pass q (shuffled by (seed, epoch, j, q))
//!  draws: stride scheduling — source j's t-th draw at virtual time (t + φ_j) / w_j,
//!         the earliest first (φ_j in [0, 1), drawn from the seed: the same
//!         every epoch, so an epoch's length never changes)
//!  the epoch: draws until the rule ends it ─► global ids (base_j + sample)
//! ```
//!
//! Stride scheduling, not a weighted coin per position: after any `k`
//! positions each source has been drawn within one or two of `w_j × k`
//! times, so the realised proportions match the weights in every prefix
//! (a window, a batch, a resumed tail), and a small source is never
//! starved or flooded by chance. Within each source the order is that
//! source's own shuffle, as if it were read alone.

use serde::{Deserialize, Serialize};
use sluice_udfs::random::SampleRng;

use super::order::{EpochShape, Shuffle};

/// What ends a mixture's epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum MixEpoch {
    /// Until the first source has no sample left: every sample read at
    /// most once, and the weights hold to the end.
    #[default]
    FirstExhausted,
    /// As many positions as all sources have samples; a source that runs
    /// out begins its next pass (a new order of its samples), so the
    /// weights hold and small sources repeat.
    Resample,
    /// A fixed number of positions, sources resampled as with `resample`.
    Samples(u64),
}

/// The sources of a mixture, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct MixLayout {
    /// Samples of each source.
    pub sizes: Vec<u64>,
    /// Each source's weight (positive; need not add up to 1).
    pub weights: Vec<f64>,
    /// What ends an epoch.
    pub rule: MixEpoch,
    /// The shuffle of each source's order and of the phases (none: key
    /// order, and the phases of seed 0).
    pub shuffle: Option<Shuffle>,
}

impl MixLayout {
    /// The first global id of each source's samples.
    pub fn bases(&self) -> Vec<u64> {
        self.sizes
            .iter()
            .scan(0, |next, &n| {
                let base = *next;
                *next += n;
                Some(base)
            })
            .collect()
    }

    /// The source of global id `id`.
    pub fn source_of(bases: &[u64], id: u64) -> usize {
        bases.partition_point(|&b| b <= id).saturating_sub(1)
    }

    /// The epoch's sequence of global ids (source `j`'s sample `s` is
    /// `bases()[j] + s`).
    pub fn epoch_order(&self, epoch: u64) -> Vec<u64> {
        let seed = self.shuffle.map_or(0, |s| s.seed);
        let bases = self.bases();
        let mut rng = SampleRng::new(seed, 0, "", "sluice.mix");
        let mut parts: Vec<Draws> = self
            .sizes
            .iter()
            .zip(&self.weights)
            .enumerate()
            .map(|(j, (&n, &w))| Draws {
                n,
                weight: w,
                phase: (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64,
                drawn: 0,
                pass: Vec::new(),
                j,
            })
            .collect();
        let len = match self.rule {
            MixEpoch::FirstExhausted => u64::MAX,
            MixEpoch::Resample => self.sizes.iter().sum(),
            MixEpoch::Samples(n) => n,
        };
        let mut out = Vec::new();
        while (out.len() as u64) < len {
            let Some(next) = parts
                .iter_mut()
                .filter(|s| s.n > 0)
                .min_by(|a, b| a.due().total_cmp(&b.due()).then(a.j.cmp(&b.j)))
            else {
                break;
            };
            if self.rule == MixEpoch::FirstExhausted && next.drawn == next.n {
                break;
            }
            let sample = next.draw(self.shuffle, epoch);
            out.push(bases[next.j] + sample);
        }
        out
    }
}

/// A part's draws in one epoch.
struct Draws {
    n: u64,
    weight: f64,
    phase: f64,
    drawn: u64,
    /// The order of its current pass.
    pass: Vec<u64>,
    j: usize,
}

impl Draws {
    /// The virtual time of its next draw.
    fn due(&self) -> f64 {
        (self.drawn as f64 + 1.0 - self.phase) / self.weight
    }

    /// Its next sample: the next of its pass's order (a new pass when one
    /// ends).
    fn draw(&mut self, shuffle: Option<Shuffle>, epoch: u64) -> u64 {
        let at = self.drawn % self.n;
        if at == 0 {
            let pass = self.drawn / self.n;
            let shuffle = shuffle.map(|s| Shuffle {
                seed: pass_seed(s.seed, self.j as u64, pass),
                ..s
            });
            self.pass = EpochShape {
                samples: self.n,
                world_size: 1,
                batch_size: 1,
                drop_last: false,
                shuffle,
                start: 0,
            }
            .epoch_order(epoch);
        }
        self.drawn += 1;
        self.pass[at as usize]
    }
}

/// The seed of source `j`'s order in pass `pass` (SplitMix64's finaliser
/// over the three).
fn pass_seed(seed: u64, j: u64, pass: u64) -> u64 {
    let mut z = seed ^ j.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ pass.rotate_left(32);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::order::ShuffleMode;
    use proptest::prelude::*;

    fn mix(sizes: Vec<u64>, weights: Vec<f64>, rule: MixEpoch, seed: Option<u64>) -> MixLayout {
        MixLayout {
            sizes,
            weights,
            rule,
            shuffle: seed.map(|seed| Shuffle {
                seed,
                mode: ShuffleMode::Full,
                block_size: 64,
                window: 1024,
            }),
        }
    }

    fn counts(m: &MixLayout, order: &[u64]) -> Vec<u64> {
        let bases = m.bases();
        let mut c = vec![0; m.sizes.len()];
        for &id in order {
            c[MixLayout::source_of(&bases, id)] += 1;
        }
        c
    }

    #[test]
    fn ten_thousand_samples_hold_their_weights() {
        let m = mix(
            vec![8_000, 5_000, 2_000],
            vec![0.6, 0.3, 0.1],
            MixEpoch::Samples(10_000),
            Some(7),
        );
        let order = m.epoch_order(0);
        assert_eq!(order.len(), 10_000);
        let c = counts(&m, &order);
        // Stride scheduling: within two draws of the weight, not a
        // binomial's ±1 %.
        for (got, w) in c.iter().zip([6_000.0, 3_000.0, 1_000.0]) {
            assert!((*got as f64 - w).abs() <= 2.0, "{c:?}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// In every prefix, each source's count is within two of its
        /// weight's share; the order is a function of (seed, epoch); every
        /// id is its source's; `first_exhausted` reads each sample at most
        /// once and ends with a source spent; the resampling rules have
        /// their length and read each pass of a source once.
        #[test]
        fn a_mixture_is_deterministic_weighted_and_ends_by_its_rule(
            sizes in proptest::collection::vec(0u64..60, 1..5),
            weights in proptest::collection::vec(1u32..10, 5),
            rule in prop_oneof![
                Just(MixEpoch::FirstExhausted),
                Just(MixEpoch::Resample),
                (0u64..300).prop_map(MixEpoch::Samples),
            ],
            seed in proptest::option::of(any::<u64>()),
            epoch in 0u64..4,
        ) {
            let weights: Vec<f64> = weights[..sizes.len()].iter().map(|&w| f64::from(w)).collect();
            let m = mix(sizes.clone(), weights.clone(), rule, seed);
            let order = m.epoch_order(epoch);
            prop_assert_eq!(&order, &m.epoch_order(epoch));
            let bases = m.bases();
            let total: u64 = sizes.iter().sum();
            prop_assert!(order.iter().all(|&id| id < total));
            // Proportions in every prefix, among the sources that can be
            // drawn.
            let live: f64 = sizes.iter().zip(&weights).filter(|(n, _)| **n > 0).map(|(_, w)| w).sum();
            let mut c = vec![0f64; sizes.len()];
            for (k, &id) in order.iter().enumerate() {
                c[MixLayout::source_of(&bases, id)] += 1.0;
                for j in 0..sizes.len() {
                    if sizes[j] > 0 {
                        let want = weights[j] / live * (k + 1) as f64;
                        prop_assert!((c[j] - want).abs() <= 2.0, "{:?} at {}", c, k);
                    }
                }
            }
            match rule {
                MixEpoch::FirstExhausted => {
                    let mut seen = order.clone();
                    seen.sort_unstable();
                    seen.dedup();
                    prop_assert_eq!(seen.len(), order.len());
                    let c = counts(&m, &order);
                    prop_assert!(c.iter().zip(&sizes).any(|(c, n)| c == n));
                }
                MixEpoch::Resample | MixEpoch::Samples(_) => {
                    let want = if let MixEpoch::Samples(n) = rule { n } else { total };
                    prop_assert_eq!(order.len() as u64, if total == 0 { 0 } else { want });
                    // Each source's draws: whole passes, each a permutation.
                    for (j, &n) in sizes.iter().enumerate().filter(|(_, n)| **n > 0) {
                        let mine: Vec<u64> = order
                            .iter()
                            .filter(|&&id| MixLayout::source_of(&bases, id) == j)
                            .map(|id| id - bases[j])
                            .collect();
                        for pass in mine.chunks(n as usize) {
                            let mut p = pass.to_vec();
                            p.sort_unstable();
                            p.dedup();
                            prop_assert_eq!(p.len(), pass.len());
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn every_epoch_has_the_same_length() {
        let m = mix(
            vec![70, 20, 9],
            vec![0.5, 0.3, 0.2],
            MixEpoch::FirstExhausted,
            Some(3),
        );
        let n = m.epoch_order(0).len();
        assert!((1..99).contains(&n), "{n}");
        assert!((1..20).all(|e| m.epoch_order(e).len() == n));
    }

    #[test]
    fn another_epoch_or_seed_is_another_mixture() {
        let m = mix(vec![50, 50], vec![1.0, 1.0], MixEpoch::Resample, Some(1));
        assert_ne!(m.epoch_order(0), m.epoch_order(1));
        let other = mix(vec![50, 50], vec![1.0, 1.0], MixEpoch::Resample, Some(2));
        assert_ne!(m.epoch_order(0), other.epoch_order(0));
        // Unshuffled: each source in key order, pass after pass.
        let plain = mix(vec![3, 2], vec![1.0, 1.0], MixEpoch::Samples(8), None);
        let order = plain.epoch_order(0);
        let a: Vec<u64> = order.iter().copied().filter(|&id| id < 3).collect();
        assert_eq!(a, vec![0, 1, 2, 0]);
        let b: Vec<u64> = order.iter().copied().filter(|&id| id >= 3).collect();
        assert_eq!(b, vec![3, 4, 3, 4]);
    }
}
