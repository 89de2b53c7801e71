//! Moving a replicated dataset's parts between storage nodes, online:
//! re-replication after a node is lost, drain before a node is taken
//! out, rebalance after a node joins.
//!
//! Each is a [`Plan`] (`plan`: which part goes from where to where) carried
//! out as a two-phase commit over the nodes it touches (`copy`): every
//! node affected prepares a new version of the dataset — the rows of its
//! current version it keeps, and the rows copied in from a holder — and
//! the new versions are committed on all of them or on none. Then the
//! coordinator's ledger names the new versions and the new layout, and a
//! new job or query reads them.
//!
//! Nothing stops meanwhile. A job running reads the versions it pinned at
//! submit, which stay: a node's version that a move replaced, or a
//! drained node's, is retired (its chunks freed) only once no pending or
//! running job reads it (checked every second, in the background). A
//! lost node's old copy is not touched: it is gone. If it comes back, the
//! ledger knows what it holds as moved away (`PartLedger::moved_away`):
//! it is never read, and it is told to retire those versions — by the
//! lost-node watch for a node named at start, at its registration for
//! one that registers.
//!
//! Moves run one at a time, and never beside a sharded ingest (both hold
//! the storage nodes' ingest locks).
//!
//! Modules:
//! - [`lost`]: `LostNodes`: a storage node that does not answer for longer
//!   than the cluster's lost time counts as lost.

pub mod copy;
pub mod lost;
pub mod plan;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use sluice_base::Fault;
use sluice_flight::copy::Retire;
use sluice_flight::{LinkError, StorageEndpoint};
use tonic::Code;

pub use self::copy::NodeVersion;
pub use self::plan::{Move, Plan, Short};
use crate::job::Jobs;
use crate::replicas::ledger::PartLayout;

/// Why parts move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Why {
    /// These nodes are lost: their parts are copied from the holders left.
    Lost(Vec<String>),
    /// This node is drained: its parts go elsewhere, then it holds none.
    Drain(String),
    /// Spread the parts evenly over the nodes (one joined).
    Rebalance,
}

impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Lost(n) => write!(f, "re-replication of {}", n.join(", ")),
            Self::Drain(n) => write!(f, "drain of {n}"),
            Self::Rebalance => f.write_str("rebalance"),
        }
    }
}

/// Why parts could not move.
#[derive(Debug, thiserror::Error)]
pub enum MoveError {
    /// A node the layout names is not known.
    #[error("storage node {0} is not known to this coordinator")]
    UnknownNode(String),
    /// The dataset was not laid out by this cluster's ingest.
    #[error("dataset {0} has no layout here (it was not ingested by this cluster)")]
    NotLaidOut(String),
    /// Its samples could not be listed.
    #[error("cannot list the samples to move: {0}")]
    Listing(String),
    /// Parts that look alike while some holders do not answer, and that
    /// would move differently.
    #[error(
        "parts {parts:?} are all found on {nodes:?} while their other holders do not answer, \
         and would move differently; try again when those answer"
    )]
    Ambiguous {
        /// The parts.
        parts: Vec<usize>,
        /// Where their samples are found.
        nodes: Vec<String>,
    },
    /// A node could not write its new version: nothing moved.
    #[error("{0}; nothing moved")]
    Copy(LinkError),
    /// Some nodes committed their new versions, then one could not.
    #[error(
        "new versions committed on {committed:?} but not on {failed}; the layout is unchanged \
         and the move should be run again"
    )]
    Partial {
        /// Nodes whose new version is committed.
        committed: Vec<String>,
        /// The node that could not commit.
        failed: String,
    },
    /// The ledger could not be written.
    #[error("the moves committed but the ledger could not note them: {0}")]
    Ledger(String),
}

impl Fault for MoveError {
    fn code(&self) -> Code {
        match self {
            Self::UnknownNode(_) | Self::NotLaidOut(_) => Code::NotFound,
            Self::Ambiguous { .. } => Code::FailedPrecondition,
            Self::Copy(e) => e.code(),
            Self::Listing(_) | Self::Partial { .. } | Self::Ledger(_) => Code::Internal,
        }
    }

