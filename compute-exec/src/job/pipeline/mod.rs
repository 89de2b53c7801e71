//! The stream of an epoch: a rank's positions `from..to`, delivered in
//! batches of `batch_size`, in the epoch's order. [`Job::deliver`] checks
//! a reader's request, takes over the epoch begun ahead for it or starts
//! the stream ([`Job::stream`]) on the jobs' runtime, and counts each
//! batch as its reader receives it; a whole epoch's stream begins the
//! rank's next epoch ahead ([`Job::read_ahead`], see `crate::job::ahead`).
//! The stream is one staged pipeline whose whole shape is
//! [`Job::produce`]:
//!
//! ```text
//!  the job's plan, placed once at submit, bound to the stream's epoch
//!    (`crate::job::placed`: its seed/epoch literals, bad-sample log, cancel)
//!  windows   positions from..to ─► windows of whole batches, sized by bytes
//!            and the stream's pace (`windows`, `pace`; the last one cut
//!            begins the next epoch of a whole-epoch stream:
//!            `crate::job::ahead`)
//!  fetch     per window: output cache ─► window budget ─► the plan, run on
//!            the jobs' runtime over the rows' ids ─► retry a lost node
//!            (`fetch`)
//!  in order  WINDOWS_RUNNING windows at once, WINDOWS_WAITING more done
//!            early and waiting (`crate::job::in_order`)
//!  rebatch   rows back at their slots ─► batches; the finish stage
//!            (normalize) runs as they are cut (`crate::job::rebatch`)
//!  sink      the reader's channel (`deliver`): full, the windows stop,
//!            then the reads
//! ```
//!
//! Sizing, statistics, re-planning and bad samples are the job's
//! [`observe::Observe`]r's, told at each window and batch, not the
//! stages' (its rules for bad samples: [`bad_tally`]). Every knob is in
//! [`options`], with its reason. Nothing per window depends on the size
//! of the dataset: rows are named by id, the plan is the epoch's.

pub mod bad_tally;
pub mod deliver;
pub mod fetch;
pub mod observe;
pub mod options;
pub mod pace;
pub mod windows;

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use futures::{Stream, StreamExt};
use sluice_udfs::OnError;
use sluice_udfs::UdfEnv;
use sluice_udfs::env::Cancel;
use tokio::sync::mpsc;

use self::deliver::{Sink, deliver};
use self::fetch::Fetch;
use self::observe::JobObserver;
use self::options::{AHEAD_ROOM, AHEAD_WAIT, CHANNEL_BATCHES, WINDOWS_RUNNING, WINDOWS_WAITING};
use self::windows::{Sizing, Span, windows};
use super::Job;
use super::ahead::{Batches, NextEpoch};
use super::in_order::InOrder;
use super::order::Worker;
use super::placed::StreamPlan;
use super::query::udf_options;
use super::rank_batch::RankBatch;
use super::rebatch::Rebatcher;
use super::run::Ready;
use super::status::JobState;
use crate::error::JobError;
use crate::replicas::index::SampleIndex;
use crate::session::output_cache::OutputCache;

