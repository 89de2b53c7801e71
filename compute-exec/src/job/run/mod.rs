//! [`Job`]: a submitted pipeline with its options — its states, what it
//! reads, its progress and records. `impl Job` is in three files: here,
//! [`create`] (how it comes to be and starts), and `crate::job::pipeline`
//! (a rank's share of an epoch: [`Job::deliver`], the stream).
//!
//! ```text
//!  submit ─► plan the SQL (errors → 4xx), pin each node's version ─► Pending
//!         ─► index: the samples' row ids, sorted by key (once) ─► Running
//!  deliver(rank, epoch, offset) ─► the epoch's stream (see `pipeline`) ─► Done
//!                                    when every position has been read
//! ```
//! - [`create`]: planned at submit, or restored from its record; started;
//! - [`progress`]: batches received, nodes' reports, done, in its state;
//! - [`record`]: the record that survives a restart, and its saving (a
//!   restarted server serves the same job, with the progress it had);
//! - `mix_shares`: a mixture as it runs: its parts' weights and sizes;
//! - `ready`: `Ready`: what a job holds once its samples are listed;
//! - `source`: `Source` and `Sources`: what a job reads.

mod create;
mod mix_shares;
mod progress;
mod ready;
mod record;
mod source;

pub use ready::Ready;
pub use source::{Source, Sources};

use self::record::Saves;

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use arrow::datatypes::SchemaRef;
use sluice_base::BadSample;
use sluice_flight::gather::Finishes;
use sluice_planner::{Explanation, Offload};
use sluice_udfs::ErrorLog;
use sluice_udfs::env::Cancel;
use tokio::runtime::Handle;
use tokio::sync::watch;

use super::adapt::Adaptive;
use super::ahead::ReadAhead;
use super::coverage::Progress;
use super::mix_status::MixStatus;
use super::order::EpochShape;
use super::order::Worker;
use super::placed::JobPlan;
use super::rank_batch::RankBatch;
use super::report::{NodeReport, Reported};
use super::routes::RankRoutes;
use super::spec::JobSpec;
use super::stages::{JobStages, StageStats};
use super::status::{JobState, JobStatus};
use super::store::JobRecord;
use crate::error::{Failure, JobError};
use crate::session::ComputeSession;

#[derive(Debug)]
struct Inner {
    error: Option<String>,
    failure: Option<Failure>,
    ready: Option<Arc<Ready>>,
    progress: Progress,
    routes: RankRoutes,
}

/// See the module docs.
#[derive(Debug)]
pub struct Job {
    id: String,
    spec: JobSpec,
    sql: String,
    offload: Offload,
    created: SystemTime,
    session: Arc<ComputeSession>,
    /// Its plan, prepared and placed once: every stream runs it.
    placed: Arc<JobPlan>,
    /// Where its stages run now, and the moves that led there.
    adaptive: Adaptive,
    /// Where its time goes, stage by stage.
    stages: StageStats,
    /// Each rank's next epoch, begun before it is asked for.
    ahead: ReadAhead,
    /// The parent of its streams' UDF cancel flags (see [`Job::cancel`]).
    stop: Cancel,
    /// Its columns, as trainers receive them.
    schema: SchemaRef,
    /// The columns its windows make: [`Job::schema`]'s, but for those
    /// finished as batches are written out (see [`super::finish`]).
    rows_schema: SchemaRef,
    finishes: Option<Finishes>,
    state: watch::Sender<JobState>,
    inner: Mutex<Inner>,
    bad: ErrorLog,
    /// Where its CPU work runs (off the runtime serving requests).
    runtime: Handle,
    /// What it reads: its dataset, or its mixture's parts.
    sources: Sources,
    /// Where its records go (see [`record`]).
    saves: Saves,
    /// When it last did anything (planned, read): an idle job expires.
    active: Mutex<std::time::Instant>,
}

impl Job {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Its id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// What was submitted.
    pub fn spec(&self) -> &JobSpec {
        &self.spec
    }

    /// Its state now.
    pub fn state(&self) -> JobState {
        *self.state.borrow()
    }

    /// How long since it was planned (or restored) or last read.
    pub fn idle_for(&self) -> std::time::Duration {
        self.active
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .elapsed()
    }

    fn touch(&self) {
        *self.active.lock().unwrap_or_else(|e| e.into_inner()) = std::time::Instant::now();
    }

    /// The schema of its batches.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The columns its windows make, before the finishes.
    pub(super) fn rows_schema(&self) -> &SchemaRef {
        &self.rows_schema
    }

    /// The columns finished as its batches are written out.
    pub(super) fn finishes(&self) -> Option<&Finishes> {
        self.finishes.as_ref()
    }

    /// Why its stages run where they do now.
    pub fn explanation(&self) -> Explanation {
        let mut e = self.adaptive.explanation();
        e.at_delivery = super::finish::describe(&self.schema, self.finishes.as_ref());
        e.mixture = mix_shares::lines(self.mix_status());
        e
    }

