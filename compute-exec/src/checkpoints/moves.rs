//! Moving checkpoint stripes off storage nodes that leave — lost (down
//! past the cluster's lost time) or drained — so that every stripe has
//! its copies again ([`ClusterCheckpoints::move_away`]).
//!
//! For each committed version with a piece on a leaving node, each of
//! that piece's stripes gets a new home: a node that stays and holds no
//! copy of it, the least loaded first. The stripe is read as a reader
//! reads it (any holder, checked there against its crc32c; the leaving
//! node itself last, which a drained node still answers), and each new
//! home writes the stripes it gets as a new piece of its own, committed
//! there. Then one ledger transaction swaps the leaving node's piece for
//! the new ones, and the old piece is deleted (a node that is down
//! deletes nothing; the sweep takes it once it is back, since no version
//! names it). A stripe with no holder left, or no node to go to, is
//! reported short, and the leaving node's piece stays named for it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use futures::{StreamExt, TryStreamExt};
use serde::Serialize;

use sluice_flight::checkpoint::data::Encoded;

use super::ledger::{Piece, StripedVersion};
use super::{ClusterCheckpointError, ClusterCheckpoints, PIECES, Result, new_id};

/// Stripes of one new piece moved at once.
const IN_FLIGHT: usize = 4;

/// What a move of checkpoint stripes did.
#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
pub struct CheckpointMoves {
    /// Why (`drain of …`, `re-replication of …`).
    pub why: String,
    /// Versions whose stripes moved.
    pub versions: u64,
    /// Stripe copies made.
    pub stripes: u64,
    /// Bytes copied.
    pub bytes: u64,
    /// What could not move, and why.
    pub short: Vec<String>,
    /// Wall time, seconds.
    pub seconds: f64,
}

impl ClusterCheckpoints {
    /// Gives every stripe held on one of `leaving` a copy on a node that
    /// stays (see the module docs); `why` names the move in its report.
    pub async fn move_away(&self, leaving: &[String], why: &str) -> Result<CheckpointMoves> {
        let started = Instant::now();
        let mut report = CheckpointMoves {
            why: why.to_string(),
            ..Default::default()
        };
        let endpoints = self.session.endpoints();
        let up = crate::moves::answering(&endpoints).await;
        let staying: Vec<String> = endpoints
            .iter()
            .map(|e| e.name().to_string())
            .filter(|n| !leaving.contains(n) && up.contains(n))
            .collect();
        for v in self.ledger.list("")? {
            if !v.pieces.iter().any(|p| leaving.contains(&p.node)) {
                continue;
            }
            match self.move_version(&v, leaving, &staying, &mut report).await {
                Ok(true) => report.versions += 1,
                Ok(false) => {}
                Err(e) => report.short.push(format!("{}@{}: {e}", v.name, v.version)),
            }
        }
        report.seconds = started.elapsed().as_secs_f64();
        if report.versions > 0 || !report.short.is_empty() {
            tracing::info!(
                "{why}: {} checkpoint version(s), {} stripe copies, {} short",
                report.versions,
                report.stripes,
                report.short.len()
            );
        }
        Ok(report)
    }