    fn kind(&self) -> &str {
        match self {
            Self::UnknownNode(_) => "node_not_found",
            Self::NotLaidOut(_) => "not_laid_out",
            Self::Listing(_) => "listing_failed",
            Self::Ambiguous { .. } => "holders_unavailable",
            Self::Copy(e) => e.kind(),
            Self::Partial { .. } => "partial_commit",
            Self::Ledger(_) => "ledger",
        }
    }
}

/// A version a move replaced, retired once no job reads it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Retiring {
    /// The node.
    pub node: String,
    /// Its versions up to this one go.
    pub through: u64,
    /// The jobs that read it when the move committed (it waits for them).
    pub waiting_for: Vec<String>,
}

/// What a move of one dataset did.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct MoveReport {
    /// The dataset.
    pub dataset: String,
    /// Why (`re-replication of …`, `drain of …`, `rebalance`).
    pub why: String,
    /// The copies made.
    pub moves: Vec<Move>,
    /// Parts a node stopped holding: `[part, node]`.
    #[schema(value_type = Vec<Object>)]
    pub drops: Vec<(usize, String)>,
    /// Parts still short of copies, and why.
    pub short: Vec<Short>,
    /// The new version on each node written.
    pub versions: Vec<NodeVersion>,
    /// Versions to be retired.
    pub retiring: Vec<Retiring>,
    /// Wall time, seconds.
    pub seconds: f64,
}

/// Moves `dataset`'s parts for `why` (see the module docs).
pub async fn move_dataset(
    jobs: &Arc<Jobs>,
    dataset: &str,
    why: &Why,
) -> Result<MoveReport, MoveError> {
    let started = Instant::now();
    let session = jobs.session();
    let layout = session
        .ledger()
        .layout(dataset)
        .ok_or_else(|| MoveError::NotLaidOut(dataset.to_string()))?;
    let endpoints = session.endpoints();
    let readable = answering(&endpoints).await;
    let leaving: Vec<String> = match why {
        Why::Lost(n) => n.clone(),
        Why::Drain(n) => vec![n.clone()],
        Why::Rebalance => Vec::new(),
    };
    let nodes: Vec<String> = endpoints
        .iter()
        .map(|e| e.name().to_string())
        .filter(|n| readable.contains(n) && !leaving.contains(n))
        .collect();
    let plan = match why {
        Why::Rebalance => plan::spread(&layout, &nodes),
        _ => plan::away(&layout, &leaving, &nodes, &|n| readable.contains(n)),
    };
    let mut report = MoveReport {
        dataset: dataset.to_string(),
        why: why.to_string(),
        moves: plan.moves.clone(),
        drops: plan.drops.clone(),
        short: plan.short.clone(),
        versions: Vec::new(),
        retiring: Vec::new(),
        seconds: 0.0,
    };
    let changed = !plan.moves.is_empty() || !plan.drops.is_empty();
    if changed {
        // The dataset's schema as its nodes list it now.
        if let Err(e) = session.refresh().await {
            tracing::warn!("before the {why} of {dataset}: {e}");
        }
        let schema = session
            .table_schemas()
            .await
            .remove(dataset)
            .ok_or_else(|| MoveError::Listing(format!("no node lists {dataset}")))?;
        let txn = crate::ingest::txn_id(&format!("move-{dataset}"));
        report.versions = copy::execute(dataset, &schema, &layout, &plan, &endpoints, &txn).await?;
    }
    let after = laid_out(&layout, &plan, &report.versions);
    if changed || after != layout {
        note(jobs, dataset, &layout, &after)?;
    }
    // The versions no layout names any more, on the nodes that answer.
    for (node, &version) in &layout.versions {
        if after.versions.get(node) != Some(&version) && readable.contains(node) {
            report.retiring.push(Retiring {
                node: node.clone(),
                through: version,
                waiting_for: jobs.pinning(dataset, node, version),
            });
        }
    }
    for r in &report.retiring {
        if let Some(node) = endpoints.iter().find(|e| e.name() == r.node) {
            retire_when_unread(Arc::clone(jobs), Arc::clone(node), dataset, r.through);
        }
    }
    report.seconds = started.elapsed().as_secs_f64();
    tracing::info!(
        "{} of {dataset}: {} part copies, {} drops, {} parts short, {:.1} s",
        report.why,
        report.moves.len(),
        report.drops.len(),
        report.short.len(),
        report.seconds
    );
    Ok(report)
}

