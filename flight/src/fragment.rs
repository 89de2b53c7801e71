//! [`StorageFragmentExec`]: a storage fragment as one leaf — the contract
//! between the planner's cut and whatever carries the fragment to the node
//! that holds its rows.
//!
//! The leaf names the dataset, the node that runs it (the URL it is
//! dialled at), what that node reads of the dataset ([`NodeReads`]), the
//! fragment's physical plan (scan leaf, the stages below the cut) and the
//! UDF options it runs under. On the wire the plan travels in sluice's
//! own encoding ([`crate::codec`]): the node decodes it in a session of its
//! own, where sluice's UDFs resolve and bind to the node's options.
//!
//! On the node the leaf runs through the session's [`FragmentRunner`] (the
//! storage node itself); anywhere else executing it is an error that says
//! so. Its output is the fragment's rows, then **one report row**: the
//! rows of the fragment's schema with every column nullable, plus a
//! [`REPORT`] column, null on data rows and, on the last row, the
//! fragment's [`FragmentReport`] (its bad samples by name, its stage times,
//! rows and bytes) as JSON. The accounting travels in band, in order with
//! the rows, whatever the transport; [`split_report`] takes it off on the
//! receiving side, so nothing above the cut ever sees it.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow::array::{Array, ArrayRef, RecordBatch, StringArray, new_null_array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use async_trait::async_trait;
use bytes::Bytes;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Result, exec_err};
use datafusion::error::DataFusionError;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, displayable,
};
use futures::{StreamExt, TryStreamExt, stream};
use sluice_udfs::UdfOptions;

use crate::messages::FragmentReport;
use crate::scan::{Take, with_take};
use crate::stream::link_bytes;

/// The report column of a fragment's output.
pub const REPORT: &str = "__report";

/// What one node reads of a dataset that a query or a window spreads over
/// several nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeReads {
    /// Every row it holds (no key of the dataset is on two nodes).
    Whole,
    /// These rows.
    Take(Take),
    /// None: other holders read its keys (or the node is a task of its
    /// own placed only so that the stage crosses the network).
    Nothing,
}

impl fmt::Display for NodeReads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeReads::Whole => write!(f, "all its rows"),
            NodeReads::Take(t) => match &t.rows {
                Some(rows) => write!(f, "{} rows of v{}", rows.len(), t.version),
                None => write!(f, "all rows of v{}", t.version),
            },
            NodeReads::Nothing => write!(f, "nothing"),
        }
    }
}

/// The plan a [`StorageFragmentExec`] carries: as planned (on the compute
/// side) or as received (on the node, still encoded).
#[derive(Debug, Clone)]
pub enum FragmentPlan {
    /// The physical plan.
    Planned(Arc<dyn ExecutionPlan>),
    /// sluice's encoding of it ([`crate::encode_fragment`]).
    Encoded(Bytes),
}

/// What runs a storage fragment on a storage node: the node itself,
/// registered as an extension of the session its tasks run in.
#[async_trait]
pub trait FragmentRunner: fmt::Debug + Send + Sync {
    /// Runs `plan` (encoded) under `options`; the stream, then the
    /// fragment's report once the stream has ended.
    async fn run(&self, plan: &[u8], options: UdfOptions) -> Result<Reported>;
}

/// A running fragment: its rows, and the report that follows them.
pub struct Reported {
    /// The fragment's rows.
    pub rows: SendableRecordBatchStream,
    /// Its report, once `rows` has ended (its rows and bytes are counted
    /// by [`StorageFragmentExec`]).
    pub report: Box<dyn Fn() -> FragmentReport + Send + Sync>,
}

impl fmt::Debug for Reported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reported").finish_non_exhaustive()
    }
}

/// The session extension that holds the node's [`FragmentRunner`].
#[derive(Debug, Clone)]
pub struct LocalRunner(pub Arc<dyn FragmentRunner>);

