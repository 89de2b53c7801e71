//! Checkpoints on a cluster: a coordinator over remote storage nodes
//! serves the checkpoint protocol (`sluice_flight::checkpoint`) and keeps
//! every version striped and replicated over its storage nodes.
//!
//! ```text
//!  trainer ── checkpoint.begin ──► coordinator ── checkpoint.begin ×n ──► every storage node that answers
//!          ◄── {upload, direct: each node's upload and pass}
//!          ── DoPut stripe s, with node k's pass ──────────────────────► nodes s … s+R−1 (mod n), at once
//!          (or ── DoPut parts ──► coordinator: cut into stripes of 4 MiB, each sent on the same way)
//!          ── checkpoint.commit ─►   every node commits its piece (durable) ─► one ledger transaction:
//!                                    the version exists
//!          ── checkpoint.stat {direct} ─► coordinator ── checkpoint.read_pass ×pieces ──► their nodes
//!          ◄── {…, direct: each piece, its stripes and its read pass}
//!          ── DoGet stripe s, with its piece's read pass ──────────────► one of its holders, the next on error
//!          (or ── DoGet range ──► coordinator: each stripe from one holder, the next on any error)
//! ```
//!
//! - **Striped** ([`stripes`]): consecutive stripes go to different
//!   nodes, so a write or read of a few stripes keeps every node busy.
//!   Each node keeps its stripes of a version as one checkpoint version of
//!   its own (a piece, named `.stripes/<upload>/<name>`), so the node's
//!   store, its crc32c per extent and its crash safety apply unchanged.
//! - **Replicated** like a dataset: R copies of each stripe (the cluster's
//!   default, 2 with at least 2 nodes), on R distinct nodes. A write needs
//!   R nodes to answer its `begin`; a read needs one holder of each
//!   stripe.
//! - **Two-phase**: a version exists only once every piece is committed
//!   (durable) on its node and then the coordinator's ledger
//!   ([`ledger`]) records it, in one transaction with every version of a
//!   group commit. A writer, a node or the coordinator killed before that
//!   leaves the previous version readable and nothing partial listed; the
//!   pieces left behind are deleted (at once where the nodes answer, else
//!   by the sweep, [`sweep`]).
//! - **Scoped tokens** apply as on one machine: the Flight service checks
//!   a call's checkpoint name before it reaches here.
//!
//! - **Lost and drained nodes** ([`moves`]): the stripes a node held get
//!   a copy on a node that stays, from their other holders.
//! - **Scrub and repair** ([`scrub`]): each node reads its pieces back
//!   against their checksums; a bad extent is rewritten from another
//!   holder.
//!
//! - **Written and read by the trainer itself** where it asks and the
//!   nodes give passes ([`begin`], [`read`]): it sends each stripe to its
//!   holders directly and reads each from one of them, and the coordinator
//!   only begins, commits and says where the stripes are (DAOS's
//!   client-side striping); otherwise the bytes pass through here.
//!
//! Files: [`stripes`] (placement), [`ledger`] (what exists), [`begin`]
//! (a version begun, its writer's direct layout), [`idle`] (uploads whose
//! writer went), [`upload`] (a version being written), [`commit`], [`read`],
//! [`sweep`] (pieces no version names), [`moves`] (stripes off nodes
//! that leave), [`scrub`] (reading back, repairing), [`endpoint`] (the
//! protocol).

pub mod begin;
pub mod commit;
pub mod endpoint;
pub mod idle;
pub mod ledger;
pub mod moves;
pub mod read;
pub mod scrub;
pub mod stripes;
pub mod sweep;
pub mod upload;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use sluice_base::{CallError, Fault};
use sluice_flight::checkpoint::node::NodeCheckpoints;
use sluice_flight::{Credential, LinkError};
use tonic::{Code, Status};

use crate::session::ComputeSession;
use ledger::{CheckpointLedger, LedgerError};
use upload::ClusterUpload;

