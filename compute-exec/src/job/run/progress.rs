//! A job's progress: each batch a reader receives here
//! ([`Job::delivered`]), each report a compute node sends the coordinator
//! ([`Job::merge_report`], checked against the job and the nodes its
//! ranks were sent to), and the bytes sent to trainers. A job is done when
//! every position of every epoch was delivered; its record is saved then,
//! and at most every second before.

use std::sync::Arc;

use super::{Inner, Job};
use crate::error::JobError;
use crate::job::order::Worker;
use crate::job::rank_batch::RankBatch;
use crate::job::report::{NodeReport, ReportBounds, Reported};
use crate::job::status::{JobState, TierBytes};

impl Job {
    /// Records a batch handed to `worker` of `rank`'s reader: the
    /// positions of the rank's share it covers (one batch of the rank's
    /// when the worker's part is every Nth batch).
    pub(super) fn delivered(
        self: &Arc<Self>,
        rank: u64,
        worker: Worker,
        epoch: u64,
        d: &mut RankBatch,
    ) {
        self.touch();
        if let Some((count, fresh)) = d.bad.take() {
            self.record_bad(count, fresh);
        }
        let mut inner = self.lock();
        let batch = self.spec.batch_size;
        let (from, to) = if d.next_offset > d.from {
            let first = worker.rank_position(d.from, batch);
            (first, first + (d.next_offset - d.from))
        } else {
            (d.from, d.next_offset)
        };
        inner
            .progress
            .deliver(rank, epoch, from, to, d.num_rows() as u64);
        self.settle(inner);
    }

    /// After progress: done when every position of every epoch was
    /// delivered (saved at once), else saved at most every second.
    pub(super) fn settle(self: &Arc<Self>, mut inner: std::sync::MutexGuard<'_, Inner>) {
        let total = inner.ready.as_ref().map(|r| r.positions(self.spec.epochs));
        let due = inner.progress.save_due();
        if total.is_some_and(|t| inner.progress.positions >= t) {
            drop(inner);
            self.state.send_if_modified(|s| {
                if *s == JobState::Running {
                    *s = JobState::Done;
                    true
                } else {
                    false
                }
            });
            self.save();
        } else if due {
            drop(inner);
            self.save_in_background();
        }
    }

    /// What this node delivered, moved and skipped since `last` (what its
    /// earlier reports said), as `node`'s report to the coordinator, with
    /// the watermark it leaves; `None` when nothing changed.
    pub fn report_since(&self, node: &str, last: &Reported) -> Option<(NodeReport, Reported)> {
        let (skipped, named) = self.bad.snapshot();
        let inner = self.lock();
        let p = &inner.progress;
        let failover = inner.ready.as_ref().map(|r| &r.failover);
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

    /// Notes that `rank` is served by the compute node at `node` (what a
    /// trainer was just told): that node's reports of it count.
    pub fn route(&self, rank: u64, node: &str) {
        self.lock().routes.note(rank, node);
    }

    /// Adds a compute node's report (see [`NodeReport`]), once it is
    /// checked against this job and the nodes its ranks were sent to; a
    /// report that does not fit is refused whole and changes nothing.
    pub fn merge_report(self: &Arc<Self>, report: NodeReport) -> Result<(), JobError> {
        let refused = |reason: String| JobError::BadReport {
            node: report.node.chars().take(64).collect(),
            reason,
        };
        let mut inner = self.lock();
        let Some(ready) = inner.ready.as_ref() else {
            return Err(refused("the job is still being planned here".into()));
        };
        let bounds = ReportBounds {
            world_size: ready.layout.world_size,
            epochs: self.spec.epochs,
            per_rank: ready.layout.per_rank(),
        };
        let routes = &inner.routes;
        report
            .check(&bounds, |rank| routes.sent(rank, &report.node))
            .map_err(refused)?;
        let ready = Arc::clone(ready);
        inner
            .progress
            .merge(&report.ranges, report.delivered, report.bytes);
        ready.failover.reported(&report.node, report.failovers);
        self.bad.merge(report.skipped, report.bad_samples);
        self.touch();
        self.settle(inner);
        Ok(())
    }

    /// Records Flight bytes sent to a trainer.
    pub fn sent(&self, bytes: u64) {
        self.lock().progress.bytes.trainer += bytes;
    }

    /// Counts `bytes` handed to a trainer through shared memory.
    pub fn sent_shm(&self, bytes: u64) {
        self.lock().progress.bytes.shm += bytes;
    }
}
