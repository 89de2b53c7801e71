//! [`ReportedExec`]: the receiving end of storage fragments that carry
//! their report in band ([`sluice_planner::fragment`]). It takes each
//! fragment's report row off, merges the report into the query's
//! [`UdfEnv`] (bad samples by name, stage times filed under the node that
//! ran them; a fragment that failed, as the error its node would have
//! answered), counts the rows and bytes that crossed in a [`Tally`], and
//! hands the rows on in the fragment's own schema: nothing above it sees
//! the report.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow::datatypes::SchemaRef;
use datafusion::common::Result;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::DataFusionError;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
};
use futures::{StreamExt, future};
use sluice_flight::LinkError;
use sluice_planner::fragment::link_bytes;
use sluice_planner::fragment::{Received, split_report};
use sluice_udfs::UdfEnv;

/// What storage fragments sent to the compute side: rows and the bytes of
/// their Arrow values.
#[derive(Debug, Default)]
pub struct Tally {
    /// Rows received.
    pub rows: AtomicU64,
    /// Bytes of Arrow values received.
    pub bytes: AtomicU64,
}

/// See the module docs.
#[derive(Debug)]
pub struct ReportedExec {
    input: Arc<dyn ExecutionPlan>,
    rows_schema: SchemaRef,
    udfs: Arc<UdfEnv>,
    tally: Arc<Tally>,
    properties: Arc<PlanProperties>,
}

impl ReportedExec {
    /// The rows of `input` (fragments' output) in `rows_schema`, their
    /// reports merged into `udfs`, counted in `tally`.
    pub fn new(
        input: Arc<dyn ExecutionPlan>,
        rows_schema: SchemaRef,
        udfs: Arc<UdfEnv>,
        tally: Arc<Tally>,
    ) -> Self {
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&rows_schema)),
            input.output_partitioning().clone(),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Self {
            input,
            rows_schema,
            udfs,
            tally,
            properties,
        }
    }
}

impl ReportedExec {
    /// The fragments' output it reads.
    pub fn input(&self) -> &Arc<dyn ExecutionPlan> {
        &self.input
    }

    /// The query's UDF environment the reports merge into.
    pub fn udfs(&self) -> &Arc<UdfEnv> {
        &self.udfs
    }

    /// Where the rows that crossed are counted.
    pub fn tally(&self) -> &Arc<Tally> {
        &self.tally
    }
}

impl DisplayAs for ReportedExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ReportedExec: the fragments' reports taken off")
    }
}

impl ExecutionPlan for ReportedExec {
    fn name(&self) -> &str {
        "ReportedExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let Some(input) = children.into_iter().next() else {
            return datafusion::common::internal_err!("ReportedExec needs its input");
        };
        Ok(Arc::new(Self::new(
            input,
            Arc::clone(&self.rows_schema),
            Arc::clone(&self.udfs),
            Arc::clone(&self.tally),
        )))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let wire = self.input.execute(partition, context)?;
        let schema = Arc::clone(&self.rows_schema);
        let (udfs, tally) = (Arc::clone(&self.udfs), Arc::clone(&self.tally));
        let rows = wire.filter_map(move |b| {
            let out = match b.and_then(|b| split_report(&b, &schema)) {
                Ok(Received::Rows(b)) => {
                    tally.rows.fetch_add(b.num_rows() as u64, Ordering::Relaxed);
                    tally
                        .bytes
                        .fetch_add(link_bytes(&b) as u64, Ordering::Relaxed);
                    Some(Ok(b))
                }
                Ok(Received::Report(r)) => {
                    udfs.errors.merge(r.bad_total, r.bad);
                    udfs.clock.merge(&r.node, &r.stages);
                    // A fragment that failed says why, as its node would.
                    r.failed.map(|f| {
                        let e = LinkError::from_status(&r.node, &f.status());
                        Err(DataFusionError::from(e))
                    })
                }
                Err(e) => Some(Err(e)),
            };
            future::ready(out)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.rows_schema),
            rows,
        )))
    }
}
