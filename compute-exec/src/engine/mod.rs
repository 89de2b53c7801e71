//! The cross-host data plane on the distributed engine
//! (datafusion-distributed, pinned): the one module of this crate that
//! names the engine's types.
//!
//! sluice's planner decides the cut; the engine carries it.
//!
//! - **Queries.** A storage fragment over a dataset becomes one engine
//!   stage with a task per node that reads: each a [`StorageFragmentExec`]
//!   that reads what its node reads ([`NodeReads`]: all its rows, or the
//!   keys it owns of a replicated dataset), routed to that node by
//!   [`route_to_holders`]. A node that reads nothing (other holders read
//!   its keys; it may be down) gets no task. A `NetworkCoalesceExec` is
//!   the boundary; the compute fragment runs above it, on this node, over
//!   [`crate::reported::ReportedExec`], which takes each task's in-band
//!   report off its rows. A query's partial aggregate joins the fragments
//!   on the nodes ([`PartialOnStorage`]); a plan that crosses ends in one
//!   partition ([`OneStream`]: the engine runs only partition 0 of its
//!   top).
//! - **Job streams.** A stream's feed on a node is one engine query whose
//!   windows are fed to the node's task as work units ([`EngineFeed`]).
//! - **One fragment on one node** (a job index's key listing, a move's or
//!   a repair's read): one engine query of its own ([`run_on_node`]).
//! - A stage keeps two tasks at least, both on the node when one node
//!   reads, the second reading nothing: the engine drops a boundary between
//!   two one-task stages, which would run the fragment here, away from its
//!   data.
//!
//! The engine's own planning never distributes anything else: its task
//! count per stage is held at one, so a plan without sluice's boundary is
//! left as it was. Exchanges are uncompressed (sluice measured that what
//! crosses a cut does not shrink, `docs/benchmarks.md`) and the engine's
//! end-of-task metrics collection is off (the report carries sluice's).
//!
//! Modules:
//! - `channels`: `NodeChannels`: how the coordinating session reaches the
//!   storage nodes' engine workers;
//! - `feed`: `EngineFeed`: a job stream's feed on one storage node;
//! - `one_stream`: `OneStream`: a plan that crosses hosts on the engine ends
//!   in one partition;
//! - `owed`: `OwedWindows`: the windows an engine feed owes, oldest first;
//! - `partial`: `PartialOnStorage`: a query's partial aggregate runs in the
//!   storage fragments;
//! - `single`: `run_on_node`: one storage fragment run on one node reached by
//!   network, as an engine query of its own;
//! - `stage_query`: `run_stage`: a stage built by hand, run as one engine
//!   query of its own.

mod channels;
mod feed;
mod one_stream;
mod owed;
mod partial;
mod single;
mod stage_query;

use std::sync::Arc;

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{Result, exec_err, plan_err};
use datafusion::execution::SessionStateBuilder;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion_distributed::{
    DistributedExec, DistributedExt, DistributedLeafExec, NetworkCoalesceExec, RouteTasksEvent,
    RouteTasksEventResponse, SessionStateBuilderExt, display_plan_ascii,
};
use sluice_flight::StorageEndpoint;
use sluice_planner::fragment::FragmentPlan;
use sluice_planner::fragment::{NodeReads, SluiceCodec, StorageFragmentExec, WindowsExec};
use sluice_udfs::UdfEnv;
use url::Url;

pub use channels::NodeChannels;
pub use feed::EngineFeed;
pub use one_stream::OneStream;
pub use partial::PartialOnStorage;
pub use single::run_on_node;

use crate::reported::{ReportedExec, Tally};

/// `builder` as a coordinating session of the engine, reaching the storage
/// nodes through `channels`.
pub fn coordinating(
    builder: SessionStateBuilder,
    channels: NodeChannels,
) -> Result<SessionStateBuilder> {
    builder
        .with_distributed_planner()
        .with_distributed_channel_resolver(channels)
        .with_distributed_user_codec(SluiceCodec)
        .with_distributed_route_tasks_handler(route_to_holders)
        .with_distributed_work_unit_feed(|w: &WindowsExec| Some(&w.windows))
        .with_distributed_max_tasks_per_stage(1)?
        .with_distributed_compression(None)?
        .with_distributed_metrics_collection(false)
        .map(|b| {
            b.with_physical_optimizer_rule(Arc::new(PartialOnStorage))
                .with_physical_optimizer_rule(Arc::new(OneStream))
        })
}

