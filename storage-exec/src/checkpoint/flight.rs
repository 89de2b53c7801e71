//! [`Checkpoints`] as a [`CheckpointEndpoint`]: the checkpoint protocol of
//! `sluice_flight::checkpoint` over the store.

use std::sync::Arc;

use arrow_flight::FlightData;
use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use serde::Deserialize;
use serde_json::json;
use sluice_flight::checkpoint::requests::{
    Begin, BeginGroup, Commit, Group, Named, Prefix, UploadId, Uploads, body, json_bytes, unknown,
};
use sluice_flight::checkpoint::scrub::{RepairExtent, RepairedExtent, ScrubCheckpoints};
use sluice_flight::checkpoint::{CheckpointEndpoint, GetTicket, PutCommand, data};
use sluice_flight::shm_handshake::Probe;
use sluice_flight::stream::FlightStream;
use tonic::Status;

use super::shared::{GetRequest, GroupItem, GroupRequest};
use super::{CheckpointInfo, Checkpoints};
use crate::error::StorageError;

/// The status a checkpoint error answers (its [`sluice_base::Fault`]
/// code and kind: a corrupt checkpoint is `DATA_LOSS`, a full device
/// `RESOURCE_EXHAUSTED`).
pub fn status(e: StorageError) -> Status {
    sluice_base::fault::status(&e)
}

#[derive(Deserialize)]
struct PutOpen {
    probe: Probe,
    size: u64,
}

#[derive(Deserialize)]
struct ShmPut {
    region: String,
    upload: String,
    at: u64,
    length: u64,
    offset: u64,
}

/// What every opening of a read region names.
#[derive(Deserialize)]
struct Opening {
    probe: Probe,
    /// Regions the client keeps from earlier reads.
    #[serde(default)]
    kept: Vec<String>,
    /// Read a version of at most this many bytes before answering.
    #[serde(default)]
    fill: u64,
}

#[derive(Deserialize)]
struct GetOpen {
    name: String,
    #[serde(default)]
    version: Option<u64>,
    #[serde(flatten)]
    opening: Opening,
    /// A version of at least this many bytes gets a region of its own.
    #[serde(default)]
    own_from: u64,
    /// ...and below this many (0: any larger one too).
    #[serde(default)]
    own_below: u64,
    /// A larger version streams through a region of this many bytes.
    #[serde(default)]
    window: u64,
}

impl GetOpen {
    fn request(&self) -> GetRequest<'_> {
        GetRequest {
            name: &self.name,
            version: self.version,
            probe: &self.opening.probe,
            kept: &self.opening.kept,
            fill: self.opening.fill,
            own_from: self.own_from,
            own_below: self.own_below,
            window: self.window,
        }
    }
}

#[derive(Deserialize)]
struct GetGroup {
    items: Vec<GroupItem>,
    #[serde(flatten)]
    opening: Opening,
    /// The region's bytes at most (0: no bound).
    #[serde(default)]
    max_bytes: u64,
}

#[derive(Deserialize)]
struct ShmGet {
    region: String,
    /// Which of a group region's versions (0: a region of one).
    #[serde(default)]
    item: usize,
    offset: u64,
    length: u64,
    /// Where in the region the range lands (at `offset` when absent).
    #[serde(default)]
    at: Option<u64>,
}

#[derive(Deserialize)]
struct RegionId {
    region: String,
}

#[async_trait]
impl CheckpointEndpoint for Checkpoints {
    async fn put(
        &self,
        command: PutCommand,
        data: BoxStream<'static, Result<FlightData, Status>>,
    ) -> Result<u64, Status> {
        let pieces = data::pieces(data).map_err(|e| StorageError::BadUpload {
            name: "(upload)".into(),
            reason: format!("part stream: {e}"),
        });
        self.write(&command.checkpoint_upload, command.offset, pieces)
            .await
            .map_err(status)
    }

    async fn get(&self, ticket: GetTicket) -> Result<FlightStream, Status> {
        let record = Arc::new(
            self.get(&ticket.checkpoint, Some(ticket.version))
                .map_err(status)?,
        );
        let buffers = self
            .read(record, ticket.offset, ticket.length)
            .map(|buf| buf.map_err(status));
        Ok(data::encode(buffers, None))
    }

    fn pending_uploads(&self) -> usize {
        Checkpoints::pending_uploads(self)
    }

    fn lent_regions(&self) -> usize {
        Checkpoints::lent_regions(self)
    }

    async fn versions(&self, prefix: &str) -> Result<Vec<CheckpointInfo>, Status> {
        self.list(prefix).map_err(status)
    }

    async fn remove(
        &self,
        name: &str,
        version: Option<u64>,
    ) -> Result<Vec<CheckpointInfo>, Status> {
        self.delete(name, version).map_err(status)
    }

