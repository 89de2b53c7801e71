//! How a job comes to be: planned at submit ([`Job::plan`]: the SQL and
//! the options checked, the plan prepared and placed once, the version
//! each node holds pinned), or restored from its record after a restart
//! ([`Job::restore`]: the same plan over the versions it pinned then, and
//! the progress it had); then started ([`Job::start`]: its samples
//! listed, and it is readable).

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use arrow::datatypes::{DataType, Schema, SchemaRef};
use datafusion::logical_expr::LogicalPlan;
use sluice_flight::StorageEndpoint;
use sluice_flight::gather::Finishes;
use sluice_planner::fragment::SLOT;
use sluice_planner::{Explanation, Offload};
use sluice_udfs::ErrorLog;
use sluice_udfs::env::Cancel;
use tokio::runtime::Handle;
use tokio::sync::watch;

use super::{Inner, Job, Ready, Saves, Source, Sources};
use crate::error::JobError;
use crate::job::adapt::Adaptive;
use crate::job::ahead::ReadAhead;
use crate::job::coverage::Progress;
use crate::job::mix_plan::{source_field, union_of};
use crate::job::placed::JobPlan;
use crate::job::query::{JobQuery, WindowPlan, udf_options};
use crate::job::routes::RankRoutes;
use crate::job::spec::{JobSpec, Part};
use crate::job::stages::StageStats;
use crate::job::status::JobState;
use crate::job::store::{JobRecord, JobStore};
use crate::replicas::index::Pin;
use crate::session::{ComputeSession, PlannedQuery, Prepared};

impl Job {
    /// Resolves the samples to row ids of the pinned versions and makes
    /// the job readable.
    pub async fn start(&self) {
        match self.sources.index().await {
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
            Some(&record.part_pins()),
            created,
        )
        .await?;
        // A compute node's ledger is empty: the layouts are the record's.
        let mut job = job;
        for (source, layout) in job.sources.iter_mut().zip(&record.layouts) {
            if source.layout.is_none() {
                source.layout.clone_from(layout);
            }
        }
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
        pinned: Option<&[Vec<Pin>]>,
        created: SystemTime,
    ) -> Result<Self, JobError> {
        let spec = spec.hoisted()?;
        let parts = spec.validate()?;
        let offload = spec.offload.offload()?;
        let stages = StageStats::default();
        let mut planned = Vec::with_capacity(parts.len());
        for (i, part) in parts.into_iter().enumerate() {
            let pins = pinned.map(|p| p.get(i).map_or(&[][..], Vec::as_slice));
            let p = PartPlan::plan(&spec, &session, part, offload, pins, &stages).await;
            planned.push(p.map_err(|e| match spec.mix {
                Some(_) => in_part(e, i),
                None => e,
            })?);
        }
        let whole = match spec.mix {
            Some(_) => Whole::mixture(planned)?,
            None => Whole::one(planned),
        };
        let adaptive = Adaptive::new(whole.explanation);
        Ok(Self {
            id,
            spec,
            sql: whole.sql,
            offload,
            created,
            session,
            adaptive,
            placed: whole.placed,
            stages,
            ahead: ReadAhead::default(),
            stop: Cancel::default(),
            schema: whole.schema,
            rows_schema: whole.rows_schema,
            finishes: whole.finishes,
            state: watch::Sender::new(JobState::Pending),
            inner: Mutex::new(Inner {
                error: None,
                failure: None,
                ready: None,
                progress: Progress::default(),
                routes: RankRoutes::default(),
            }),
            bad: ErrorLog::default(),
            runtime,
            sources: Sources::new(whole.sources),
            saves: Saves::new(store),
            active: Mutex::new(std::time::Instant::now()),
        })
    }
}

/// An error of a mixture's part `i`, saying which.
fn in_part(e: JobError, i: usize) -> JobError {
    match e {
        JobError::InvalidSql(m) => JobError::InvalidSql(format!("mix part {}: {m}", i + 1)),
        JobError::InvalidOptions(m) => JobError::InvalidOptions(format!("mix part {}: {m}", i + 1)),
        JobError::NotAPipeline(m) => JobError::NotAPipeline(format!("mix part {}: {m}", i + 1)),
        other => other,
    }
}

