//! [`run_on_node`]: one storage fragment run on one node reached by
//! network, as an engine query of its own — a job index's key listing, a
//! move's read of the rows it copies, a repair's read of a good copy, a
//! fragment read whole outside a window.
//!
//! ```text
//!  this node                                     storage node
//!  DistributedExec ─ ReportedExec ─ NetworkCoalesceExec ══ t0: StorageFragmentExec (all of it)
//!                                                         t1: StorageFragmentExec (nothing)
//! ```
//!
//! The fragment carries its own take, if any; the node's task reads all
//! that it names and the second task (the engine keeps no one-task
//! boundary) reads nothing. The node's report is taken off in band, its
//! bad samples and stage times merged into the caller's UDF environment.
//! A fragment that fails on the node fails with its status (a dataset not
//! found, a checksum mismatch: the node's own kind, as `LinkError`); a
//! query that ends for any other reason (the node died, the link broke)
//! is the node being unavailable. A failure before the first batch is
//! this function's error, as it would be for a node in this process.

use std::error::Error;
use std::sync::Arc;

use datafusion::error::DataFusionError;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::{StreamExt, TryStreamExt, stream};
use sluice_flight::{LinkError, StorageEndpoint};
use sluice_planner::fragment::{FragmentPlan, NodeReads, StorageFragmentExec};
use sluice_udfs::UdfEnv;

use super::stage_query::run_stage;
use super::{NodeChannels, stage_of};
use crate::reported::Tally;

/// Runs `fragment` (over `dataset`) on `endpoint`, a node reached by
/// network, under `udfs`: its rows, in one stream (see the module docs).
pub async fn run_on_node(
    endpoint: &Arc<dyn StorageEndpoint>,
    dataset: &str,
    fragment: Arc<dyn ExecutionPlan>,
    udfs: Arc<UdfEnv>,
) -> Result<SendableRecordBatchStream, LinkError> {
    let node = endpoint.name().to_string();
    let schema = fragment.schema();
    let task = |reads| {
        StorageFragmentExec::new(
            dataset.to_string(),
            node.clone(),
            reads,
            FragmentPlan::Planned(Arc::clone(&fragment)),
            udfs.options,
            Arc::clone(&schema),
        )
    };
    let tasks = vec![task(NodeReads::Whole), task(NodeReads::Nothing)];
    let lost = |e: DataFusionError| link_error(&node, e);
    let stage = stage_of(tasks, &udfs, &Arc::new(Tally::default())).map_err(lost)?;
    let mut rows = run_stage(stage, NodeChannels::new(std::slice::from_ref(endpoint)))
        .await
        .map_err(lost)?;
    // The first answer, so that a fragment the node refuses fails here.
    let first = match rows.next().await {
        None => None,
        Some(Err(e)) => return Err(lost(e)),
        Some(Ok(b)) => Some(Ok(b)),
    };
    let rest = rows.map_err(move |e| DataFusionError::from(link_error(&node, e)));
    Ok(Box::pin(RecordBatchStreamAdapter::new(
        schema,
        stream::iter(first).chain(rest),
    )))
}

/// `e`, met running a fragment on `node`, as the link's error: the node's
/// own (its status, carried in band) when there is one, else the node
/// being unavailable (the engine's transport keeps only strings).
fn link_error(node: &str, e: DataFusionError) -> LinkError {
    let ours = sluice_base::fault::fault_of(&e).and_then(|f| {
        let err: &(dyn Error + 'static) = f;
        err.downcast_ref::<LinkError>().cloned()
    });
    ours.unwrap_or_else(|| LinkError::Unavailable {
        node: node.to_string(),
        reason: e.to_string(),
    })
}
