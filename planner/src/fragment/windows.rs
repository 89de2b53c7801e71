//! [`WindowsExec`]: a storage fragment run for window after window of a
//! job stream on one node, its windows' takes fed to it while it runs —
//! the leaf of a job's stage on the distributed engine
//! (datafusion-distributed), and the one module of this crate that names
//! the engine's types.
//!
//! The coordinating side holds the [`WindowSource`]: each window asked for
//! is one work unit ([`WindowUnit`], the take's row ids and slots) sent to
//! the task that runs on the node, in order. On the node the leaf runs the
//! fragment once per unit through the session's [`FragmentRunner`], and
//! its output is each window's rows followed by that window's report row
//! ([`crate::fragment::report`]): the windows come back in the order they
//! were asked for, each complete when its report arrives.
//!
//! The stage has two tasks on the node, the second fed no windows: the
//! engine drops a boundary between two one-task stages, which would run
//! the fragment away from its data.

use std::fmt;
use std::sync::{Arc, Mutex};

use arrow::datatypes::Schema;
use arrow::datatypes::SchemaRef;
use datafusion::common::internal_err;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Result, exec_err};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use datafusion_distributed::{WorkUnitFeed, WorkUnitFeedProto, WorkUnitFeedProvider};
use datafusion_proto::protobuf;
use prost::Message;

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt, stream};
use sluice_udfs::UdfOptions;
use tokio::sync::mpsc;

use super::leaf::{FragmentPlan, LocalRunner};
use super::report::reported_schema;
use super::scan::Take;

/// One window on the wire: the rows of a pinned version, each with its
/// slot.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WindowUnit {
    /// The version pinned.
    #[prost(uint64, tag = "1")]
    pub version: u64,
    /// Row ids, in the order wanted.
    #[prost(uint32, repeated, tag = "2")]
    pub rows: Vec<u32>,
    /// The slot of each row.
    #[prost(uint32, repeated, tag = "3")]
    pub slots: Vec<u32>,
}

impl WindowUnit {
    /// The unit of `take` (which names its rows).
    pub fn of(take: &Take) -> Option<Self> {
        Some(Self {
            version: take.version,
            rows: take.rows.as_deref()?.to_vec(),
            slots: take.slots.to_vec(),
        })
    }

    /// The take it asks for.
    pub fn take(self) -> Result<Take> {
        Take::listed(self.version, self.rows, self.slots)
            .map_err(|e| datafusion::error::DataFusionError::Execution(format!("a window of {e}")))
    }
}

/// The coordinating side's windows of one stage: task 0's, as they are
/// asked for; task 1 is fed none.
#[derive(Debug, Clone, Default)]
pub struct WindowSource {
    units: Arc<Mutex<Option<mpsc::UnboundedReceiver<WindowUnit>>>>,
}

impl WindowSource {
    /// A source, and where its windows are sent.
    pub fn new() -> (Self, mpsc::UnboundedSender<WindowUnit>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let source = Self {
            units: Arc::new(Mutex::new(Some(rx))),
        };
        (source, tx)
    }
}

impl WorkUnitFeedProvider for WindowSource {
    type WorkUnit = WindowUnit;

    fn feed(
        &self,
        partition: usize,
        _ctx: Arc<TaskContext>,
    ) -> Result<BoxStream<'static, Result<WindowUnit>>> {
        if partition != 0 {
            return Ok(stream::empty().boxed());
        }
        let Some(rx) = self.units.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return exec_err!("a stream's windows were fed twice");
        };
        let units = stream::unfold(
            rx,
            |mut rx| async move { rx.recv().await.map(|u| (Ok(u), rx)) },
        );
        Ok(units.boxed())
    }
}

/// See the module docs.
#[derive(Debug, Clone)]
pub struct WindowsExec {
    /// The dataset it reads.
    pub dataset: String,
    /// The node each task runs on (both on the same node).
    pub nodes: Vec<String>,
    /// The fragment.
    pub plan: FragmentPlan,
    /// The UDF options it runs under.
    pub options: UdfOptions,
    /// The fragment's own schema (without the report).
    pub rows_schema: SchemaRef,
    /// The windows.
    pub windows: WorkUnitFeed<WindowSource>,
    properties: Arc<PlanProperties>,
}

impl WindowsExec {
    /// `plan` over `dataset` on `node`, fed `windows`.
    pub fn new(
        dataset: String,
        nodes: Vec<String>,
        plan: FragmentPlan,
        options: UdfOptions,
        rows_schema: SchemaRef,
        windows: WorkUnitFeed<WindowSource>,
    ) -> Self {
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(reported_schema(&rows_schema)),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Self {
            dataset,
            nodes,
            plan,
            options,
            rows_schema,
            windows,
            properties,
        }
    }

    /// The plan encoded, as the node receives it.
    pub fn encoded(&self) -> Result<bytes::Bytes> {
        match &self.plan {
            FragmentPlan::Encoded(b) => Ok(b.clone()),
            FragmentPlan::Planned(p) => Ok(super::encode_fragment(Arc::clone(p))?.into()),
        }
    }
}

