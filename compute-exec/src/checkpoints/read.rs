//! Reading a cluster checkpoint: each stripe of the range from one of its
//! holders — the stripe's own first choice in turn (so the reads of one
//! range spread over the nodes), a node that failed lately last — and
//! from the next holder when one fails: down, or its copy failing its
//! checksum there (`DATA_LOSS`). Several stripes are read at once, and
//! the bytes go out in order.
//!
//! A trainer that asks reads the stripes from the nodes itself instead
//! ([`ClusterCheckpoints::direct_read`]): each piece's node signs a read
//! pass for it (`sluice_access::read_pass`), and the trainer is told where
//! every stripe is; a stripe it cannot read from any of its holders it
//! reads through here.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::buffer::Buffer;
use futures::{Stream, StreamExt, TryStreamExt};
use sluice_base::{CallError, Fault};
use sluice_flight::LinkError;
use sluice_flight::checkpoint::node::NodeCheckpoints;
use sluice_flight::checkpoint::{DirectPiece, DirectRead};
use tonic::Code;

use super::ledger::{Piece, StripedVersion};
use super::{BEGIN_WAIT, ClusterCheckpointError, ClusterCheckpoints, Result};

/// Stripes of one range read at once.
const DEPTH: usize = 4;

/// What the reads of one range need, owned (the stream outlives the call).
struct Reads {
    version: Arc<StripedVersion>,
    nodes: HashMap<String, Arc<NodeCheckpoints>>,
    /// Nodes that failed lately, to try last.
    down: Vec<String>,
    owner: std::sync::Weak<ClusterCheckpoints>,
}

impl ClusterCheckpoints {
    /// One version of `name` (the newest when `version` is `None`).
    pub fn version(&self, name: &str, version: Option<u64>) -> Result<StripedVersion> {
        self.ledger.get(name, version)?.ok_or_else(|| {
            ClusterCheckpointError::Call(CallError::NotFound(match version {
                Some(v) => format!("checkpoint '{name}' has no version {v}"),
                None => format!("no checkpoint '{name}'"),
            }))
        })
    }

    /// Where a trainer reads `version`'s stripes itself: each piece whose
    /// node signs a read pass within [`BEGIN_WAIT`], with it (a node that
    /// failed lately is not asked, one that cannot be reached now is
    /// marked so); `None` where those pieces miss a stripe (a node down,
    /// or one that gives no passes: the reads then come through here).
    pub async fn direct_read(&self, version: &StripedVersion) -> Option<DirectRead> {
        let asked = version.pieces.iter().filter(|p| !self.is_down(&p.node));
        let passes = asked.map(|p| async move {
            match self.read_pass(p).await {
                Ok(pass) => pass.map(|pass| DirectPiece {
                    url: p.node.clone(),
                    piece: p.local.clone(),
                    version: p.local_version,
                    stripes: p.stripes.clone(),
                    pass,
                }),
                Err(e) => {
                    let (name, node) = (&version.name, &p.node);
                    tracing::info!("checkpoint '{name}': no read pass from {node}: {e}");
                    if matches!(e, LinkError::Unavailable { .. }) {
                        self.mark_down(&p.node);
                    }
                    None
                }
            }
        });
        let pieces: Vec<DirectPiece> = futures::future::join_all(passes)
            .await
            .into_iter()
            .flatten()
            .collect();
        // A piece's stripes are ascending (`Piece::stripes`).
        let held = |s| pieces.iter().any(|p| p.stripes.binary_search(&s).is_ok());
        let whole = (0..version.size.div_ceil(version.unit)).all(held);
        whole.then_some(DirectRead {
            unit: version.unit,
            pieces,
        })
    }

