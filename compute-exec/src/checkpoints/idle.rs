//! Uploads whose writer went (`ClusterCheckpoints::expire_idle`): aborted
//! on every node once idle past the timeout. An upload whose parts pass through the coordinator is idle
//! when none has for that long. One its writer writes to the nodes
//! directly sends nothing here, so it is idle only once a node no longer
//! holds its piece open (each node expires its own idle uploads); until
//! then it counts as active now.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use sluice_flight::checkpoint::node::NodeCheckpoints;

use super::upload::ClusterUpload;

/// The (node, piece upload) pairs of `uploads` that their nodes still
/// hold open: one question to each node. A node that does not answer
/// holds none (the upload could not commit without it).
pub(super) async fn open_on_nodes(uploads: &[&ClusterUpload]) -> HashSet<(String, String)> {
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
