//! [`StorageFragmentExec`]: a storage fragment as one leaf, what it reads
//! ([`NodeReads`]), and what runs it on a node ([`FragmentRunner`]). See
//! the module docs of [`crate::fragment`].

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arrow::datatypes::SchemaRef;
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

use super::report::{
    FailedWith, FragmentReport, link_bytes, report_batch, reported_schema, with_report_column,
};
use super::scan::{Take, with_take};

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

    /// Runs `plan` (encoded) under `options` once per take of `takes`, as
    /// they come: each window's rows, then its report row, in `schema`
    /// ([`super::reported_schema`] of the fragment's), windows in the
    /// order taken; `node` names this node in the reports.
    async fn run_windows(
        &self,
        plan: &[u8],
        options: UdfOptions,
        takes: futures::stream::BoxStream<'static, Result<Take>>,
        schema: SchemaRef,
        node: String,
    ) -> Result<SendableRecordBatchStream>;
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
                Ok(Some(super::encode_fragment(Arc::clone(p))?.into()))
            }
            (FragmentPlan::Planned(p), NodeReads::Take(t)) => {
                let taken = with_take(Arc::clone(p), t)?;
                Ok(Some(super::encode_fragment(taken)?.into()))
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
        // A failure ends the output with a report that carries its status
        // (its kind survives whatever carries the rows).
        let batches = stream::once(async move {
            let failed_with = |e: &DataFusionError| FragmentReport {
                failed: Some(FailedWith::of(e)),
                node: node.clone(),
                ..Default::default()
            };
            let run = match runner.0.run(&plan, options).await {
                Ok(run) => run,
                Err(e) => {
                    let report = report_batch(&out, &failed_with(&e));
                    return Ok::<_, DataFusionError>(stream::iter([report]).boxed());
                }
            };
            let sent = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
            let failed: Arc<Mutex<Option<FailedWith>>> = Arc::default();
            let (count, data, stop) = (Arc::clone(&sent), Arc::clone(&out), Arc::clone(&failed));
            let body = run.rows.scan((), move |_, b| {
                let b = match b {
                    Ok(b) => b,
                    Err(e) => {
                        *stop.lock().unwrap_or_else(|p| p.into_inner()) = Some(FailedWith::of(&e));
                        return std::future::ready(None);
                    }
                };
                count.0.fetch_add(b.num_rows() as u64, Ordering::Relaxed);
                count.1.fetch_add(link_bytes(&b) as u64, Ordering::Relaxed);
                std::future::ready(Some(with_report_column(b, &data)))
            });
            let report = run.report;
            let tail = stream::once(async move {
                let mut r = report();
                r.rows = sent.0.load(Ordering::Relaxed);
                r.bytes = sent.1.load(Ordering::Relaxed);
                r.node = node;
                r.failed = failed.lock().unwrap_or_else(|p| p.into_inner()).take();
                report_batch(&out, &r)
            });
            Ok(body.chain(tail).boxed())
        })
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, batches)))
    }
}
