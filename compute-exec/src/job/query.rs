//! The plan of a job: its SQL as a pipeline over one dataset, and that
//! pipeline as the plan every window of an epoch runs.
//!
//! A job's plan reads the dataset through a table with one more column
//! than the dataset's own, the virtual [`SLOT`]: storage nodes fill it
//! with the slot the job gave each row it asked for (see
//! [`sluice_planner::fragment::Take`]), and the plan carries it to its output, so a
//! row finds its position in the epoch whichever node, partition or side
//! of the cut produced it.

use std::sync::Arc;

use arrow::datatypes::{Schema, SchemaRef};
use datafusion::common::{Column, TableReference};
use datafusion::datasource::provider_as_source;
use datafusion::logical_expr::expr_rewriter::unnormalize_cols;
use datafusion::logical_expr::{
    Expr, LogicalPlan, LogicalPlanBuilder, Projection, TableScan, TableScanBuilder,
};
use sluice_flight::gather::Finishes;
use sluice_planner::fragment::SLOT;
use sluice_planner::fragment::slot_field;
use sluice_planner::pipeline::Pipeline;
use sluice_udfs::{StageClock, UdfEnv, UdfOptions};

use super::finish::{Deferred, defer};
use super::spec::JobSpec;
use crate::error::JobError;
use crate::remote::RemoteDatasetTable;
use crate::session::{ComputeSession, Prepared};

pub use crate::replicas::index::KEY;

/// The UDF options of `spec`'s `epoch`, under the server's `limits`.
pub fn udf_options(spec: &JobSpec, epoch: u64, limits: &sluice_udfs::Limits) -> UdfOptions {
    UdfOptions {
        on_error: spec.on_error,
        seed: spec.shuffle.map_or(0, |s| s.seed),
        epoch,
        limits: *limits,
        cache_stages: false,
    }
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
    let schema = p.scan.source.schema();
    if !schema.fields().iter().any(|f| f.name() == KEY) {
        return Err(JobError::NotAPipeline(format!(
            "dataset {} has no {KEY} column",
            p.dataset()
        )));
    }
    if p.filter.is_some() {
        return Err(JobError::NotAPipeline(
            "a job's filters select its samples once, at submit, from their metadata: \
             they may not read `data` (filter on the UDFs' results in the trainer)"
                .into(),
        ));
    }
    Ok(p)
}

/// The plan every window of a job runs, and how its rows become the
/// job's columns.
#[derive(Debug)]
pub struct WindowPlan {
    /// The plan (its outputs, then [`SLOT`]).
    pub plan: LogicalPlan,
    /// The job's columns, as its SQL names and types them.
    pub columns: SchemaRef,
    /// The columns finished as batches are written out, from the plan's
    /// output of the same place (see [`super::finish`]).
    pub finishes: Option<Finishes>,
}

/// A job's SQL, prepared on `session` under `options`, with its pipeline.
#[derive(Debug)]
pub struct JobQuery {
    /// The SQL prepared against the datasets the nodes hold now.
    pub prepared: Prepared,
    /// Its pipeline.
    pub pipeline: Pipeline,
    /// The UDF options it runs under, and the bad samples it met.
    pub udfs: Arc<UdfEnv>,
}

impl JobQuery {
    /// Prepares `sql` on `session` under `options`; its UDFs record their
    /// time in `clock`.
    pub async fn prepare(
        session: &ComputeSession,
        sql: &str,
        options: UdfOptions,
        clock: Arc<StageClock>,
    ) -> Result<Self, JobError> {
        let udfs = UdfEnv::timed(options, clock);
        let prepared = session
            .prepare(sql, &udfs)
            .await
            .map_err(|e| JobError::planning(&e))?;
        let pipeline = pipeline_of(&prepared)?;
        Ok(Self {
            prepared,
            pipeline,
            udfs,
        })
    }

    /// The dataset table the job reads (`name` or `name@N`).
    pub fn table(&self) -> String {
        self.pipeline.dataset()
    }

    /// The filters that select the job's samples (metadata only), with
    /// unqualified columns, as a scan takes them.
    pub fn filters(&self) -> Vec<Expr> {
        unnormalize_cols(self.pipeline.scan.filters.iter().cloned())
    }

    /// The scan of the pipeline over the dataset with the [`SLOT`] column.
    fn slotted_scan(&self) -> datafusion::common::Result<TableScan> {
        let scan = &self.pipeline.scan;
        let schema = scan.source.schema();
        let mut fields: Vec<_> = schema.fields().iter().cloned().collect();
        fields.push(Arc::new(slot_field()));
        let table = RemoteDatasetTable::new(self.table(), Arc::new(Schema::new(fields)));
        TableScanBuilder::new(scan.table_name.clone(), provider_as_source(Arc::new(table)))
            .with_filters(scan.filters.clone())
            .build()
    }

    /// The plan every window runs: the pipeline over the slotted scan,
    /// its outputs (less the stages deferred to delivery: see
    /// [`super::finish`], timed into `clock`) and [`SLOT`]; optimized, not
    /// yet placed.
    pub fn window_plan(&self, clock: &Arc<StageClock>) -> Result<WindowPlan, JobError> {
        let internal = |e: datafusion::error::DataFusionError| JobError::Internal(e.to_string());
        let scan = self.slotted_scan().map_err(internal)?;
        let qualifier = Some::<TableReference>(scan.table_name.clone());
        let projection = &self.pipeline.projection;
        let Deferred {
            mut exprs,
            finishes,
        } = defer(
            &projection.expr,
            projection.input.schema(),
            &projection.schema,
            clock,
        );
        exprs.push(Expr::Column(Column::new(qualifier, SLOT)));
        let mut b = LogicalPlanBuilder::from(LogicalPlan::TableScan(scan));
        b = b.project(exprs).map_err(internal)?;
        if let Some(checks) = self.pipeline.checks_filter() {
            b = b.filter(checks).map_err(internal)?;
        }
        let plan = b.build().map_err(internal)?;
        let plan = self
            .prepared
            .optimize(plan)
            .map_err(|e| JobError::InvalidSql(e.to_string()))?;
        // The job's columns: the pipeline's, whatever the windows make.
        let columns = Arc::new(projection.schema.as_arrow().clone());
        Ok(WindowPlan {
            plan,
            columns,
            finishes,
        })
    }
}
