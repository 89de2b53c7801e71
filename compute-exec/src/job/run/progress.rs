//! A job's progress, as its state ([`Inner`]) counts it: each batch a
//! reader receives here ([`Inner::delivered`]), each report a compute
//! node sends the coordinator ([`Inner::merge_report`], checked against
//! the job and the nodes its ranks were sent to), and what this node
//! reports in turn ([`Inner::report_since`]). A job is done when every
//! position of every epoch was delivered ([`Inner::settled`]); `Job`
//! saves its record then, and at most every second before.

use std::sync::Arc;

use sluice_udfs::ErrorLog;

use super::Inner;
use crate::error::JobError;
use crate::job::order::Worker;
use crate::job::rank_batch::RankBatch;
use crate::job::report::{NodeReport, ReportBounds, Reported};
use crate::job::status::TierBytes;

impl Inner {
    /// Counts a batch handed to `worker` of `rank`'s reader: the
    /// positions of the rank's share it covers (one batch of the rank's
    /// when the worker's part is every Nth batch of `batch`).
    pub(super) fn delivered(
        &mut self,
        rank: u64,
        worker: Worker,
        epoch: u64,
        batch: u64,
        d: &RankBatch,
    ) {
        let (from, to) = if d.next_offset > d.from {
            let first = worker.rank_position(d.from, batch);
            (first, first + (d.next_offset - d.from))
        } else {
            (d.from, d.next_offset)
        };
        self.progress
            .deliver(rank, epoch, from, to, d.num_rows() as u64);
    }

    /// Whether every position of `epochs` epochs was delivered, and
    /// whether a save of the progress is due (at most every second).
    pub(super) fn settled(&mut self, epochs: u64) -> (bool, bool) {
        let total = self.ready.as_ref().map(|r| r.positions(epochs));
        let due = self.progress.save_due();
        (total.is_some_and(|t| self.progress.positions >= t), due)
    }

    /// What this node delivered, moved and skipped (`bad`) since `last`
    /// (what its earlier reports said), as `node`'s report to the
    /// coordinator, with the watermark it leaves; `None` when nothing
    /// changed.
    pub(super) fn report_since(
        &self,
        node: &str,
        last: &Reported,
        bad: &ErrorLog,
    ) -> Option<(NodeReport, Reported)> {
        let (skipped, named) = bad.snapshot();
        let p = &self.progress;
        let failover = self.ready.as_ref().map(|r| &r.failover);
        let now = Reported {
            delivered: p.delivered,
            bytes: p.bytes,
            skipped,
            named: named.len(),
            failovers: failover.map_or(0, |f| f.tally()),
        };
        if now == *last {
            return None;
        }
        let report = NodeReport {
            node: node.to_string(),
            ranges: p.record().ranges,
            delivered: now.delivered.saturating_sub(last.delivered),
            bytes: TierBytes {
                link: now.bytes.link.saturating_sub(last.bytes.link),
                trainer: now.bytes.trainer.saturating_sub(last.bytes.trainer),
                shm: now.bytes.shm.saturating_sub(last.bytes.shm),
            },
            skipped: now.skipped.saturating_sub(last.skipped),
            bad_samples: named.into_iter().skip(last.named).collect(),
            failovers: failover.map_or_else(Vec::new, |f| f.events().0),
        };
        Some((report, now))
    }

    /// Adds a compute node's report (see [`NodeReport`]) to a job of
    /// `epochs` epochs, once it is checked against the job and the nodes
    /// its ranks were sent to (its bad samples go to `bad`); a report
    /// that does not fit is refused whole and changes nothing.
    pub(super) fn merge_report(
        &mut self,
        report: NodeReport,
        epochs: u64,
        bad: &ErrorLog,
    ) -> Result<(), JobError> {
        let refused = |reason: String| JobError::BadReport {
            node: report.node.chars().take(64).collect(),
            reason,
        };
        let Some(ready) = self.ready.as_ref() else {
            return Err(refused("the job is still being planned here".into()));
        };
        let bounds = ReportBounds {
            world_size: ready.layout.world_size,
            epochs,
            per_rank: ready.layout.per_rank(),
        };
        let routes = &self.routes;
        report
            .check(&bounds, |rank| routes.sent(rank, &report.node))
            .map_err(refused)?;
        // The job's listing, held apart from the progress it changes.
        let ready = Arc::clone(ready);
        self.progress
            .merge(&report.ranges, report.delivered, report.bytes);
        ready.failover.reported(&report.node, report.failovers);
        bad.merge(report.skipped, report.bad_samples);
        Ok(())
    }
}
