//! What a job reports: its state and progress, rates, bytes per tier and
//! skipped samples ([`JobStatus`]), and the bookkeeping behind it
//! ([`Progress`]: which positions of which (rank, epoch) were delivered).

use std::collections::HashMap;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use sluice_udfs::env::BadSample;

use super::JobSpec;

/// The life of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Submitted; its samples are being listed.
    Pending,
    /// Readable.
    Running,
    /// Every position of every (rank, epoch) was delivered; still readable.
    Done,
    /// It cannot go on (see its error).
    Failed,
    /// Cancelled by a user; its resources are freed.
    Cancelled,
}

impl JobState {
    /// Whether the job is over for good.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Failed | Self::Cancelled)
    }
}

/// Bytes a job moved, per tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TierBytes {
    /// Arrow values storage fragments sent to the compute side.
    pub link: u64,
    /// Flight messages sent to trainers.
    pub trainer: u64,
}

/// A job as the REST API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobStatus {
    /// Its id.
    pub id: String,
    /// Its state.
    pub state: JobState,
    /// Why it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Seconds since the Unix epoch when it was submitted.
    pub created: f64,
    /// What was submitted.
    pub spec: JobSpec,
    /// The SQL its plan form compiled to (absent when it was submitted as
    /// SQL: `spec.sql` is that).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sql: Option<String>,
    /// Samples per epoch (known once running).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub samples: Option<u64>,
    /// Samples each rank reads per epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub samples_per_rank: Option<u64>,
    /// Fraction of all (rank, epoch) positions delivered, 0 to 1.
    pub progress: f64,
    /// Samples delivered to trainers (re-reads included).
    pub delivered: u64,
    /// Delivered samples per second, from the first read to the last
    /// delivery.
    pub samples_per_s: f64,
    /// Bytes per tier.
    pub bytes: TierBytes,
    /// Samples skipped or nulled by the error policy, or gone from the
    /// dataset since the job listed it.
    pub skipped: u64,
    /// The first of them, with the reason.
    #[schema(value_type = Vec<Object>)]
    pub bad_samples: Vec<BadSample>,
    /// Rows of the pinned versions the job does not deliver, and why (a
    /// key held by more than one storage node is read once): every row
    /// is delivered or counted here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// Positions delivered per (rank, epoch), and the counters of a job.
#[derive(Debug, Default)]
pub struct Progress {
    covered: HashMap<(u64, u64), Vec<u64>>,
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

/// [`Progress`] as the job store keeps it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProgressRecord {
    /// Positions delivered, per (rank, epoch), as bitmaps.
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
        let bits = self.covered.entry((rank, epoch)).or_default();
        for p in from..to {
            let (word, bit) = ((p / 64) as usize, p % 64);
            if bits.len() <= word {
                bits.resize(word + 1, 0);
            }
            if bits[word] & (1 << bit) == 0 {
                bits[word] |= 1 << bit;
                self.positions += 1;
            }
        }
        self.delivered += rows;
        let now = Instant::now();
        self.first.get_or_insert(now);
        self.last = Some(now);
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

    /// Forgets the positions (a cancelled job's).
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
        let mut covered: Vec<_> = self.covered.iter().map(|(k, v)| (*k, v.clone())).collect();
        covered.sort_unstable_by_key(|(k, _)| *k);
        ProgressRecord {
            covered,
            bytes: self.bytes,
            delivered: self.delivered,
        }
    }

    /// The progress a job store kept.
    pub fn restore(r: &ProgressRecord) -> Self {
        let covered: HashMap<(u64, u64), Vec<u64>> = r.covered.iter().cloned().collect();
        let positions = covered
            .values()
            .flatten()
            .map(|w| u64::from(w.count_ones()))
            .sum();
        Self {
            covered,
            positions,
            delivered: r.delivered,
            bytes: r.bytes,
            ..Self::default()
        }
    }

    pub fn release(&mut self) {
        self.covered = HashMap::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
