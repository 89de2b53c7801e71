//! [`Progress`]: the bookkeeping behind a job's status — which positions
//! of which (rank, epoch) were delivered (as [`Ranges`]), the rows, bytes
//! and rate, and what the job's record keeps of them.

use std::collections::HashMap;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::status::{RankProgress, TierBytes};

/// A rank and the spans of positions delivered to it.
pub type RankSpans<'a> = (u64, &'a [(u64, u64)]);

/// Positions delivered per (rank, epoch), and the counters of a job.
#[derive(Debug, Default)]
pub struct Progress {
    covered: HashMap<(u64, u64), Ranges>,
    /// Distinct positions delivered.
    pub positions: u64,
    /// Samples delivered (re-reads included).
    pub delivered: u64,
    /// Bytes per tier.
    pub bytes: TierBytes,
    first: Option<Instant>,
    last: Option<Instant>,
    saved: Option<Instant>,
}

/// Positions of one (rank, epoch) as sorted, disjoint, non-adjacent
/// half-open ranges. Readers deliver in order, so an epoch read whole is
/// one range and one read in progress is one range plus a few gaps left
/// by a reader that resumed elsewhere: the job's record grows with the
/// gaps, not with the samples (a bitmap was a word per 64 samples of
/// every (rank, epoch) ever read, saved every second).
///
/// Read from a record or a node's report, ranges are checked (none runs
/// backwards) and put in that form, so that no count over them can
/// overflow.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<(u64, u64)>")]
pub struct Ranges(Vec<(u64, u64)>);

impl TryFrom<Vec<(u64, u64)>> for Ranges {
    type Error = String;

    fn try_from(mut spans: Vec<(u64, u64)>) -> Result<Self, String> {
        if let Some((from, to)) = spans.iter().find(|(from, to)| from > to) {
            return Err(format!("the range {from}..{to} runs backwards"));
        }
        // In order, each insert merges at the end: n log n in all.
        spans.sort_unstable();
        let mut r = Self::default();
        for (from, to) in spans {
            r.insert(from, to);
        }
        Ok(r)
    }
}

impl Ranges {
    /// The ranges, sorted and disjoint.
    pub fn spans(&self) -> &[(u64, u64)] {
        &self.0
    }

    /// Adds `from..to`; returns how many positions were new.
    fn insert(&mut self, from: u64, to: u64) -> u64 {
        if from >= to {
            return 0;
        }
        // Ranges that overlap or touch `from..to` merge with it.
        let first = self.0.partition_point(|&(_, e)| e < from);
        let last = self.0.partition_point(|&(s, _)| s <= to);
        let (mut lo, mut hi, mut had) = (from, to, 0);
        for &(s, e) in &self.0[first..last] {
            lo = lo.min(s);
            hi = hi.max(e);
            had += e.min(to).saturating_sub(s.max(from));
        }
        self.0.splice(first..last, [(lo, hi)]);
        (to - from) - had
    }

    /// Positions covered.
    fn len(&self) -> u64 {
        self.0.iter().map(|(s, e)| e - s).sum()
    }

    /// The ranges of a bitmap (a record written before ranges).
    fn from_bitmap(words: &[u64]) -> Self {
        let mut r = Self::default();
        for (i, &w) in words.iter().enumerate() {
            for bit in 0..64 {
                if w & (1 << bit) != 0 {
                    let p = i as u64 * 64 + bit;
                    r.insert(p, p + 1);
                }
            }
        }
        r
    }
}

/// [`Progress`] as the job store keeps it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProgressRecord {
    /// Positions delivered, per (rank, epoch), as ranges.
    #[serde(default)]
    pub ranges: Vec<((u64, u64), Ranges)>,
    /// Positions as bitmaps, in records written before `ranges`: read,
    /// never written.
    #[serde(default, skip_serializing)]
    pub covered: Vec<((u64, u64), Vec<u64>)>,
    /// Bytes per tier.
    pub bytes: TierBytes,
    /// Rows handed to readers.
    pub delivered: u64,
}

/// How often a running job's progress is saved, at most.
pub const SAVE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

