//! Uploads whose writer went: aborted on every node once idle past the
//! timeout. An upload whose parts pass through the coordinator is idle
//! when none has for that long. One its writer writes to the nodes
//! directly sends nothing here, so it is idle only once a node no longer
//! holds its piece open (each node expires its own idle uploads); until
//! then it counts as active now.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use sluice_flight::checkpoint::node::NodeCheckpoints;

use super::upload::ClusterUpload;
use super::{ClusterCheckpoints, lock};

impl ClusterCheckpoints {
    /// Aborts the uploads idle past the timeout; how many.
    pub async fn expire_idle(&self) -> usize {
        let idle = self.keeping.idle_timeout;
        let quiet: Vec<(String, Arc<ClusterUpload>)> = lock(&self.uploads)
            .iter()
            .filter(|(_, u)| u.idle_for(idle))
            .map(|(id, u)| (id.clone(), Arc::clone(u)))
            .collect();
        if quiet.is_empty() {
            return 0;
        }
        let direct: Vec<&ClusterUpload> = quiet
            .iter()
            .filter(|(_, u)| u.direct)
            .map(|(_, u)| &**u)
            .collect();
        let open = open_on_nodes(&direct).await;
        let expired: Vec<Arc<ClusterUpload>> = {
            let mut uploads = lock(&self.uploads);
            quiet
                .iter()
                .filter_map(|(id, u)| {
                    let held = u.direct
                        && u.nodes.iter().all(|(n, piece)| {
                            open.contains(&(n.name().to_string(), piece.clone()))
                        });
                    if held {
                        u.touch();
                        return None;
                    }
                    uploads.remove(id)
                })
                .collect()
        };
        for u in &expired {
            tracing::warn!(
                "checkpoint '{}': upload idle for {} s{}, aborted on every node",
                u.name,
                idle.as_secs(),
                if u.direct {
                    " (a node no longer held its piece open)"
                } else {
                    ""
                }
            );
            u.abort_everywhere().await;
        }
        expired.len()
    }
}

/// The (node, piece upload) pairs of `uploads` that their nodes still
/// hold open: one question to each node. A node that does not answer
/// holds none (the upload could not commit without it).
async fn open_on_nodes(uploads: &[&ClusterUpload]) -> HashSet<(String, String)> {
    let mut asked: HashMap<String, (Arc<NodeCheckpoints>, Vec<String>)> = HashMap::new();
    for u in uploads {
        for (node, piece) in &u.nodes {
            asked
                .entry(node.name().to_string())
                .or_insert_with(|| (Arc::clone(node), Vec::new()))
                .1
                .push(piece.clone());
        }
    }
    let answers = futures::future::join_all(asked.into_values().map(|(node, pieces)| async move {
        match node.open_uploads(&pieces).await {
            Ok(open) => open
                .into_iter()
                .map(|p| (node.name().to_string(), p))
                .collect(),
            Err(e) => {
                tracing::warn!("checkpoint uploads written directly: {e}");
                Vec::new()
            }
        }
    }))
    .await;
    answers.into_iter().flatten().collect()
}
