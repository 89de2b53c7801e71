//! [`Job`]: a submitted pipeline with its options, and the delivery of a
//! rank's share of an epoch ([`Job::deliver`]).
//!
//! ```text
//!  submit ─► plan the SQL (errors → 4xx) ─► Pending ─► list the samples' keys ─► Running
//!  deliver(rank, epoch, offset):
//!    positions offset.. ─► windows of samples ─► pipeline WHERE key IN (window)
//!      (placed by the planner; storage fragments filter the catalog first)
//!    ─► rows put back in the epoch's order ─► batches of batch_size
//! ```
//!
//! The rows of a window come back in whatever order the storage nodes and
//! partitions produce them; they are matched to positions by key, so the
//! order a rank sees depends on (seed, epoch) only.

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{Schema, SchemaRef};
use datafusion::common::{Column, TableReference};
use datafusion::logical_expr::{
    Expr, LogicalPlan, LogicalPlanBuilder, Projection, TableScanBuilder, col, lit,
};
use datafusion::physical_plan::collect;
use futures::{Stream, TryStreamExt};
use sluice_planner::pipeline::Pipeline;
use sluice_planner::{Explanation, Offload};
use sluice_udfs::env::BadSample;
use sluice_udfs::{ErrorLog, UdfEnv, UdfOptions};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, watch};

use super::order::Layout;
use super::rebatch::Rebatcher;
use super::spec::{JobError, JobSpec};
use super::status::{JobState, JobStatus, Progress};
use crate::session::{ComputeSession, Prepared};

/// The dataset column holding each sample's key.
pub const KEY: &str = "key";
/// The column a job adds to its pipeline to match rows to positions.
pub const JOB_KEY: &str = "__job_key";
/// Samples fetched per query, at least (rounded up to whole batches).
pub const WINDOW: u64 = 256;

/// A batch of a rank's stream: the positions it covers and the offset to
/// resume after it.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The rows.
    pub batch: RecordBatch,
    /// The first position it covers.
    pub from: u64,
    /// The offset after it: ask for this one to resume.
    pub next_offset: u64,
}

/// The positions `from..to` of rank `rank`'s share of `epoch`.
#[derive(Debug, Clone, Copy)]
struct Span {
    rank: u64,
    epoch: u64,
    from: u64,
    to: u64,
}

/// What a running job holds: its samples' keys and its layout.
#[derive(Debug)]
struct Ready {
    keys: Vec<String>,
    layout: Layout,
    orders: Mutex<Vec<(u64, Arc<Vec<u64>>)>>,
}

