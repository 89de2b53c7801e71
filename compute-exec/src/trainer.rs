//! Job streams to trainers, as the compute node's Flight service
//! ([`QueryService`](crate::QueryService)) answers them:
//!
//! - [`flight_info`] for `GetFlightInfo(descriptor = job id)`: the job's
//!   schema, samples per epoch and one endpoint per rank, whose ticket is a
//!   [`JobTicket`] for epoch 0 at offset 0;
//! - [`stream`] for `DoGet(JobTicket {job, rank, epoch, offset[, limit]})`:
//!   that rank's batches of `batch_size` rows, in the epoch's order, from
//!   `offset`. Each batch's app metadata is `{"from": F, "next_offset": N}`:
//!   a trainer that stops after it resumes with `offset = N` and receives
//!   exactly the samples it had not. A batch larger than a gRPC message is
//!   sent as several messages; only the last carries the metadata. The
//!   messages' bodies borrow the window batches the rows were gathered
//!   from ([`Gathered::encode_split`]): the batch is never made, and
//!   [`crate::direct`] frames the pieces for gRPC without copying them.
//!
//! A trainer on this host (its ticket's [`Probe`] checks out) gets its
//! batches through shared memory instead ([`sluice_flight::shm`]): after
//! the schema, one control message `{"segment": SegmentInfo, "kept": K}`
//! (`kept`: the segment of the trainer's earlier stream, which it still
//! maps, see [`sluice_flight::kept`]), then per
//! batch a message with no body whose metadata adds `{"slot", "len"}`:
//! the rows are written into the slot straight from the window batches,
//! the one copy of their values on this path. A
//! batch that does not fit a slot, or finds none free in time, comes as
//! Flight messages as above. `transport` in the ticket forces either way.

use std::pin::Pin;
use std::sync::Arc;

use arrow::ipc::writer::IpcWriteOptions;
use arrow_flight::{
    FlightData, FlightDescriptor, FlightEndpoint, FlightInfo, SchemaAsIpc, SchemaResult, Ticket,
};
use bytes::Bytes;
use futures::{Stream, StreamExt, stream};
use serde::{Deserialize, Serialize};
use sluice_flight::MAX_MESSAGE;
use sluice_flight::gather::Gathered;
use sluice_flight::kept::{Held, KeptSegments};
use sluice_flight::shm::{Probe, Segment, SlotRef, Transport, message_len};
use sluice_flight::slices::SlicedMessage;
use sluice_flight::stream::FlightStream;
use sluice_flight::ticket::JobTicket;
use tonic::Status;

use crate::job::{JobError, Jobs, RankBatch};
use sluice_flight::CallError;

/// Largest Arrow body of one message to a trainer; larger batches are
/// sliced by rows.
pub const MAX_TRAINER_MESSAGE: usize = MAX_MESSAGE / 2;

/// The app metadata of a trainer batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchMeta {
    /// The first position the batch covers.
    pub from: u64,
    /// The offset to resume after it.
    pub next_offset: u64,
}

/// The gRPC status of a job error: its [`sluice_flight::Fault`] code and
/// kind (a checksum mismatch on a node is `DATA_LOSS` here too).
pub fn job_status(e: &JobError) -> Status {
    sluice_flight::fault::status(e)
}

fn job_id(d: &FlightDescriptor) -> Result<String, Status> {
    let id = if !d.cmd.is_empty() {
        String::from_utf8(d.cmd.to_vec())
            .map_err(|_| CallError::bad_request("the descriptor's cmd is not a job id"))?
    } else {
        d.path.first().cloned().unwrap_or_default()
    };
    if id.is_empty() {
        return Err(CallError::bad_request("the descriptor names no job"));
    }
    Ok(id)
}

/// The Flight messages of one batch: slices under the message limit, the
/// last with `meta`. Their bodies share the window batches' buffers.
fn encode(rows: &Gathered, meta: &BatchMeta) -> Result<Vec<SlicedMessage>, Status> {
    let mut out = rows
        .encode_split(MAX_TRAINER_MESSAGE)
        .map_err(|e| CallError::encoding(format!("cannot encode a batch: {e}")))?;
    let json = serde_json::to_vec(meta).map_err(|e| CallError::encoding(e.to_string()))?;
    if let Some(last) = out.last_mut() {
        last.app_metadata = Bytes::from(json);
    }
    Ok(out)
}

