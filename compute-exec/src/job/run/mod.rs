//! [`Job`]: a submitted pipeline with its options — its states, and the
//! delivery of a rank's share of an epoch ([`Job::deliver`]).
//!
//! ```text
//!  submit ─► plan the SQL (errors → 4xx), pin each node's version ─► Pending
//!         ─► index: the samples' row ids, sorted by key (once) ─► Running
//!  deliver(rank, epoch, offset) ─► the epoch's stream (see `pipeline`) ─► Done
//!                                    when every position has been read
//! ```
//!
//! Here: the job, its states and what it reads. Beside it:
//! - [`create`]: planned at submit, or restored from its record;
//! - [`reader`]: a rank's share of an epoch for its reader, and the next
//!   epoch begun ahead;
//! - [`progress`]: batches received, compute nodes' reports, done;
//! - [`record`]: the record that survives a restart, and its saving, so
//!   that a restarted server serves the same job: same versions, same
//!   order, same bytes, and the progress it had;
//! - `mix_shares`: a mixture as it runs: its parts' weights and sizes;
//! - `ready`: `Ready`: what a job holds once its samples are listed;
//! - `source`: `Source`: what a job reads for one of its pipelines.

mod create;
mod mix_shares;
mod progress;
mod reader;
mod ready;
mod record;
mod source;

pub use ready::Ready;
pub use source::Source;

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
use super::order::EpochShape;
use super::placed::JobPlan;
use super::routes::RankRoutes;
use super::spec::JobSpec;
use super::stages::{JobStages, StageStats};
use super::status::{JobState, JobStatus};
use super::store::JobStore;
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
    sources: Vec<Source>,
    store: Option<Arc<JobStore>>,
    /// Records are numbered as made; the newest written is kept here, so
    /// that a record written late never replaces a newer one.
    next_save: std::sync::atomic::AtomicU64,
    saved: Mutex<u64>,
    /// When it last did anything (planned, read): an idle job expires.
    active: Mutex<std::time::Instant>,
}

impl Job {
    /// Resolves the samples to row ids of the pinned versions and makes
    /// the job readable.
    pub async fn start(&self) {
        match self.index().await {
            Ok(index) => {
                if index.replicated() > 0 {
                    tracing::info!(
                        "job {}: {} of {} samples are held by more than one storage node \
                         (replicas); each is read once, from a live holder",
                        self.id,
                        index.replicated(),
                        index.len()
                    );
                }
                let ready = Arc::new(Ready::new(&self.spec, index));
                ready.failover.on_corrupt(self.repair_on_corrupt());
                if let Err(e) = self.spec.check_samples(ready.epoch_len()) {
                    self.fail(&e);
                    return;
                }
                let total = ready.positions(self.spec.epochs);
                let done = {
                    let mut inner = self.lock();
                    inner.ready = Some(ready);
                    total == 0 || inner.progress.positions >= total
                };
                self.state.send_if_modified(|s| {
                    if *s == JobState::Pending {
                        *s = if done {
                            JobState::Done
                        } else {
                            JobState::Running
                        };
                        true
                    } else {
                        false
                    }
                });
                self.save();
            }
            Err(e) => self.fail(&e),
        }
    }

    /// What its reads do when a node's replica is first found corrupt:
    /// the session's [`RepairNode`](crate::session::RepairNode), if it has
    /// one, runs in the background over that node and the job's datasets.
    fn repair_on_corrupt(&self) -> crate::job::failover::OnCorrupt {
        let session = Arc::clone(&self.session);
        let runtime = self.runtime.clone();
        let datasets: Vec<String> = self
            .sources
            .iter()
            .map(|s| s.table.split('@').next().unwrap_or_default().to_string())
            .collect();
        Box::new(move |node: &str| {
            let Some(repair) = session.repair().cloned() else {
                return;
            };
            let run = (repair.0)(Arc::clone(&session), node.to_string(), datasets.clone());
            sluice_base::task::detach_on(&runtime, run);
        })
    }

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
        e.mixture = self.mix_lines();
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
    fn fail(&self, e: &JobError) {
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
        if let Some(Err(e)) = self.store.as_ref().map(|s| s.remove(&self.id)) {
            tracing::warn!("job {}: cannot remove its record: {e}", self.id);
        }
    }

    /// Waits until the job is readable.
    async fn ready(&self) -> Result<Arc<Ready>, JobError> {
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
            mix: self.mix_status_of(&inner),
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
}