/// One pipeline of a job planned and placed: the job's one, or a part of
/// its mixture.
struct PartPlan {
    part: Part,
    prepared: Prepared,
    window: LogicalPlan,
    placed: PlannedQuery,
    rows_schema: SchemaRef,
    schema: SchemaRef,
    finishes: Option<Finishes>,
    source: Source,
}

impl PartPlan {
    /// Plans `part` on `session` and pins the version each node holds now
    /// (or `pinned`, a restored job's).
    async fn plan(
        spec: &JobSpec,
        session: &Arc<ComputeSession>,
        part: Part,
        offload: Offload,
        pinned: Option<&[Pin]>,
        stages: &StageStats,
    ) -> Result<Self, JobError> {
        let options = udf_options(spec, 0, session.limits());
        let query = JobQuery::prepare(session, &part.sql, options, Arc::default()).await?;
        let table = query.table();
        let held = session.pins(&table).await;
        let pins = match pinned {
            None => held,
            Some(pins) => pinned_again(held, pins, &table)?,
        };
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
        let (rows_schema, schema) = schemas(&placed.plan.schema(), &columns, finishes.as_ref());
        let source = Source {
            name: part.name.clone(),
            weight: part.weight,
            table_schema: query.pipeline.scan.source.schema(),
            filters: query.filters(),
            layout: session.ledger().layout(&table),
            table,
            pins,
        };
        Ok(Self {
            part,
            prepared: query.prepared,
            window,
            placed,
            rows_schema,
            schema,
            finishes,
            source,
        })
    }
}

/// What a job runs, from its parts.
struct Whole {
    sql: String,
    placed: Arc<JobPlan>,
    explanation: Explanation,
    schema: SchemaRef,
    rows_schema: SchemaRef,
    finishes: Option<Finishes>,
    sources: Vec<Source>,
}

impl Whole {
    /// A job of one pipeline.
    fn one(mut parts: Vec<PartPlan>) -> Self {
        let p = parts.remove(0);
        Self {
            sql: p.part.sql,
            placed: Arc::new(JobPlan::new(p.prepared, p.window, p.placed.plan)),
            explanation: p.placed.explanation,
            schema: p.schema,
            rows_schema: p.rows_schema,
            finishes: p.finishes,
            sources: vec![p.source],
        }
    }

    /// A mixture: its parts' placed plans under one union (see
    /// `crate::job::mix_plan`), their rows and a `source` column.
    fn mixture(parts: Vec<PartPlan>) -> Result<Self, JobError> {
        let first = &parts[0];
        for (i, p) in parts.iter().enumerate().skip(1) {
            check_agrees(first, p, i)?;
        }
        let with_source = |schema: &SchemaRef| {
            let mut fields: Vec<_> = schema.fields().iter().cloned().collect();
            fields.push(Arc::new(source_field()));
            Arc::new(Schema::new(fields))
        };
        let rows_schema = with_source(&first.rows_schema);
        let schema = with_source(&first.schema);
        let finishes: Option<Finishes> = first
            .finishes
            .as_ref()
            .map(|f| f.iter().cloned().chain([None]).collect());
        let sql = parts
            .iter()
            .map(|p| {
                format!(
                    "-- {} (weight {})\n{}",
                    p.part.name, p.part.weight, p.part.sql
                )
            })
            .collect::<Vec<_>>()
            .join("\n");
        let mut explanation = first.placed.explanation.clone();
        for p in &parts[1..] {
            let e = &p.placed.explanation;
            explanation.pipelines.extend(e.pipelines.iter().cloned());
            explanation
                .storage_fragments
                .extend(e.storage_fragments.iter().cloned());
            explanation.compute_fragment.push_str(&e.compute_fragment);
        }
        let union = union_of(
            parts
                .iter()
                .map(|p| (p.part.name.clone(), Arc::clone(&p.placed.plan)))
                .collect(),
        )
        .map_err(|e| JobError::Internal(format!("cannot make the mixture's plan: {e}")))?;
        let windows: Vec<LogicalPlan> = parts.iter().map(|p| p.window.clone()).collect();
        let mut sources = Vec::with_capacity(parts.len());
        let mut prepared = None;
        for p in parts {
            prepared.get_or_insert(p.prepared);
            sources.push(p.source);
        }
        let prepared = prepared.ok_or_else(|| JobError::Internal("a mixture of none".into()))?;
        Ok(Self {
            sql,
            placed: Arc::new(JobPlan::mixture(prepared, &windows, union)),
            explanation,
            schema,
            rows_schema,
            finishes,
            sources,
        })
    }
}

