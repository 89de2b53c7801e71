//! Where a pipeline's time goes: every UDF call is timed, per stage (the
//! UDF) and per site (the storage node or compute process it ran on).
//!
//! ```text
//!  Udf::invoke_with_args(batch of n rows) ─► elapsed ─► StageClock::record(site, udf, n, ns)
//!      ─► per (tier, node, udf): rows, calls, ns, and a histogram of ns per sample
//!  a storage node's fragment ─► its clock's snapshot in the fragment's report
//!      ─► StageClock::merge on the compute side, under the name it knows the node by
//! ```
//!
//! The histogram has [`PER_OCTAVE`] buckets per power of two of the time
//! per sample of a call (a call's time over its rows: a UDF works a batch
//! at a time), so a p90 read from it is within 19% of the true one. One
//! lock per call, a call being a batch of decodes or resizes: nothing a
//! profile of the hot path sees.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// Histogram buckets per power of two.
pub const PER_OCTAVE: usize = 4;
/// Buckets in all: 1 ns to about 2^40 ns (18 minutes) per sample.
pub const BUCKETS: usize = 40 * PER_OCTAVE;

/// Which side of the planner's cut a stage ran on.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// A storage node, next to the data.
    Storage,
    /// The compute side, next to the trainers.
    #[default]
    Compute,
}

impl Tier {
    /// Its name in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Storage => "storage",
            Self::Compute => "compute",
        }
    }
}

/// Where a UDF runs: a tier, and the node's name (empty: this process's
/// compute side).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Site {
    /// The side of the cut.
    pub tier: Tier,
    /// The storage node (as the compute side names it), or empty.
    pub node: String,
}

impl Site {
    /// A storage node named `node`.
    pub fn storage(node: &str) -> Self {
        Self {
            tier: Tier::Storage,
            node: node.to_owned(),
        }
    }
}

/// What one stage at one site did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    /// Rows it evaluated.
    pub rows: u64,
    /// Calls (batches).
    pub calls: u64,
    /// Wall time inside the calls, nanoseconds.
    pub nanos: u64,
    /// Rows per histogram bucket of the time per sample, as (bucket,
    /// rows) for the buckets that have any.
    pub hist: Vec<(u16, u64)>,
}

/// The bucket of `ns` per sample.
fn bucket(ns: u64) -> u16 {
    let ns = ns.max(1) as f64;
    let b = (ns.log2() * PER_OCTAVE as f64).floor() as usize;
    b.min(BUCKETS - 1) as u16
}

/// The middle of bucket `b`, nanoseconds.
fn bucket_middle(b: u16) -> f64 {
    (2f64).powf((f64::from(b) + 0.5) / PER_OCTAVE as f64)
}

impl Tally {
    /// Adds a call of `rows` rows that took `nanos`.
    pub fn add(&mut self, rows: u64, nanos: u64) {
        if rows == 0 {
            return;
        }
        self.rows += rows;
        self.calls += 1;
        self.nanos += nanos;
        self.count(bucket(nanos / rows), rows);
    }

    fn count(&mut self, b: u16, rows: u64) {
        match self.hist.binary_search_by_key(&b, |&(k, _)| k) {
            Ok(i) => self.hist[i].1 += rows,
            Err(i) => self.hist.insert(i, (b, rows)),
        }
    }

    /// Adds another tally.
    pub fn merge(&mut self, other: &Tally) {
        self.rows += other.rows;
        self.calls += other.calls;
        self.nanos += other.nanos;
        for &(b, rows) in &other.hist {
            self.count(b, rows);
        }
    }

    /// What was added since `before` (a snapshot of this tally).
    pub fn since(&self, before: &Tally) -> Tally {
        let mut d = Tally {
            rows: self.rows.saturating_sub(before.rows),
            calls: self.calls.saturating_sub(before.calls),
            nanos: self.nanos.saturating_sub(before.nanos),
            hist: Vec::new(),
        };
        for &(b, rows) in &self.hist {
            let had = before
                .hist
                .binary_search_by_key(&b, |&(k, _)| k)
                .map_or(0, |i| before.hist[i].1);
            if rows > had {
                d.hist.push((b, rows - had));
            }
        }
        d
    }

    /// Mean time per sample, nanoseconds.
    pub fn mean_ns(&self) -> f64 {
        self.nanos as f64 / self.rows.max(1) as f64
    }

