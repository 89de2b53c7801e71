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
use sluice_udfs::BadSample;

use super::status::{Ranges, TierBytes};

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
}