    /// Moves `v`'s stripes off `leaving`; whether anything moved.
    async fn move_version(
        &self,
        v: &StripedVersion,
        leaving: &[String],
        staying: &[String],
        report: &mut CheckpointMoves,
    ) -> Result<bool> {
        // Each stripe of a leaving piece, to the least loaded node that
        // stays and holds no copy of it.
        let mut load: HashMap<&str, usize> = staying.iter().map(|n| (n.as_str(), 0)).collect();
        for p in &v.pieces {
            if let Some(l) = load.get_mut(p.node.as_str()) {
                *l += p.stripes.len();
            }
        }
        let mut gets: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        let mut kept = Vec::new();
        for p in v.pieces.iter().filter(|p| leaving.contains(&p.node)) {
            let mut short = false;
            for &s in &p.stripes {
                let holders: Vec<&str> =
                    v.holders(s).iter().map(|(h, _)| h.node.as_str()).collect();
                let target = staying
                    .iter()
                    .filter(|n| !holders.contains(&n.as_str()))
                    .filter(|n| !gets.get(*n).is_some_and(|g| g.contains(&s)))
                    .min_by_key(|n| load.get(n.as_str()).copied().unwrap_or(0));
                match target {
                    Some(t) => {
                        *load.entry(t.as_str()).or_default() += 1;
                        gets.entry(t.clone()).or_default().push(s);
                    }
                    None => {
                        short = true;
                        report.short.push(format!(
                            "{}@{} stripe {s}: no node without a copy to take it",
                            v.name, v.version
                        ));
                    }
                }
            }
            if short {
                kept.push(p.node.clone());
            }
        }
        if gets.is_empty() {
            return Ok(false);
        }
        let version = Arc::new(v.clone());
        let local = format!("{PIECES}{}/{}", new_id(), v.name);
        let mut added = Vec::new();
        for (node, mut stripes) in gets {
            stripes.sort_unstable();
            match self.write_piece(&version, &node, &local, &stripes).await {
                Ok((piece, bytes)) => {
                    report.stripes += piece.stripes.len() as u64;
                    report.bytes += bytes;
                    added.push(piece);
                }
                Err(e) => {
                    // Nothing is swapped: the pieces written are deleted.
                    self.delete_pieces(&[StripedVersion {
                        pieces: added,
                        ..v.clone()
                    }])
                    .await;
                    return Err(e);
                }
            }
        }
        let dropped: Vec<Piece> = v
            .pieces
            .iter()
            .filter(|p| leaving.contains(&p.node) && !kept.contains(&p.node))
            .cloned()
            .collect();
        let swapped = self
            .ledger
            .swap_pieces(&v.name, v.version, &dropped, &added)?;
        let gone = StripedVersion {
            pieces: if swapped { dropped } else { added },
            ..v.clone()
        };
        // Swapped: the old pieces go; not (the version was deleted
        // meanwhile): the new ones do.
        self.delete_pieces(&[gone]).await;
        Ok(swapped)
    }

    /// Writes `stripes` of `version` to `node` as a new piece named
    /// `local`; the piece, and the bytes written.
    async fn write_piece(
        &self,
        version: &Arc<StripedVersion>,
        node: &str,
        local: &str,
        stripes: &[u64],
    ) -> Result<(Piece, u64)> {
        let to = self
            .node(node)
            .map_err(|source| ClusterCheckpointError::Node {
                name: version.name.clone(),
                source,
            })?;
        let at_node = |source| ClusterCheckpointError::Node {
            name: version.name.clone(),
            source,
        };
        let upload = to.begin(local).await.map_err(at_node)?;
        let to_put = Arc::clone(&to);
        let upload_id = upload.clone();
        let unit = version.unit;
        let reads: Vec<_> = stripes
            .iter()
            .enumerate()
            .map(|(i, &s)| {
                (
                    i as u64 * unit,
                    self.read(Arc::clone(version), s * unit, unit),
                )
            })
            .collect();
        let name = version.name.clone();
        let written = futures::stream::iter(reads)
            .map(move |(at, bytes)| {
                let to = Arc::clone(&to_put);
                let upload = upload_id.clone();
                let name = name.clone();
                async move {
                    let bufs: Vec<_> = bytes.try_collect().await?;
                    let part = Encoded::of(bufs).map_err(|e| {
                        ClusterCheckpointError::Call(sluice_base::CallError::Encoding(format!(
                            "checkpoint '{name}': {e}"
                        )))
                    })?;
                    let len = part.bytes;
                    to.put(upload, at, &part)
                        .await
                        .map_err(|source| ClusterCheckpointError::Node { name, source })?;
                    Ok::<_, ClusterCheckpointError>(len)
                }
            })
            .buffer_unordered(IN_FLIGHT)
            .try_fold(0u64, |n, len| futures::future::ready(Ok(n + len)))
            .await;
        let size = match written {
            Ok(size) => size,
            Err(e) => {
                let _ = to.abort(&upload).await;
                return Err(e);
            }
        };
        let info = to.commit(&upload, size).await.map_err(at_node)?;
        Ok((
            Piece {
                node: node.to_string(),
                local: local.to_string(),
                local_version: info.version,
                stripes: stripes.to_vec(),
            },
            size,
        ))
    }
}
