//! Checkpoints on a cluster: a coordinator over remote storage nodes
//! serves the checkpoint protocol (`sluice_flight::checkpoint`) and keeps
//! every version striped and replicated over its storage nodes.
//!
//! ```text
//!  trainer ── checkpoint.begin ──► coordinator ── checkpoint.begin ×n ──► every storage node that answers
//!          ── DoPut parts ───────►   cut into stripes of 4 MiB; stripe s ─► nodes s … s+R−1 (mod n), at once
//!          ── checkpoint.commit ─►   every node commits its piece (durable) ─► one ledger transaction:
//!                                    the version exists
//!          ── DoGet range ───────►   each stripe from one holder, the next on any error (lost, checksum)
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
//! Files: [`stripes`] (placement), [`ledger`] (what exists),
//! [`upload`] (a version being written), [`commit`], [`read`],
//! [`sweep`] (pieces no version names), [`moves`] (stripes off nodes
//! that leave), [`scrub`] (reading back, repairing), [`endpoint`] (the
//! protocol).

pub mod commit;
pub mod endpoint;
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

use futures::StreamExt;
use sluice_base::{CallError, Fault};
use sluice_flight::checkpoint::node::NodeCheckpoints;
use sluice_flight::{Credential, LinkError};
use tonic::{Code, Status};

use crate::session::ComputeSession;
use ledger::{CheckpointLedger, LedgerError};
use stripes::Striping;
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

    /// Starts a version of `name` over the storage nodes that answer;
    /// its upload id.
    pub async fn begin(&self, name: &str) -> Result<String> {
        if let Some(reason) = sluice_flight::checkpoint::requests::name_problem(name) {
            return Err(ClusterCheckpointError::Call(CallError::BadRequest(
                format!(
                    "bad checkpoint name {:?}: {reason}",
                    name.chars().take(64).collect::<String>()
                ),
            )));
        }
        self.expire_idle().await;
        let known = self.session.endpoints();
        let replicas = self
            .keeping
            .replicas
            .unwrap_or_else(|| crate::ingest::default_replicas(known.len()));
        let id = new_id();
        let local = format!("{PIECES}{id}/{name}");
        let most = sluice_flight::checkpoint::requests::MAX_NAME - (local.len() - name.len());
        if name.len() > most {
            return Err(ClusterCheckpointError::Call(CallError::BadRequest(
                format!(
                    "bad checkpoint name {:?}: on a cluster a name is at most {most} bytes",
                    name.chars().take(64).collect::<String>()
                ),
            )));
        }
        let begun = futures::future::join_all(known.iter().map(|e| {
            let local = &local;
            async move {
                let node = self.node(e.name())?;
                let upload = tokio::time::timeout(BEGIN_WAIT, node.begin(local))
                    .await
                    .map_err(|_| LinkError::Unavailable {
                        node: e.name().to_string(),
                        reason: format!(
                            "no answer to begin a checkpoint within {} s",
                            BEGIN_WAIT.as_secs()
                        ),
                    })??;
                Ok::<_, LinkError>((node, upload))
            }
        }))
        .await;
        let mut nodes = Vec::new();
        let mut missing = Vec::new();
        for r in begun {
            match r {
                Ok(pair) => nodes.push(pair),
                Err(e) => missing.push(e.to_string()),
            }
        }
        if (nodes.len() as u32) < replicas.max(1) {
            for (node, upload) in &nodes {
                let _ = node.abort(upload).await;
            }
            return Err(ClusterCheckpointError::TooFewNodes {
                name: name.to_string(),
                replicas,
                answered: nodes.len(),
                known: known.len(),
                missing: if missing.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", missing.join("; "))
                },
            });
        }
        if !missing.is_empty() {
            tracing::warn!(
                "checkpoint '{name}': striped over the {} node(s) that answered; not over: {}",
                nodes.len(),
                missing.join("; ")
            );
        }
        let striping = Striping {
            unit: STRIPE,
            nodes: nodes.len() as u32,
            replicas,
        };
        let upload = ClusterUpload::new(name.to_string(), local, striping, nodes);
        lock(&self.uploads).insert(id.clone(), Arc::new(upload));
        Ok(id)
    }

    /// Begins an upload of each of `names` (a checkpoint's files, to
    /// commit together with [`Self::commit_group`]), a few at once; their
    /// ids in order. Where one cannot begin, those begun are aborted and
    /// its error is the answer.
    pub async fn begin_group(&self, names: &[String]) -> Result<Vec<String>> {
        if let Some(reason) = sluice_flight::checkpoint::requests::group_problem(names) {
            return Err(ClusterCheckpointError::Call(CallError::BadRequest(reason)));
        }
        // Collected first: a stream's closure over `begin` is not `Send`
        // for every lifetime, as the action's future must be.
        let calls: Vec<_> = names.iter().map(|name| self.begin(name)).collect();
        let begun: Vec<Result<String>> = futures::stream::iter(calls)
            .buffered(BEGIN_DEPTH)
            .collect()
            .await;
        let mut ids = Vec::with_capacity(names.len());
        let mut failed = None;
        for r in begun {
            match r {
                Ok(id) => ids.push(id),
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        let Some(e) = failed else {
            return Ok(ids);
        };
        for id in &ids {
            let _ = self.abort(id).await;
        }
        Err(e)
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
        let expired: Vec<Arc<ClusterUpload>> = {
            let mut uploads = lock(&self.uploads);
            let ids: Vec<String> = uploads
                .iter()
                .filter(|(_, u)| u.idle_for(idle))
                .map(|(id, _)| id.clone())
                .collect();
            ids.iter().filter_map(|id| uploads.remove(id)).collect()
        };
        for u in &expired {
            tracing::warn!(
                "checkpoint '{}': upload idle for {} s, aborted on every node",
                u.name,
                idle.as_secs()
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
