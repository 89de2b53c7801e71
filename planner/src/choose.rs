//! Choosing a cut: every candidate's estimated rates, the pick, and the
//! per-sample split when one group of samples wants another cut than the
//! rest.
//!
//! A candidate's throughput is the slowest of three rates: storage CPU
//! (nodes × cores / storage ns per sample), the link (bytes per second /
//! bytes per sample) and compute CPU (cores / compute ns per sample).
//! When the two sides share a machine ([`Resources::colocated`]) there is
//! one rate: the machine's cores / all the CPU a sample takes, on either
//! side (the link is memory). Cuts then differ only by the work each adds
//! (a `to_tensor` that runs once instead of twice), so the one with the
//! least CPU wins and ties go to fewer bytes handed over, and no split
//! "between sides" can look faster than the cores it has. The
//! Socket work is charged here, as it depends on where the sides run:
//! apart, each side pays [`NET_NS_PER_BYTE`] for every byte over the link
//! and compute pays it again for every byte it streams to the trainer;
//! co-located, the hand-over is memory and only the trainer's stream is a
//! socket. The
//! best candidate wins; candidates within [`TIE`] of each other are ties,
//! broken towards fewer bytes over the link. A per-sample split — samples
//! above a metadata threshold at one cut, the rest at another — is chosen
//! only when it beats the best single cut by [`SPLIT_GAIN`], as it scans
//! the dataset's metadata twice.

use serde::{Deserialize, Serialize};
use sluice_udfs::cost::SampleStats;

use crate::cost::{NET_NS_PER_BYTE, SampleCost, mean};
use crate::resources::Resources;

/// Relative difference under which two throughputs are a tie.
pub const TIE: f64 = 0.01;
/// How much better than the best single cut a split must be.
pub const SPLIT_GAIN: f64 = 1.10;

/// Estimated rates of a placement, in samples per second.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Rates {
    /// What storage CPU sustains.
    pub storage_per_s: f64,
    /// What the link sustains (`None`: unlimited).
    pub link_per_s: Option<f64>,
    /// What compute CPU sustains.
    pub compute_per_s: f64,
    /// The slowest of the three.
    pub per_s: f64,
    /// Mean bytes over the link per sample.
    pub bytes_per_sample: f64,
    /// Mean storage CPU per sample, ns.
    pub storage_ns: f64,
    /// Mean compute CPU per sample, ns.
    pub compute_ns: f64,
    /// Both sides on one machine: one pool of cores, no link.
    #[serde(default)]
    pub colocated: bool,
}

impl Rates {
    /// The rates of a mean per-sample cost under `res`.
    pub fn of(c: SampleCost, res: &Resources) -> Self {
        let trainer_ns = NET_NS_PER_BYTE * c.out_bytes;
        if res.colocated.is_some() {
            let compute_ns = c.compute_ns + trainer_ns;
            let pool = res.compute_cores.max(1.0) * 1e9 / (c.storage_ns + compute_ns).max(1.0);
            return Self {
                storage_per_s: pool,
                link_per_s: None,
                compute_per_s: pool,
                per_s: pool,
                bytes_per_sample: c.link_bytes,
                storage_ns: c.storage_ns,
                compute_ns,
                colocated: true,
            };
        }
        let link_ns = NET_NS_PER_BYTE * c.link_bytes;
        let storage_ns = c.storage_ns + link_ns;
        let compute_ns = c.compute_ns + link_ns + trainer_ns;
        let storage_per_s =
            res.storage_nodes.max(1) as f64 * res.storage_cores * 1e9 / storage_ns.max(1.0);
        let compute_per_s = res.compute_cores * 1e9 / compute_ns.max(1.0);
        let link_per_s = res.link_bytes_per_s.map(|b| b / c.link_bytes.max(1.0));
        let per_s = storage_per_s
            .min(compute_per_s)
            .min(link_per_s.unwrap_or(f64::INFINITY));
        Self {
            storage_per_s,
            link_per_s,
            compute_per_s,
            per_s,
            bytes_per_sample: c.link_bytes,
            storage_ns,
            compute_ns,
            colocated: false,
        }
    }