/// The stage of a storage fragment (`fragment`, over `dataset`): one task
/// per node of `reads`, under `udfs`' options, its rows counted in `tally`
/// and its reports merged into `udfs`.
pub fn fragment_stage(
    dataset: &str,
    fragment: Arc<dyn ExecutionPlan>,
    reads: Vec<(Arc<dyn StorageEndpoint>, NodeReads)>,
    udfs: &Arc<UdfEnv>,
    tally: &Arc<Tally>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let task = |node: &str, reads: NodeReads| {
        StorageFragmentExec::new(
            dataset.to_string(),
            node.to_string(),
            reads,
            FragmentPlan::Planned(Arc::clone(&fragment)),
            udfs.options,
            fragment.schema(),
        )
    };
    // A node that reads nothing gets no task: it may be down (its keys
    // are read by other holders). The stage keeps two tasks at least,
    // padded on a node that reads.
    let Some((first, _)) = reads
        .iter()
        .find(|(_, r)| *r != NodeReads::Nothing)
        .or(reads.first())
    else {
        return exec_err!("no storage node holds dataset {dataset}");
    };
    let mut tasks: Vec<StorageFragmentExec> = reads
        .iter()
        .filter(|(_, r)| *r != NodeReads::Nothing)
        .map(|(e, r)| task(e.name(), r.clone()))
        .collect();
    while tasks.len() < 2 {
        tasks.push(task(first.name(), NodeReads::Nothing));
    }
    stage_of(tasks, udfs, tally)
}

/// The stage of `tasks` (one per task, at least two), behind the boundary
/// and the node that takes their reports off.
fn stage_of(
    tasks: Vec<StorageFragmentExec>,
    udfs: &Arc<UdfEnv>,
    tally: &Arc<Tally>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let Some(first) = tasks.first() else {
        return exec_err!("a storage fragment's stage without tasks");
    };
    let rows_schema = Arc::clone(&first.rows_schema);
    let count = tasks.len();
    let tasks: Vec<Arc<dyn ExecutionPlan>> = tasks.into_iter().map(|t| Arc::new(t) as _).collect();
    let leaf = DistributedLeafExec::try_new(Arc::clone(&tasks[0]), tasks)?;
    let boundary = NetworkCoalesceExec::try_new(Arc::new(leaf), count, 1)?;
    Ok(Arc::new(ReportedExec::new(
        Arc::new(boundary),
        rows_schema,
        Arc::clone(udfs),
        Arc::clone(tally),
    )))
}

