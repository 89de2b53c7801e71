//! What a stream tells its job as it goes, kept out of the stages:
//! [`Observe`] is called at each window fetched and each batch handed
//! on, and [`JobObserver`] is the job's:
//!
//! - **sizing**: each window's output bytes per sample and the stream's
//!   pace (`super::pace`) size the next window (`super::windows::Sizing`);
//! - **statistics**: samples made, link bytes, windows waiting, the
//!   reader's channel and the time blocked on it (`crate::job::stages`);
//! - **adapt**: on an auto job over separate machines, every window feeds
//!   the job's meter, and a review that finds the plan contradicted
//!   places the window plan again (`crate::job::adapt`);
//! - **bad samples**: those met since the last batch travel with the next
//!   one (counted when a reader receives it), and a sample that came back
//!   with no row is an error unless the error policy skipped it (the
//!   rules: `super::bad_tally`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sluice_flight::StorageEndpoint;
use sluice_udfs::OnError;

use super::bad_tally::{BadTally, Unsent};
use super::fetch::Fetched;
use super::pace::Pace;
use super::windows::Sizing;
use crate::error::JobError;
use crate::job::Job;
use crate::job::adapt::{GAIN, Meter, choice_of, observed_link};
use crate::job::placed::StreamPlan;

/// See the module docs.
pub trait Observe: Send {
    /// A window fetched, before its rows are put in batches.
    fn window(&mut self, w: &Fetched) -> impl Future<Output = ()> + Send;

    /// Checks the samples of the window at `start` (`samples`) that came
    /// back with no row (`missing`, by slot).
    fn missing(&mut self, missing: &[u32], samples: &[u64], start: u64) -> Result<(), JobError>;

    /// The bad samples to hand on with the next batch.
    fn take_bad(&mut self) -> Option<Unsent>;

    /// A batch handed to the reader, whose channel held `queued` batches,
    /// after `waited` blocked on it.
    fn sent(&mut self, queued: u64, waited: Duration);

    /// Every batch of the last window handed on.
    fn handed_on(&mut self);

    /// The stream ended with every batch handed on.
    fn end(self);
}

/// The job's observer of one stream (see the module docs).
#[derive(Debug)]
pub struct JobObserver {
    job: Arc<Job>,
    plan: Arc<StreamPlan>,
    sizing: Sizing,
    /// The stream's wall time per sample, for `sizing`.
    pace: Pace,
    /// Windows fetched and not yet taken (the fetch stage counts them up).
    fetched: Arc<AtomicU64>,
    /// The job's meter, when it may move its cut.
    meter: Option<(Meter, Vec<Arc<dyn StorageEndpoint>>)>,
    /// Samples made by this stream.
    made: u64,
    /// Bad samples refused and rows missing.
    bad: BadTally,
    /// When the batches of the last window were all handed on.
    last_window: Instant,
}

impl JobObserver {
    /// The observer of a stream of `job` running `plan`, noting windows
    /// in `sizing` and reading the windows waiting off `fetched`.
    pub async fn start(
        job: &Arc<Job>,
        plan: &Arc<StreamPlan>,
        sizing: Sizing,
        fetched: Arc<AtomicU64>,
    ) -> Self {
        let meter = if job.may_replan() {
            let nodes = job.sources().nodes();
            Some((Meter::start(&nodes).await, nodes))
        } else {
            None
        };
        Self {
            job: Arc::clone(job),
            plan: Arc::clone(plan),
            sizing,
            pace: Pace::default(),
            fetched,
            meter,
            made: 0,
            bad: BadTally::default(),
            last_window: Instant::now(),
        }
    }

