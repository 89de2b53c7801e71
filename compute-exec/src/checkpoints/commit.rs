//! The commit of cluster checkpoints: every node commits its piece of
//! every upload of the group (durable and listed there, all at once),
//! then one ledger transaction makes the versions exist. A node that
//! fails its commit fails the group: the pieces already committed are
//! deleted, the others aborted, and nothing is recorded. Listing and
//! deleting versions (their pieces on every node) are here too.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use sluice_base::CallError;
use sluice_flight::checkpoint::CheckpointInfo;
use sluice_flight::checkpoint::node::NodeCheckpoints;

use super::ledger::{Piece, StripedVersion};
use super::upload::ClusterUpload;
use super::{ClusterCheckpointError, ClusterCheckpoints, Result, lock};

/// One node's piece of one upload, to commit.
struct Share {
    upload: usize,
    node: Arc<NodeCheckpoints>,
    local_upload: String,
    local_size: u64,
    stripes: Vec<u64>,
}

impl ClusterCheckpoints {
    /// Every version of the checkpoints whose names start with `prefix`.
    pub fn list(&self, prefix: &str) -> Result<Vec<CheckpointInfo>> {
        Ok(self
            .ledger
            .list(prefix)?
            .iter()
            .map(StripedVersion::info)
            .collect())
    }

    /// Deletes one version of `name`, or every one, and their pieces.
    pub async fn delete(&self, name: &str, version: Option<u64>) -> Result<Vec<CheckpointInfo>> {
        let dropped = self.ledger.delete(name, version)?;
        if dropped.is_empty() {
            return Err(ClusterCheckpointError::Call(CallError::NotFound(format!(
                "no checkpoint '{name}'{}",
                version.map(|v| format!(" version {v}")).unwrap_or_default()
            ))));
        }
        self.delete_pieces(&dropped).await;
        Ok(dropped.iter().map(StripedVersion::info).collect())
    }

    /// Commits upload `id` as the next version of its name, `size` bytes.
    pub async fn commit(&self, id: &str, size: u64) -> Result<CheckpointInfo> {
        let mut infos = self.commit_group(&[(id.to_string(), size)]).await?;
        Ok(infos.remove(0))
    }

    /// Commits every upload of `group` (id, size) as the next version of
    /// its name, together: all exist, or none does. Their names must
    /// differ.
    pub async fn commit_group(&self, group: &[(String, u64)]) -> Result<Vec<CheckpointInfo>> {
        let uploads = group
            .iter()
            .map(|(id, _)| self.upload(id))
            .collect::<Result<Vec<_>>>()?;
        let names: Vec<&str> = uploads.iter().map(|u| u.name.as_str()).collect();
        if let Some(problem) = sluice_flight::checkpoint::requests::group_problem(&names) {
            return Err(ClusterCheckpointError::Call(CallError::BadRequest(problem)));
        }
        let (shares, empty) = shares(&uploads, group);
        let commits = futures::future::join_all(
            shares
                .iter()
                .map(|s| s.node.commit(&s.local_upload, s.local_size)),
        );
        let aborts = futures::future::join_all(
            empty
                .iter()
                .map(|(node, upload)| async move { drop(node.abort(upload).await) }),
        );
        let (committed, _) = futures::join!(commits, aborts);
        let mut first_error = None;
        let mut versions_there = Vec::with_capacity(committed.len());
        for (i, c) in committed.into_iter().enumerate() {
            match c {
                Ok(info) => versions_there.push(Some(info.version)),
                Err(e) => {
                    versions_there.push(None);
                    first_error.get_or_insert((i, e));
                }
            }
        }
        if let Some((at, source)) = first_error {
            self.undo(&uploads, &shares, &versions_there).await;
            self.forget(group);
            return Err(ClusterCheckpointError::Node {
                name: uploads[shares[at].upload].name.clone(),
                source,
            });
        }
        let mut versions = recorded_versions(&uploads, group, shares, versions_there);
        let recorded = self.ledger.commit(&mut versions, self.keeping.keep);
        // Only now may the sweep take pieces the ledger does not name.
        self.forget(group);
        let dropped = recorded?;
        self.delete_pieces(&dropped).await;
        for v in &versions {
            tracing::info!(
                "checkpoint '{}' version {} committed ({} bytes over {} piece(s), {} replica(s))",
                v.name,
                v.version,
                v.size,
                v.pieces.len(),
                v.replicas
            );
        }
        Ok(versions.iter().map(StripedVersion::info).collect())
    }

