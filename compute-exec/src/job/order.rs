//! The job maths: which sample each rank reads at each position of an
//! epoch. Pure functions of the sample count and the job options, so the
//! order depends on (seed, epoch) only — never on the storage nodes, the
//! workers or the placement.
//!
//! ```text
//!  samples 0..n (the dataset's keys, sorted)
//!    ──permute(seed, epoch)──►  epoch order e[0..n)
//!    ──pad (wrap) or drop────►  positions start..start + world×per_rank
//!    ──interleave───────────►  rank r reads e[(start + i × world + r) mod n], i = 0..per_rank
//!    ──every Nth batch──────►  DataLoader worker w of N reads the rank's batches w, w + N, …
//! ```
//!
//! The epoch order is **one global sequence**, and a position in it is
//! all a trainer's checkpoint needs: when every rank has taken `k`
//! batches of `b`, the samples taken are exactly the global prefix
//! `e[0..start + k × b × world)` (ranks step together in data-parallel
//! training). A job resumed there (`start`) with another world size,
//! batch size or number of workers interleaves the rest `e[start..n)`
//! over its own ranks: every sample of the epoch exactly once, in the
//! same global order. Workers take whole batches in turn, as a
//! `DataLoader` hands them out, so a rank's batches still arrive in
//! its order.
//!
//! - `full`: a Fisher–Yates permutation of all samples (random reads).
//! - `block`: the samples in runs of `block_size` neighbours are permuted
//!   as runs, then shuffled within consecutive windows of `window`
//!   positions — reads stay sequential within a run.
//! - `drop_last = false` pads every rank to ⌈n / world⌉ samples by wrapping
//!   to the start of the epoch order (as PyTorch's `DistributedSampler`);
//!   `drop_last = true` keeps the largest multiple of `world × batch_size`,
//!   so that every rank gets the same number of full batches.

use serde::{Deserialize, Serialize};
use sluice_udfs::random::SampleRng;

/// How an epoch's order is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ShuffleMode {
    /// A true permutation.
    #[default]
    Full,
    /// Permuted runs of neighbouring samples, shuffled within a window.
    Block,
}

/// The shuffle of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Shuffle {
    /// The seed of every epoch's permutation (and of the random UDFs).
    pub seed: u64,
    /// Full or block.
    #[serde(default)]
    pub mode: ShuffleMode,
    /// `block`: samples per run.
    #[serde(default = "default_block")]
    pub block_size: u64,
    /// `block`: positions shuffled together after the runs are permuted.
    #[serde(default = "default_window")]
    pub window: u64,
}

fn default_block() -> u64 {
    64
}

fn default_window() -> u64 {
    1024
}

/// The shape of a job's epochs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochShape {
    /// Samples in the dataset (after the pipeline's filters).
    pub samples: u64,
    /// Ranks.
    pub world_size: u64,
    /// Rows per batch.
    pub batch_size: u64,
    /// Drop the tail rather than pad.
    pub drop_last: bool,
    /// The shuffle, if any (none: key order).
    pub shuffle: Option<Shuffle>,
    /// The global position this epoch begins at: 0, or where a resumed
    /// job's first epoch continues (see the module docs).
    pub start: u64,
}

impl EpochShape {
    /// Samples each rank reads per epoch.
    pub fn per_rank(&self) -> u64 {
        let world = self.world_size.max(1);
        let rest = self.samples.saturating_sub(self.start);
        if self.drop_last {
            let step = world * self.batch_size.max(1);
            rest / step * self.batch_size.max(1)
        } else {
            rest.div_ceil(world)
        }
    }

    /// The global position reached when every rank has read `offset`
    /// positions of its share: the epoch's samples before it were all
    /// read, and none after it.
    pub fn global_position(&self, offset: u64) -> u64 {
        let read = offset.min(self.per_rank());
        (self.start + read * self.world_size.max(1)).min(self.samples)
    }

    /// Batches each rank reads per epoch (the last may be short unless
    /// `drop_last`).
    pub fn batches_per_rank(&self) -> u64 {
        self.per_rank().div_ceil(self.batch_size.max(1))
    }