    /// A pass that reads `piece` at its node, within [`BEGIN_WAIT`]; none
    /// where the node gives none.
    async fn read_pass(&self, piece: &Piece) -> Result<Option<String>, LinkError> {
        let node = self.node(&piece.node)?;
        tokio::time::timeout(
            BEGIN_WAIT,
            node.read_pass(&piece.local, piece.local_version),
        )
        .await
        .map_err(|_| LinkError::Unavailable {
            node: piece.node.clone(),
            reason: format!("no answer to a read pass within {} s", BEGIN_WAIT.as_secs()),
        })?
    }

    /// The bytes `[offset, offset + len)` of `version` (clipped to its
    /// size), as buffers in order.
    pub fn read(
        &self,
        version: Arc<StripedVersion>,
        offset: u64,
        len: u64,
    ) -> impl Stream<Item = Result<Buffer>> + Send + use<> {
        let end = offset.saturating_add(len).min(version.size);
        let unit = version.unit;
        let mut nodes = HashMap::new();
        for p in &version.pieces {
            if let Ok(n) = self.node(&p.node) {
                nodes.insert(p.node.clone(), n);
            }
        }
        let down = nodes.keys().filter(|n| self.is_down(n)).cloned().collect();
        let reads = Arc::new(Reads {
            version,
            nodes,
            down,
            owner: self.me.clone(),
        });
        let stripes = if end > offset {
            offset / unit..end.div_ceil(unit)
        } else {
            0..0
        };
        futures::stream::iter(stripes)
            .map(move |s| {
                let reads = Arc::clone(&reads);
                let lo = offset.max(s * unit);
                let hi = end.min((s + 1) * unit);
                async move { reads.stripe(s, lo, hi).await }
            })
            .buffered(DEPTH)
            .map_ok(|bufs| futures::stream::iter(bufs.into_iter().map(Ok)))
            .try_flatten()
    }
}

impl Reads {
    /// Bytes `[lo, hi)` of stripe `s`, from the first holder that gives
    /// them.
    async fn stripe(&self, s: u64, lo: u64, hi: u64) -> Result<Vec<Buffer>> {
        let v = &self.version;
        let mut holders = v.holders(s);
        if !holders.is_empty() {
            let turn = (s % holders.len() as u64) as usize;
            holders.rotate_left(turn);
        }
        holders.sort_by_key(|(p, _)| self.down.contains(&p.node));
        let mut errors = Vec::new();
        let mut lost = true;
        for (piece, base) in holders {
            let at = base + (lo - s * v.unit);
            match self.fetch(piece, at, hi - lo).await {
                Ok(bufs) => return Ok(bufs),
                Err(e) => {
                    if e.code() != Code::DataLoss {
                        lost = false;
                        if let Some(owner) = self.owner.upgrade() {
                            owner.mark_down(&piece.node);
                        }
                    }
                    tracing::warn!(
                        "checkpoint '{}' version {}: stripe {s} from {}: {e}",
                        v.name,
                        v.version,
                        piece.node
                    );
                    errors.push(e.to_string());
                }
            }
        }
        Err(ClusterCheckpointError::Unreadable {
            name: v.name.clone(),
            version: v.version,
            start: lo,
            end: hi,
            lost: lost && !errors.is_empty(),
            errors: if errors.is_empty() {
                "no node holds it".into()
            } else {
                errors.join("; ")
            },
        })
    }

    /// `len` bytes at `at` of `piece`, from its node.
    async fn fetch(&self, piece: &Piece, at: u64, len: u64) -> Result<Vec<Buffer>, LinkError> {
        let node = self
            .nodes
            .get(&piece.node)
            .ok_or_else(|| LinkError::Unavailable {
                node: piece.node.clone(),
                reason: "cannot be dialled".into(),
            })?;
        let bufs: Vec<Buffer> = node
            .get(&piece.local, piece.local_version, at, len)
            .await?
            .try_collect()
            .await?;
        let got: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        if got != len {
            return Err(LinkError::Protocol(format!(
                "{} sent {got} of the {len} bytes at {at} of {}",
                piece.node, piece.local
            )));
        }
        Ok(bufs)
    }
}
