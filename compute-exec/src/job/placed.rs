//! A job's plan, prepared and placed once — at submit, or when a saved
//! job is restored — and run by every stream of the job.
//!
//! ```text
//!  submit: SQL ─► prepared (session, tables, planner) ─► window plan ─► placed
//!                                                            │  (JobPlan, generation 0)
//!  each stream: the placed plan bound to its epoch's UDF environment
//!    (`StreamPlan`: a walk of the plan, no SQL, optimizer or placement)
//!  a re-plan (`adapt`, the only one): the window plan placed again under the
//!    observed link ─► installed as the next generation ─► every stream's next
//!    window binds and runs it
//! ```
//!
//! Each stream has its own UDF environment (its epoch's seed and epoch
//! literals, its bad-sample log, its cancel: [`sluice_udfs::rebind`]), its
//! own feeds to the storage nodes, its own count of link bytes and its own
//! memory pool, as when each stream planned for itself; what it no longer
//! does is refresh the catalogs, parse, optimize, calibrate and place.

use std::sync::{Arc, Mutex, RwLock};

use datafusion::execution::TaskContext;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::ExecutionPlan;
use sluice_planner::Offload;
use sluice_udfs::UdfEnv;

use crate::error::JobError;
use crate::remote::for_stream;
use crate::reported::Tally;
use crate::session::{PlannedQuery, Prepared};

/// A placed plan and the number of placements before it.
#[derive(Clone)]
struct Generation {
    number: u64,
    plan: Arc<dyn ExecutionPlan>,
}

/// See the module.
pub struct JobPlan {
    /// The job's SQL as prepared at submit: its session, its tables (the
    /// nodes and versions it pinned) and its planner.
    prepared: Prepared,
    /// The plan every window runs, before placement (none: a mixture's,
    /// never placed again).
    window: Option<LogicalPlan>,
    /// Whether `window` computes the same row for a sample every epoch
    /// ([`sluice_udfs::rebind::same_every_epoch`]): its rows may be kept
    /// (the output cache) or only its decode stages (the stage cache).
    same_every_epoch: bool,
    /// The placement streams run now.
    placed: RwLock<Generation>,
}

impl std::fmt::Debug for JobPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobPlan")
            .field("window", &self.window)
            .field("generation", &self.current().number)
            .finish_non_exhaustive()
    }
}

impl JobPlan {
    /// The plan of a job whose window plan `window` was prepared in
    /// `prepared` and placed as `placed`.
    pub fn new(prepared: Prepared, window: LogicalPlan, placed: Arc<dyn ExecutionPlan>) -> Self {
        Self {
            prepared,
            same_every_epoch: sluice_udfs::rebind::same_every_epoch(&window),
            window: Some(window),
            placed: RwLock::new(Generation {
                number: 0,
                plan: placed,
            }),
        }
    }

    /// The plan of a mixture, whose parts' window plans are `windows`
    /// (the first prepared in `prepared`) and whose placed parts are
    /// under `placed` (see `crate::job::mix_plan`). It is never placed
    /// again: each part keeps the placement calibrated for it.
    pub fn mixture(
        prepared: Prepared,
        windows: &[LogicalPlan],
        placed: Arc<dyn ExecutionPlan>,
    ) -> Self {
        Self {
            prepared,
            same_every_epoch: windows.iter().all(sluice_udfs::rebind::same_every_epoch),
            window: None,
            placed: RwLock::new(Generation {
                number: 0,
                plan: placed,
            }),
        }
    }

    /// The job's SQL as prepared at submit.
    pub fn prepared(&self) -> &Prepared {
        &self.prepared
    }

    /// Whether the window plan computes the same row for a sample every
    /// epoch (see the field).
    pub fn same_every_epoch(&self) -> bool {
        self.same_every_epoch
    }

    fn current(&self) -> Generation {
        self.placed
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The number of placements since the first (0: none since submit).
    pub fn generation(&self) -> u64 {
        self.current().number
    }

    /// The window plan placed again, `auto`, as if the storage→compute
    /// link carried `link_bytes_per_s`; not yet run by any stream.
    pub async fn place_under(&self, link_bytes_per_s: f64) -> Result<PlannedQuery, JobError> {
        let Some(window) = &self.window else {
            return Err(JobError::Internal(
                "a mixture's parts are not placed again".into(),
            ));
        };
        let mut prepared = self.prepared.clone();
        prepared.set_link(link_bytes_per_s);
        prepared
            .place(window.clone(), Offload::Auto)
            .await
            .map_err(|e| JobError::running(&e))
    }

    /// Makes `plan` the placement every stream runs from its next window.
    pub fn replace(&self, plan: Arc<dyn ExecutionPlan>) {
        let mut placed = self.placed.write().unwrap_or_else(|e| e.into_inner());
        placed.number += 1;
        placed.plan = plan;
    }

    /// The plan of one stream, under `udfs`, counting its link bytes in a
    /// tally of its own.
    pub fn for_stream(self: &Arc<Self>, udfs: &Arc<UdfEnv>) -> Result<StreamPlan, JobError> {
        let tally = Arc::new(Tally::default());
        let Generation { number, plan } = self.current();
        let bound = for_stream(plan, udfs, &tally).map_err(|e| JobError::running(&e))?;
        Ok(StreamPlan {
            job: Arc::clone(self),
            task: self
                .prepared
                .task_ctx()
                .map_err(|e| JobError::running(&e))?,
            udfs: Arc::clone(udfs),
            tally,
            bound: Mutex::new(Generation {
                number,
                plan: bound,
            }),
        })
    }
}

/// A job's plan bound to one stream (see the module).
pub struct StreamPlan {
    job: Arc<JobPlan>,
    task: Arc<TaskContext>,
    udfs: Arc<UdfEnv>,
    tally: Arc<Tally>,
    bound: Mutex<Generation>,
}

impl std::fmt::Debug for StreamPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bound = self.bound.lock().unwrap_or_else(|e| e.into_inner());
        f.debug_struct("StreamPlan")
            .field("epoch", &self.udfs.options.epoch)
            .field("generation", &bound.number)
            .finish_non_exhaustive()
    }
}

impl StreamPlan {
    /// The plan the stream's next window runs: the job's current
    /// placement, bound to the stream (again only when it was replaced).
    pub fn plan(&self) -> Result<Arc<dyn ExecutionPlan>, JobError> {
        let mut bound = self.bound.lock().unwrap_or_else(|e| e.into_inner());
        let now = self.job.current();
        if now.number != bound.number {
            let plan =
                for_stream(now.plan, &self.udfs, &self.tally).map_err(|e| JobError::running(&e))?;
            *bound = Generation {
                number: now.number,
                plan,
            };
        }
        Ok(Arc::clone(&bound.plan))
    }

    /// The context its windows run in (a memory pool of the stream's own).
    pub fn task(&self) -> &Arc<TaskContext> {
        &self.task
    }

    /// What its storage fragments sent.
    pub fn tally(&self) -> &Arc<Tally> {
        &self.tally
    }

    /// Its UDF environment.
    pub fn udfs(&self) -> &Arc<UdfEnv> {
        &self.udfs
    }
}
