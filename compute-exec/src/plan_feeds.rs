//! [`Feeds`]: the feeds of one placed plan of a job stream — one per
//! storage node, opened at the node's first window and kept for the
//! stream's later windows (see `sluice_flight::feed`), so a window costs
//! each node a work unit of a running engine query, not a round trip, a
//! fragment decoded and a session built. A re-plan places a new plan, with feeds
//! of its own; the old plan's close with its last window.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::ExecutionPlan;
use sluice_flight::{Feed, LinkError, StorageEndpoint};
use sluice_planner::fragment::Take;
use sluice_udfs::UdfEnv;

use sluice_flight::endpoint::endpoint_id;

use crate::engine::EngineFeed;

/// The rows each storage node reads for one window of a job, by node
/// (`sluice_flight::endpoint::endpoint_id`).
pub type Takes = Arc<HashMap<usize, Take>>;

/// See the module docs.
#[derive(Debug, Default)]
pub struct Feeds {
    open: tokio::sync::Mutex<HashMap<usize, Arc<dyn Feed>>>,
}

impl Feeds {
    /// Runs `fragment` (over `dataset`) over `take`'s rows on `endpoint`,
    /// through its feed (opened now if this is the node's first window):
    /// the node's own for a node in this process, else on the distributed
    /// engine ([`crate::engine::EngineFeed`]).
    pub async fn window(
        &self,
        endpoint: &Arc<dyn StorageEndpoint>,
        dataset: &str,
        fragment: &Arc<dyn ExecutionPlan>,
        udfs: &Arc<UdfEnv>,
        take: &Take,
    ) -> Result<SendableRecordBatchStream, LinkError> {
        let feed = {
            let mut open = self.open.lock().await;
            match open.get(&endpoint_id(endpoint)) {
                Some(feed) => Arc::clone(feed),
                None => {
                    let feed: Arc<dyn Feed> = match Arc::clone(endpoint).in_process() {
                        Some(node) => node.feed(Arc::clone(fragment), Arc::clone(udfs)).await?,
                        None => Arc::new(EngineFeed::new(
                            endpoint,
                            dataset,
                            Arc::clone(fragment),
                            Arc::clone(udfs),
                        )),
                    };
                    open.insert(endpoint_id(endpoint), Arc::clone(&feed));
                    feed
                }
            }
        };
        feed.window(take).await
    }
}
