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
//! A job's record (spec, pins, state, progress) is saved in the job store
//! at each change of state, as it progresses (at most once a second), when
//! a reader's stream ends and when the server stops, so that a restarted
//! server serves the same job: same versions, same order, same bytes, and
//! the progress it had.

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use arrow::datatypes::{Schema, SchemaRef};
use futures::{Stream, TryStreamExt};
use sluice_flight::gather::Finishes;
use sluice_flight::{SLOT, StorageEndpoint};
use sluice_planner::{Explanation, Offload};
use sluice_udfs::ErrorLog;
use sluice_udfs::env::{BadSample, Cancel};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, watch};

use super::adapt::Adaptive;
use super::ahead::{Batches, NextEpoch, ReadAhead};
use super::error::{Failure, JobError};
use super::index::{Pin, SampleIndex};
use super::order::Layout;
use super::pipeline::options::CHANNEL_BATCHES;
use super::pipeline::options::{AHEAD_ROOM, AHEAD_WAIT};
use super::pipeline::windows::Span;
use super::placed::JobPlan;
use super::query::{JobQuery, WindowPlan, udf_options};
use super::rank_batch::RankBatch;
use super::report::{NodeReport, ReportBounds, Reported};
use super::routes::RankRoutes;
use super::spec::JobSpec;
use super::stages::{JobStages, StageStats};
use super::status::{JobState, JobStatus, Progress, TierBytes};
use super::store::{JobRecord, JobStore};
use crate::session::ComputeSession;

/// What a running job holds: its samples' row ids and its layout.
#[derive(Debug)]
pub struct Ready {
    /// Where each sample is.
    pub index: SampleIndex,
    /// Samples per epoch and rank.
    pub layout: Layout,
    orders: Mutex<Vec<(u64, Arc<Vec<u64>>)>>,
}

impl Ready {
    /// The order of `epoch` (the last few are kept).
    pub fn order(&self, epoch: u64) -> Arc<Vec<u64>> {
        let mut orders = self.orders.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, o)) = orders.iter().find(|(e, _)| *e == epoch) {
            return Arc::clone(o);
        }
        let o = Arc::new(self.layout.epoch_order(epoch));
        orders.push((epoch, Arc::clone(&o)));
        if orders.len() > 4 {
            orders.remove(0);
        }
        o
    }
}

#[derive(Debug)]
struct Inner {
    error: Option<String>,
    failure: Option<Failure>,
    ready: Option<Arc<Ready>>,
    progress: Progress,
    warnings: Vec<String>,
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
    /// The table it reads and the versions it pinned on each node.
    table: String,
    /// The table's schema and the filters choosing the samples, as planned.
    table_schema: SchemaRef,
    filters: Vec<datafusion::logical_expr::Expr>,
    pins: Vec<(Arc<dyn StorageEndpoint>, u64)>,
    store: Option<Arc<JobStore>>,
    /// Records are numbered as made; the newest written is kept here, so
    /// that a record written late never replaces a newer one.
    next_save: std::sync::atomic::AtomicU64,
    saved: Mutex<u64>,
    /// When it last did anything (planned, read): an idle job expires.
    active: Mutex<std::time::Instant>,
}

/// Writes `record` (number `seq`) unless a newer one was written.
fn write_record(store: &JobStore, saved: &Mutex<u64>, seq: u64, record: &JobRecord) {
    let mut newest = saved.lock().unwrap_or_else(|e| e.into_inner());
    if seq < *newest {
        return;
    }
    match store.save(record) {
        Ok(()) => *newest = seq,
        Err(e) => tracing::warn!("job {}: cannot save its record: {e}", record.id),
    }
}

impl Job {
    /// Plans `spec` on `session` (every error of the SQL or the options
    /// comes back here) and pins the version each node holds now, as job
    /// `id` in state pending, whose index and windows will run on
    /// `runtime`; its record goes to `store`.
    pub async fn plan(
        id: String,
        spec: JobSpec,
        session: Arc<ComputeSession>,
        runtime: Handle,
        store: Option<Arc<JobStore>>,
    ) -> Result<Self, JobError> {
        Self::plan_pinned(id, spec, session, runtime, store, None, SystemTime::now()).await
    }