impl Ready {
    /// The order of `epoch` (the last few are kept).
    fn order(&self, epoch: u64) -> Arc<Vec<u64>> {
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
    ready: Option<Arc<Ready>>,
    progress: Progress,
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
    explanation: Explanation,
    schema: SchemaRef,
    state: watch::Sender<JobState>,
    inner: Mutex<Inner>,
    bad: ErrorLog,
    /// Where its CPU work runs (off the runtime serving requests).
    runtime: Handle,
}

/// The plan of `pipeline` with its scan reading every column, `keys` (if
/// any) as a filter on the sample key, and the key added as [`JOB_KEY`].
fn job_plan(pipeline: &Pipeline, keys: Option<&[&str]>) -> datafusion::common::Result<LogicalPlan> {
    let scan = &pipeline.scan;
    let full = TableScanBuilder::from(scan.clone())
        .with_projection(None)
        .with_fetch(None)
        .build()?;
    let mut b = LogicalPlanBuilder::from(LogicalPlan::TableScan(full));
    if let Some(LogicalPlan::Filter(f)) = &pipeline.filter {
        b = b.filter(f.predicate.clone())?;
    }
    let key = Expr::Column(Column::new(
        Some::<TableReference>(scan.table_name.clone()),
        KEY,
    ));
    if let Some(keys) = keys {
        b = b.filter(
            key.clone()
                .in_list(keys.iter().map(|k| lit(*k)).collect(), false),
        )?;
    }
    let mut exprs = pipeline.projection.expr.clone();
    exprs.push(key.alias(JOB_KEY));
    b = b.project(exprs)?;
    if let Some(checks) = pipeline.checks_filter() {
        b = b.filter(checks)?;
    }
    b.build()
}

/// The pipeline of a prepared job query.
fn pipeline_of(prepared: &Prepared) -> Result<Pipeline, JobError> {
    // A query of plain columns optimizes to a bare (filtered) scan: it is
    // the pipeline projecting those columns.
    let plan = match &prepared.plan {
        p @ (LogicalPlan::TableScan(_) | LogicalPlan::Filter(_)) => {
            let columns = p.schema().columns().into_iter().map(Expr::Column).collect();
            Projection::try_new(columns, Arc::new(p.clone()))
                .map(LogicalPlan::Projection)
                .map_err(|e| JobError::Internal(e.to_string()))?
        }
        p => p.clone(),
    };
    let p = Pipeline::find(&plan).ok_or_else(|| {
        JobError::NotAPipeline(
            "a job reads one dataset through a projection (UDFs, columns) and filters; \
             joins, aggregates, sorts and limits are not pipelines"
                .into(),
        )
    })?;
    if !p
        .scan
        .source
        .schema()
        .fields()
        .iter()
        .any(|f| f.name() == KEY)
    {
        return Err(JobError::NotAPipeline(format!(
            "dataset {} has no {KEY} column",
            p.dataset()
        )));
    }
    Ok(p)
}

/// `sql` prepared on `session` under `options`, with its pipeline.
async fn prepare_pipeline(
    session: &ComputeSession,
    sql: &str,
    options: UdfOptions,
) -> Result<(Arc<UdfEnv>, Prepared, Pipeline), JobError> {
    let udfs = UdfEnv::new(options);
    let prepared = session
        .prepare(sql, &udfs)
        .await
        .map_err(|e| JobError::planning(&e))?;
    let pipeline = pipeline_of(&prepared)?;
    Ok((udfs, prepared, pipeline))
}

impl Job {
    /// Plans `spec` on `session` (every error of the SQL or the options
    /// comes back here), as job `id` in state pending, whose listing and
    /// windows will run on `runtime`.
    pub async fn plan(
        id: String,
        spec: JobSpec,
        session: Arc<ComputeSession>,
        runtime: Handle,
    ) -> Result<Self, JobError> {
        let sql = spec.validate()?;
        let offload = spec.offload.offload()?;
        let (_, prepared, pipeline) =
            prepare_pipeline(&session, &sql, udf_options(&spec, 0)).await?;
        let plan = job_plan(&pipeline, None)
            .and_then(|p| prepared.optimize(p))
            .map_err(|e| JobError::InvalidSql(e.to_string()))?;
        let placed = prepared
            .place(plan, offload)
            .await
            .map_err(|e| JobError::InvalidOptions(e.to_string()))?;
        let full = placed.plan.schema();
        let fields: Vec<_> = full
            .fields()
            .iter()
            .filter(|f| f.name() != JOB_KEY)
            .cloned()
            .collect();
        Ok(Self {
            id,
            spec,
            sql,
            offload,
            created: SystemTime::now(),
            session,
            explanation: placed.explanation,
            schema: Arc::new(Schema::new(fields)),
            state: watch::Sender::new(JobState::Pending),
            inner: Mutex::new(Inner {
                error: None,
                ready: None,
                progress: Progress::default(),
            }),
            bad: ErrorLog::default(),
            runtime,
        })
    }

    /// Lists the samples (their keys, sorted) and makes the job readable.
    pub async fn start(&self) {
        match self.list_keys().await {
            Ok(keys) => {
                let layout = self.spec.layout(keys.len() as u64);
                let ready = Arc::new(Ready {
                    keys,
                    layout,
                    orders: Mutex::new(Vec::new()),
                });
                let empty = layout.per_rank() == 0;
                self.lock().ready = Some(ready);
                self.state.send_if_modified(|s| {
                    if *s == JobState::Pending {
                        *s = if empty {
                            JobState::Done
                        } else {
                            JobState::Running
                        };
                        true
                    } else {
                        false
                    }
                });
            }
            Err(e) => self.fail(&e.to_string()),
        }
    }

