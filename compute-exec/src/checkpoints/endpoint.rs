//! [`ClusterCheckpoints`] as a [`CheckpointEndpoint`]: the checkpoint
//! protocol a trainer speaks to one machine, answered by the cluster (a
//! `begin` that asks `direct` is answered with the nodes' upload passes
//! too, and a `stat` that asks `direct` with their read passes, where
//! they give them). The same-host actions (`checkpoint.shm.*`)
//! answer `shm_unavailable`: a cluster's checkpoint lives on several
//! hosts, so its writers and readers go over Flight (the client falls
//! back by itself).

use std::sync::Arc;

use arrow_flight::FlightData;
use async_trait::async_trait;
use bytes::Bytes;
use futures::TryStreamExt;
use futures::stream::BoxStream;
use serde_json::json;
use sluice_base::CallError;
use sluice_flight::checkpoint::requests::{
    Begin, BeginGroup, Commit, Group, Named, Prefix, Stat, UploadId, body, json_bytes, unknown,
};
use sluice_flight::checkpoint::{
    CheckpointEndpoint, CheckpointInfo, DirectRead, GetTicket, PutCommand, data,
};
use sluice_flight::stream::FlightStream;
use tonic::Status;

use super::{ClusterCheckpointError, ClusterCheckpoints};

/// A `stat`'s answer: the version, and where its reader was given read
/// passes, where its stripes are.
#[derive(serde::Serialize)]
struct Stated {
    #[serde(flatten)]
    info: CheckpointInfo,
    #[serde(skip_serializing_if = "Option::is_none")]
    direct: Option<DirectRead>,
}

#[async_trait]
impl CheckpointEndpoint for ClusterCheckpoints {
    async fn put(
        &self,
        command: PutCommand,
        data: BoxStream<'static, Result<FlightData, Status>>,
    ) -> Result<u64, Status> {
        let upload = self.upload(&command.checkpoint_upload)?;
        let name = upload.name.clone();
        let pieces = data::pieces(data).map_err(move |e| {
            ClusterCheckpointError::Call(CallError::BadRequest(format!(
                "checkpoint '{name}': part stream: {e}"
            )))
        });
        Ok(upload.write_part(command.offset, pieces).await?)
    }

    async fn get(&self, ticket: GetTicket) -> Result<FlightStream, Status> {
        let version = Arc::new(self.version(&ticket.checkpoint, Some(ticket.version))?);
        let buffers = self
            .read(version, ticket.offset, ticket.length)
            .map_err(Status::from);
        Ok(data::encode(buffers, None))
    }

    fn pending_uploads(&self) -> usize {
        super::lock(&self.uploads).len()
    }

    async fn versions(&self, prefix: &str) -> Result<Vec<CheckpointInfo>, Status> {
        Ok(self.list(prefix)?)
    }

    async fn remove(
        &self,
        name: &str,
        version: Option<u64>,
    ) -> Result<Vec<CheckpointInfo>, Status> {
        Ok(self.delete(name, version).await?)
    }

    async fn action(&self, kind: &str, bytes: &[u8]) -> Result<Bytes, Status> {
        match kind {
            "checkpoint.begin" => {
                let b: Begin = body(kind, bytes)?;
                let begun = self.begin(&b.name, b.direct).await?;
                match begun.direct {
                    Some(d) => json_bytes(&json!({ "upload": begun.upload, "direct": d })),
                    None => json_bytes(&json!({ "upload": begun.upload })),
                }
            }
            "checkpoint.begin_group" => {
                let b: BeginGroup = body(kind, bytes)?;
                let begun = self.begin_group(&b.names, b.direct).await?;
                let uploads: Vec<&str> = begun.iter().map(|b| b.upload.as_str()).collect();
                if b.direct {
                    let direct: Vec<_> = begun.iter().map(|b| b.direct.as_ref()).collect();
                    return json_bytes(&json!({ "uploads": uploads, "direct": direct }));
                }
                json_bytes(&json!({ "uploads": uploads }))
            }
            "checkpoint.commit" => {
                let c: Commit = body(kind, bytes)?;
                json_bytes(&self.commit(&c.upload, c.size).await?)
            }
            "checkpoint.commit_group" => {
                let g: Group = body(kind, bytes)?;
                json_bytes(&self.commit_group(&g.pairs()).await?)
            }
            "checkpoint.abort" => {
                let u: UploadId = body(kind, bytes)?;
                self.abort(&u.upload).await?;
                json_bytes(&json!({ "aborted": u.upload }))
            }
            "checkpoint.stat" => {
                let Stat { named, direct } = body(kind, bytes)?;
                let version = self.version(&named.name, named.version)?;
                let direct = if direct {
                    self.direct_read(&version).await
                } else {
                    None
                };
                json_bytes(&Stated {
                    info: version.info(),
                    direct,
                })
            }
            "checkpoint.list" => {
                let p: Prefix = body(kind, bytes)?;
                json_bytes(&self.list(&p.prefix)?)
            }
            "checkpoint.delete" => {
                let n: Named = body(kind, bytes)?;
                json_bytes(&self.delete(&n.name, n.version).await?)
            }
            shm if shm.starts_with("checkpoint.shm.") => Err(CallError::NoSharedMemory(
                "a cluster keeps checkpoints striped over its storage nodes: they travel over \
                 Flight"
                    .into(),
            )
            .status()),
            other => Err(unknown(other)),
        }
    }
}
