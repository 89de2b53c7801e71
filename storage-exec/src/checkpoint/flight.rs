//! [`Checkpoints`] as a [`CheckpointEndpoint`]: the checkpoint protocol of
//! `sluice_flight::checkpoint` over the store.

use std::sync::Arc;

use arrow::array::{Array, LargeBinaryArray, RecordBatch};
use arrow::buffer::{Buffer, OffsetBuffer};
use arrow_flight::FlightData;
use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use serde::Deserialize;
use serde_json::json;
use sluice_base::CallError;
use sluice_flight::MAX_MESSAGE;
use sluice_flight::checkpoint::{CheckpointEndpoint, GetTicket, PutCommand, data_schema};
use sluice_flight::shm_handshake::Probe;
use sluice_flight::stream::FlightStream;
use tonic::Status;

use super::Checkpoints;
use crate::error::StorageError;

/// The status a checkpoint error answers (its [`sluice_base::Fault`]
/// code and kind: a corrupt checkpoint is `DATA_LOSS`, a full device
/// `RESOURCE_EXHAUSTED`).
pub fn status(e: StorageError) -> Status {
    sluice_base::fault::status(&e)
}

fn body<'a, T: Deserialize<'a>>(kind: &str, bytes: &'a [u8]) -> Result<T, Status> {
    serde_json::from_slice(bytes).map_err(|e| CallError::bad_request(format!("{kind}: {e}")))
}

fn json_bytes(v: &impl serde::Serialize) -> Result<Bytes, Status> {
    serde_json::to_vec(v)
        .map(Bytes::from)
        .map_err(|e| CallError::encoding(e.to_string()))
}

/// The value buffers of a batch's first (binary) column, in row order.
fn values(batch: &RecordBatch) -> Result<Vec<Buffer>, StorageError> {
    let bad = |reason: String| StorageError::BadUpload {
        name: "(upload)".into(),
        reason,
    };
    let col = batch
        .columns()
        .first()
        .ok_or_else(|| bad("a part batch has no column".into()))?;
    let array = col
        .as_any()
        .downcast_ref::<LargeBinaryArray>()
        .ok_or_else(|| {
            bad(format!(
                "part data must be LargeBinary, not {}",
                col.data_type()
            ))
        })?;
    if array.null_count() > 0 {
        return Err(bad("part data has nulls".into()));
    }
    let offsets = array.value_offsets();
    let values = array.values();
    Ok(offsets
        .windows(2)
        .map(|w| values.slice_with_length(w[0] as usize, (w[1] - w[0]) as usize))
        .filter(|b| !b.is_empty())
        .collect())
}

#[derive(Deserialize)]
struct Named {
    name: String,
    #[serde(default)]
    version: Option<u64>,
}

#[derive(Deserialize)]
struct Begin {
    name: String,
}

#[derive(Deserialize)]
struct Commit {
    upload: String,
    size: u64,
}

#[derive(Deserialize)]
struct UploadId {
    upload: String,
}

#[derive(Deserialize)]
struct Group {
    uploads: Vec<Commit>,
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

#[derive(Deserialize)]
struct GetOpen {
    name: String,
    #[serde(default)]
    version: Option<u64>,
    probe: Probe,
}

#[derive(Deserialize)]
struct ShmGet {
    region: String,
    offset: u64,
    length: u64,
}

#[derive(Deserialize)]
struct RegionId {
    region: String,
}

#[derive(Deserialize)]
struct Prefix {
    #[serde(default)]
    prefix: String,
}

#[async_trait]
impl CheckpointEndpoint for Checkpoints {
    async fn put(
        &self,
        command: PutCommand,
        data: BoxStream<'static, Result<FlightData, Status>>,
    ) -> Result<u64, Status> {
        let batches = FlightRecordBatchStream::new_from_flight_data(
            data.map_err(|s| FlightError::Tonic(Box::new(s))),
        );
        let pieces = batches
            .map_err(|e| StorageError::BadUpload {
                name: "(upload)".into(),
                reason: format!("part stream: {e}"),
            })
            .and_then(|b| futures::future::ready(values(&b)))
            .map_ok(|v| futures::stream::iter(v.into_iter().map(Ok)))
            .try_flatten();
        self.write(&command.checkpoint_upload, command.offset, pieces)
            .await
            .map_err(status)
    }