    /// Takes a failed group back: committed pieces (`versions_there`
    /// set) are deleted, the others aborted; a node that cannot be told
    /// drops its upload by its idle timeout, its piece by the sweep.
    async fn undo(
        &self,
        uploads: &[Arc<ClusterUpload>],
        shares: &[Share],
        versions_there: &[Option<u64>],
    ) {
        futures::future::join_all(shares.iter().zip(versions_there).map(|(s, v)| async move {
            let undone = match v {
                Some(_) => s.node.delete(&uploads[s.upload].local).await.map(drop),
                None => s.node.abort(&s.local_upload).await,
            };
            if let Err(e) = undone {
                tracing::warn!("checkpoint '{}': {e}", uploads[s.upload].name);
            }
        }))
        .await;
    }

    fn forget(&self, group: &[(String, u64)]) {
        let mut map = lock(&self.uploads);
        for (id, _) in group {
            map.remove(id);
        }
    }

    /// Deletes the pieces of `versions` from their nodes; a node that
    /// does not answer keeps them until the sweep.
    pub(super) async fn delete_pieces(&self, versions: &[StripedVersion]) {
        let pieces = versions.iter().flat_map(|v| &v.pieces);
        futures::future::join_all(pieces.map(|p| async move {
            let gone = match self.node(&p.node) {
                Ok(node) => node.delete(&p.local).await.map(drop),
                Err(e) => Err(e),
            };
            if let Err(e) = gone {
                tracing::warn!("checkpoint piece {} left for the sweep: {e}", p.local);
            }
        }))
        .await;
    }
}

/// The versions a committed group records: each upload's, with a piece
/// per share at the version its node committed (`versions_there`).
fn recorded_versions(
    uploads: &[Arc<ClusterUpload>],
    group: &[(String, u64)],
    shares: Vec<Share>,
    versions_there: Vec<Option<u64>>,
) -> Vec<StripedVersion> {
    let created_unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default();
    let mut versions: Vec<StripedVersion> = uploads
        .iter()
        .zip(group)
        .map(|(u, (_, size))| StripedVersion {
            name: u.name.clone(),
            version: 0,
            size: *size,
            created_unix_ms,
            unit: u.striping.unit,
            replicas: u.striping.replicas,
            pieces: Vec::new(),
        })
        .collect();
    for (s, v) in shares.into_iter().zip(versions_there) {
        versions[s.upload].pieces.push(Piece {
            node: s.node.name().to_string(),
            local: uploads[s.upload].local.clone(),
            local_version: v.unwrap_or_default(),
            stripes: s.stripes,
        });
    }
    versions
}

/// Every node's piece of every upload of the group, with its size; and
/// the uploads of nodes holding no stripe of theirs (a checkpoint smaller
/// than a stripe per node), to abort.
fn shares(
    uploads: &[Arc<ClusterUpload>],
    group: &[(String, u64)],
) -> (Vec<Share>, Vec<(Arc<NodeCheckpoints>, String)>) {
    let mut out = Vec::new();
    let mut empty = Vec::new();
    for (i, (u, (_, size))) in uploads.iter().zip(group).enumerate() {
        for (k, (node, local_upload)) in u.nodes.iter().enumerate() {
            let stripes = u.striping.held(k as u32, *size);
            if stripes.is_empty() {
                empty.push((Arc::clone(node), local_upload.clone()));
                continue;
            }
            out.push(Share {
                upload: i,
                node: Arc::clone(node),
                local_upload: local_upload.clone(),
                local_size: u.striping.local_size(k as u32, *size),
                stripes,
            });
        }
    }
    (out, empty)
}