    async fn list_keys(&self) -> Result<Vec<String>, JobError> {
        // Listed under the `null` policy: under `skip` the plan filters on
        // the UDFs' results, which would decode every sample to list it.
        // Bad samples are skipped (and counted) when delivered instead.
        let mut options = udf_options(&self.spec, 0);
        options.on_error = sluice_udfs::OnError::Null;
        let (_, prepared, pipeline) = prepare_pipeline(&self.session, &self.sql, options).await?;
        let plan = job_plan(&pipeline, None)
            .and_then(|p| {
                LogicalPlanBuilder::from(p)
                    .project(vec![col(JOB_KEY)])?
                    .build()
            })
            .and_then(|p| prepared.optimize(p))
            .map_err(|e| JobError::Internal(e.to_string()))?;
        let q = prepared
            .place(plan, Offload::Compute)
            .await
            .map_err(|e| JobError::running(&e))?;
        let batches = collect(q.plan, q.ctx.task_ctx())
            .await
            .map_err(|e| JobError::running(&e))?;
        let mut keys = Vec::new();
        for b in &batches {
            let c = arrow::compute::cast(b.column(0), &arrow::datatypes::DataType::Utf8)
                .map_err(|e| JobError::Internal(e.to_string()))?;
            keys.extend(c.as_string::<i32>().iter().flatten().map(str::to_owned));
        }
        keys.sort_unstable();
        let before = keys.len();
        keys.dedup();
        if keys.len() < before {
            tracing::warn!(
                "job {}: {} key(s) are on more than one storage node; each is read once",
                self.id,
                before - keys.len()
            );
        }
        Ok(keys)
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

    /// The schema of its batches.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Why its stages run where they do.
    pub fn explanation(&self) -> &Explanation {
        &self.explanation
    }

    /// Marks it failed.
    fn fail(&self, why: &str) {
        let changed = self.state.send_if_modified(|s| {
            if s.is_final() {
                false
            } else {
                *s = JobState::Failed;
                true
            }
        });
        if changed {
            tracing::warn!("job {} failed: {why}", self.id);
            self.lock().error = Some(why.to_string());
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
        let mut inner = self.lock();
        inner.ready = None;
        inner.progress.release();
    }

    /// Waits until the job is readable.
    async fn ready(&self) -> Result<Arc<Ready>, JobError> {
        let mut rx = self.state.subscribe();
        let state = *rx
            .wait_for(|s| *s != JobState::Pending)
            .await
            .map_err(|e| JobError::Internal(e.to_string()))?;
        match state {
            JobState::Cancelled => Err(JobError::Cancelled(self.id.clone())),
            JobState::Failed => Err(JobError::Failed(
                self.id.clone(),
                self.lock().error.clone().unwrap_or_default(),
            )),
            _ => self
                .lock()
                .ready
                .clone()
                .ok_or_else(|| JobError::Cancelled(self.id.clone())),
        }
    }

    /// Samples per epoch and per rank, once known.
    pub async fn layout(&self) -> Result<Layout, JobError> {
        Ok(self.ready().await?.layout)
    }

    /// Records a batch handed to a reader.
    fn delivered(&self, rank: u64, epoch: u64, d: &Delivery) {
        let mut inner = self.lock();
        inner.progress.deliver(
            rank,
            epoch,
            d.from,
            d.next_offset,
            d.batch.num_rows() as u64,
        );
        let total = inner
            .ready
            .as_ref()
            .map(|r| r.layout.per_rank() * r.layout.world_size * self.spec.epochs);
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
        }
    }

    /// Records Flight bytes sent to a trainer.
    pub fn sent(&self, bytes: u64) {
        self.lock().progress.bytes.trainer += bytes;
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
            created: self
                .created
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            spec: self.spec.clone(),
            sql: self.sql.clone(),
            samples: layout.map(|l| l.samples),
            samples_per_rank: layout.map(|l| l.per_rank()),
            progress,
            delivered: inner.progress.delivered,
            samples_per_s: inner.progress.rate(),
            bytes: inner.progress.bytes,
            skipped,
            bad_samples,
        }
    }

    /// Rank `rank`'s share of `epoch` from position `offset`, at most
    /// `limit` positions: batches of `batch_size` rows in the epoch's order.
    pub async fn deliver(
        self: &Arc<Self>,
        rank: u64,
        epoch: u64,
        offset: u64,
        limit: Option<u64>,
    ) -> Result<impl Stream<Item = Result<Delivery, JobError>> + Send + 'static, JobError> {
        let s = self
            .deliver_with(rank, epoch, offset, limit, |_| Ok(()))
            .await?;
        Ok(s.map_ok(|(d, ())| d))
    }

    /// [`Job::deliver`], with `finish` applied to each batch where the
    /// batches are made (on the jobs' runtime): a reader's encoding, say.
    pub async fn deliver_with<T, F>(
        self: &Arc<Self>,
        rank: u64,
        epoch: u64,
        offset: u64,
        limit: Option<u64>,
        finish: F,
    ) -> Result<impl Stream<Item = Result<(Delivery, T), JobError>> + Send + 'static, JobError>
    where
        T: Send + 'static,
        F: Fn(&Delivery) -> Result<T, JobError> + Send + Sync + 'static,
    {
        if rank >= self.spec.world_size {
            return Err(JobError::OutOfRange(format!(
                "rank {rank} of a job of world_size {}",
                self.spec.world_size
            )));
        }
        if epoch >= self.spec.epochs {
            return Err(JobError::OutOfRange(format!(
                "epoch {epoch} of a job of {} epoch(s)",
                self.spec.epochs
            )));
        }
        let ready = self.ready().await?;
        let per_rank = ready.layout.per_rank();
        if offset > per_rank {
            return Err(JobError::OutOfRange(format!(
                "offset {offset} past the {per_rank} samples a rank reads per epoch"
            )));
        }
        let end = limit.map_or(per_rank, |l| offset.saturating_add(l).min(per_rank));
        self.lock().progress.start();
        let batch = self.spec.batch_size;
        let window = WINDOW.div_ceil(batch) * batch;
        let (tx, rx) = mpsc::channel((window / batch + 1) as usize);
        let job = Arc::clone(self);
        self.runtime.spawn(async move {
            let mut cancelled = job.state.subscribe();
            let span = Span {
                rank,
                epoch,
                from: offset,
                to: end,
            };
            let work = job.produce(&ready, span, &finish, &tx);
            let outcome = tokio::select! {
                r = work => r,
                _ = cancelled.wait_for(|s| *s == JobState::Cancelled) => {
                    Err(JobError::Cancelled(job.id.clone()))
                }
            };
            if let Err(e) = outcome {
                if !matches!(e, JobError::Unavailable(_) | JobError::Cancelled(_)) {
                    job.fail(&e.to_string());
                }
                let _closed = tx.send(Err(e)).await;
            }
        });
        let job = Arc::clone(self);
        Ok(futures::stream::unfold(rx, move |mut rx| {
            let job = Arc::clone(&job);
            async move {
                let item = rx.recv().await?;
                if let Ok((d, _)) = &item {
                    job.delivered(rank, epoch, d);
                }
                Some((item, rx))
            }
        }))
    }