impl Progress {
    /// Records positions `from..to` of (`rank`, `epoch`): `rows` samples.
    pub fn deliver(&mut self, rank: u64, epoch: u64, from: u64, to: u64, rows: u64) {
        self.positions += self
            .covered
            .entry((rank, epoch))
            .or_default()
            .insert(from, to);
        self.delivered += rows;
        let now = Instant::now();
        self.first.get_or_insert(now);
        self.last = Some(now);
    }

    /// The latest epoch any rank was delivered positions of, and each
    /// rank's delivered spans of it.
    pub fn latest_epoch(&self) -> Option<(u64, Vec<RankSpans<'_>>)> {
        let epoch = self.covered.keys().map(|(_, e)| *e).max()?;
        let spans = self
            .covered
            .iter()
            .filter(|((_, e), _)| *e == epoch)
            .map(|((r, _), ranges)| (*r, ranges.spans()))
            .collect();
        Some((epoch, spans))
    }

    /// Each rank that read anything: its latest epoch, the positions of it
    /// delivered, and the epochs done, when a rank's epoch has `per_rank`
    /// positions.
    pub fn ranks(&self, per_rank: u64) -> Vec<RankProgress> {
        let mut out: Vec<RankProgress> = Vec::new();
        let mut keys: Vec<_> = self.covered.keys().copied().collect();
        keys.sort_unstable();
        for (rank, epoch) in keys {
            let delivered = self.covered[&(rank, epoch)].len();
            let done = u64::from(per_rank > 0 && delivered >= per_rank);
            match out.last_mut() {
                Some(r) if r.rank == rank => {
                    r.epoch = epoch;
                    r.delivered = delivered;
                    r.epochs_done += done;
                }
                _ => out.push(RankProgress {
                    rank,
                    epoch,
                    delivered,
                    of: per_rank,
                    epochs_done: done,
                }),
            }
        }
        out
    }

    /// Adds what a compute node delivered for this job: its positions
    /// (merged: a range reported twice counts once), `rows` and `bytes`
    /// (what it delivered since its last report).
    pub fn merge(&mut self, ranges: &[((u64, u64), Ranges)], rows: u64, bytes: TierBytes) {
        for (key, r) in ranges {
            let mine = self.covered.entry(*key).or_default();
            for &(from, to) in &r.0 {
                self.positions = self.positions.saturating_add(mine.insert(from, to));
            }
        }
        // Saturating: a node's counters are its word, and no word of it
        // may wrap a counter or panic the coordinator.
        self.delivered = self.delivered.saturating_add(rows);
        self.bytes.link = self.bytes.link.saturating_add(bytes.link);
        self.bytes.trainer = self.bytes.trainer.saturating_add(bytes.trainer);
        self.bytes.shm = self.bytes.shm.saturating_add(bytes.shm);
        if rows > 0 {
            let now = Instant::now();
            self.first.get_or_insert(now);
            self.last = Some(now);
        }
    }

    /// Records that a reader started (the rate counts from the first).
    pub fn start(&mut self) {
        self.first.get_or_insert_with(Instant::now);
    }

    /// Delivered samples per second, from the first reader's start to the
    /// last delivery.
    pub fn rate(&self) -> f64 {
        match (self.first, self.last) {
            (Some(a), Some(b)) if b > a => self.delivered as f64 / (b - a).as_secs_f64(),
            _ => 0.0,
        }
    }

    /// Whether the progress should be saved now (at most every
    /// [`SAVE_EVERY`]); if so, the clock restarts.
    pub fn save_due(&mut self) -> bool {
        let now = Instant::now();
        match self.saved {
            Some(t) if now - t < SAVE_EVERY => false,
            _ => {
                self.saved = Some(now);
                true
            }
        }
    }

    /// What the job store keeps.
    pub fn record(&self) -> ProgressRecord {
        let mut ranges: Vec<_> = self.covered.iter().map(|(k, v)| (*k, v.clone())).collect();
        ranges.sort_unstable_by_key(|(k, _)| *k);
        ProgressRecord {
            ranges,
            covered: Vec::new(),
            bytes: self.bytes,
            delivered: self.delivered,
        }
    }

