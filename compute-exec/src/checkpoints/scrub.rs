//! Scrub and repair of the cluster's checkpoints: every storage node
//! reads back its pieces against their checksums (`checkpoint.scrub`),
//! and each bad extent is rewritten from another holder of the same
//! stripe (`checkpoint.repair`, which takes only the extent's own bytes).
//! The good bytes are read as a reader reads them: the bad copy fails its
//! checksum where it is and the next holder gives them.

use std::sync::Arc;

use futures::TryStreamExt;
use serde::{Deserialize, Serialize};
use sluice_flight::checkpoint::scrub::{BadExtent, CheckpointScrub, ScrubCheckpoints};

use super::ledger::StripedVersion;
use super::{ClusterCheckpointError, ClusterCheckpoints, PIECES};

/// What became of one bad extent.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ExtentRepair {
    /// The checkpoint.
    pub checkpoint: String,
    /// Its version.
    pub version: u64,
    /// The extent's first byte in the checkpoint.
    pub offset: u64,
    /// Its length.
    pub len: u64,
    /// `repaired`, `good` (it read back good by then), or why not.
    pub outcome: String,
}

/// One node's checkpoint scrub.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CheckpointsScrubbed {
    /// Its report (absent: it failed, see `error`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Object)]
    pub report: Option<CheckpointScrub>,
    /// Why its scrub failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What became of each bad extent.
    pub repairs: Vec<ExtentRepair>,
}

impl ClusterCheckpoints {
    /// Scrubs the pieces on every storage node, at most `rate` bytes a
    /// second on each, and repairs what is found: (node, what it did).
    pub async fn scrub_and_repair(&self, rate: Option<u64>) -> Vec<(String, CheckpointsScrubbed)> {
        let req = ScrubCheckpoints {
            prefix: PIECES.to_string(),
            rate_bytes_per_s: rate,
        };
        let nodes: Vec<String> = self
            .session
            .endpoints()
            .iter()
            .map(|e| e.name().to_string())
            .collect();
        let reports = futures::future::join_all(nodes.iter().map(|url| {
            let req = &req;
            async move { self.node(url)?.scrub(req).await }
        }))
        .await;
        // Read once for every bad extent of every node.
        let versions = self.ledger.list("").unwrap_or_default();
        let mut out = Vec::with_capacity(nodes.len());
        for (url, report) in nodes.into_iter().zip(reports) {
            let mut done = CheckpointsScrubbed::default();
            match report {
                Ok(report) => {
                    for bad in &report.bad {
                        done.repairs
                            .push(self.repair_extent(&versions, &url, bad).await);
                    }
                    done.report = Some(report);
                }
                Err(e) => done.error = Some(e.to_string()),
            }
            out.push((url, done));
        }
        out
    }

    /// Repairs `bad`, an extent of a piece on `url`, found among
    /// `versions`.
    async fn repair_extent(
        &self,
        versions: &[StripedVersion],
        url: &str,
        bad: &BadExtent,
    ) -> ExtentRepair {
        let found = versions.iter().find(|v| {
            v.pieces
                .iter()
                .any(|p| p.node == url && p.local == bad.name && p.local_version == bad.version)
        });
        let Some(v) = found else {
            return ExtentRepair {
                checkpoint: bad.name.clone(),
                version: bad.version,
                offset: bad.offset,
                len: bad.len,
                outcome: "no version names this piece (the sweep deletes it)".into(),
            };
        };
        let at = cluster_offset(v, url, bad);
        let outcome = match at {
            Some(at) => match self.restore(v, url, bad, at).await {
                Ok(true) => "repaired".to_string(),
                Ok(false) => "good".to_string(),
                Err(e) => e.to_string(),
            },
            None => "the extent is not inside one stripe of the piece".to_string(),
        };
        tracing::warn!(
            "scrub: checkpoint '{}' version {} bytes {}.. on {url}: {outcome}",
            v.name,
            v.version,
            at.unwrap_or_default()
        );
        ExtentRepair {
            checkpoint: v.name.clone(),
            version: v.version,
            offset: at.unwrap_or_default(),
            len: bad.len,
            outcome,
        }
    }

    /// Reads the extent's bytes from the holders and has `url` write them.
    async fn restore(
        &self,
        v: &StripedVersion,
        url: &str,
        bad: &BadExtent,
        at: u64,
    ) -> Result<bool, ClusterCheckpointError> {
        let bufs: Vec<_> = self
            .read(Arc::new(v.clone()), at, bad.len)
            .try_collect()
            .await?;
        let bytes: Vec<u8> = bufs
            .iter()
            .flat_map(|b| b.as_slice().iter().copied())
            .collect();
        let node = self
            .node(url)
            .map_err(|source| ClusterCheckpointError::Node {
                name: v.name.clone(),
                source,
            })?;
        node.repair(&bad.name, bad.version, bad.offset, &bytes)
            .await
            .map_err(|source| ClusterCheckpointError::Node {
                name: v.name.clone(),
                source,
            })
    }
}

/// Where `bad`, an extent of `v`'s piece on `url`, starts in the
/// checkpoint (`None`: it crosses a stripe's end, which a piece's extents
/// never do).
fn cluster_offset(v: &StripedVersion, url: &str, bad: &BadExtent) -> Option<u64> {
    let piece = v
        .pieces
        .iter()
        .find(|p| p.node == url && p.local == bad.name)?;
    let i = bad.offset / v.unit;
    let within = bad.offset - i * v.unit;
    if within + bad.len > v.unit {
        return None;
    }
    Some(piece.stripes.get(i as usize)? * v.unit + within)
}