    /// Its placement as it runs: moves, measurements.
    pub fn adaptive(&self) -> &Adaptive {
        &self.adaptive
    }

    /// Its plan, prepared and placed once, that every stream runs.
    pub fn placed(&self) -> &Arc<JobPlan> {
        &self.placed
    }

    /// Its SQL (the plan form compiled).
    pub fn sql(&self) -> &str {
        &self.sql
    }

    /// Where its stages may run.
    pub fn offload(&self) -> Offload {
        self.offload
    }

    /// The session it plans in.
    pub fn session(&self) -> &Arc<ComputeSession> {
        &self.session
    }

    /// The runtime of its CPU work.
    pub fn runtime(&self) -> &Handle {
        &self.runtime
    }

    /// Where sample `s` (in key order) is: node, version and row id.
    pub fn locate(&self, s: u64) -> Option<(String, u64, u32)> {
        let ready = self.lock().ready.clone()?;
        ready.index.locate(s).map(|(n, v, r)| (n.to_string(), v, r))
    }

    /// Adds `count` bad samples (the first of them in `fresh`) to its log.
    pub(super) fn record_bad(&self, count: u64, fresh: Vec<BadSample>) {
        self.bad.merge(count, fresh);
    }

    /// Adds bytes storage nodes sent to the compute side.
    pub(super) fn record_link(&self, bytes: u64) {
        self.lock().progress.bytes.link += bytes;
    }

    /// Marks it failed by `e`.
    pub(in crate::job) fn fail(&self, e: &JobError) {
        // The error is in place before the state says failed: a status
        // read in between never shows a failed job without its reason.
        let mut inner = self.lock();
        let changed = self.state.send_if_modified(|s| {
            if s.is_final() {
                false
            } else {
                *s = JobState::Failed;
                true
            }
        });
        if changed {
            inner.error = Some(e.to_string());
            inner.failure = Some(e.failure());
        }
        drop(inner);
        if changed {
            tracing::warn!("job {} failed: {e}", self.id);
            self.save();
        }
    }

    /// Cancels it: streams in flight end, its listing is freed.
    pub fn cancel(&self) {
        self.state.send_if_modified(|s| {
            if s.is_final() {
                false
            } else {
                *s = JobState::Cancelled;
                true
            }
        });
        {
            let mut inner = self.lock();
            inner.ready = None;
            inner.progress.release();
        }
        self.ahead.clear();
        // Its streams' UDFs stop at their next row now: their tasks, which
        // see the cancel too, run on the executor whose threads may all be
        // inside those UDFs.
        self.stop.cancel();
        self.saves.remove(&self.id);
    }

    /// Waits until the job is readable.
    pub(in crate::job) async fn ready(&self) -> Result<Arc<Ready>, JobError> {
        let mut rx = self.state.subscribe();
        let state = *rx
            .wait_for(|s| *s != JobState::Pending)
            .await
            .map_err(|e| JobError::Internal(e.to_string()))?;
        match state {
            JobState::Cancelled => Err(JobError::Cancelled {
                job: self.id.clone(),
            }),
            JobState::Failed => {
                let inner = self.lock();
                Err(JobError::failed(
                    &self.id,
                    inner.error.as_deref().unwrap_or_default(),
                    inner.failure.as_ref(),
                ))
            }
            _ => self
                .lock()
                .ready
                .clone()
                .ok_or_else(|| JobError::Cancelled {
                    job: self.id.clone(),
                }),
        }
    }

    /// Samples per epoch and per rank, once known.
    pub async fn layout(&self) -> Result<EpochShape, JobError> {
        Ok(self.ready().await?.layout)
    }

    /// The first epoch the job reads and its layout, once known (a
    /// resumed job's begins where the training stopped).
    pub async fn first_epoch(&self) -> Result<(u64, EpochShape), JobError> {
        let ready = self.ready().await?;
        let first = ready.first_epoch();
        Ok((first, ready.layout_of(first)))
    }

    /// Its status.
    pub fn status(&self) -> JobStatus {
        let state = self.state();
        let inner = self.lock();
        let layout = inner.ready.as_ref().map(|r| r.layout);
        let total = inner.ready.as_ref().map(|r| r.positions(self.spec.epochs));
        let progress = match (state, total) {
            (JobState::Done, _) => 1.0,
            (_, Some(t)) if t > 0 => inner.progress.positions as f64 / t as f64,
            _ => 0.0,
        };
        let (skipped, bad_samples) = self.bad.snapshot();
        JobStatus {
            id: self.id.clone(),
            state,
            error: inner.error.clone(),
            error_kind: inner.failure.as_ref().map(|f| f.kind.clone()),
            endpoints: Vec::new(),
            created: self
                .created
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            spec: self.spec.clone(),
            sql: self.spec.sql.is_none().then(|| self.sql.clone()),
            samples: layout.map(|l| l.samples),
            samples_per_rank: layout.map(|l| l.per_rank()),
            resumed: inner.ready.as_ref().and_then(|r| r.resumed()),
            mix: mix_shares::status(&self.sources, &inner),
            progress,
            delivered: inner.progress.delivered,
            samples_per_s: inner.progress.rate(),
            bytes: inner.progress.bytes,
            skipped,
            bad_samples,
            failovers: inner
                .ready
                .as_ref()
                .map_or_else(Vec::new, |r| r.failover.all_events()),
            observed: self.adaptive.last(),
            replans: self.adaptive.history(),
            ranks: layout.map_or_else(Vec::new, |l| inner.progress.ranks(l.per_rank())),
            stages: self.stage_view(false),
        }
    }