    /// The epoch order: a permutation of `0..samples`.
    pub fn epoch_order(&self, epoch: u64) -> Vec<u64> {
        let n = self.samples;
        let mut order: Vec<u64> = (0..n).collect();
        let Some(shuffle) = self.shuffle else {
            return order;
        };
        let mut rng = SampleRng::new(shuffle.seed, epoch, "", "sluice.shuffle");
        match shuffle.mode {
            ShuffleMode::Full => permute(&mut order, &mut rng),
            ShuffleMode::Block => {
                let block = shuffle.block_size.max(1);
                let mut runs: Vec<u64> = (0..n.div_ceil(block)).collect();
                permute(&mut runs, &mut rng);
                order.clear();
                for r in runs {
                    order.extend(r * block..((r + 1) * block).min(n));
                }
                let window = usize::try_from(shuffle.window.max(1)).unwrap_or(usize::MAX);
                for w in order.chunks_mut(window) {
                    permute(w, &mut rng);
                }
            }
        }
        order
    }

    /// The samples rank `rank` reads at positions `from..to` of an epoch
    /// whose order is `order`.
    pub fn rank_samples(&self, order: &[u64], rank: u64, from: u64, to: u64) -> Vec<u64> {
        self.worker_samples(order, rank, Worker::ALL, from, to)
    }

    /// The samples `worker` of rank `rank` reads at positions `from..to`
    /// of its part of the rank's share.
    pub fn worker_samples(
        &self,
        order: &[u64],
        rank: u64,
        worker: Worker,
        from: u64,
        to: u64,
    ) -> Vec<u64> {
        let n = order.len() as u64;
        if n == 0 {
            return Vec::new();
        }
        let world = self.world_size.max(1);
        let batch = self.batch_size.max(1);
        (from..to.min(worker.len(self.per_rank(), batch)))
            .map(|p| {
                let i = worker.rank_position(p, batch);
                order[((self.start + i * world + rank) % n) as usize]
            })
            .collect()
    }
}

/// A `DataLoader` worker's part of a rank's share: the rank's batches
/// `index`, `index + count`, `index + 2 × count`, … — the order in which a
/// `DataLoader` takes batches from its workers, so that the batches a
/// trainer receives are the rank's in order, whatever the workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Worker {
    /// This worker, below `count`.
    pub index: u64,
    /// Workers of the rank.
    pub count: u64,
}

impl Worker {
    /// The whole share (no workers, or one).
    pub const ALL: Worker = Worker { index: 0, count: 1 };

    /// Positions in this worker's part of a share of `per_rank`
    /// positions in batches of `batch` (the share's last batch may be
    /// short).
    pub fn len(&self, per_rank: u64, batch: u64) -> u64 {
        let batch = batch.max(1);
        let count = self.count.max(1);
        let (full, rest) = (per_rank / batch, per_rank % batch);
        let mine = full.saturating_sub(self.index).div_ceil(count);
        let last = if rest > 0 && full % count == self.index {
            rest
        } else {
            0
        };
        mine * batch + last
    }

    /// The position in the rank's share of this worker's position `p`.
    pub fn rank_position(&self, p: u64, batch: u64) -> u64 {
        let batch = batch.max(1);
        (self.index + p / batch * self.count.max(1)) * batch + p % batch
    }
}

/// Fisher–Yates with `rng`.
fn permute(items: &mut [u64], rng: &mut SampleRng) {
    for i in (1..items.len()).rev() {
        let j = below(rng, i as u64 + 1) as usize;
        items.swap(i, j);
    }
}

