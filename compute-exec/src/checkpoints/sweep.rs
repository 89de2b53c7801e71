//! The sweep: pieces on the storage nodes that no committed version
//! names and no upload in progress writes — left by a coordinator killed
//! between the nodes' commits and its ledger's, by a delete a node did
//! not hear, or by a group whose undoing a node missed — are deleted.
//!
//! The nodes are listed first and the ledger and the uploads read after:
//! a piece committed on a node before its upload finished is then either
//! still an upload here or named by the ledger, never taken for litter.

use std::collections::HashSet;
use std::time::Duration;

use super::{ClusterCheckpoints, PIECES, lock};

/// How soon after start the first sweep runs.
pub const FIRST: Duration = Duration::from_secs(30);

impl ClusterCheckpoints {
    /// Deletes the pieces no version names from every node that answers;
    /// how many.
    pub async fn sweep(&self) -> usize {
        let nodes = self.session.endpoints();
        let listed = futures::future::join_all(nodes.iter().map(|e| async move {
            let node = self.node(e.name()).ok()?;
            match node.list(PIECES).await {
                Ok(list) => Some((node, list)),
                Err(err) => {
                    tracing::warn!("checkpoint sweep: {err}");
                    None
                }
            }
        }))
        .await;
        let active: HashSet<String> = lock(&self.uploads)
            .values()
            .map(|u| u.local.clone())
            .collect();
        let named: HashSet<(String, String)> = match self.ledger.list("") {
            Ok(all) => all
                .into_iter()
                .flat_map(|v| v.pieces)
                .map(|p| (p.node, p.local))
                .collect(),
            Err(e) => {
                tracing::warn!("checkpoint sweep skipped: {e}");
                return 0;
            }
        };
        let mut swept = 0;
        for (node, list) in listed.into_iter().flatten() {
            let mut names: Vec<String> = list.into_iter().map(|i| i.name).collect();
            names.dedup();
            for local in names {
                let known = named.contains(&(node.name().to_string(), local.clone()));
                if known || active.contains(&local) {
                    continue;
                }
                match node.delete(&local).await {
                    Ok(_) => {
                        swept += 1;
                        tracing::info!("checkpoint sweep: {local} on {} deleted", node.name());
                    }
                    Err(e) => tracing::warn!("checkpoint sweep: {e}"),
                }
            }
        }
        swept
    }
}