    /// Which of the three limits the rate.
    pub fn bottleneck(&self) -> &'static str {
        if self.colocated {
            "cpu"
        } else if self.link_per_s.is_some_and(|l| l <= self.per_s) {
            "link"
        } else if self.storage_per_s <= self.per_s {
            "storage"
        } else {
            "compute"
        }
    }

    /// Whether `self` beats `other`: faster beyond a tie, or tied with fewer bytes.
    pub fn beats(&self, other: &Rates) -> bool {
        if self.per_s > other.per_s * (1.0 + TIE) {
            return true;
        }
        if other.per_s > self.per_s * (1.0 + TIE) {
            return false;
        }
        self.bytes_per_sample < other.bytes_per_sample
    }
}

/// What the split's threshold is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Metric {
    /// Probed width × height (0 when not probed).
    Pixels,
    /// Object bytes.
    Bytes,
}

impl Metric {
    /// The metric of a dataset's sample: pixels if any object has them.
    pub fn for_rows(rows: &[SampleStats]) -> Self {
        if rows.iter().any(|r| r.width > 0.0 && r.height > 0.0) {
            Self::Pixels
        } else {
            Self::Bytes
        }
    }

    /// The metric's value for one object.
    pub fn value(self, r: &SampleStats) -> f64 {
        match self {
            Self::Pixels => r.width * r.height,
            Self::Bytes => r.bytes,
        }
    }
}

/// A per-sample split: objects above `threshold` run at cut `above`, the
/// others at cut `below`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Split {
    /// What the threshold is on.
    pub metric: Metric,
    /// The threshold.
    pub threshold: u64,
    /// Cut of the objects above it.
    pub above: usize,
    /// Cut of the others.
    pub below: usize,
    /// Share of the sample above it.
    pub share_above: f64,
    /// Estimated rates.
    pub rates: Rates,
}

/// The best per-sample split of `table[cut][row]`, if one beats `best` by
/// [`SPLIT_GAIN`].
pub fn best_split(
    table: &[Vec<SampleCost>],
    rows: &[SampleStats],
    res: &Resources,
    best: &Rates,
) -> Option<Split> {
    if rows.len() < 2 || table.len() < 2 {
        return None;
    }
    let metric = Metric::for_rows(rows);
    let values: Vec<f64> = rows.iter().map(|r| metric.value(r)).collect();
    let mut sorted = values.clone();
    sorted.sort_by(f64::total_cmp);
    sorted.dedup();
    let mut thresholds: Vec<f64> = (1..10).map(|i| sorted[i * sorted.len() / 10]).collect();
    thresholds.dedup();
    let mut found: Option<Split> = None;
    for &t in &thresholds {
        let above: Vec<bool> = values.iter().map(|&v| v > t).collect();
        let n_above = above.iter().filter(|&&a| a).count();
        if n_above == 0 || n_above == rows.len() {
            continue;
        }
        for (a, costs_a) in table.iter().enumerate() {
            for (b, costs_b) in table.iter().enumerate() {
                if a == b {
                    continue;
                }
                let costs = above
                    .iter()
                    .enumerate()
                    .map(|(i, &is_above)| if is_above { costs_a[i] } else { costs_b[i] });
                let rates = Rates::of(mean(costs), res);
                if found.as_ref().is_none_or(|f| rates.beats(&f.rates)) {
                    found = Some(Split {
                        metric,
                        threshold: t as u64,
                        above: a,
                        below: b,
                        share_above: n_above as f64 / rows.len() as f64,
                        rates,
                    });
                }
            }
        }
    }
    found.filter(|s| s.rates.per_s > best.per_s * SPLIT_GAIN)
}