    /// Its per-stage statistics: of the last seconds, or of the whole job
    /// (`total`, EXPLAIN ANALYZE); `None` before its first window.
    pub fn stage_view(&self, total: bool) -> Option<JobStages> {
        // The placement alone: `status` holds the job's lock here, which
        // the mixture's lines of `explanation` take.
        let e = self.adaptive.explanation();
        let estimate = e.pipelines.first().map(|p| &p.rates);
        if total {
            self.stages.total(&e.resources, estimate)
        } else {
            self.stages.view(&e.resources, estimate)
        }
    }

    /// Where the streams of the job record what they do.
    pub(super) fn stage_stats(&self) -> &StageStats {
        &self.stages
    }

    /// What it reads.
    pub fn sources(&self) -> &Sources {
        &self.sources
    }

    /// Whether it is a weighted mixture of pipelines.
    pub fn is_mixture(&self) -> bool {
        self.spec.mix.is_some()
    }

    /// Whether `who` may read its streams, status and plan: every dataset
    /// it reads (`crate::access::may_read_job`).
    pub fn may_be_read_by(&self, who: &sluice_access::Grant) -> Result<(), String> {
        crate::access::may_read_job(who, self.id(), self.sources.datasets())
    }

    /// Whether its placement may move while it runs: under `auto`, on
    /// separate machines, and not a mixture (each part keeps the
    /// placement it was calibrated for at submit).
    pub fn may_replan(&self) -> bool {
        !self.is_mixture() && self.adaptive().may_move(self.offload())
    }

    /// Its mixture's status now (`None`: not a mixture, or not started).
    pub fn mix_status(&self) -> Option<MixStatus> {
        mix_shares::status(&self.sources, &self.lock())
    }

    /// The record the job store keeps.
    pub fn record(&self) -> JobRecord {
        record::record_of(self, &self.lock())
    }

    /// Saves its record (a failure to is logged: the job goes on). A
    /// cancelled job has none.
    pub fn save(&self) {
        self.save_on(None);
    }

    /// [`Job::save`] on the jobs' blocking pool: progress saved while a
    /// reader's stream is polled, off the runtime serving requests.
    pub(in crate::job) fn save_in_background(&self) {
        self.save_on(Some(&self.runtime));
    }

    fn save_on(&self, runtime: Option<&Handle>) {
        if self.state() != JobState::Cancelled {
            self.saves.save(|| self.record(), runtime);
        }
    }

    /// Notes that a reader began a stream of it.
    pub(in crate::job) fn reading(&self) {
        self.lock().progress.start();
        self.touch();
    }

    /// Records a batch handed to `worker` of `rank`'s reader.
    pub(in crate::job) fn delivered(
        &self,
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
        inner.delivered(rank, worker, epoch, self.spec.batch_size, d);
        self.settle(inner);
    }

    /// After progress: done when every position of every epoch was
    /// delivered (saved at once), else saved at most every second.
    fn settle(&self, mut inner: std::sync::MutexGuard<'_, Inner>) {
        let (done, due) = inner.settled(self.spec.epochs);
        drop(inner);
        if done {
            self.state.send_if_modified(|s| {
                let running = *s == JobState::Running;
                if running {
                    *s = JobState::Done;
                }
                running
            });
            self.save();
        } else if due {
            self.save_in_background();
        }
    }

    /// This node's report to the coordinator of what changed since `last`.
    pub fn report_since(&self, node: &str, last: &Reported) -> Option<(NodeReport, Reported)> {
        self.lock().report_since(node, last, &self.bad)
    }

    /// Notes that `rank` is served by the compute node at `node` (what a
    /// trainer was just told): that node's reports of it count.
    pub fn route(&self, rank: u64, node: &str) {
        self.lock().routes.note(rank, node);
    }

    /// Adds a compute node's report, checked first (see [`progress`]).
    pub fn merge_report(&self, report: NodeReport) -> Result<(), JobError> {
        let mut inner = self.lock();
        inner.merge_report(report, self.spec.epochs, &self.bad)?;
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

    /// Each rank's next epoch begun ahead.
    pub(in crate::job) fn ahead(&self) -> &ReadAhead {
        &self.ahead
    }

    /// The parent of its streams' cancel flags.
    pub(in crate::job) fn stop(&self) -> &Cancel {
        &self.stop
    }

    /// Its state, as it changes.
    pub(in crate::job) fn watch_state(&self) -> watch::Receiver<JobState> {
        self.state.subscribe()
    }
}