/// The Flight info of the job `descriptor` names.
pub async fn flight_info(
    jobs: &Jobs,
    descriptor: FlightDescriptor,
    near: Option<std::net::IpAddr>,
) -> Result<FlightInfo, Status> {
    let job = jobs
        .get(&job_id(&descriptor)?)
        .map_err(|e| job_status(&e))?;
    let layout = job.layout().await.map_err(|e| job_status(&e))?;
    let mut info = FlightInfo::new()
        .try_with_schema(job.schema())
        .map_err(|e| CallError::encoding(e.to_string()))?
        .with_descriptor(descriptor)
        .with_ordered(true)
        .with_total_records((layout.per_rank() * layout.world_size) as i64);
    let nodes = jobs.compute_nodes().serving_ranks(layout.world_size, near);
    for (rank, node) in (0..layout.world_size).zip(nodes) {
        let body = sluice_flight::Ticket::Job(JobTicket {
            job: job.id().to_string(),
            rank,
            epoch: 0,
            offset: 0,
            limit: None,
            transport: Transport::Auto,
            probe: None,
            held: None,
        })
        .to_bytes();
        // The compute node that serves the rank, if nodes registered with
        // this one; else this server (an endpoint without a location).
        let mut endpoint = FlightEndpoint::new().with_ticket(Ticket::new(body));
        if let Some(location) = node {
            // That node's reports of the rank count (`job::routes`).
            job.route(rank, &location);
            endpoint = endpoint.with_location(location);
        }
        info = info.with_endpoint(endpoint);
    }
    Ok(info)
}

/// The schema of the job `descriptor` names.
pub fn schema(jobs: &Jobs, descriptor: &FlightDescriptor) -> Result<SchemaResult, Status> {
    let job = jobs.get(&job_id(descriptor)?).map_err(|e| job_status(&e))?;
    let opts = IpcWriteOptions::default();
    SchemaAsIpc::new(job.schema(), &opts)
        .try_into()
        .map_err(|e: arrow::error::ArrowError| CallError::encoding(e.to_string()))
}

/// A job stream's messages.
pub type Messages = Pin<Box<dyn Stream<Item = Result<SlicedMessage, Status>> + Send>>;

/// Whether a ticket's read goes through shared memory.
fn wants_shm(t: &JobTicket) -> Result<bool, Status> {
    let checked = t.probe.as_ref().map(Probe::verify);
    match (t.transport, checked) {
        (Transport::Flight, _) | (Transport::Auto, None | Some(Err(_))) => Ok(false),
        (_, Some(Ok(()))) => Ok(true),
        (Transport::Shm, None) => Err(CallError::bad_request(
            "transport shm needs the trainer's probe of /dev/shm",
        )),
        (Transport::Shm, Some(Err(why))) => {
            Err(CallError::NoSharedMemory(format!("transport shm: {why}")).status())
        }
    }
}

/// The Flight messages of a [`JobTicket`]'s read: the schema, then the
/// batches as [`SlicedMessage`]s (or their shared-memory slots).
pub async fn messages(jobs: &Jobs, t: JobTicket) -> Result<Messages, Status> {
    let shm = wants_shm(&t)?;
    let job = jobs.find(&t.job).await.map_err(|e| job_status(&e))?;
    let opts = IpcWriteOptions::default();
    let schema = SlicedMessage::from(FlightData::from(SchemaAsIpc::new(job.schema(), &opts)));
    if shm {
        let deliveries = job
            .deliver_with(t.rank, t.epoch, t.offset, t.limit, |_| Ok(()))
            .await
            .map_err(|e| job_status(&e))?;
        let forced = t.transport == Transport::Shm;
        let state = ShmStream {
            job,
            segment: None,
            tried: false,
            forced,
            held: t.held,
        };
        let messages = stream::unfold(
            (Box::pin(deliveries), state),
            |(mut deliveries, mut state)| async move {
                let Some(next) = deliveries.next().await else {
                    state.end().await;
                    return None;
                };
                let out = match next {
                    Ok((d, ())) => state.messages(&d).await,
                    Err(e) => vec![Err(job_status(&e))],
                };
                Some((stream::iter(out), (deliveries, state)))
            },
        )
        .flatten();
        return Ok(Box::pin(
            stream::once(async move { Ok(schema) }).chain(messages),
        ));
    }
    // Each batch's messages borrow the window batches its rows came from.
    let deliveries = job
        .deliver_with(t.rank, t.epoch, t.offset, t.limit, |d| {
            let meta = BatchMeta {
                from: d.from,
                next_offset: d.next_offset,
            };
            encode(&d.rows, &meta).map_err(|s| JobError::Internal(s.message().to_string()))
        })
        .await
        .map_err(|e| job_status(&e))?;
    let messages = deliveries
        .then(
            move |d: Result<(RankBatch, Vec<SlicedMessage>), JobError>| {
                let job = Arc::clone(&job);
                async move {
                    let msgs = made(d.map_err(|e| job_status(&e))?.1).await?;
                    job.sent(flight_bytes(&msgs));
                    Ok::<_, Status>(msgs)
                }
            },
        )
        .flat_map(|m| match m {
            Ok(msgs) => stream::iter(msgs.into_iter().map(Ok).collect::<Vec<_>>()),
            Err(s) => stream::iter(vec![Err(s)]),
        });
    Ok(Box::pin(
        stream::once(async move { Ok(schema) }).chain(messages),
    ))
}