    async fn get(&self, ticket: GetTicket) -> Result<FlightStream, Status> {
        let record = Arc::new(
            self.get(&ticket.checkpoint, Some(ticket.version))
                .map_err(status)?,
        );
        let schema = data_schema();
        let batch_schema = Arc::clone(&schema);
        let batches = self
            .read(record, ticket.offset, ticket.length)
            .map(move |buf| {
                let buf = buf.map_err(|e| FlightError::Tonic(Box::new(status(e))))?;
                let offsets = OffsetBuffer::from_lengths([buf.len()]);
                let array = LargeBinaryArray::try_new(offsets, buf, None)?;
                Ok(RecordBatch::try_new(
                    Arc::clone(&batch_schema),
                    vec![Arc::new(array)],
                )?)
            });
        let data = FlightDataEncoderBuilder::new()
            .with_max_flight_data_size(MAX_MESSAGE)
            .with_schema(schema)
            .build(batches)
            .map_err(|e| match e {
                FlightError::Tonic(s) => *s,
                other => CallError::encoding(other.to_string()),
            });
        Ok(Box::pin(data))
    }

    async fn action(&self, kind: &str, bytes: &[u8]) -> Result<Bytes, Status> {
        match kind {
            "checkpoint.begin" => {
                let b: Begin = body(kind, bytes)?;
                let id = self.begin(&b.name).map_err(status)?;
                json_bytes(&json!({ "upload": id }))
            }
            "checkpoint.commit" => {
                let c: Commit = body(kind, bytes)?;
                json_bytes(&self.commit(&c.upload, c.size).await.map_err(status)?)
            }
            "checkpoint.commit_group" => {
                let g: Group = body(kind, bytes)?;
                let group: Vec<(String, u64)> =
                    g.uploads.into_iter().map(|c| (c.upload, c.size)).collect();
                json_bytes(&self.commit_group(&group).await.map_err(status)?)
            }
            "checkpoint.shm.put_open" => {
                let o: PutOpen = body(kind, bytes)?;
                json_bytes(&self.shm_put_open(&o.probe, o.size).await.map_err(status)?)
            }
            "checkpoint.shm.put" => {
                let p: ShmPut = body(kind, bytes)?;
                let n = self
                    .shm_put(&p.region, &p.upload, p.at, p.length, p.offset)
                    .await
                    .map_err(status)?;
                json_bytes(&json!({ "bytes": n }))
            }
            "checkpoint.shm.get_open" => {
                let o: GetOpen = body(kind, bytes)?;
                let (region, info) = self
                    .shm_get_open(&o.name, o.version, &o.probe)
                    .await
                    .map_err(status)?;
                json_bytes(&json!({ "region": region, "checkpoint": info }))
            }
            "checkpoint.shm.get" => {
                let g: ShmGet = body(kind, bytes)?;
                let n = self
                    .shm_get(&g.region, g.offset, g.length)
                    .await
                    .map_err(status)?;
                json_bytes(&json!({ "bytes": n }))
            }
            "checkpoint.shm.touch" => {
                let r: RegionId = body(kind, bytes)?;
                self.shm_touch(&r.region).map_err(status)?;
                json_bytes(&json!({ "region": r.region }))
            }
            "checkpoint.shm.close" => {
                let r: RegionId = body(kind, bytes)?;
                self.shm_close(&r.region).map_err(status)?;
                json_bytes(&json!({ "closed": r.region }))
            }
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
            other => Err(CallError::bad_request(format!(
                "unknown checkpoint action {:?}",
                other.chars().take(64).collect::<String>()
            ))),
        }
    }
}