/// The layout once `plan` is carried out and `versions` committed.
fn laid_out(layout: &PartLayout, plan: &Plan, versions: &[NodeVersion]) -> PartLayout {
    let holding: HashSet<&String> = plan.holders.iter().flatten().collect();
    let mut v: BTreeMap<String, u64> = layout
        .versions
        .iter()
        .filter(|(n, _)| holding.contains(n))
        .map(|(n, v)| (n.clone(), *v))
        .collect();
    for nv in versions {
        v.insert(nv.node.clone(), nv.version);
    }
    PartLayout {
        replicas: layout.replicas,
        holders: plan.holders.clone(),
        versions: v,
    }
}

/// Notes the new layout in the ledger and has the session read it.
fn note(
    jobs: &Arc<Jobs>,
    dataset: &str,
    before: &PartLayout,
    after: &PartLayout,
) -> Result<(), MoveError> {
    let ledger = jobs.session().ledger();
    let gone: Vec<String> = before
        .versions
        .keys()
        .filter(|n| !after.versions.contains_key(*n))
        .cloned()
        .collect();
    let parts: Vec<(String, u64)> = after
        .versions
        .iter()
        .map(|(n, v)| (n.clone(), *v))
        .collect();
    ledger
        .committed(dataset, &parts)
        .and_then(|()| ledger.released(dataset, &gone))
        .and_then(|()| ledger.laid_out(dataset, after.clone()))
        .map_err(|e| MoveError::Ledger(e.to_string()))?;
    let session = Arc::clone(jobs.session());
    sluice_base::task::detach(async move {
        if let Err(e) = session.refresh().await {
            tracing::warn!("after a move: {e}");
        }
    });
    Ok(())
}

/// The nodes of `endpoints` that answer within two seconds.
pub async fn answering(endpoints: &[Arc<dyn StorageEndpoint>]) -> HashSet<String> {
    let asked = endpoints.iter().map(|e| async move {
        let up = tokio::time::timeout(Duration::from_secs(2), e.node_info()).await;
        matches!(up, Ok(Ok(_))).then(|| e.name().to_string())
    });
    futures::future::join_all(asked)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// How long a replaced version waits for the jobs reading it.
const RETIRE_WAIT: Duration = Duration::from_secs(24 * 3600);

/// Retires `dataset`'s versions through `through` on `node` once no
/// pending or running job reads them, checked every second, in the
/// background: after a move, or when a node the moves left behind comes
/// back holding its old copy.
pub fn retire_when_unread(
    jobs: Arc<Jobs>,
    node: Arc<dyn StorageEndpoint>,
    dataset: &str,
    through: u64,
) {
    let dataset = dataset.to_string();
    sluice_base::task::detach(async move {
        let started = Instant::now();
        while !jobs.pinning(&dataset, node.name(), through).is_empty() {
            if started.elapsed() > RETIRE_WAIT {
                tracing::warn!(
                    "{dataset} version {through} on {} is still read after {} h; kept",
                    node.name(),
                    RETIRE_WAIT.as_secs() / 3600
                );
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let req = Retire {
            dataset: dataset.clone(),
            through: Some(through),
        };
        match node.retire(&req).await {
            Ok(r) => tracing::info!(
                "{dataset}: retired versions {:?} on {} ({} bytes)",
                r.versions,
                node.name(),
                r.bytes
            ),
            Err(e) => tracing::warn!("{dataset}: cannot retire on {}: {e}", node.name()),
        }
    });
}