/// Bytes per stripe: one chunk of a node's store (4 MiB by default), so
/// a stripe sent whole is one extent there.
pub const STRIPE: u64 = 4 << 20;
/// Connections the coordinator holds to each node for checkpoints.
const LANES: usize = 4;
/// How long a node has to answer a `begin`.
const BEGIN_WAIT: Duration = Duration::from_secs(5);

/// How many uploads of a `begin_group` are begun at once (each asks every
/// node).
const BEGIN_DEPTH: usize = 8;
/// How long a node that failed a read is tried last.
const DOWN_FOR: Duration = Duration::from_secs(10);
/// What the pieces of the cluster's checkpoints are named under on a node.
pub const PIECES: &str = ".stripes/";

/// How the cluster keeps checkpoints.
#[derive(Debug, Clone)]
pub struct Keeping {
    /// Versions kept per name (the newest), at least 1.
    pub keep: usize,
    /// An upload with no part in flight for this long is aborted.
    pub idle_timeout: Duration,
    /// Copies of each stripe (`None`: 2 with at least 2 nodes).
    pub replicas: Option<u32>,
    /// How often the nodes are swept for pieces no version names (the
    /// first sweep comes at most [`sweep::FIRST`] after start).
    pub sweep_every: Duration,
}

/// Why a cluster checkpoint call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClusterCheckpointError {
    /// A storage node failed its share.
    #[error("checkpoint '{name}': {source}")]
    Node {
        /// The checkpoint.
        name: String,
        /// The node's error (naming it).
        source: LinkError,
    },
    /// Too few storage nodes answered for the replicas asked.
    #[error(
        "checkpoint '{name}': {replicas} replica(s) need as many storage nodes; \
         {answered} of {known} answered{missing}"
    )]
    TooFewNodes {
        /// The checkpoint.
        name: String,
        /// Copies asked of each stripe.
        replicas: u32,
        /// Nodes that answered.
        answered: usize,
        /// Nodes known.
        known: usize,
        /// Those that did not, and why.
        missing: String,
    },
    /// No holder of a stripe could give it.
    #[error(
        "checkpoint '{name}' version {version}: bytes {start}..{end}: every holder failed: {errors}"
    )]
    Unreadable {
        /// The checkpoint.
        name: String,
        /// Its version.
        version: u64,
        /// First byte of the stripe's range.
        start: u64,
        /// Its end.
        end: u64,
        /// Each holder's error.
        errors: String,
        /// Whether every holder answered with a checksum mismatch or a
        /// loss (`DATA_LOSS`), not with being down.
        lost: bool,
    },
    /// The ledger.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// The request itself (an unknown upload or version, a bad name or
    /// size).
    #[error("{0}")]
    Call(CallError),
}

impl Fault for ClusterCheckpointError {
    fn code(&self) -> Code {
        match self {
            Self::Node { source, .. } => source.code(),
            Self::TooFewNodes { .. } => Code::Unavailable,
            Self::Unreadable { lost: true, .. } => Code::DataLoss,
            Self::Unreadable { .. } => Code::Unavailable,
            Self::Ledger(_) => Code::Internal,
            Self::Call(e) => e.code(),
        }
    }

    fn kind(&self) -> &str {
        match self {
            Self::Node { source, .. } => source.kind(),
            Self::TooFewNodes { .. } => "node_unavailable",
            Self::Unreadable { lost: true, .. } => "checksum_mismatch",
            Self::Unreadable { .. } => "node_unavailable",
            Self::Ledger(_) => "internal",
            Self::Call(e) => e.kind(),
        }
    }
}

impl From<ClusterCheckpointError> for Status {
    fn from(e: ClusterCheckpointError) -> Self {
        sluice_base::fault::status(&e)
    }
}

type Result<T, E = ClusterCheckpointError> = std::result::Result<T, E>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// See the module docs.
#[derive(Debug)]
pub struct ClusterCheckpoints {
    session: Arc<ComputeSession>,
    ledger: CheckpointLedger,
    keeping: Keeping,
    credential: Credential,
    nodes: Mutex<HashMap<String, Arc<NodeCheckpoints>>>,
    uploads: Mutex<HashMap<String, Arc<ClusterUpload>>>,
    /// Nodes that failed a read lately, and when.
    down: Mutex<HashMap<String, Instant>>,
    /// Itself, for the streams that outlive a call.
    me: std::sync::Weak<Self>,
}