    /// Runs the windows of positions `from..to` and sends their batches,
    /// each with what `finish` makes of it.
    async fn produce<T>(
        &self,
        ready: &Ready,
        span: Span,
        finish: &(dyn Fn(&Delivery) -> Result<T, JobError> + Send + Sync),
        tx: &mpsc::Sender<Result<(Delivery, T), JobError>>,
    ) -> Result<(), JobError> {
        let Span {
            rank,
            epoch,
            from,
            to,
        } = span;
        let (udfs, prepared, pipeline) =
            prepare_pipeline(&self.session, &self.sql, udf_options(&self.spec, epoch)).await?;
        let order = ready.order(epoch);
        let batch = self.spec.batch_size;
        let window = WINDOW.div_ceil(batch) * batch;
        let mut rebatch = Rebatcher::new(Arc::clone(&self.schema), batch as usize, from);
        let mut reported = 0;
        let mut start = from;
        while start < to {
            let stop = (start + window).min(to);
            let samples = ready.layout.rank_samples(&order, rank, start, stop);
            let keys: Vec<&str> = samples
                .iter()
                .map(|&s| ready.keys[s as usize].as_str())
                .collect();
            let rows = self.window(&prepared, &pipeline, &keys).await?;
            let (total, bad) = udfs.errors.snapshot();
            if total > reported {
                let fresh = bad.into_iter().skip(reported as usize).collect();
                self.bad.merge(total - reported, fresh);
                reported = total;
            }
            let link = prepared
                .tally()
                .bytes
                .swap(0, std::sync::atomic::Ordering::Relaxed);
            self.lock().progress.bytes.link += link;
            let missing = rebatch.add(&rows, JOB_KEY, &keys, start)?;
            if self.spec.on_error != sluice_udfs::OnError::Skip {
                // Under `skip` the UDFs counted them; otherwise the sample
                // left the dataset after the job listed it.
                for k in missing {
                    self.bad.record(BadSample {
                        udf: "job".into(),
                        key: k.to_string(),
                        reason: "not in the dataset any more".into(),
                    });
                }
            }
            start = stop;
            while let Some(cut) = rebatch.next(start >= to)? {
                let done = finish(&cut)?;
                if tx.send(Ok((cut, done))).await.is_err() {
                    return Ok(());
                }
            }
        }
        if let Some(cut) = rebatch.finish(to)? {
            let done = finish(&cut)?;
            let _closed = tx.send(Ok((cut, done))).await;
        }
        Ok(())
    }

    /// The pipeline's rows for `keys` (with [`JOB_KEY`]), in any order.
    async fn window(
        &self,
        prepared: &Prepared,
        pipeline: &Pipeline,
        keys: &[&str],
    ) -> Result<Vec<RecordBatch>, JobError> {
        let mut distinct = keys.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        let plan = job_plan(pipeline, Some(&distinct))
            .and_then(|p| prepared.optimize(p))
            .map_err(|e| JobError::Internal(e.to_string()))?;
        let q = prepared
            .place(plan, self.offload)
            .await
            .map_err(|e| JobError::running(&e))?;
        collect(q.plan, q.ctx.task_ctx())
            .await
            .map_err(|e| JobError::running(&e))
    }
}

fn udf_options(spec: &JobSpec, epoch: u64) -> UdfOptions {
    UdfOptions {
        on_error: spec.on_error,
        seed: spec.shuffle.map_or(0, |s| s.seed),
        epoch,
        limits: sluice_udfs::Limits::default(),
    }
}