/// See the module docs.
#[derive(Debug, Clone)]
pub struct StorageFragmentExec {
    /// The dataset it reads.
    pub dataset: String,
    /// The node that runs it: the URL it is dialled at.
    pub node: String,
    /// What that node reads.
    pub reads: NodeReads,
    /// The fragment.
    pub plan: FragmentPlan,
    /// The UDF options it runs under.
    pub options: UdfOptions,
    /// The fragment's own schema (without the report).
    pub rows_schema: SchemaRef,
    properties: Arc<PlanProperties>,
}

/// `schema` as a fragment sends it: every column nullable, then [`REPORT`].
pub fn reported_schema(schema: &Schema) -> SchemaRef {
    let mut fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_nullable(true))
        .collect();
    fields.push(Field::new(REPORT, DataType::Utf8, true));
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// What one batch of a fragment's output is, once the report column is
/// taken off: rows of `rows_schema`, or the fragment's report.
#[derive(Debug)]
pub enum Received {
    /// Rows.
    Rows(RecordBatch),
    /// The report that ends the fragment.
    Report(FragmentReport),
}

/// Splits a batch of a fragment's output (see the module docs).
pub fn split_report(batch: &RecordBatch, rows_schema: &SchemaRef) -> Result<Received> {
    let n = batch.num_columns();
    if n == 0 {
        return exec_err!("a storage fragment's output lacks its report column");
    }
    let Some(report) = batch.column(n - 1).as_any().downcast_ref::<StringArray>() else {
        return exec_err!("a storage fragment's output lacks its report column");
    };
    if report.null_count() < report.len() {
        let json = (0..report.len())
            .find(|&i| report.is_valid(i))
            .map(|i| report.value(i))
            .unwrap_or_default();
        let r = serde_json::from_str(json)
            .map_err(|e| DataFusionError::Execution(format!("a fragment's bad report: {e}")))?;
        return Ok(Received::Report(r));
    }
    let columns: Vec<ArrayRef> = batch.columns()[..n - 1].to_vec();
    Ok(Received::Rows(RecordBatch::try_new(
        Arc::clone(rows_schema),
        columns,
    )?))
}

fn report_batch(schema: &SchemaRef, report: &FragmentReport) -> Result<RecordBatch> {
    let json = serde_json::to_string(report)
        .map_err(|e| DataFusionError::Execution(format!("cannot encode a report: {e}")))?;
    let n = schema.fields().len();
    let mut columns: Vec<ArrayRef> = schema.fields()[..n - 1]
        .iter()
        .map(|f| new_null_array(f.data_type(), 1))
        .collect();
    columns.push(Arc::new(StringArray::from(vec![json])));
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}

fn with_report_column(batch: RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    let mut columns = batch.columns().to_vec();
    columns.push(new_null_array(&DataType::Utf8, batch.num_rows()));
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}

impl StorageFragmentExec {
    /// `plan` over `dataset`, run on `node`, reading `reads` under
    /// `options`; `rows_schema` is the plan's own schema.
    pub fn new(
        dataset: String,
        node: String,
        reads: NodeReads,
        plan: FragmentPlan,
        options: UdfOptions,
        rows_schema: SchemaRef,
    ) -> Self {
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(reported_schema(&rows_schema)),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Self {
            dataset,
            node,
            reads,
            plan,
            options,
            rows_schema,
            properties,
        }
    }

    /// The plan as the node receives it: encoded, with the node's take
    /// applied (`None`: the node reads nothing).
    pub fn encoded(&self) -> Result<Option<Bytes>> {
        match (&self.plan, &self.reads) {
            (_, NodeReads::Nothing) => Ok(None),
            (FragmentPlan::Encoded(b), _) => Ok(Some(b.clone())),
            (FragmentPlan::Planned(p), NodeReads::Whole) => {
                Ok(Some(crate::encode_fragment(Arc::clone(p))?.into()))
            }
            (FragmentPlan::Planned(p), NodeReads::Take(t)) => {
                let taken = with_take(Arc::clone(p), t)?;
                Ok(Some(crate::encode_fragment(taken)?.into()))
            }
        }
    }
}

