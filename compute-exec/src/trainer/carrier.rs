//! [`Carrier`]: how a reader's batches travel to a trainer (the messages
//! that carry each; the stream's one sink is `crate::job::pipeline`'s
//! channel, which the carrier drains), and [`FlightCarrier`], the one
//! every stream can take: each batch as Flight messages whose bodies borrow the window batches its rows came
//! from (sliced under [`MAX_TRAINER_MESSAGE`], the last carrying the
//! batch's [`BatchMeta`]). The shared-memory carrier is `super::shm_carrier`.

use std::sync::Arc;

use bytes::Bytes;
use serde::Serialize;
use sluice_base::CallError;
use sluice_flight::gather::Gathered;
use sluice_flight::slices::SlicedMessage;
use tonic::Status;

use super::{BatchMeta, MAX_TRAINER_MESSAGE};
use crate::job::{Job, RankBatch};

/// How a reader's batches travel: the messages that carry each, in order.
pub(super) trait Carrier: Send {
    /// The messages that carry `batch`; an `Err` among them ends the
    /// stream.
    fn messages(
        &mut self,
        batch: &RankBatch,
    ) -> impl Future<Output = Vec<Result<SlicedMessage, Status>>> + Send;

    /// The stream was read to its end.
    fn end(&mut self) -> impl Future<Output = ()> + Send;
}

/// Batches as Flight messages (see the module docs).
pub(super) struct FlightCarrier {
    job: Arc<Job>,
}

impl FlightCarrier {
    pub(super) fn new(job: Arc<Job>) -> Self {
        Self { job }
    }

    /// The job whose batches these are.
    pub(super) fn job(&self) -> &Arc<Job> {
        &self.job
    }
}

impl Carrier for FlightCarrier {
    async fn messages(&mut self, batch: &RankBatch) -> Vec<Result<SlicedMessage, Status>> {
        let msgs = match encode(&batch.rows, &meta_of(batch)) {
            Ok(msgs) => made(msgs).await,
            Err(s) => Err(s),
        };
        match msgs {
            Ok(msgs) => {
                self.job.sent(flight_bytes(&msgs));
                msgs.into_iter().map(Ok).collect()
            }
            Err(s) => vec![Err(s)],
        }
    }

    async fn end(&mut self) {}
}

/// The app metadata of `batch`.
pub(super) fn meta_of(batch: &RankBatch) -> BatchMeta {
    BatchMeta {
        from: batch.from,
        next_offset: batch.next_offset,
    }
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
pub(super) fn control(meta: &impl Serialize) -> Result<SlicedMessage, Status> {
    let json = serde_json::to_vec(meta).map_err(|e| CallError::encoding(e.to_string()))?;
    Ok(SlicedMessage {
        app_metadata: Bytes::from(json),
        ..SlicedMessage::default()
    })
}
