//! [`run_fragment`]: one storage fragment run on the node that holds its
//! rows, wherever that node is — in this process, directly; reached by
//! network, as an engine query ([`crate::engine::run_on_node`]), the one
//! data plane between hosts.

use std::sync::Arc;

use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::ExecutionPlan;
use sluice_flight::{LinkError, StorageEndpoint};
use sluice_udfs::UdfEnv;

/// Runs `fragment` (whose leaves scan `dataset`) on `endpoint` under
/// `udfs`' options: its rows in one stream; bad samples and stage times
/// the node met are merged into `udfs`. A fragment the node refuses (a
/// dataset it does not hold, a node that cannot be reached) fails here,
/// with the node's error.
pub async fn run_fragment(
    endpoint: &Arc<dyn StorageEndpoint>,
    dataset: &str,
    fragment: Arc<dyn ExecutionPlan>,
    udfs: Arc<UdfEnv>,
) -> Result<SendableRecordBatchStream, LinkError> {
    match Arc::clone(endpoint).in_process() {
        Some(node) => node.execute(fragment, udfs).await,
        None => crate::engine::run_on_node(endpoint, dataset, fragment, udfs).await,
    }
}