    /// Reviews the plan with what the meter measured: under an observed
    /// link that contradicts the plan's, places the job's window plan
    /// again, and makes it the job's plan (every stream's next windows
    /// run it) if it promises [`GAIN`] × the observed rate. A failed
    /// re-plan keeps the plan that runs.
    async fn review(job: &Job, meter: &mut Meter, nodes: &[Arc<dyn StorageEndpoint>], made: u64) {
        let cores = job.placed().prepared().resources().compute_cores;
        let observed = meter.review(nodes, cores).await;
        if !job.adaptive().observed(&observed) {
            return;
        }
        let Some(link) = observed_link(&observed, job.adaptive().assumed_link()) else {
            return;
        };
        let placed = match job.placed().place_under(link).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(
                    "job {}: re-planning failed, keeping the plan: {e}",
                    job.id()
                );
                return;
            }
        };
        let before = choice_of(&job.explanation());
        let after = choice_of(&placed.explanation);
        let promised = placed
            .explanation
            .pipelines
            .first()
            .map_or(0.0, |p| p.rates.per_s);
        if after == before || promised < GAIN * observed.samples_per_s {
            return;
        }
        tracing::info!(
            "job {}: {} bound at {:.0} samples/s ({:.0} B/s over the link): {before} -> {after}",
            job.id(),
            observed.bottleneck,
            observed.samples_per_s,
            observed.link_bytes_per_s
        );
        job.placed().replace(placed.plan);
        job.adaptive().moved(placed.explanation, observed, made);
    }
}

impl Observe for JobObserver {
    async fn window(&mut self, w: &Fetched) {
        let n = w.samples.len() as u64;
        tracing::trace!(job = %self.job.id(), start = w.start, samples = n,
            took_ms = w.took.as_secs_f64() * 1e3, "a window is done");
        let waiting = self.fetched.fetch_sub(1, Ordering::Relaxed);
        let bytes = w.rows.bytes() / (w.rows.len().max(1) as u64);
        let pace = self.pace.window(n, w.took, Instant::now());
        self.sizing.measured(bytes, pace);
        // Counted when the next batch reaches a reader.
        let (total, kept) = self.plan.udfs().errors.snapshot();
        self.bad.logged(total, kept);
        let link = self.plan.tally().bytes.swap(0, Ordering::Relaxed);
        self.job.record_link(link);
        self.made += n;
        self.job
            .stage_stats()
            .window(n, link, waiting, self.last_window.elapsed());
        if let Some((meter, nodes)) = self.meter.as_mut() {
            meter.window(n, link);
            if meter.due() {
                Self::review(&self.job, meter, nodes, self.made).await;
            }
        }
    }

    /// A sample with no row is one the error policy skipped, and named;
    /// any other is lost, and the stream fails naming it rather than end
    /// short. Under `skip`, no more rows may be missing than samples were
    /// skipped.
    fn missing(&mut self, missing: &[u32], samples: &[u64], start: u64) -> Result<(), JobError> {
        let skipping = self.job.spec().on_error == OnError::Skip;
        if self.bad.missing(missing.len() as u64, skipping) {
            return Ok(());
        }
        let Some(&first) = missing.first() else {
            return Ok(());
        };
        let position = start + u64::from(first);
        let at = self
            .job
            .locate(samples[first as usize])
            .map_or_else(String::new, |(node, version, row)| {
                format!(" (row {row} of version {version} on {node})")
            });
        Err(JobError::Internal(format!(
            "{} sample(s) of this window came back from no storage node, the first at \
             position {position}{at}",
            missing.len()
        )))
    }

    fn take_bad(&mut self) -> Option<Unsent> {
        self.bad.take()
    }

    fn sent(&mut self, queued: u64, waited: Duration) {
        self.pace.blocked(waited);
        self.job.stage_stats().sent(queued, waited);
        if let Some((meter, _)) = self.meter.as_mut() {
            meter.waited(waited);
        }
    }

    fn handed_on(&mut self) {
        self.last_window = Instant::now();
    }

    fn end(mut self) {
        // Met after the last batch (its samples all skipped): the reader
        // has had every batch of the span.
        if let Some((count, kept)) = self.bad.take() {
            self.job.record_bad(count, kept);
        }
    }
}