impl Job {
    /// Rank `rank`'s share of `epoch` from position `offset`, at most
    /// `limit` positions: batches of `batch_size` rows in the epoch's
    /// order, each counted as delivered when its reader takes it. How
    /// they travel on is the reader's (`crate::trainer`'s carriers).
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
        self.reading();
        // The whole epoch, begun ahead by the stream before it, or a new
        // stream.
        let claimed = self.ahead().take(rank, epoch, ready.whole_epoch(&span));
        tracing::debug!(job = %self.id(), rank, epoch, offset, end,
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
        if rank >= self.spec().world_size {
            return Err(JobError::OutOfRange {
                what: "rank",
                value: rank,
                end: self.spec().world_size,
            });
        }
        if epoch >= self.spec().epochs {
            return Err(JobError::OutOfRange {
                what: "epoch",
                value: epoch,
                end: self.spec().epochs,
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
                self.spec().epochs
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
    fn stream(self: &Arc<Self>, ready: Arc<Ready>, span: Span, next: Arc<NextEpoch>) -> Batches {
        let (tx, rx) = mpsc::channel(CHANNEL_BATCHES);
        let cancel = self.stop().child();
        let batches = Batches::new(rx, cancel.on_drop());
        let job = Arc::clone(self);
        sluice_base::task::detach_on(self.runtime(), async move {
            let mut cancelled = job.watch_state();
            let work = job.produce(&ready, span, next, &tx, cancel);
            let outcome = tokio::select! {
                r = work => r,
                _ = cancelled.wait_for(|s| *s == JobState::Cancelled) => {
                    Err(JobError::Cancelled { job: job.id().to_string() })
                }
                // The reader left: its windows stop now (dropping `work`
                // aborts them), not when the next batch finds no one to
                // take it; so does the next epoch begun for it.
                () = tx.closed() => {
                    job.ahead().forget(span.rank, span.epoch + 1);
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
        self.ahead().has(rank, epoch)
    }

    /// Begins `rank`'s `epoch` from offset 0 for a reader yet to ask (see
    /// [`crate::job::ahead`]); dropped after [`AHEAD_WAIT`] if none does.
    fn read_ahead(self: &Arc<Self>, ready: &Arc<Ready>, rank: u64, epoch: u64) {
        let readable = matches!(self.state(), JobState::Running | JobState::Done);
        // Speculative work never takes the room readers' windows need: it
        // begins only while half the node's window budget is free.
        let budget = self.session().window_budget();
        let roomy = budget.available() >= (budget.bytes() / 2).max(AHEAD_ROOM);
        if epoch >= self.spec().epochs
            || !readable
            || !roomy
            || self.ahead().has(rank, epoch)
            || self.ahead().was_asked(rank, epoch)
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
        tracing::debug!(job = %self.id(), rank, epoch, "the next epoch begun ahead");
        let id = self.ahead().offer(rank, epoch, {
            let next = Arc::new(NextEpoch::default());
            (
                self.stream(Arc::clone(ready), span, Arc::clone(&next)),
                next,
            )
        });
        let job = Arc::downgrade(self);
        sluice_base::task::detach_on(self.runtime(), async move {
            tokio::time::sleep(AHEAD_WAIT).await;
            if let Some(job) = job.upgrade() {
                job.ahead().expire(id);
            }
        });
    }

    /// Runs the windows of `span` and hands their batches to `sink` until
    /// the span ends or the reader leaves. A whole epoch's stream begins
    /// the next epoch when it cuts its last window (`next`, see
    /// [`super::ahead`]); `cancel` stops its UDFs.
    pub(super) async fn produce(
        self: &Arc<Self>,
        ready: &Arc<Ready>,
        span: Span,
        next: Arc<NextEpoch>,
        sink: &impl Sink,
        cancel: Cancel,
    ) -> Result<(), JobError> {
        let asked = std::time::Instant::now();
        let plan = self.bind(span.epoch, cancel)?;
        // However this stream ends (the reader left, the job was
        // cancelled, a window failed), its UDFs stop at their next row.
        let _stop = plan.udfs().cancel.on_drop();
        tracing::debug!(job = %self.id(), rank = span.rank, epoch = span.epoch,
            from = span.from, to = span.to,
            bound_ms = asked.elapsed().as_secs_f64() * 1e3, "a stream begins");
        let batch = self.spec().batch_size;
        let sizing = Sizing::default();
        let fetched = Arc::new(AtomicU64::new(0));
        let fetch = Fetch {
            ready: Arc::clone(ready),
            order: ready.order(span.epoch),
            layout: ready.layout_of(span.epoch),
            rank: span.rank,
            worker: span.worker,
            plan: Arc::clone(&plan),
            budget: self.session().window_budget().clone(),
            outputs: self.output_cache(&ready.index),
            schema: Arc::clone(self.rows_schema()),
            storage_wait: Duration::from_secs_f64(self.spec().storage_wait_s),
            sizing: sizing.clone(),
            fetched: Arc::clone(&fetched),
        };
        let last = self.next_epoch_after(ready, span, next);
        let cut = windows(span, batch, sizing.clone(), last);
        let windows = InOrder::new(
            cut.map(move |(a, b)| fetch.window(a, b)),
            WINDOWS_RUNNING,
            WINDOWS_WAITING,
        );
        let rebatch = Rebatcher::new(
            Arc::clone(self.schema()),
            self.finishes().cloned(),
            batch as usize,
            span.from,
        );
        let observer = JobObserver::start(self, &plan, sizing, fetched).await;
        deliver(windows, rebatch, span.to, observer, sink).await
    }

    /// The job's plan, placed at submit (or since re-placed), bound to
    /// `epoch` and to UDFs `cancel` stops: nothing is planned again.
    fn bind(&self, epoch: u64, cancel: Cancel) -> Result<Arc<StreamPlan>, JobError> {
        let mut options = udf_options(self.spec(), epoch, self.session().limits());
        // A random job's decode stages are the same every epoch: the
        // node's stage cache keeps them (a deterministic job's whole rows
        // are the output cache's).
        options.cache_stages = !self.placed().same_every_epoch();
        let udfs = UdfEnv::cancelled_by(options, self.stage_stats().clock(), cancel);
        Ok(Arc::new(self.placed().for_stream(&udfs)?))
    }

    /// What a stream of `span` does when it cuts its last window: a whole
    /// epoch's begins the rank's next epoch, once (`next`).
    fn next_epoch_after(
        self: &Arc<Self>,
        ready: &Arc<Ready>,
        span: Span,
        next: Arc<NextEpoch>,
    ) -> Option<Box<dyn FnOnce() + Send>> {
        if !ready.whole_epoch(&span) {
            return None;
        }
        let (job, ready) = (Arc::clone(self), Arc::clone(ready));
        Some(Box::new(move || {
            if next.mark(NextEpoch::ISSUED) {
                job.read_ahead(&ready, span.rank, span.epoch + 1);
            }
        }))
    }
}

impl Job {
    /// The node's output cache and this job's identity in it, when the
    /// job qualifies (see the module docs) and the cache is enabled.
    /// `index` is the job's: its pins name the versions its keys are rows of.
    fn output_cache(&self, index: &SampleIndex) -> Option<(Arc<OutputCache>, u64)> {
        let cache = self.session().output_cache();
        if !cache.enabled()
            || self.spec().on_error == OnError::Null
            || !self.placed().same_every_epoch()
        {
            return None;
        }
        let pins: Vec<String> = index
            .pins()
            .iter()
            .map(|p| format!("{}@{}", p.node, p.version))
            .collect();
        let identity = format!(
            "{}\n{:?}\n{:?}\n{}",
            self.sql(),
            self.spec().on_error,
            self.session().limits(),
            pins.join(",")
        );
        let id = cache.identity(&identity);
        Some((Arc::clone(cache), id))
    }
}