/// Part `i` of a mixture gives the same columns as the first, finished
/// the same way: the rows of all parts go into the same batches.
fn check_agrees(first: &PartPlan, p: &PartPlan, i: usize) -> Result<(), JobError> {
    let shape = |s: &SchemaRef| -> Vec<(String, DataType)> {
        s.fields()
            .iter()
            .map(|f| (f.name().clone(), f.data_type().clone()))
            .collect()
    };
    let finished = |p: &PartPlan| super::super::finish::describe(&p.schema, p.finishes.as_ref());
    let (a, b) = (shape(&first.schema), shape(&p.schema));
    if a != b || shape(&first.rows_schema) != shape(&p.rows_schema) {
        let says = |s: &[(String, DataType)]| {
            s.iter()
                .map(|(n, t)| format!("{n}: {t}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Err(JobError::InvalidOptions(format!(
            "mix part {} ({}) gives columns [{}], and part 1 ({}) gives [{}]: the parts of a \
             mixture must give the same columns (names and types; resize to one shape)",
            i + 1,
            p.part.name,
            says(&b),
            first.part.name,
            says(&a)
        )));
    }
    if finished(first) != finished(p) {
        return Err(JobError::InvalidOptions(format!(
            "mix part {} ({}) finishes its columns at delivery as {:?}, and part 1 as {:?}",
            i + 1,
            p.part.name,
            finished(p),
            finished(first)
        )));
    }
    Ok(())
}

/// Storage nodes, each with the version of a dataset it is read at.
type NodeVersions = Vec<(Arc<dyn StorageEndpoint>, u64)>;

/// The versions `pins` names, each on the node of the same name among
/// those that hold `table` now (`held`), each node once.
fn pinned_again(held: NodeVersions, pins: &[Pin], table: &str) -> Result<NodeVersions, JobError> {
    let mut free = held;
    let mut out = Vec::with_capacity(pins.len());
    for p in pins {
        let Some(i) = free.iter().position(|(e, _)| e.name() == p.node) else {
            return Err(JobError::Unavailable {
                node: p.node.clone(),
                reason: format!(
                    "it holds version {} of {table}, and is not among the nodes this server \
                     reaches",
                    p.version
                ),
            });
        };
        let (e, _) = free.swap_remove(i);
        out.push((e, p.version));
    }
    Ok(out)
}

/// The schema of the rows the windows make (the placed plan's, without
/// the slot), and the job's (the same, but a finished column is the
/// SQL's, `columns`: the windows make only its input).
fn schemas(
    placed: &SchemaRef,
    columns: &SchemaRef,
    finishes: Option<&Finishes>,
) -> (SchemaRef, SchemaRef) {
    let fields: Vec<_> = placed
        .fields()
        .iter()
        .filter(|f| f.name() != SLOT)
        .cloned()
        .collect();
    let rows = Arc::new(Schema::new(fields.clone()));
    let fields: Vec<_> = fields
        .into_iter()
        .enumerate()
        .map(|(i, f)| match finishes.and_then(|d| d[i].as_ref()) {
            Some(_) => Arc::clone(&columns.fields()[i]),
            None => f,
        })
        .collect();
    (rows, Arc::new(Schema::new(fields)))
}
