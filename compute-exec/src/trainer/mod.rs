//! Job streams to trainers, as the compute node's Flight service
//! ([`QueryService`](crate::QueryService)) answers them:
//!
//! - [`flight_info`] for `GetFlightInfo(descriptor = job id)`: the job's
//!   schema, samples per epoch and one endpoint per rank, whose ticket is a
//!   [`JobTicket`] for the job's first epoch (0, or the one it resumes)
//!   at offset 0;
//! - [`stream`] for `DoGet(JobTicket {job, rank, epoch, offset[, limit,
//!   worker, workers]})`:
//!   that rank's batches of `batch_size` rows, in the epoch's order, from
//!   `offset`. Each batch's app metadata is `{"from": F, "next_offset": N}`:
//!   a trainer that stops after it resumes with `offset = N` and receives
//!   exactly the samples it had not. A batch larger than a gRPC message is
//!   sent as several messages; only the last carries the metadata. The
//!   messages' bodies borrow the window batches the rows were gathered
//!   from (`Gathered::encode_split`): the batch is never made, and
//!   [`crate::direct`] frames the pieces for gRPC without copying them;
//! - `shm_carrier`: `ShmCarrier`: a trainer's batches through a shared-memory
//!   segment (`sluice_shm`);
//! - `carrier`: `Carrier`: how a reader's batches travel to a trainer.
//!
//! A trainer on this host (its ticket's probe checks out) gets its
//! batches through shared memory instead ([`sluice_shm`]): after
//! the schema, one control message `{"segment": SegmentInfo, "kept": K}`
//! (`kept`: the segment of the trainer's earlier stream, which it still
//! maps, see [`sluice_shm::kept`]), then per
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
use futures::{Stream, StreamExt, stream};
use serde::{Deserialize, Serialize};
use sluice_base::CallError;
use sluice_flight::MAX_MESSAGE;
use sluice_flight::shm_handshake::Transport;
use sluice_flight::slices::SlicedMessage;
use sluice_flight::stream::FlightStream;
use sluice_flight::ticket::JobTicket;
use tonic::Status;

use crate::job::order::Worker;
use crate::job::{JobError, Jobs, RankBatch};

mod carrier;
mod shm_carrier;

use carrier::{Carrier, FlightCarrier};
use shm_carrier::ShmCarrier;

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

/// The gRPC status of a job error: its [`sluice_base::Fault`] code and
/// kind (a checksum mismatch on a node is `DATA_LOSS` here too).
pub fn job_status(e: &JobError) -> Status {
    sluice_base::fault::status(e)
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

/// The Flight info of the job `descriptor` names.
pub async fn flight_info(
    jobs: &Jobs,
    descriptor: FlightDescriptor,
    near: Option<std::net::IpAddr>,
) -> Result<FlightInfo, Status> {
    let job = jobs
        .get(&job_id(&descriptor)?)
        .map_err(|e| job_status(&e))?;
    let (epoch, layout) = job.first_epoch().await.map_err(|e| job_status(&e))?;
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
            epoch,
            offset: 0,
            limit: None,
            worker: 0,
            workers: 1,
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
    let checked = t.probe.as_ref().map(sluice_shm::host::verify);
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

/// The ticket's DataLoader worker.
fn worker(t: &JobTicket) -> Result<Worker, Status> {
    if !(1..=MAX_WORKERS).contains(&t.workers) {
        return Err(CallError::bad_request(format!(
            "workers must be in 1..={MAX_WORKERS}, not {}",
            t.workers
        )));
    }
    Ok(Worker {
        index: t.worker,
        count: t.workers,
    })
}

/// The most DataLoader workers a rank's reader may name.
const MAX_WORKERS: u64 = 1024;

/// The Flight messages of a [`JobTicket`]'s read: the schema, then the
/// batches as the ticket's [`Carrier`] carries them.
pub async fn messages(jobs: &Jobs, t: JobTicket) -> Result<Messages, Status> {
    let shm = wants_shm(&t)?;
    let job = jobs.find(&t.job).await.map_err(|e| job_status(&e))?;
    let opts = IpcWriteOptions::default();
    let schema = SlicedMessage::from(FlightData::from(SchemaAsIpc::new(job.schema(), &opts)));
    let batches = job
        .deliver_part(t.rank, worker(&t)?, t.epoch, t.offset, t.limit)
        .await
        .map_err(|e| job_status(&e))?;
    let flight = FlightCarrier::new(Arc::clone(&job));
    let body = if shm {
        let forced = t.transport == Transport::Shm;
        through(batches, ShmCarrier::new(flight, forced, t.held))
    } else {
        through(batches, flight)
    };
    Ok(Box::pin(
        stream::once(async move { Ok(schema) }).chain(body),
    ))
}

/// `batches` as `carrier` carries them; the carrier hears of the stream's end
/// when it was read to it.
fn through<B, S>(batches: B, carrier: S) -> Messages
where
    B: Stream<Item = Result<RankBatch, JobError>> + Send + 'static,
    S: Carrier + 'static,
{
    let messages = stream::unfold(
        (Box::pin(batches), carrier),
        |(mut batches, mut carrier)| async move {
            let out = match batches.next().await {
                None => {
                    carrier.end().await;
                    return None;
                }
                Some(Ok(batch)) => carrier.messages(&batch).await,
                Some(Err(e)) => vec![Err(job_status(&e))],
            };
            Some((stream::iter(out), (batches, carrier)))
        },
    );
    Box::pin(messages.flatten())
}

/// [`messages`] for tonic's encoder (the body of each message copied into
/// one buffer): the path of clients that [`crate::direct`] does not serve.
pub async fn stream(jobs: &Jobs, ticket: JobTicket) -> Result<FlightStream, Status> {
    let m = messages(jobs, ticket).await?;
    Ok(Box::pin(m.map(|m| m.map(|m| m.to_flight_data()))))
}
