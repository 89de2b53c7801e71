//! Beginning a cluster checkpoint's version: a piece's upload on every
//! storage node that answers, striped over those, and for a writer that
//! asks, the layout and the nodes' upload passes to write the stripes to
//! them itself ([`Direct`]; see `sluice_access::pass`).

use std::sync::Arc;

use futures::StreamExt;
use sluice_base::CallError;
use sluice_flight::LinkError;
use sluice_flight::checkpoint::node::NodeCheckpoints;
use sluice_flight::checkpoint::{Direct, DirectNode};

use super::stripes::Striping;
use super::upload::ClusterUpload;
use super::{
    BEGIN_DEPTH, BEGIN_WAIT, ClusterCheckpointError, ClusterCheckpoints, PIECES, Result, STRIPE,
    lock, new_id,
};

/// An upload begun: its id, and where its writer was given passes, how
/// to write its stripes to the nodes directly.
#[derive(Debug, Clone)]
pub struct Begun {
    /// The upload id.
    pub upload: String,
    /// The stripes' layout and each node's upload and pass (none: the
    /// parts go through the coordinator).
    pub direct: Option<Direct>,
}

/// A node's piece begun: its client, its upload there, and its pass.
type Piece = (Arc<NodeCheckpoints>, String, Option<String>);

impl ClusterCheckpoints {
    /// Starts a version of `name` over the storage nodes that answer,
    /// with passes for its writer to write the stripes itself when
    /// `direct` is asked and every node gives one.
    pub async fn begin(&self, name: &str, direct: bool) -> Result<Begun> {
        let local = self.piece_name(name)?;
        self.expire_idle().await;
        let known = self.session.endpoints();
        let replicas = self
            .keeping
            .replicas
            .unwrap_or_else(|| crate::ingest::default_replicas(known.len()));
        let begun = futures::future::join_all(
            known
                .iter()
                .map(|e| self.begin_piece(e.name(), &local.1, direct)),
        )
        .await;
        let mut pieces = Vec::new();
        let mut missing = Vec::new();
        for r in begun {
            match r {
                Ok(piece) => pieces.push(piece),
                Err(e) => missing.push(e.to_string()),
            }
        }
        if (pieces.len() as u32) < replicas.max(1) {
            for (node, upload, _) in &pieces {
                let _ = node.abort(upload).await;
            }
            return Err(ClusterCheckpointError::TooFewNodes {
                name: name.to_string(),
                replicas,
                answered: pieces.len(),
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
                pieces.len(),
                missing.join("; ")
            );
        }
        let striping = Striping {
            unit: STRIPE,
            nodes: pieces.len() as u32,
            replicas,
        };
        let layout = direct.then(|| layout(&striping, &pieces)).flatten();
        if direct && layout.is_none() {
            tracing::info!(
                "checkpoint '{name}': a node gave no upload pass (it takes only the cluster's \
                 certificates), so the parts go through the coordinator"
            );
        }
        let nodes = pieces.into_iter().map(|(n, u, _)| (n, u)).collect();
        let (id, local) = local;
        let upload = ClusterUpload::new(name.to_string(), local, striping, nodes, layout.is_some());
        lock(&self.uploads).insert(id.clone(), Arc::new(upload));
        Ok(Begun {
            upload: id,
            direct: layout,
        })
    }

    /// A new upload id for `name` and its pieces' name on the nodes, or
    /// why the name cannot be one.
    fn piece_name(&self, name: &str) -> Result<(String, String)> {
        let bad = |reason: String| {
            ClusterCheckpointError::Call(CallError::BadRequest(format!(
                "bad checkpoint name {:?}: {reason}",
                name.chars().take(64).collect::<String>()
            )))
        };
        if let Some(reason) = sluice_flight::checkpoint::requests::name_problem(name) {
            return Err(bad(reason.to_string()));
        }
        let id = new_id();
        let local = format!("{PIECES}{id}/{name}");
        let most = sluice_flight::checkpoint::requests::MAX_NAME - (local.len() - name.len());
        if name.len() > most {
            return Err(bad(format!("on a cluster a name is at most {most} bytes")));
        }
        Ok((id, local))
    }

    /// The piece `local` begun on the node at `url` (with a pass, when
    /// `pass` is asked and the node gives one), within [`BEGIN_WAIT`].
    async fn begin_piece(
        &self,
        url: &str,
        local: &str,
        pass: bool,
    ) -> std::result::Result<Piece, LinkError> {
        let node = self.node(url)?;
        let begun = async {
            if pass {
                node.begin_with_pass(local).await
            } else {
                node.begin(local).await.map(|u| (u, None))
            }
        };
        let (upload, pass) = tokio::time::timeout(BEGIN_WAIT, begun)
            .await
            .map_err(|_| LinkError::Unavailable {
                node: url.to_string(),
                reason: format!(
                    "no answer to begin a checkpoint within {} s",
                    BEGIN_WAIT.as_secs()
                ),
            })??;
        Ok((node, upload, pass))
    }

    /// Begins an upload of each of `names` (a checkpoint's files, to
    /// commit together with [`Self::commit_group`]), a few at once; their
    /// ids in order. Where one cannot begin, those begun are aborted and
    /// its error is the answer.
    pub async fn begin_group(&self, names: &[String], direct: bool) -> Result<Vec<Begun>> {
        if let Some(reason) = sluice_flight::checkpoint::requests::group_problem(names) {
            return Err(ClusterCheckpointError::Call(CallError::BadRequest(reason)));
        }
        // Collected first: a stream's closure over `begin` is not `Send`
        // for every lifetime, as the action's future must be.
        let calls: Vec<_> = names.iter().map(|name| self.begin(name, direct)).collect();
        let begun: Vec<Result<Begun>> = futures::stream::iter(calls)
            .buffered(BEGIN_DEPTH)
            .collect()
            .await;
        let mut ok = Vec::with_capacity(names.len());
        let mut failed = None;
        for r in begun {
            match r {
                Ok(b) => ok.push(b),
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        let Some(e) = failed else {
            return Ok(ok);
        };
        for b in &ok {
            let _ = self.abort(&b.upload).await;
        }
        Err(e)
    }
}

/// The layout a writer is given to write the stripes itself: `None`
/// unless every node gave a pass.
fn layout(striping: &Striping, pieces: &[Piece]) -> Option<Direct> {
    let nodes = pieces
        .iter()
        .map(|(node, upload, pass)| {
            Some(DirectNode {
                url: node.name().to_string(),
                upload: upload.clone(),
                pass: pass.clone()?,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    Some(Direct {
        unit: striping.unit,
        replicas: striping.replicas,
        nodes,
    })
}