impl DisplayAs for WindowsExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "WindowsExec: dataset={}, nodes=[{}], a job's windows as they are asked for",
            self.dataset,
            self.nodes.join(", ")
        )
    }
}

impl ExecutionPlan for WindowsExec {
    fn name(&self) -> &str {
        "WindowsExec"
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
        let schema = Arc::clone(self.properties.eq_properties.schema());
        let Some(runner) = context.session_config().get_extension::<LocalRunner>() else {
            return exec_err!(
                "the windows over {} run on storage node {}, not in this process",
                self.dataset,
                self.nodes.first().map_or("?", String::as_str)
            );
        };
        let takes = self
            .windows
            .feed(partition, Arc::clone(&context))?
            .and_then(|u| async move { u.take() })
            .boxed();
        let plan = self.encoded()?;
        let (options, out) = (self.options, Arc::clone(&schema));
        let node = self.nodes.first().cloned().unwrap_or_default();
        let rows =
            stream::once(
                async move { runner.0.run_windows(&plan, options, takes, out, node).await },
            )
            .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, rows)))
    }
}

/// A [`WindowsExec`] on the wire: its plan, and the handle of the feed
/// its windows come down.
#[derive(Clone, PartialEq, prost::Message)]
struct WindowsNode {
    #[prost(string, tag = "1")]
    dataset: String,
    #[prost(string, repeated, tag = "2")]
    nodes: Vec<String>,
    #[prost(bytes = "vec", tag = "3")]
    plan: Vec<u8>,
    #[prost(string, tag = "4")]
    udf_options: String,
    #[prost(message, optional, tag = "5")]
    schema: Option<protobuf::Schema>,
    #[prost(message, optional, tag = "6")]
    windows: Option<WorkUnitFeedProto>,
}

/// A [`WindowsExec`] from the wire.
pub(super) fn decode_windows(buf: &[u8]) -> Result<Arc<dyn ExecutionPlan>> {
    let node = WindowsNode::decode(buf).map_err(wire_error)?;
    let schema: Schema = match &node.schema {
        Some(s) => s.try_into()?,
        None => return internal_err!("the windows over {} have no schema", node.dataset),
    };
    let Some(windows) = node.windows else {
        return internal_err!("the windows over {} have no feed", node.dataset);
    };
    Ok(Arc::new(WindowsExec::new(
        node.dataset,
        node.nodes,
        FragmentPlan::Encoded(node.plan.into()),
        serde_json::from_str(&node.udf_options).map_err(wire_error)?,
        Arc::new(schema),
        WorkUnitFeed::from_proto(windows)?,
    )))
}

/// A [`WindowsExec`] on the wire (after sluice's codec's tag byte).
pub(super) fn encode_windows(w: &WindowsExec, buf: &mut Vec<u8>) -> Result<()> {
    let msg = WindowsNode {
        dataset: w.dataset.clone(),
        nodes: w.nodes.clone(),
        plan: w.encoded()?.to_vec(),
        udf_options: serde_json::to_string(&w.options).map_err(wire_error)?,
        schema: Some(w.rows_schema.as_ref().try_into()?),
        windows: Some(w.windows.to_proto()),
    };
    msg.encode(buf).map_err(wire_error)
}

/// A wire message that does not decode, as an error.
fn wire_error(e: impl std::fmt::Display) -> datafusion::error::DataFusionError {
    datafusion::error::DataFusionError::Internal(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_crosses_the_wire_as_the_take_it_asks_for() {
        let take = Take::listed(7, vec![4, 0, 9], vec![0, 1, 2]).unwrap();
        let unit = WindowUnit::of(&take).unwrap();
        let wire = WindowUnit::decode(unit.encode_to_vec().as_slice()).unwrap();
        assert_eq!(wire.take().unwrap(), take);
        // A job's index (every row) is no window.
        assert!(WindowUnit::of(&Take::index(7)).is_none());
        // A unit whose rows and slots disagree names what it holds.
        let bad = WindowUnit {
            version: 7,
            rows: vec![1, 2],
            slots: vec![0],
        };
        let e = bad.take().unwrap_err().to_string();
        assert!(e.contains("a window of 2 rows but 1 slots"), "{e}");
    }

    #[tokio::test]
    async fn windows_are_fed_to_task_zero_in_order_once() {
        let (source, tx) = WindowSource::new();
        let ctx = Arc::new(TaskContext::default());
        // Task 1 is fed nothing.
        let none: Vec<_> = source.feed(1, Arc::clone(&ctx)).unwrap().collect().await;
        assert!(none.is_empty());
        let fed = source.feed(0, Arc::clone(&ctx)).unwrap();
        for v in [3u64, 1, 2] {
            tx.send(WindowUnit {
                version: v,
                rows: vec![v as u32],
                slots: vec![0],
            })
            .unwrap();
        }
        drop(tx);
        let got: Vec<u64> = fed.map_ok(|u| u.version).try_collect().await.unwrap();
        assert_eq!(got, [3, 1, 2]);
        let e = source.feed(0, ctx).err().unwrap().to_string();
        assert!(e.contains("fed twice"), "{e}");
    }
}