    /// The progress a job store kept (in either form).
    pub fn restore(r: &ProgressRecord) -> Self {
        let mut covered: HashMap<(u64, u64), Ranges> = r.ranges.iter().cloned().collect();
        for (k, words) in &r.covered {
            let old = Ranges::from_bitmap(words);
            let ranges = covered.entry(*k).or_default();
            for &(s, e) in &old.0 {
                ranges.insert(s, e);
            }
        }
        let positions = covered
            .values()
            .map(Ranges::len)
            .fold(0u64, u64::saturating_add);
        Self {
            covered,
            positions,
            delivered: r.delivered,
            bytes: r.bytes,
            ..Self::default()
        }
    }

    /// Forgets the positions (a cancelled job's).
    pub fn release(&mut self) {
        self.covered = HashMap::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_show_their_latest_epoch_and_the_epochs_done() {
        let mut p = Progress::default();
        p.deliver(1, 0, 0, 10, 10);
        p.deliver(0, 0, 0, 10, 10);
        p.deliver(0, 1, 0, 4, 4);
        let r = p.ranks(10);
        assert_eq!(r.len(), 2);
        assert_eq!(
            (r[0].rank, r[0].epoch, r[0].delivered, r[0].epochs_done),
            (0, 1, 4, 1)
        );
        assert_eq!(
            (r[1].rank, r[1].epoch, r[1].delivered, r[1].epochs_done),
            (1, 0, 10, 1)
        );
    }

    #[test]
    fn positions_count_once() {
        let mut p = Progress::default();
        p.deliver(0, 0, 0, 100, 100);
        p.deliver(0, 0, 50, 130, 80);
        p.deliver(1, 0, 0, 10, 10);
        assert_eq!(p.positions, 140);
        assert_eq!(p.delivered, 190);
    }

    #[test]
    fn progress_survives_its_record() {
        let mut p = Progress::default();
        p.deliver(0, 1, 3, 70, 67);
        p.bytes.link = 9;
        let q = Progress::restore(&p.record());
        assert_eq!(q.positions, 67);
        assert_eq!(q.delivered, 67);
        assert_eq!(q.record(), p.record());
    }

    #[test]
    fn ranges_merge_and_count_new_positions_once() {
        let mut r = Ranges::default();
        assert_eq!(r.insert(10, 20), 10);
        assert_eq!(r.insert(30, 40), 10);
        assert_eq!(r.insert(15, 35), 10, "only 20..30 is new");
        assert_eq!(r.0, [(10, 40)]);
        assert_eq!(r.insert(40, 41), 1, "an adjacent range joins");
        assert_eq!(r.insert(0, 5), 5);
        assert_eq!(r.insert(3, 3), 0);
        assert_eq!(r.0, [(0, 5), (10, 41)]);
        assert_eq!(r.insert(0, 100), 100 - 5 - 31);
        assert_eq!(r.0, [(0, 100)]);
        // Against a bitmap, over many random inserts.
        let (mut bits, mut ranges, mut x) = (vec![false; 500], Ranges::default(), 7u64);
        for _ in 0..300 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let from = (x >> 33) % 500;
            let to = (from + (x >> 20) % 40).min(500);
            let new = (from..to).filter(|&p| !bits[p as usize]).count() as u64;
            (from..to).for_each(|p| bits[p as usize] = true);
            assert_eq!(ranges.insert(from, to), new);
            assert!(ranges.0.windows(2).all(|w| w[0].1 < w[1].0));
        }
        assert_eq!(ranges.len(), bits.iter().filter(|&&b| b).count() as u64);
    }

    #[test]
    fn a_whole_epoch_is_one_range_and_old_bitmaps_still_restore() {
        let mut p = Progress::default();
        for start in (0..1_000_000).step_by(256) {
            p.deliver(3, 7, start, start + 256, 256);
        }
        let record = p.record();
        assert_eq!(record.ranges, [((3, 7), Ranges(vec![(0, 1_000_192)]))]);
        assert!(serde_json::to_vec(&record).unwrap().len() < 200);
        let old: ProgressRecord = serde_json::from_str(
            r#"{"covered": [[[0, 1], [7, 1]]], "bytes": {"link": 0, "trainer": 0}, "delivered": 4}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let q = Progress::restore(&old);
        assert_eq!(q.positions, 4);
        assert_eq!(
            q.record().ranges,
            [((0, 1), Ranges(vec![(0, 3), (64, 65)]))]
        );
    }
}