/// `msgs` with their computed pieces (finished columns, see
/// [`crate::job::finish`]) made into bytes, on the blocking pool: the
/// stage they run must not hold a thread that serves streams.
async fn made(msgs: Vec<SlicedMessage>) -> Result<Vec<SlicedMessage>, Status> {
    if !msgs.iter().any(SlicedMessage::has_computed) {
        return Ok(msgs);
    }
    tokio::task::spawn_blocking(move || msgs.into_iter().map(SlicedMessage::made).collect())
        .await
        .map_err(|e| CallError::encoding(format!("cannot finish a batch: {e}")))
}

fn flight_bytes(msgs: &[SlicedMessage]) -> u64 {
    msgs.iter()
        .map(|m| (m.body_len() + m.header.len()) as u64)
        .sum()
}

/// A message with app metadata only.
fn control(meta: &impl Serialize) -> Result<SlicedMessage, Status> {
    let json = serde_json::to_vec(meta).map_err(|e| CallError::encoding(e.to_string()))?;
    Ok(SlicedMessage {
        app_metadata: Bytes::from(json),
        ..SlicedMessage::default()
    })
}

/// A batch's metadata when it is in a slot.
#[derive(Serialize)]
struct SlotMeta {
    #[serde(flatten)]
    batch: BatchMeta,
    #[serde(flatten)]
    slot: SlotRef,
}

/// One shared-memory read: its segment, made at the first batch (whose
/// size sets the slots') or taken back from the trainer's earlier stream.
struct ShmStream {
    job: std::sync::Arc<crate::job::Job>,
    segment: Option<std::sync::Arc<Segment>>,
    tried: bool,
    forced: bool,
    /// The segments the trainer still maps, as its ticket says.
    held: Option<Held>,
}

impl ShmStream {
    /// A segment for batches of `size` bytes: one the trainer still maps
    /// from its earlier stream, or a new one (`None`: Flight it is).
    fn segment_for(&self, size: usize) -> std::io::Result<Option<(std::sync::Arc<Segment>, bool)>> {
        if let Some(seg) = self
            .held
            .as_ref()
            .and_then(|h| KeptSegments::global().take(h, size))
        {
            return Ok(Some((seg, true)));
        }
        Ok(Segment::for_batch(size)?.map(|s| (std::sync::Arc::new(s), false)))
    }

    /// The stream was read to its end: once the trainer has mapped the
    /// segment, it is kept for the trainer's next stream (if the trainer
    /// said who it is); else it goes with the stream.
    async fn end(&mut self) {
        let Some(seg) = self.segment.take() else {
            return;
        };
        seg.until_mapped(sluice_flight::shm::MAP_WAIT).await;
        if let Some(held) = self.held.as_ref().filter(|_| seg.mapped()) {
            KeptSegments::global().keep(held, seg);
        }
    }

    async fn messages(&mut self, d: &RankBatch) -> Vec<Result<SlicedMessage, Status>> {
        let meta = BatchMeta {
            from: d.from,
            next_offset: d.next_offset,
        };
        let mut out = Vec::with_capacity(2);
        let whole = match d.rows.encode() {
            Ok(m) => m,
            Err(e) => {
                return vec![Err(CallError::encoding(format!(
                    "cannot encode a batch: {e}"
                )))];
            }
        };
        if !self.tried {
            self.tried = true;
            let size = message_len(&whole) + 4096;
            match self.segment_for(size) {
                Ok(Some((seg, kept))) => {
                    out.push(control(
                        &serde_json::json!({ "segment": seg.info(), "kept": kept }),
                    ));
                    self.segment = Some(seg);
                }
                Ok(None) => {
                    tracing::info!(job = %self.job.id(), bytes = size,
                        "batches too large for a shared-memory segment: Flight it is");
                }
                Err(e) if self.forced => {
                    return vec![Err(CallError::NoSharedMemory(format!(
                        "transport shm: cannot make a segment in {}: {e}",
                        sluice_flight::shm::SHM_DIR
                    ))
                    .status())];
                }
                Err(e) => {
                    tracing::warn!(job = %self.job.id(), error = %e,
                        "cannot make a shared-memory segment: Flight it is");
                }
            }
        }
        if let Some(seg) = &self.segment {
            match seg.put(whole).await {
                Ok(Some(slot)) => {
                    self.job.sent_shm(slot.len);
                    out.push(control(&SlotMeta { batch: meta, slot }));
                    return out;
                }
                Ok(None) => {}
                Err(e) => {
                    out.push(Err(CallError::encoding(e)));
                    return out;
                }
            }
        }
        let msgs = match encode(&d.rows, &meta) {
            Ok(msgs) => made(msgs).await,
            Err(s) => Err(s),
        };
        match msgs {
            Ok(msgs) => {
                self.job.sent(flight_bytes(&msgs));
                out.extend(msgs.into_iter().map(Ok));
            }
            Err(s) => out.push(Err(s)),
        }
        out
    }
}

/// [`messages`] for tonic's encoder (the body of each message copied into
/// one buffer): the path of clients that [`crate::direct`] does not serve.
pub async fn stream(jobs: &Jobs, ticket: JobTicket) -> Result<FlightStream, Status> {
    let m = messages(jobs, ticket).await?;
    Ok(Box::pin(m.map(|m| m.map(|m| m.to_flight_data()))))
}