    /// The `q` quantile (0 to 1) of the time per sample, nanoseconds, from
    /// the histogram (0 when empty).
    pub fn quantile_ns(&self, q: f64) -> f64 {
        let total: u64 = self.hist.iter().map(|&(_, r)| r).sum();
        if total == 0 {
            return 0.0;
        }
        let want = (q.clamp(0.0, 1.0) * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for &(b, rows) in &self.hist {
            seen += rows;
            if seen >= want {
                return bucket_middle(b);
            }
        }
        self.hist.last().map_or(0.0, |&(b, _)| bucket_middle(b))
    }
}

/// A stage at a site, with what it did: one entry of a clock's snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageTiming {
    /// Where it ran.
    pub site: Site,
    /// The UDF.
    pub udf: String,
    /// What it did.
    pub tally: Tally,
}

/// The tallies of the UDFs of one query, or of every query of a job.
#[derive(Debug, Default)]
pub struct StageClock {
    inner: Mutex<BTreeMap<(Site, String), Tally>>,
}

impl StageClock {
    /// Records a call of `udf` at `site` over `rows` rows taking `nanos`.
    pub fn record(&self, site: &Site, udf: &str, rows: u64, nanos: u64) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        // The key is looked up before it is built: a call allocates nothing
        // once its stage has a tally.
        let found = g
            .iter_mut()
            .find(|((s, u), _)| s == site && u == udf)
            .map(|(_, t)| t);
        match found {
            Some(t) => t.add(rows, nanos),
            None => g
                .entry((site.clone(), udf.to_owned()))
                .or_default()
                .add(rows, nanos),
        }
    }

    /// Every stage's tally so far.
    pub fn snapshot(&self) -> Vec<StageTiming> {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.iter()
            .map(|((site, udf), tally)| StageTiming {
                site: site.clone(),
                udf: udf.clone(),
                tally: tally.clone(),
            })
            .collect()
    }

    /// Adds what a storage node's clock recorded, under `node`, the name
    /// this side knows the node by.
    pub fn merge(&self, node: &str, stages: &[StageTiming]) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        for s in stages {
            let site = Site {
                tier: s.site.tier,
                node: if s.site.tier == Tier::Storage {
                    node.to_owned()
                } else {
                    s.site.node.clone()
                },
            };
            g.entry((site, s.udf.clone())).or_default().merge(&s.tally);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_p90_is_read_from_the_histogram_within_a_bucket() {
        let mut t = Tally::default();
        // 90 fast samples (1 ms each, in calls of 10) and 10 slow ones (20 ms).
        for _ in 0..9 {
            t.add(10, 10_000_000);
        }
        t.add(10, 200_000_000);
        assert_eq!(t.rows, 100);
        assert_eq!(t.calls, 10);
        assert!((t.mean_ns() - 2_900_000.0).abs() < 1.0);
        let p50 = t.quantile_ns(0.5);
        assert!((p50 / 1e6 - 1.0).abs() < 0.2, "p50 {p50}");
        let p90 = t.quantile_ns(0.9);
        assert!((p90 / 1e6 - 1.0).abs() < 0.2, "p90 {p90}");
        let p99 = t.quantile_ns(0.99);
        assert!((p99 / 20e6 - 1.0).abs() < 0.2, "p99 {p99}");
        assert_eq!(Tally::default().quantile_ns(0.9), 0.0);
    }

    #[test]
    fn a_difference_of_snapshots_is_what_came_between() {
        let mut t = Tally::default();
        t.add(4, 4_000);
        let before = t.clone();
        t.add(6, 600_000);
        let d = t.since(&before);
        assert_eq!((d.rows, d.calls, d.nanos), (6, 1, 600_000));
        assert_eq!(d.hist, vec![(bucket(100_000), 6)]);
    }

    #[test]
    fn a_storage_nodes_stages_merge_under_the_name_this_side_knows() {
        let here = StageClock::default();
        here.record(&Site::default(), "normalize", 8, 800);
        let there = StageClock::default();
        there.record(&Site::storage("self"), "decode_image", 8, 8_000);
        there.record(&Site::storage("self"), "decode_image", 8, 8_000);
        here.merge("node-a:50051", &there.snapshot());
        here.merge("node-a:50051", &there.snapshot());
        let s = here.snapshot();
        assert_eq!(s.len(), 2);
        let decode = s.iter().find(|s| s.udf == "decode_image").unwrap();
        assert_eq!(decode.site, Site::storage("node-a:50051"));
        assert_eq!((decode.tally.rows, decode.tally.calls), (32, 4));
        let norm = s.iter().find(|s| s.udf == "normalize").unwrap();
        assert_eq!(norm.site.tier, Tier::Compute);
    }
}