/// The stage under `reported` with `grow` applied to every task's
/// fragment (`None`: it is not a stage [`fragment_stage`] made).
pub(crate) fn restage(
    reported: &ReportedExec,
    grow: impl Fn(Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>>,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let Some(boundary) = reported.input().downcast_ref::<NetworkCoalesceExec>() else {
        return Ok(None);
    };
    // The optimizer may have spread the stage's output over more
    // partitions above the leaf; the rebuilt stage starts from the leaf.
    let mut node = Arc::clone(
        boundary
            .children()
            .first()
            .copied()
            .unwrap_or(reported.input()),
    );
    let leaf = loop {
        if let Some(leaf) = node.downcast_ref::<DistributedLeafExec>() {
            break leaf;
        }
        let next = match node.children().as_slice() {
            [only] if node.is::<RepartitionExec>() => Arc::clone(only),
            _ => return Ok(None),
        };
        node = next;
    };
    let mut tasks = Vec::with_capacity(leaf.variants().len());
    for v in leaf.variants() {
        let Some(f) = v.downcast_ref::<StorageFragmentExec>() else {
            return Ok(None);
        };
        let FragmentPlan::Planned(plan) = &f.plan else {
            return Ok(None);
        };
        let grown = grow(Arc::clone(plan))?;
        tasks.push(StorageFragmentExec::new(
            f.dataset.clone(),
            f.node.clone(),
            f.reads.clone(),
            FragmentPlan::Planned(Arc::clone(&grown)),
            f.options,
            grown.schema(),
        ));
    }
    stage_of(tasks, reported.udfs(), reported.tally()).map(Some)
}

/// Routes each task of a storage fragment's stage to the node it names;
/// other stages are left to the engine's routing.
pub fn route_to_holders(ev: RouteTasksEvent<'_>) -> Option<Result<RouteTasksEventResponse>> {
    let nodes = fragment_nodes(ev.plan)?;
    if nodes.len() != ev.task_count {
        return Some(plan_err!(
            "a storage fragment's stage of {} tasks names {} nodes",
            ev.task_count,
            nodes.len()
        ));
    }
    let urls = nodes
        .iter()
        .map(|n| Url::parse(n).or_else(|e| plan_err!("storage node {n}: {e}")))
        .collect::<Result<Vec<_>>>();
    Some(urls.map(RouteTasksEventResponse::new))
}

/// The nodes the tasks of `stage` run on, when it is a storage fragment's.
fn fragment_nodes(stage: &Arc<dyn ExecutionPlan>) -> Option<Vec<String>> {
    let mut nodes = None;
    let _ = stage.apply(|p| {
        if let Some(w) = p.downcast_ref::<WindowsExec>() {
            nodes = Some(w.nodes.clone());
            return Ok(TreeNodeRecursion::Stop);
        }
        let Some(leaf) = p.downcast_ref::<DistributedLeafExec>() else {
            return Ok(TreeNodeRecursion::Continue);
        };
        let named: Option<Vec<String>> = leaf
            .variants()
            .iter()
            .map(|v| {
                v.downcast_ref::<StorageFragmentExec>()
                    .map(|f| f.node.clone())
            })
            .collect();
        nodes = named;
        Ok(TreeNodeRecursion::Stop)
    });
    nodes
}

/// The plan as EXPLAIN shows it when it runs on the engine: its stages,
/// their tasks, and the node each storage task runs on.
pub fn describe(plan: &Arc<dyn ExecutionPlan>) -> Option<String> {
    plan.is::<DistributedExec>()
        .then(|| display_plan_ascii(plan.as_ref(), false))
}

#[cfg(test)]
mod tests {
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_plan::empty::EmptyExec;
    use sluice_flight::StorageClient;

    use super::*;

    fn node(port: u16) -> Arc<dyn StorageEndpoint> {
        // A client connects on first use: none is made here.
        Arc::new(StorageClient::new(&format!("http://127.0.0.1:{port}")).unwrap())
    }

    fn fragment() -> Arc<dyn ExecutionPlan> {
        let schema = Arc::new(Schema::new(vec![Field::new("key", DataType::Utf8, false)]));
        Arc::new(EmptyExec::new(schema))
    }

    fn stage(reads: Vec<(Arc<dyn StorageEndpoint>, NodeReads)>) -> Result<Arc<dyn ExecutionPlan>> {
        let udfs = Arc::new(UdfEnv::default());
        fragment_stage(
            "photos",
            fragment(),
            reads,
            &udfs,
            &Arc::new(Tally::default()),
        )
    }

    fn url(port: u16) -> String {
        format!("http://127.0.0.1:{port}")
    }

    #[tokio::test]
    async fn a_fragments_tasks_go_to_the_nodes_that_read_and_are_two_at_least() {
        // A node that reads nothing gets no task.
        let s = stage(vec![
            (node(1), NodeReads::Whole),
            (node(2), NodeReads::Nothing),
            (node(3), NodeReads::Whole),
        ])
        .unwrap();
        assert!(s.is::<ReportedExec>());
        assert_eq!(fragment_nodes(&s).unwrap(), [url(1), url(3)]);
        // One node reads: a second task on it, reading nothing, keeps the
        // boundary (two one-task stages would be merged here).
        let s = stage(vec![
            (node(1), NodeReads::Nothing),
            (node(2), NodeReads::Whole),
        ])
        .unwrap();
        assert_eq!(fragment_nodes(&s).unwrap(), [url(2), url(2)]);
        // No node reads (all down, say): the stage still crosses.
        let s = stage(vec![(node(4), NodeReads::Nothing)]).unwrap();
        assert_eq!(fragment_nodes(&s).unwrap(), [url(4), url(4)]);
        // No node at all: an error naming the dataset.
        let e = stage(Vec::new()).unwrap_err().to_string();
        assert!(e.contains("no storage node holds dataset photos"), "{e}");
    }

    #[tokio::test]
    async fn a_restaged_fragment_keeps_its_nodes_and_grows_each_task() {
        let s = stage(vec![
            (node(1), NodeReads::Whole),
            (node(2), NodeReads::Whole),
        ])
        .unwrap();
        let reported = s.downcast_ref::<ReportedExec>().unwrap();
        let grown = restage(reported, |p| {
            Ok(Arc::new(
                datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec::new(p),
            ) as _)
        })
        .unwrap()
        .expect("a stage fragment_stage made");
        assert_eq!(fragment_nodes(&grown).unwrap(), [url(1), url(2)]);
        let mut grew = Vec::new();
        grown
            .apply(|p| {
                let Some(leaf) = p.downcast_ref::<DistributedLeafExec>() else {
                    return Ok(TreeNodeRecursion::Continue);
                };
                for v in leaf.variants() {
                    let f = v.downcast_ref::<StorageFragmentExec>().unwrap();
                    let FragmentPlan::Planned(plan) = &f.plan else {
                        panic!("a task's fragment is planned");
                    };
                    grew.push(plan.name().to_string());
                }
                Ok(TreeNodeRecursion::Stop)
            })
            .unwrap();
        assert_eq!(grew, ["CoalescePartitionsExec"; 2]);
        // A plan with no fragment is no stage: nothing to route or grow.
        assert!(fragment_nodes(&fragment()).is_none());
        let other = ReportedExec::new(
            fragment(),
            fragment().schema(),
            Arc::new(UdfEnv::default()),
            Arc::new(Tally::default()),
        );
        assert!(restage(&other, Ok).unwrap().is_none());
    }
}