    /// A job saved by an earlier run of the server, planned again over the
    /// versions it pinned then.
    pub async fn restore(
        record: JobRecord,
        session: Arc<ComputeSession>,
        runtime: Handle,
        store: Option<Arc<JobStore>>,
    ) -> Result<Self, JobError> {
        let created = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs_f64(record.created);
        let job = Self::plan_pinned(
            record.id.clone(),
            record.spec.clone(),
            session,
            runtime,
            store,
            Some(&record.pins),
            created,
        )
        .await?;
        {
            let mut inner = job.lock();
            inner.progress = Progress::restore(&record.progress);
            inner.routes = record.routes.clone();
            inner.error = record.error.clone();
            inner.failure = record.failure.clone();
        }
        job.bad.merge(record.skipped, record.bad_samples.clone());
        if record.state.is_final() {
            job.state.send_replace(record.state);
        }
        Ok(job)
    }

    async fn plan_pinned(
        id: String,
        spec: JobSpec,
        session: Arc<ComputeSession>,
        runtime: Handle,
        store: Option<Arc<JobStore>>,
        pinned: Option<&[Pin]>,
        created: SystemTime,
    ) -> Result<Self, JobError> {
        let sql = spec.validate()?;
        let offload = spec.offload.offload()?;
        let options = udf_options(&spec, 0, session.limits());
        let query = JobQuery::prepare(&session, &sql, options, Arc::default()).await?;
        let table = query.table();
        let held = session.pins(&table).await;
        let pins = match pinned {
            None => held,
            Some(pins) => {
                // Nodes are matched by name, each once.
                let mut free = held;
                let mut out = Vec::with_capacity(pins.len());
                for p in pins {
                    let Some(i) = free.iter().position(|(e, _)| e.name() == p.node) else {
                        return Err(JobError::Unavailable {
                            node: p.node.clone(),
                            reason: format!(
                                "it holds version {} of {table}, and is not among the nodes \
                                 this server reaches",
                                p.version
                            ),
                        });
                    };
                    let (e, _) = free.swap_remove(i);
                    out.push((e, p.version));
                }
                out
            }
        };
        let stages = StageStats::default();
        let WindowPlan {
            plan: window,
            columns,
            finishes,
        } = query.window_plan(&stages.clock())?;
        // A job is calibrated under `auto` even where its sides share one
        // machine (a query there is not: the measured costs cannot change
        // the cut). It runs for epochs, and the rate it was planned at is
        // shown beside the rate it runs at for all of them: from the UDF
        // profiles alone, that estimate was 2x off on a dataset of PNGs.
        let placed = query
            .prepared
            .place_with(window.clone(), offload, matches!(offload, Offload::Auto))
            .await
            .map_err(|e| JobError::InvalidOptions(e.to_string()))?;
        let full = placed.plan.schema();
        let fields: Vec<_> = full
            .fields()
            .iter()
            .filter(|f| f.name() != SLOT)
            .cloned()
            .collect();
        // A finished column is the SQL's; the windows make its input.
        let rows_schema = Arc::new(Schema::new(fields.clone()));
        let fields: Vec<_> = fields
            .into_iter()
            .enumerate()
            .map(
                |(i, f)| match finishes.as_ref().and_then(|d| d[i].as_ref()) {
                    Some(_) => Arc::clone(&columns.fields()[i]),
                    None => f,
                },
            )
            .collect();
        let table_schema = query.pipeline.scan.source.schema();
        let filters = query.filters();
        let plan = Arc::new(JobPlan::new(query.prepared, window, placed.plan));
        let adaptive = Adaptive::new(placed.explanation);
        Ok(Self {
            id,
            spec,
            sql,
            offload,
            created,
            session,
            adaptive,
            placed: plan,
            stages,
            ahead: ReadAhead::default(),
            stop: Cancel::default(),
            schema: Arc::new(Schema::new(fields)),
            rows_schema,
            finishes,
            state: watch::Sender::new(JobState::Pending),
            inner: Mutex::new(Inner {
                error: None,
                failure: None,
                ready: None,
                progress: Progress::default(),
                warnings: Vec::new(),
                routes: RankRoutes::default(),
            }),
            bad: ErrorLog::default(),
            runtime,
            table,
            table_schema,
            filters,
            pins,
            store,
            next_save: std::sync::atomic::AtomicU64::new(0),
            saved: Mutex::new(0),
            active: Mutex::new(std::time::Instant::now()),
        })
    }

