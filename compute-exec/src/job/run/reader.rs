//! A rank's share of an epoch for its reader: [`Job::deliver`] checks the
//! request, takes over the epoch begun ahead for it or starts the stream
//! (`crate::job::pipeline`) on the jobs' runtime, and counts each batch
//! as its reader receives it; a whole epoch's stream begins the rank's
//! next epoch ahead ([`Job::read_ahead`], see `crate::job::ahead`).

use std::sync::Arc;

use futures::Stream;
use tokio::sync::mpsc;

use super::{Job, Ready};
use crate::error::JobError;
use crate::job::ahead::{Batches, NextEpoch};
use crate::job::order::Worker;
use crate::job::pipeline::options::{AHEAD_ROOM, AHEAD_WAIT, CHANNEL_BATCHES};
use crate::job::pipeline::windows::Span;
use crate::job::rank_batch::RankBatch;
use crate::job::status::JobState;

impl Job {
    /// Rank `rank`'s share of `epoch` from position `offset`, at most
    /// `limit` positions: batches of `batch_size` rows in the epoch's
    /// order, each counted as delivered when its reader takes it. How
    /// they travel on is the reader's (`crate::trainer`'s sinks).
    pub async fn deliver(
        self: &Arc<Self>,
        rank: u64,
        epoch: u64,
        offset: u64,
        limit: Option<u64>,
    ) -> Result<impl Stream<Item = Result<RankBatch, JobError>> + Send + 'static, JobError> {
        self.deliver_part(rank, Worker::ALL, epoch, offset, limit)
            .await
    }

    /// As [`Job::deliver`], for `worker`'s part of the rank's share (its
    /// every Nth batch, see [`Worker`]): `offset` and `limit` are
    /// positions in that part.
    pub async fn deliver_part(
        self: &Arc<Self>,
        rank: u64,
        worker: Worker,
        epoch: u64,
        offset: u64,
        limit: Option<u64>,
    ) -> Result<impl Stream<Item = Result<RankBatch, JobError>> + Send + 'static, JobError> {
        let ready = self.ready().await?;
        let span = self.span(&ready, rank, worker, epoch, offset, limit)?;
        let (offset, end) = (span.from, span.to);
        self.lock().progress.start();
        self.touch();
        // The whole epoch, begun ahead by the stream before it, or a new
        // stream.
        let claimed = self.ahead.take(rank, epoch, ready.whole_epoch(&span));
        tracing::debug!(job = %self.id, rank, epoch, offset, end,
            begun_ahead = claimed.is_some(), "a reader asks");
        let batches = match claimed {
            Some((batches, next)) => {
                // Read now: if it issued its last window already, the
                // epoch after it begins here.
                if next.mark(NextEpoch::READ) {
                    self.read_ahead(&ready, rank, epoch + 1);
                }
                batches
            }
            None => self.stream(ready, span, NextEpoch::read()),
        };
        let job = Arc::clone(self);
        Ok(futures::stream::unfold(batches, move |mut rx| {
            let job = Arc::clone(&job);
            async move {
                let Some(item) = rx.recv().await else {
                    // The stream ended: what it delivered is saved now,
                    // not at the next delivery that may never come.
                    job.save_in_background();
                    return None;
                };
                let item = item.map(|mut d| {
                    job.delivered(rank, worker, epoch, &mut d);
                    d
                });
                Some((item, rx))
            }
        }))
    }

    /// The positions a reader asks for, checked against the job: its
    /// rank, worker and epoch, and an offset within the worker's part (at
    /// a batch's start when the part is every Nth batch).
    fn span(
        &self,
        ready: &Ready,
        rank: u64,
        worker: Worker,
        epoch: u64,
        offset: u64,
        limit: Option<u64>,
    ) -> Result<Span, JobError> {
        if rank >= self.spec.world_size {
            return Err(JobError::OutOfRange {
                what: "rank",
                value: rank,
                end: self.spec.world_size,
            });
        }
        if epoch >= self.spec.epochs {
            return Err(JobError::OutOfRange {
                what: "epoch",
                value: epoch,
                end: self.spec.epochs,
            });
        }
        if worker.index >= worker.count {
            return Err(JobError::OutOfRange {
                what: "worker",
                value: worker.index,
                end: worker.count,
            });
        }
        let first = ready.first_epoch();
        if epoch < first {
            return Err(JobError::InvalidOptions(format!(
                "epoch {epoch}: this job resumes a training at epoch {first}, and reads \
                 epochs {first}..{}",
                self.spec.epochs
            )));
        }
        let layout = ready.layout_of(epoch);
        let batch = layout.batch_size;
        let share = worker.len(layout.per_rank(), batch);
        if offset > share {
            return Err(JobError::OutOfRange {
                what: "offset",
                value: offset,
                end: share + 1,
            });
        }
        if worker.count > 1 && !offset.is_multiple_of(batch) && offset != share {
            return Err(JobError::InvalidOptions(format!(
                "offset {offset}: a worker's part is whole batches of {batch}, and is \
                 resumed at a batch's start"
            )));
        }
        Ok(Span {
            rank,
            worker,
            epoch,
            from: offset,
            to: limit.map_or(share, |l| offset.saturating_add(l).min(share)),
        })
    }

    /// Starts the stream of `span` on the jobs' runtime: its batches, as
    /// made, in a channel of [`CHANNEL_BATCHES`].
    /// `next`: when it begins the epoch after it (see [`NextEpoch`]).
    pub(in crate::job) fn stream(
        self: &Arc<Self>,
        ready: Arc<Ready>,
        span: Span,
        next: Arc<NextEpoch>,
    ) -> Batches {
        let (tx, rx) = mpsc::channel(CHANNEL_BATCHES);
        let cancel = self.stop.child();
        let batches = Batches::new(rx, cancel.on_drop());
        let job = Arc::clone(self);
        sluice_base::task::detach_on(&self.runtime, async move {
            let mut cancelled = job.state.subscribe();
            let work = job.produce(&ready, span, next, &tx, cancel);
            let outcome = tokio::select! {
                r = work => r,
                _ = cancelled.wait_for(|s| *s == JobState::Cancelled) => {
                    Err(JobError::Cancelled { job: job.id.clone() })
                }
                // The reader left: its windows stop now (dropping `work`
                // aborts them), not when the next batch finds no one to
                // take it; so does the next epoch begun for it.
                () = tx.closed() => {
                    job.ahead.forget(span.rank, span.epoch + 1);
                    Ok(())
                }
            };
            if let Err(e) = outcome {
                // A reader that left cancels its stream's work, which may
                // end with that cancellation before `tx.closed()` is seen:
                // that is the reader's leaving, not the job's failure.
                let left = tx.is_closed();
                if !left && !matches!(e, JobError::Unavailable { .. } | JobError::Cancelled { .. })
                {
                    job.fail(&e);
                }
                let _closed = tx.send(Err(e)).await;
            }
        });
        batches
    }

    /// Whether `rank`'s `epoch` was begun ahead and waits for its reader.
    pub fn begun_ahead(&self, rank: u64, epoch: u64) -> bool {
        self.ahead.has(rank, epoch)
    }

    /// Begins `rank`'s `epoch` from offset 0 for a reader yet to ask (see
    /// [`super::ahead`]); dropped after [`AHEAD_WAIT`] if none does.
    pub(in crate::job) fn read_ahead(self: &Arc<Self>, ready: &Arc<Ready>, rank: u64, epoch: u64) {
        let readable = matches!(*self.state.borrow(), JobState::Running | JobState::Done);
        // Speculative work never takes the room readers' windows need: it
        // begins only while half the node's window budget is free.
        let budget = self.session.window_budget();
        let roomy = budget.available() >= (budget.bytes() / 2).max(AHEAD_ROOM);
        if epoch >= self.spec.epochs
            || !readable
            || !roomy
            || self.ahead.has(rank, epoch)
            || self.ahead.was_asked(rank, epoch)
        {
            return;
        }
        let span = Span {
            rank,
            worker: Worker::ALL,
            epoch,
            from: 0,
            to: ready.layout_of(epoch).per_rank(),
        };
        tracing::debug!(job = %self.id, rank, epoch, "the next epoch begun ahead");
        let id = self.ahead.offer(rank, epoch, {
            let next = Arc::new(NextEpoch::default());
            (
                self.stream(Arc::clone(ready), span, Arc::clone(&next)),
                next,
            )
        });
        let job = Arc::downgrade(self);
        sluice_base::task::detach_on(&self.runtime, async move {
            tokio::time::sleep(AHEAD_WAIT).await;
            if let Some(job) = job.upgrade() {
                job.ahead.expire(id);
            }
        });
    }
}