/// `plan` on one line: each node, then what it reads, down to the leaf.
fn chain(plan: &Arc<dyn ExecutionPlan>) -> String {
    let mut names = Vec::new();
    let mut node = Arc::clone(plan);
    loop {
        names.push(
            displayable(node.as_ref())
                .one_line()
                .to_string()
                .trim_end()
                .to_string(),
        );
        let next = match node.children().as_slice() {
            [only] => Arc::clone(only),
            _ => break,
        };
        node = next;
    }
    names.join(" <- ")
}

impl DisplayAs for StorageFragmentExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let plan = match &self.plan {
            FragmentPlan::Planned(p) => chain(p),
            FragmentPlan::Encoded(b) => format!("{} bytes", b.len()),
        };
        write!(
            f,
            "StorageFragmentExec: dataset={}, node={}, reads={}, fragment={}",
            self.dataset, self.node, self.reads, plan
        )
    }
}

impl ExecutionPlan for StorageFragmentExec {
    fn name(&self) -> &str {
        "StorageFragmentExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return exec_err!("StorageFragmentExec has one partition, not {partition}");
        }
        let schema = Arc::clone(self.properties.eq_properties.schema());
        let Some(plan) = self.encoded()? else {
            let report = report_batch(&schema, &FragmentReport::default())?;
            let once = stream::iter([Ok(report)]);
            return Ok(Box::pin(RecordBatchStreamAdapter::new(schema, once)));
        };
        let Some(runner) = context.session_config().get_extension::<LocalRunner>() else {
            return exec_err!(
                "the storage fragment over {} runs on storage node {}, not in this process",
                self.dataset,
                self.node
            );
        };
        let options = self.options;
        let node = self.node.clone();
        let out = Arc::clone(&schema);
        let batches = stream::once(async move {
            let run = runner.0.run(&plan, options).await?;
            let sent = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
            let (count, data) = (Arc::clone(&sent), Arc::clone(&out));
            let body = run.rows.map(move |b| {
                let b = b?;
                count.0.fetch_add(b.num_rows() as u64, Ordering::Relaxed);
                count.1.fetch_add(link_bytes(&b) as u64, Ordering::Relaxed);
                with_report_column(b, &data)
            });
            let report = run.report;
            let tail = stream::once(async move {
                let mut r = report();
                r.rows = sent.0.load(Ordering::Relaxed);
                r.bytes = sent.1.load(Ordering::Relaxed);
                r.node = node;
                report_batch(&out, &r)
            });
            Ok::<_, DataFusionError>(body.chain(tail))
        })
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, batches)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Int32Array;

    #[test]
    fn a_report_row_is_taken_off_and_rows_keep_their_schema() {
        let rows_schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int32, false)]));
        let wire = reported_schema(&rows_schema);
        assert!(wire.field(0).is_nullable());
        let rows = RecordBatch::try_new(
            Arc::clone(&rows_schema),
            vec![Arc::new(Int32Array::from(vec![1, 2]))],
        )
        .unwrap();
        let sent = with_report_column(rows.clone(), &wire).unwrap();
        match split_report(&sent, &rows_schema).unwrap() {
            Received::Rows(b) => assert_eq!(b, rows),
            Received::Report(_) => panic!("rows read as a report"),
        }
        let report = FragmentReport {
            bad_total: 3,
            rows: 2,
            ..Default::default()
        };
        let last = report_batch(&wire, &report).unwrap();
        match split_report(&last, &rows_schema).unwrap() {
            Received::Report(r) => assert_eq!((r.bad_total, r.rows), (3, 2)),
            Received::Rows(_) => panic!("the report read as rows"),
        }
        let no_report = RecordBatch::try_new(
            Arc::clone(&rows_schema),
            vec![Arc::new(Int32Array::from(vec![1]))],
        )
        .unwrap();
        assert!(split_report(&no_report, &rows_schema).is_err());
    }
}