    /// Resolves the samples to row ids of the pinned versions and makes
    /// the job readable.
    pub async fn start(&self) {
        match self.index().await {
            Ok(index) => {
                if index.duplicates() > 0 {
                    let warning = format!(
                        "{} row(s) not delivered: their keys are on more than one storage \
                         node, and each key is read once",
                        index.duplicates()
                    );
                    tracing::warn!("job {}: {warning}", self.id);
                    self.lock().warnings.push(warning);
                }
                let layout = self.spec.layout(index.len() as u64);
                let ready = Arc::new(Ready {
                    index,
                    layout,
                    orders: Mutex::new(Vec::new()),
                });
                let empty = layout.per_rank() == 0;
                let done = {
                    let mut inner = self.lock();
                    inner.ready = Some(ready);
                    empty || inner.progress.positions >= self.total(&layout)
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

    async fn index(&self) -> Result<SampleIndex, JobError> {
        SampleIndex::build(&self.table, &self.table_schema, &self.filters, &self.pins).await
    }

    /// Positions every rank reads over all epochs.
    fn total(&self, layout: &Layout) -> u64 {
        layout.per_rank() * layout.world_size * self.spec.epochs
    }

    /// The record the job store keeps.
    pub fn record(&self) -> JobRecord {
        let inner = self.lock();
        let (skipped, bad_samples) = self.bad.snapshot();
        JobRecord {
            id: self.id.clone(),
            spec: self.spec.clone(),
            created: self
                .created
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            pins: self
                .pins
                .iter()
                .map(|(e, v)| Pin {
                    node: e.name().to_string(),
                    version: *v,
                })
                .collect(),
            state: self.state(),
            error: inner.error.clone(),
            failure: inner.failure.clone(),
            progress: inner.progress.record(),
            skipped,
            bad_samples,
            routes: inner.routes.clone(),
        }
    }

    /// Saves its record (a failure to is logged: the job goes on). A
    /// cancelled job has none.
    pub fn save(&self) {
        if let Some((store, seq, record)) = self.to_save() {
            write_record(&store, &self.saved, seq, &record);
        }
    }

    /// [`Job::save`] on the jobs' blocking pool: progress saved while a
    /// reader's stream is polled, off the runtime serving requests.
    fn save_in_background(self: &Arc<Self>) {
        if let Some((store, seq, record)) = self.to_save() {
            let job = Arc::clone(self);
            self.runtime
                .spawn_blocking(move || write_record(&store, &job.saved, seq, &record));
        }
    }

    /// The store, the record's sequence number and the record, unless
    /// there is nothing to save.
    fn to_save(&self) -> Option<(Arc<JobStore>, u64, JobRecord)> {
        if self.state() == JobState::Cancelled {
            return None;
        }
        let store = Arc::clone(self.store.as_ref()?);
        let seq = self
            .next_save
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some((store, seq, self.record()))
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

    /// The storage nodes it reads, with the versions pinned.
    pub fn pins(&self) -> &[(Arc<dyn StorageEndpoint>, u64)] {
        &self.pins
    }

    /// The dataset it reads (as its SQL names it: `name` or
    /// `name@version`).
    pub fn dataset(&self) -> &str {
        &self.table
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
        let changed = self.state.send_if_modified(|s| {
            if s.is_final() {
                false
            } else {
                *s = JobState::Failed;
                true
            }
        });
        if changed {
            tracing::warn!("job {} failed: {e}", self.id);
            let mut inner = self.lock();
            inner.error = Some(e.to_string());
            inner.failure = Some(e.failure());
            drop(inner);
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
    pub async fn layout(&self) -> Result<Layout, JobError> {
        Ok(self.ready().await?.layout)
    }

    /// Records a batch handed to a reader.
    fn delivered(self: &Arc<Self>, rank: u64, epoch: u64, d: &mut RankBatch) {
        self.touch();
        if let Some((count, fresh)) = d.bad.take() {
            self.record_bad(count, fresh);
        }
        let mut inner = self.lock();
        inner
            .progress
            .deliver(rank, epoch, d.from, d.next_offset, d.num_rows() as u64);
        self.settle(inner);
    }

    /// After progress: done when every position of every epoch was
    /// delivered (saved at once), else saved at most every second.
    fn settle(self: &Arc<Self>, mut inner: std::sync::MutexGuard<'_, Inner>) {
        let total = inner
            .ready
            .as_ref()
            .map(|r| r.layout.per_rank() * r.layout.world_size * self.spec.epochs);
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
        let now = Reported {
            delivered: p.delivered,
            bytes: p.bytes,
            skipped,
            named: named.len(),
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
        inner
            .progress
            .merge(&report.ranges, report.delivered, report.bytes);
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

    /// Its status.
    pub fn status(&self) -> JobStatus {
        let state = self.state();
        let inner = self.lock();
        let layout = inner.ready.as_ref().map(|r| r.layout);
        let total = layout.map(|l| l.per_rank() * l.world_size * self.spec.epochs);
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
            progress,
            delivered: inner.progress.delivered,
            samples_per_s: inner.progress.rate(),
            bytes: inner.progress.bytes,
            skipped,
            bad_samples,
            warnings: inner.warnings.clone(),
            observed: self.adaptive.last(),
            replans: self.adaptive.history(),
            ranks: layout.map_or_else(Vec::new, |l| inner.progress.ranks(l.per_rank())),
            stages: self.stage_view(false),
        }
    }

    /// Its per-stage statistics: of the last seconds, or of the whole job
    /// (`total`, EXPLAIN ANALYZE); `None` before its first window.
    pub fn stage_view(&self, total: bool) -> Option<JobStages> {
        let e = self.explanation();
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

    /// Rank `rank`'s share of `epoch` from position `offset`, at most
    /// `limit` positions: batches of `batch_size` rows in the epoch's order.
    pub async fn deliver(
        self: &Arc<Self>,
        rank: u64,
        epoch: u64,
        offset: u64,
        limit: Option<u64>,
    ) -> Result<impl Stream<Item = Result<RankBatch, JobError>> + Send + 'static, JobError> {
        let s = self
            .deliver_with(rank, epoch, offset, limit, |_| Ok(()))
            .await?;
        Ok(s.map_ok(|(d, ())| d))
    }

    /// [`Job::deliver`], with `finish` applied to each batch as its reader
    /// receives it: the reader's encoding, say.
    pub async fn deliver_with<T, F>(
        self: &Arc<Self>,
        rank: u64,
        epoch: u64,
        offset: u64,
        limit: Option<u64>,
        finish: F,
    ) -> Result<impl Stream<Item = Result<(RankBatch, T), JobError>> + Send + 'static, JobError>
    where
        T: Send + 'static,
        F: Fn(&RankBatch) -> Result<T, JobError> + Send + Sync + 'static,
    {
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
        let ready = self.ready().await?;
        let per_rank = ready.layout.per_rank();
        if offset > per_rank {
            return Err(JobError::OutOfRange {
                what: "offset",
                value: offset,
                end: per_rank + 1,
            });
        }
        let end = limit.map_or(per_rank, |l| offset.saturating_add(l).min(per_rank));
        self.lock().progress.start();
        self.touch();
        // The whole epoch, begun ahead by the stream before it, or a new
        // stream.
        let claimed = self.ahead.take(rank, epoch, offset == 0 && end == per_rank);
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
            None => {
                let span = Span {
                    rank,
                    epoch,
                    from: offset,
                    to: end,
                };
                self.stream(ready, span, NextEpoch::read())
            }
        };
        let job = Arc::clone(self);
        let finish = Arc::new(finish);
        Ok(futures::stream::unfold(batches, move |mut rx| {
            let job = Arc::clone(&job);
            let finish = Arc::clone(&finish);
            async move {
                let Some(item) = rx.recv().await else {
                    // The stream ended: what it delivered is saved now,
                    // not at the next delivery that may never come.
                    job.save_in_background();
                    return None;
                };
                let item = item.and_then(|mut d| {
                    job.delivered(rank, epoch, &mut d);
                    finish(&d).map(|t| (d, t))
                });
                Some((item, rx))
            }
        }))
    }

    /// Starts the stream of `span` on the jobs' runtime: its batches, as
    /// made, in a channel of [`CHANNEL_BATCHES`].
    /// `next`: when it begins the epoch after it (see [`NextEpoch`]).
    pub(super) fn stream(
        self: &Arc<Self>,
        ready: Arc<Ready>,
        span: Span,
        next: Arc<NextEpoch>,
    ) -> Batches {
        let (tx, rx) = mpsc::channel(CHANNEL_BATCHES);
        let cancel = self.stop.child();
        let batches = Batches::new(rx, cancel.on_drop());
        let job = Arc::clone(self);
        self.runtime.spawn(async move {
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
                if !matches!(e, JobError::Unavailable { .. } | JobError::Cancelled { .. }) {
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
    pub(super) fn read_ahead(self: &Arc<Self>, ready: &Arc<Ready>, rank: u64, epoch: u64) {
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
            epoch,
            from: 0,
            to: ready.layout.per_rank(),
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
        self.runtime.spawn(async move {
            tokio::time::sleep(AHEAD_WAIT).await;
            if let Some(job) = job.upgrade() {
                job.ahead.expire(id);
            }
        });
    }
}
