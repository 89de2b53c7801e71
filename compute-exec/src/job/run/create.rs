//! How a job comes to be: planned at submit ([`Job::plan`]: the SQL and
//! the options checked, the plan prepared and placed once, the version
//! each node holds pinned), or restored from its record after a restart
//! ([`Job::restore`]: the same plan over the versions it pinned then, and
//! the progress it had).

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use arrow::datatypes::{Schema, SchemaRef};
use sluice_flight::gather::Finishes;
use sluice_flight::{SLOT, StorageEndpoint};
use sluice_planner::Offload;
use sluice_udfs::ErrorLog;
use sluice_udfs::env::Cancel;
use tokio::runtime::Handle;
use tokio::sync::watch;

use super::{Inner, Job};
use crate::job::adapt::Adaptive;
use crate::job::ahead::ReadAhead;
use crate::job::error::JobError;
use crate::job::index::Pin;
use crate::job::placed::JobPlan;
use crate::job::query::{JobQuery, WindowPlan, udf_options};
use crate::job::routes::RankRoutes;
use crate::job::spec::JobSpec;
use crate::job::stages::StageStats;
use crate::job::status::{JobState, Progress};
use crate::job::store::{JobRecord, JobStore};
use crate::session::ComputeSession;

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
            Some(pins) => pinned_again(held, pins, &table)?,
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
        let (rows_schema, schema) = schemas(&placed.plan.schema(), &columns, finishes.as_ref());
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
            schema,
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
