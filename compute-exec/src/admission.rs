//! A storage node that registers with the coordinator (`sluice
//! storage-node --coordinator`, `POST /v1/nodes/storage`): whether it is
//! read. A node not read yet must answer within [`ANSWER`], and is read
//! only if every dataset version it holds is one the cluster wrote there
//! (`replicas::ledger`); versions the cluster wrote there and then moved
//! away (the node was lost, or drained) are stale, not foreign: retired,
//! never read. A node already read learns nothing new: its registration
//! is a heartbeat. The REST handler is the adapter: it checks the
//! location's form and the node's TLS identity, keeps the quarantine, and
//! audits refusals.

use std::sync::Arc;
use std::time::Duration;

use sluice_flight::{Credential, StorageClient, StorageEndpoint};

use crate::job::Jobs;
use crate::replicas::ledger::Unknown;

/// How long a registering storage node has to list its datasets.
pub const ANSWER: Duration = Duration::from_secs(2);

/// A registration that was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admitted {
    /// The node was read already: a heartbeat.
    Known,
    /// The node is read from now on.
    Joined,
}

/// Why a storage node is not read.
#[derive(Debug, thiserror::Error)]
pub enum NotAdmitted {
    /// Its location cannot be dialled.
    #[error("{0}")]
    Location(String),
    /// It did not list its datasets in time, or failed to.
    #[error("storage node {url} did not answer: {why}")]
    Unreachable {
        /// The node.
        url: String,
        /// What went wrong.
        why: String,
    },
    /// It holds dataset versions the cluster did not write there.
    #[error(
        "storage node {url} holds dataset versions this cluster did not write there ({}): \
         quarantined; remove them from the node (or ingest through the coordinator)",
        names(.unknown)
    )]
    Foreign {
        /// The node.
        url: String,
        /// What it holds that the cluster did not write there.
        unknown: Vec<Unknown>,
    },
}

fn names(unknown: &[Unknown]) -> String {
    unknown
        .iter()
        .map(|u| format!("{}@{}", u.dataset, u.version))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Admits the storage node at `url` (dialled with `credential`) to the
/// session of `jobs`, or says why not (see the module docs).
pub async fn admit_storage(
    jobs: &Arc<Jobs>,
    url: &str,
    credential: Credential,
) -> Result<Admitted, NotAdmitted> {
    let session = jobs.session();
    if session.endpoints().iter().any(|e| e.name() == url) {
        return Ok(Admitted::Known);
    }
    let client = StorageClient::with_credential(url, credential)
        .map_err(|e| NotAdmitted::Location(e.to_string()))?;
    let unreachable = |why: String| NotAdmitted::Unreachable {
        url: url.to_string(),
        why,
    };
    let held = tokio::time::timeout(ANSWER, client.datasets())
        .await
        .map_err(|_| unreachable(format!("nothing within {} s", ANSWER.as_secs())))?
        .map_err(|e| unreachable(e.to_string()))?;
    let held: Vec<(String, u64)> = held.into_iter().map(|d| (d.name, d.version)).collect();
    let ledger = session.ledger();
    let unknown: Vec<Unknown> = ledger
        .unknown(url, &held)
        .into_iter()
        .filter(|u| !ledger.moved_away(&u.dataset, url, u.version))
        .collect();
    if !unknown.is_empty() {
        return Err(NotAdmitted::Foreign {
            url: url.to_string(),
            unknown,
        });
    }
    let client: Arc<dyn StorageEndpoint> = Arc::new(client);
    crate::moves::lost::retire_stale(jobs, &client, &held);
    if !session.admit(client) {
        return Ok(Admitted::Known);
    }
    // Its datasets are known before the next request needs them.
    if let Err(e) = session.refresh().await {
        tracing::warn!("after storage node {url} registered: {e}");
    }
    Ok(Admitted::Joined)
}