    async fn action(&self, kind: &str, bytes: &[u8]) -> Result<Bytes, Status> {
        match kind {
            "checkpoint.begin" => {
                let b: Begin = body(kind, bytes)?;
                if b.pass {
                    let (id, pass) = self.begin_with_pass(&b.name).map_err(status)?;
                    return json_bytes(&json!({ "upload": id, "pass": pass }));
                }
                let id = self.begin(&b.name).map_err(status)?;
                json_bytes(&json!({ "upload": id }))
            }
            "checkpoint.read_pass" => {
                let n: Named = body(kind, bytes)?;
                let (version, pass) = self.read_pass(&n.name, n.version).map_err(status)?;
                json_bytes(&json!({ "version": version, "pass": pass }))
            }
            "checkpoint.open_uploads" => {
                let u: Uploads = body(kind, bytes)?;
                json_bytes(&json!({ "open": self.open_uploads(&u.uploads) }))
            }
            "checkpoint.begin_group" => {
                let b: BeginGroup = body(kind, bytes)?;
                let ids = self.begin_group(&b.names).map_err(status)?;
                json_bytes(&json!({ "uploads": ids }))
            }
            "checkpoint.commit" => {
                let c: Commit = body(kind, bytes)?;
                json_bytes(&self.commit(&c.upload, c.size).await.map_err(status)?)
            }
            "checkpoint.commit_group" => {
                let g: Group = body(kind, bytes)?;
                json_bytes(&self.commit_group(&g.pairs()).await.map_err(status)?)
            }
            shm if shm.starts_with("checkpoint.shm.") => shm_action(self, shm, bytes).await,
            "checkpoint.abort" => {
                let u: UploadId = body(kind, bytes)?;
                self.abort(&u.upload).map_err(status)?;
                json_bytes(&json!({ "aborted": u.upload }))
            }
            "checkpoint.stat" => {
                let n: Named = body(kind, bytes)?;
                let r = self.get(&n.name, n.version).map_err(status)?;
                json_bytes(&super::CheckpointInfo::from(&r))
            }
            "checkpoint.list" => {
                let p: Prefix = body(kind, bytes)?;
                json_bytes(&self.list(&p.prefix).map_err(status)?)
            }
            "checkpoint.delete" => {
                let n: Named = body(kind, bytes)?;
                json_bytes(&self.delete(&n.name, n.version).map_err(status)?)
            }
            "checkpoint.scrub" => {
                let req: ScrubCheckpoints = body(kind, bytes)?;
                json_bytes(&self.scrub(&req).await.map_err(status)?)
            }
            "checkpoint.repair" => {
                use base64::Engine;
                let r: RepairExtent = body(kind, bytes)?;
                let data = base64::engine::general_purpose::STANDARD
                    .decode(r.data.as_bytes())
                    .map_err(|e| {
                        status(StorageError::BadCheckpointRepair {
                            name: r.name.clone(),
                            version: r.version,
                            offset: r.offset,
                            reason: format!("the bytes are not base64: {e}"),
                        })
                    })?;
                let rewritten = self
                    .repair(&r.name, r.version, r.offset, &data)
                    .await
                    .map_err(status)?;
                json_bytes(&RepairedExtent { rewritten })
            }
            other => Err(unknown(other)),
        }
    }
}

/// The same-host path's actions (`checkpoint.shm.*`).
async fn shm_action(c: &Checkpoints, kind: &str, bytes: &[u8]) -> Result<Bytes, Status> {
    match kind {
        "checkpoint.shm.put_open" => {
            let o: PutOpen = body(kind, bytes)?;
            json_bytes(&c.shm_put_open(&o.probe, o.size).await.map_err(status)?)
        }
        "checkpoint.shm.put" => {
            let p: ShmPut = body(kind, bytes)?;
            let n = c
                .shm_put(&p.region, &p.upload, p.at, p.length, p.offset)
                .await
                .map_err(status)?;
            json_bytes(&json!({ "bytes": n }))
        }
        "checkpoint.shm.get_open" => {
            let o: GetOpen = body(kind, bytes)?;
            json_bytes(&c.shm_get_open(o.request()).await.map_err(status)?)
        }
        "checkpoint.shm.get_group" => {
            let g: GetGroup = body(kind, bytes)?;
            let req = GroupRequest {
                items: &g.items,
                probe: &g.opening.probe,
                kept: &g.opening.kept,
                fill: g.opening.fill,
                max_bytes: g.max_bytes,
            };
            json_bytes(&c.shm_get_group(req).await.map_err(status)?)
        }
        "checkpoint.shm.get" => {
            let g: ShmGet = body(kind, bytes)?;
            let n = c
                .shm_get(&g.region, g.item, g.offset, g.length, g.at)
                .await
                .map_err(status)?;
            json_bytes(&json!({ "bytes": n }))
        }
        "checkpoint.shm.touch" => {
            let r: RegionId = body(kind, bytes)?;
            c.shm_touch(&r.region).map_err(status)?;
            json_bytes(&json!({ "region": r.region }))
        }
        "checkpoint.shm.close" => {
            let r: RegionId = body(kind, bytes)?;
            c.shm_close(&r.region).await.map_err(status)?;
            json_bytes(&json!({ "closed": r.region }))
        }
        other => Err(unknown(other)),
    }
}
