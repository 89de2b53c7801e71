//! [`Prepared`]: a statement parsed and optimized against a snapshot of
//! the datasets, with what placing it needs (the planner, the fragments'
//! tables, calibration), and [`PlannedQuery`], what placing it makes: the
//! compute fragment and why it was placed so. Each runs in a memory pool
//! of its own inside the process's budget.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::catalog::TableProvider;
use datafusion::common::Result;
use datafusion::execution::TaskContext;
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;
use sluice_flight::StorageEndpoint;
use sluice_planner::{
    CalibrationOptions, Explanation, FragmentTables, Offload, Planner, Resources, StorageFragment,
};
use sluice_udfs::UdfEnv;

use crate::calibration::{CalibrationCache, calibrate};
use crate::remote::FragmentTable;
use crate::remote::ReplicaReads;
use crate::reported::Tally;

/// A planned query.
pub struct PlannedQuery {
    /// Why it was placed so.
    pub explanation: Explanation,
    /// The compute fragment, physical.
    pub plan: Arc<dyn ExecutionPlan>,
    /// The session it runs in.
    pub ctx: SessionContext,
}

impl std::fmt::Debug for PlannedQuery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlannedQuery")
            .field("explanation", &self.explanation)
            .field("plan", &self.plan)
            .finish_non_exhaustive()
    }
}

/// A query parsed and optimized against a snapshot of the datasets, with
/// what placing it needs.
#[derive(Clone)]
pub struct Prepared {
    /// The optimized logical plan of the SQL.
    pub plan: LogicalPlan,
    pub(super) planner: Planner,
    pub(super) tables: Tables,
    pub(super) ctx: SessionContext,
    pub(super) calibration: Option<CalibrationOptions>,
    pub(super) calibrations: Arc<CalibrationCache>,
    pub(super) query_memory: usize,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("plan", &self.plan)
            .finish_non_exhaustive()
    }
}

/// The runtime of one query (or one stream of a job's plan): a memory
/// pool of its own, limited to `query_memory` bytes, inside the process's
/// budget (`sluice_udfs::memory_budget`).
pub(super) fn query_runtime(query_memory: usize) -> Result<Arc<RuntimeEnv>> {
    let shared = sluice_udfs::memory_budget::MemoryBudget::global().pool();
    RuntimeEnvBuilder::new()
        .with_memory_pool(Arc::new(sluice_udfs::memory_budget::QueryPool::new(
            query_memory,
            shared,
        )))
        .build_arc()
}

impl Prepared {
    /// The session the plan was made in (its tables and UDFs).
    pub fn ctx(&self) -> &SessionContext {
        &self.ctx
    }

    /// What the storage fragments of this query's placements sent.
    pub fn tally(&self) -> &Arc<Tally> {
        &self.tables.tally
    }

    /// A task context of this session with a memory pool of its own, under
    /// the query's limit: a plan placed once and run by many streams (a
    /// job's) gives each stream the pool a plan made for it alone had.
    pub fn task_ctx(&self) -> Result<Arc<TaskContext>> {
        let runtime = query_runtime(self.query_memory)?;
        let state = self.ctx.state();
        Ok(Arc::new(TaskContext::from(&state).with_runtime(runtime)))
    }

    /// Plans from now on assume the storage→compute link carries
    /// `bytes_per_s`, as a running job observed it.
    pub fn set_link(&mut self, bytes_per_s: f64) {
        self.planner.resources.link_bytes_per_s = Some(bytes_per_s);
        self.planner.resources.link_source = "observed by the running job".into();
    }

    /// The resources it plans for.
    pub fn resources(&self) -> &Resources {
        &self.planner.resources
    }

    /// Optimizes `plan` (one derived from [`Prepared::plan`]) again.
    pub fn optimize(&self, plan: LogicalPlan) -> Result<LogicalPlan> {
        self.ctx.state().optimize(&plan)
    }

    /// Places `plan` under `offload` and plans its compute fragment; an
    /// `auto` placement across machines is calibrated first (when
    /// calibration is on).
    pub async fn place(&self, plan: LogicalPlan, offload: Offload) -> Result<PlannedQuery> {
        // Co-located, every cut costs the one pool of cores the same stage
        // work and differs only by the hand-over (`Rates::of`): measured
        // stage costs cannot change the choice, so a run does not pay for
        // timing them (EXPLAIN still does, to show them).
        let calibrate =
            matches!(offload, Offload::Auto) && self.planner.resources.colocated.is_none();
        self.place_with(plan, offload, calibrate).await
    }

    /// [`Prepared::place`], calibrating when `calibrate` (and calibration
    /// is on).
    pub async fn place_with(
        &self,
        plan: LogicalPlan,
        offload: Offload,
        calibrate_first: bool,
    ) -> Result<PlannedQuery> {
        let planner = match self.calibration.filter(|_| calibrate_first) {
            // The query's own plan is what is timed: a plan derived from it
            // (a job's window plan) has its stages, or all but a last one
            // run at delivery, and columns of its own (the slot) no plain
            // scan can read.
            Some(settings) => Planner {
                calibrations: calibrate(
                    &self.planner,
                    &self.plan,
                    &self.tables.holders,
                    &self.ctx.state(),
                    &self.tables.udfs.options,
                    settings,
                    &self.calibrations,
                )
                .await,
                ..self.planner.clone()
            },
            None => self.planner.clone(),
        };
        // A job's window plan may defer the query's last stage to delivery:
        // the window takes the query's calibration, and that stage is still
        // costed, on the compute side.
        let placement = planner
            .deferring(&self.plan, &plan)
            .place(plan, offload, &self.tables)?;
        let state = self.ctx.state();
        let physical = state
            .query_planner()
            .create_physical_plan(&placement.compute, &state)
            .await?;
        // A built-in function's panic is a named sample under the
        // query's policy (storage fragments are guarded where they run).
        let physical = sluice_udfs::panic_guard::guard_plan(physical, &self.tables.udfs)?;
        Ok(PlannedQuery {
            explanation: placement.explanation,
            plan: physical,
            ctx: self.ctx.clone(),
        })
    }
}

/// The tables of a query's storage fragments: each dataset read from
/// the nodes that hold it.
#[derive(Clone)]
pub(super) struct Tables {
    pub(super) holders: HashMap<String, Vec<Arc<dyn StorageEndpoint>>>,
    /// Replicated datasets: which node reads which key.
    pub(super) replicas: HashMap<String, Arc<dyn ReplicaReads>>,
    pub(super) udfs: Arc<UdfEnv>,
    pub(super) compute_cores: usize,
    pub(super) tally: Arc<Tally>,
    /// Whether storage fragments cross hosts on the distributed engine
    /// (a query's session, built as the engine's coordinating one).
    pub(super) on_engine: bool,
    /// Whether the plan is made to be explained, not run.
    pub(super) explaining: bool,
}

impl FragmentTables for Tables {
    fn table(&self, fragment: &StorageFragment) -> Result<Arc<dyn TableProvider>> {
        let endpoints = self
            .holders
            .get(&fragment.dataset)
            .cloned()
            .unwrap_or_default();
        Ok(Arc::new(
            FragmentTable::new(
                fragment.clone(),
                endpoints,
                Arc::clone(&self.udfs),
                self.compute_cores,
                Arc::clone(&self.tally),
                self.replicas.get(&fragment.dataset).cloned(),
            )
            .on_engine(self.on_engine)
            .explaining(self.explaining),
        ))
    }
}