/// Uniform in `0..n` (Lemire's multiply-high; the bias is below 2⁻³²
/// for any n a dataset has).
fn below(rng: &mut SampleRng, n: u64) -> u64 {
    ((u128::from(rng.next_u64()) * u128::from(n)) >> 64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn layout(
        n: u64,
        world: u64,
        batch: u64,
        drop_last: bool,
        shuffle: Option<Shuffle>,
    ) -> EpochShape {
        EpochShape {
            samples: n,
            world_size: world,
            batch_size: batch,
            drop_last,
            shuffle,
            start: 0,
        }
    }

    fn shuffle_strategy() -> impl Strategy<Value = Option<Shuffle>> {
        prop_oneof![
            Just(None),
            any::<u64>().prop_map(|seed| Some(Shuffle {
                seed,
                mode: ShuffleMode::Full,
                block_size: 64,
                window: 1024,
            })),
            (any::<u64>(), 1u64..20, 1u64..50).prop_map(|(seed, block_size, window)| Some(
                Shuffle {
                    seed,
                    mode: ShuffleMode::Block,
                    block_size,
                    window,
                }
            )),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        /// Every epoch is a permutation, and the ranks together read every
        /// sample exactly once (drop_last: at most once, in full batches;
        /// otherwise at least once, with fewer than `world` repeats).
        #[test]
        fn every_epoch_covers_every_sample_once(
            n in 0u64..400,
            world in 1u64..9,
            batch in 1u64..17,
            drop_last in any::<bool>(),
            shuffle in shuffle_strategy(),
            epoch in 0u64..5,
        ) {
            let l = layout(n, world, batch, drop_last, shuffle);
            let order = l.epoch_order(epoch);
            let mut sorted = order.clone();
            sorted.sort_unstable();
            prop_assert_eq!(sorted, (0..n).collect::<Vec<_>>());
            let mut seen = vec![0u32; n as usize];
            for r in 0..world {
                let s = l.rank_samples(&order, r, 0, u64::MAX);
                prop_assert_eq!(s.len() as u64, l.per_rank());
                for x in s {
                    seen[x as usize] += 1;
                }
            }
            let total: u64 = seen.iter().map(|&c| u64::from(c)).sum();
            prop_assert_eq!(total, l.per_rank() * world);
            if drop_last {
                prop_assert!(seen.iter().all(|&c| c <= 1));
                prop_assert_eq!(l.per_rank() % batch, 0);
                prop_assert!(n - total < world * batch);
            } else {
                prop_assert!(n == 0 || seen.iter().all(|&c| c >= 1));
                prop_assert!(total - n < world);
                // Only samples at the start of the epoch order repeat.
                let repeats: Vec<u64> = (0..n).filter(|&x| seen[x as usize] > 1).collect();
                let head: std::collections::BTreeSet<u64> =
                    order.iter().take((total - n) as usize).copied().collect();
                prop_assert!(repeats.iter().all(|x| head.contains(x)));
            }
        }

        /// Resuming at any offset gives exactly the rest of the rank's epoch.
        #[test]
        fn resume_gives_the_exact_remainder(
            n in 1u64..300,
            world in 1u64..6,
            batch in 1u64..9,
            drop_last in any::<bool>(),
            shuffle in shuffle_strategy(),
            epoch in 0u64..3,
            rank_pick in any::<u64>(),
            offset_pick in any::<u64>(),
        ) {
            let l = layout(n, world, batch, drop_last, shuffle);
            let order = l.epoch_order(epoch);
            let rank = rank_pick % world;
            let all = l.rank_samples(&order, rank, 0, u64::MAX);
            let offset = offset_pick % (all.len() as u64 + 1);
            let rest = l.rank_samples(&order, rank, offset, u64::MAX);
            prop_assert_eq!(&rest[..], &all[offset as usize..]);
            let head = l.rank_samples(&order, rank, 0, offset);
            prop_assert_eq!([head, rest].concat(), all);
        }

        /// The order is a function of (seed, epoch): the same inputs give
        /// the same order, another epoch (almost always) another one.
        #[test]
        fn order_depends_on_seed_and_epoch_only(
            n in 20u64..200,
            seed in any::<u64>(),
            block in any::<bool>(),
            epoch in 0u64..100,
        ) {
            let shuffle = Some(Shuffle {
                seed,
                mode: if block { ShuffleMode::Block } else { ShuffleMode::Full },
                block_size: 4,
                window: 16,
            });
            let a = layout(n, 3, 4, false, shuffle);
            let b = layout(n, 7, 2, true, shuffle);
            prop_assert_eq!(a.epoch_order(epoch), b.epoch_order(epoch));
            prop_assert_ne!(a.epoch_order(epoch), a.epoch_order(epoch + 1));
        }

        /// Workers taking every Nth batch cover their rank's share once,
        /// and a loader taking their batches in turn gets it in order.
        #[test]
        fn workers_in_turn_give_the_rank_its_share_in_order(
            n in 0u64..300,
            world in 1u64..5,
            batch in 1u64..9,
            workers in 1u64..6,
            drop_last in any::<bool>(),
            shuffle in shuffle_strategy(),
        ) {
            let l = layout(n, world, batch, drop_last, shuffle);
            let order = l.epoch_order(1);
            for rank in 0..world {
                let share = l.rank_samples(&order, rank, 0, u64::MAX);
                let lens: u64 = (0..workers)
                    .map(|index| Worker { index, count: workers }.len(l.per_rank(), batch))
                    .sum();
                prop_assert_eq!(lens, l.per_rank());
                let got = received(&l, &order, rank, workers, l.batches_per_rank());
                prop_assert_eq!(got, share);
            }
        }

        /// A training that stops after any number of steps and resumes
        /// with another world size, batch size and number of workers,
        /// again and again, reads the epoch's global order exactly: every
        /// sample once (drop_last: at most once, and only a tail shorter
        /// than a global batch is left), in the order of an undisturbed
        /// run.
        #[test]
        fn elastic_resumes_read_the_global_order_once(
            n in 0u64..400,
            drop_last in any::<bool>(),
            shuffle in shuffle_strategy(),
            shapes in proptest::collection::vec((1u64..9, 1u64..9, 1u64..4, any::<u64>()), 1..6),
        ) {
            let full = layout(n, 1, 1, false, shuffle);
            let order = full.epoch_order(3);
            let mut start = 0;
            let mut read: Vec<u64> = Vec::new();
            for (i, &(world, batch, workers, stop)) in shapes.iter().enumerate() {
                let mut l = layout(n, world, batch, drop_last, shuffle);
                l.start = start;
                let steps = if i + 1 == shapes.len() {
                    l.batches_per_rank()
                } else {
                    stop % (l.batches_per_rank() + 1)
                };
                // Step by step, every rank's batch k before any batch k+1:
                // the global order.
                let per_rank: Vec<Vec<u64>> = (0..world)
                    .map(|r| received(&l, &order, r, workers, steps))
                    .collect();
                for k in 0..(steps * batch) as usize {
                    for share in &per_rank {
                        if let Some(&x) = share.get(k) {
                            read.push(x);
                        }
                    }
                }
                start = l.global_position(steps * batch);
            }
            // Padding repeats the epoch's first samples at its very end.
            read.truncate(n as usize);
            prop_assert_eq!(&read[..], &order[..read.len()]);
            if drop_last {
                let last = shapes.last().map_or(1, |s| s.0 * s.1);
                prop_assert!(n - (read.len() as u64) < last);
            } else {
                prop_assert_eq!(read.len() as u64, n);
            }
        }
    }

    /// What a rank's trainer receives when `workers` DataLoader workers
    /// each read their part and the loader takes a batch from each in
    /// turn: the first `batches` batches.
    fn received(l: &EpochShape, order: &[u64], rank: u64, workers: u64, batches: u64) -> Vec<u64> {
        let parts: Vec<Vec<u64>> = (0..workers)
            .map(|index| {
                let w = Worker {
                    index,
                    count: workers,
                };
                l.worker_samples(order, rank, w, 0, u64::MAX)
            })
            .collect();
        let b = l.batch_size as usize;
        (0..batches as usize)
            .flat_map(|j| {
                let part = &parts[j % workers as usize];
                let at = j / workers as usize * b;
                part[at.min(part.len())..(at + b).min(part.len())].to_vec()
            })
            .collect()
    }

    #[test]
    fn block_mode_keeps_runs_within_a_window() {
        let l = layout(
            1000,
            1,
            1,
            false,
            Some(Shuffle {
                seed: 5,
                mode: ShuffleMode::Block,
                block_size: 100,
                window: 100,
            }),
        );
        let order = l.epoch_order(0);
        // Windows of 100 aligned with runs of 100: each window is one run.
        for w in order.chunks(100) {
            let run = w[0] / 100;
            assert!(w.iter().all(|x| x / 100 == run), "{w:?}");
        }
        assert_ne!(order, (0..1000).collect::<Vec<_>>());
    }

    #[test]
    fn unshuffled_order_is_key_order_interleaved() {
        let l = layout(10, 3, 2, false, None);
        let order = l.epoch_order(0);
        assert_eq!(l.per_rank(), 4);
        assert_eq!(l.rank_samples(&order, 0, 0, 9), vec![0, 3, 6, 9]);
        assert_eq!(l.rank_samples(&order, 1, 0, 9), vec![1, 4, 7, 0]);
        assert_eq!(l.rank_samples(&order, 2, 0, 9), vec![2, 5, 8, 1]);
        let dropped = layout(10, 3, 2, true, None);
        assert_eq!(dropped.per_rank(), 2);
        assert_eq!(dropped.rank_samples(&order, 2, 0, 9), vec![2, 5]);
    }
}
