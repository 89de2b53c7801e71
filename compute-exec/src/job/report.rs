//! [`NodeReport`]: what a compute node serving some of a job's ranks tells
//! the coordinator, so that the job's status, progress, bytes per tier and
//! bad samples on the coordinator (REST, the dashboard, `/metrics`) count
//! every rank, wherever it was read.
//!
//! A node adopts a job with no progress of its own and reports, every
//! [`REPORT_EVERY`], the positions it delivered (as ranges: merging a range
//! twice counts it once) and what it delivered, moved and skipped since
//! its last report that was answered ([`Reported`] is that watermark). A
//! report whose answer is lost is sent again: positions stay exact, the
//! counters of that report count twice.

use serde::{Deserialize, Serialize};
use sluice_base::BadSample;
use sluice_udfs::ErrorLog;

use super::coverage::Ranges;
use super::failover::{FailoverEvent, MAX_EVENTS};
use super::status::TierBytes;

/// How often a compute node reports each job it serves.
pub const REPORT_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// See the module docs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeReport {
    /// The reporting node (its Flight location).
    pub node: String,
    /// Positions it delivered, per (rank, epoch).
    pub ranges: Vec<((u64, u64), Ranges)>,
    /// Rows it handed to readers since its last report.
    pub delivered: u64,
    /// Bytes it moved since its last report.
    pub bytes: TierBytes,
    /// Bad samples it met since its last report.
    pub skipped: u64,
    /// The first of them, named.
    pub bad_samples: Vec<BadSample>,
    /// Storage nodes its windows failed over from, all so far.
    #[serde(default)]
    pub failovers: Vec<FailoverEvent>,
}

/// Most ranges one report may carry (a node's ranks × epochs, plus the
/// gaps of readers that resumed elsewhere; far below this in practice).
pub const MAX_RANGES: usize = 1 << 16;
/// Longest node name a report may give.
pub const MAX_NODE_NAME: usize = 256;

/// What a job lets a report say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReportBounds {
    /// Ranks `0..world_size`.
    pub world_size: u64,
    /// Epochs `0..epochs`.
    pub epochs: u64,
    /// Positions `0..per_rank` of each rank's epoch.
    pub per_rank: u64,
}

impl NodeReport {
    /// Whether this report fits a job of `bounds`, every rank of it routed
    /// to the reporting node (`routed(rank)`): why not, when it does not.
    /// Nothing is merged before this passes.
    pub fn check(&self, bounds: &ReportBounds, routed: impl Fn(u64) -> bool) -> Result<(), String> {
        if self.node.is_empty() || self.node.len() > MAX_NODE_NAME {
            return Err(format!(
                "the node name must have 1 to {MAX_NODE_NAME} bytes"
            ));
        }
        let ranges: usize = self.ranges.iter().map(|(_, r)| r.spans().len()).sum();
        if ranges > MAX_RANGES {
            return Err(format!(
                "{ranges} ranges, over the {MAX_RANGES} a report may carry"
            ));
        }
        for &((rank, epoch), ref r) in &self.ranges {
            if rank >= bounds.world_size {
                return Err(format!(
                    "rank {rank} of a job with ranks 0..{}",
                    bounds.world_size
                ));
            }
            if epoch >= bounds.epochs {
                return Err(format!(
                    "epoch {epoch} of a job with epochs 0..{}",
                    bounds.epochs
                ));
            }
            if let Some(&(from, to)) = r.spans().iter().find(|&&(_, to)| to > bounds.per_rank) {
                return Err(format!(
                    "positions {from}..{to} of rank {rank}, epoch {epoch}: a rank's epoch \
                     has positions 0..{}",
                    bounds.per_rank
                ));
            }
            if !routed(rank) {
                return Err(format!("rank {rank} was never routed to this node"));
            }
        }
        if self.bad_samples.len() > ErrorLog::KEEP {
            return Err(format!(
                "{} bad samples named, over the {} a report may name",
                self.bad_samples.len(),
                ErrorLog::KEEP
            ));
        }
        if self.failovers.len() > MAX_EVENTS {
            return Err(format!(
                "{} failovers, over the {MAX_EVENTS} a report may carry",
                self.failovers.len()
            ));
        }
        for f in &self.failovers {
            f.check(MAX_NODE_NAME)?;
        }
        if (self.bad_samples.len() as u64) > self.skipped {
            return Err(format!(
                "{} bad samples named of {} counted",
                self.bad_samples.len(),
                self.skipped
            ));
        }
        Ok(())
    }
}

/// What a node's reports of one job have said so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Reported {
    /// Rows.
    pub delivered: u64,
    /// Bytes.
    pub bytes: TierBytes,
    /// Bad samples counted.
    pub skipped: u64,
    /// Bad samples named.
    pub named: usize,
    /// Its failovers' tally (`Failover::tally`).
    pub failovers: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: ReportBounds = ReportBounds {
        world_size: 2,
        epochs: 1,
        per_rank: 10,
    };

    fn report(ranges: Vec<((u64, u64), Ranges)>) -> NodeReport {
        NodeReport {
            node: "grpc://10.0.0.2:50053".into(),
            ranges,
            delivered: 10,
            bytes: TierBytes::default(),
            skipped: 0,
            bad_samples: vec![],
            failovers: vec![],
        }
    }

    fn ranges(r: &[(u64, u64)]) -> Ranges {
        serde_json::from_value(serde_json::json!(r)).unwrap()
    }

    #[test]
    fn a_report_inside_the_job_passes() {
        let r = report(vec![((1, 0), ranges(&[(0, 10)]))]);
        assert_eq!(r.check(&BOUNDS, |_| true), Ok(()));
    }

    #[test]
    fn a_report_outside_the_job_is_refused_naming_what() {
        for (ranges, needle) in [
            (vec![((7, 0), ranges(&[(0, 1)]))], "rank 7"),
            (vec![((0, 9), ranges(&[(0, 1)]))], "epoch 9"),
            (
                vec![((0, 0), ranges(&[(0, 1_000_000)]))],
                "positions 0..1000000",
            ),
            (
                vec![((0, 0), ranges(&[(u64::MAX - 1, u64::MAX)]))],
                "positions",
            ),
        ] {
            let e = report(ranges).check(&BOUNDS, |_| true).unwrap_err();
            assert!(e.contains(needle), "{e}");
        }
        let e = report(vec![((1, 0), ranges(&[(0, 2)]))])
            .check(&BOUNDS, |rank| rank == 0)
            .unwrap_err();
        assert!(e.contains("never routed"), "{e}");
        let mut r = report(vec![]);
        r.bad_samples = vec![BadSample {
            udf: "decode_image".into(),
            key: "a".into(),
            reason: "x".into(),
        }];
        assert!(
            r.check(&BOUNDS, |_| true)
                .unwrap_err()
                .contains("of 0 counted")
        );
        r.node = String::new();
        assert!(r.check(&BOUNDS, |_| true).is_err());
    }

    #[test]
    fn a_range_that_runs_backwards_is_not_a_range() {
        let e = serde_json::from_value::<Ranges>(serde_json::json!([[5, 2]])).unwrap_err();
        assert!(e.to_string().contains("5..2"), "{e}");
        // Unsorted and overlapping ranges are put in order.
        assert_eq!(ranges(&[(8, 9), (0, 3), (2, 5)]), ranges(&[(0, 5), (8, 9)]));
    }
}