impl ClusterCheckpoints {
    /// The checkpoints of `session`'s storage nodes, their ledger in `dir`;
    /// the nodes are called presenting `credential`.
    pub fn open(
        session: Arc<ComputeSession>,
        dir: &Path,
        keeping: Keeping,
        credential: Credential,
    ) -> Result<Arc<Self>> {
        let ledger = CheckpointLedger::open(dir)?;
        Ok(Arc::new_cyclic(|me| Self {
            session,
            ledger,
            keeping,
            credential,
            nodes: Mutex::default(),
            uploads: Mutex::default(),
            down: Mutex::default(),
            me: me.clone(),
        }))
    }

    /// The client of the node at `url`, made on first use.
    fn node(&self, url: &str) -> Result<Arc<NodeCheckpoints>, LinkError> {
        if let Some(n) = lock(&self.nodes).get(url) {
            return Ok(Arc::clone(n));
        }
        let made = Arc::new(NodeCheckpoints::connect(
            url,
            self.credential.clone(),
            LANES,
        )?);
        Ok(Arc::clone(
            lock(&self.nodes).entry(url.to_string()).or_insert(made),
        ))
    }

    fn unknown_upload(&self, id: &str) -> ClusterCheckpointError {
        ClusterCheckpointError::Call(CallError::NotFound(format!(
            "checkpoint upload {} (finished, aborted or idle past {} s)",
            id.chars().take(64).collect::<String>(),
            self.keeping.idle_timeout.as_secs()
        )))
    }

    fn upload(&self, id: &str) -> Result<Arc<ClusterUpload>> {
        lock(&self.uploads)
            .get(id)
            .cloned()
            .ok_or_else(|| self.unknown_upload(id))
    }

    /// Abandons upload `id`: every node drops its piece.
    pub async fn abort(&self, id: &str) -> Result<()> {
        let removed = lock(&self.uploads).remove(id);
        let upload = removed.ok_or_else(|| self.unknown_upload(id))?;
        upload.abort_everywhere().await;
        Ok(())
    }

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
        let open = idle::open_on_nodes(&direct).await;
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

    /// Expires idle uploads every quarter of the timeout and sweeps the
    /// nodes' pieces no version names every [`Keeping::sweep_every`], for
    /// as long as `this` lives.
    pub fn spawn_upkeep(this: &Arc<Self>) {
        let weak = Arc::downgrade(this);
        let every = this.keeping.sweep_every;
        let period = (this.keeping.idle_timeout / 4)
            .min(every)
            .max(Duration::from_millis(100));
        sluice_base::task::detach(async move {
            let mut tick = tokio::time::interval(period);
            let first = every.min(sweep::FIRST);
            let mut swept = Instant::now()
                .checked_sub(every - first)
                .unwrap_or_else(Instant::now);
            loop {
                tick.tick().await;
                let Some(this) = weak.upgrade() else { break };
                this.expire_idle().await;
                if swept.elapsed() >= every {
                    swept = Instant::now();
                    this.sweep().await;
                }
            }
        });
    }

    /// Whether the node `url` failed a read within [`DOWN_FOR`].
    fn is_down(&self, url: &str) -> bool {
        lock(&self.down)
            .get(url)
            .is_some_and(|t| t.elapsed() < DOWN_FOR)
    }

    fn mark_down(&self, url: &str) {
        lock(&self.down).insert(url.to_string(), Instant::now());
    }
}

/// A fresh upload id: random (an upload's id is what lets its writer,
/// and no one else, write it), and unique in time.
fn new_id() -> String {
    format!(
        "{:016x}{:016x}",
        getrandom::u64().unwrap_or_default(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or_default()
    )
}
