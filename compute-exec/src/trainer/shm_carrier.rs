//! [`ShmCarrier`]: a trainer's batches through a shared-memory segment
//! (`sluice_shm`). The first batch sizes the slots (or the trainer's kept
//! segment from its earlier stream is taken back); each batch is written
//! into a free slot and announced by a control message; a batch that does
//! not fit, or finds no slot free in time, goes as Flight messages
//! ([`FlightCarrier`]).

use std::sync::Arc;

use serde::Serialize;
use sluice_base::CallError;
use sluice_flight::shm_handshake::{Held, SlotRef};
use sluice_flight::slices::SlicedMessage;
use sluice_shm::KeptSegments;
use sluice_shm::segment::{Segment, message_len};
use tonic::Status;

use super::BatchMeta;
use super::carrier::{Carrier, FlightCarrier, control, meta_of};
use crate::job::RankBatch;

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
pub(super) struct ShmCarrier {
    /// Batches that do not go through the segment.
    flight: FlightCarrier,
    segment: Option<Arc<Segment>>,
    tried: bool,
    forced: bool,
    /// The segments the trainer still maps, as its ticket says.
    held: Option<Held>,
}

impl ShmCarrier {
    /// `forced`: the ticket asked for shared memory only, so a segment
    /// that cannot be made is an error, not Flight.
    pub(super) fn new(flight: FlightCarrier, forced: bool, held: Option<Held>) -> Self {
        Self {
            flight,
            segment: None,
            tried: false,
            forced,
            held,
        }
    }

    /// A segment for batches of `size` bytes: one the trainer still maps
    /// from its earlier stream, or a new one (`None`: Flight it is).
    fn segment_for(&self, size: usize) -> std::io::Result<Option<(Arc<Segment>, bool)>> {
        if let Some(seg) = self
            .held
            .as_ref()
            .and_then(|h| KeptSegments::global().take(h, size))
        {
            return Ok(Some((seg, true)));
        }
        Ok(Segment::for_batch(size)?.map(|s| (Arc::new(s), false)))
    }
}

impl Carrier for ShmCarrier {
    /// The stream was read to its end: once the trainer has mapped the
    /// segment, it is kept for the trainer's next stream (if the trainer
    /// said who it is); else it goes with the stream.
    async fn end(&mut self) {
        let Some(seg) = self.segment.take() else {
            return;
        };
        seg.until_mapped(sluice_shm::segment::MAP_WAIT).await;
        if let Some(held) = self.held.as_ref().filter(|_| seg.mapped()) {
            KeptSegments::global().keep(held, seg);
        }
    }

    async fn messages(&mut self, d: &RankBatch) -> Vec<Result<SlicedMessage, Status>> {
        let meta = meta_of(d);
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
                    tracing::info!(job = %self.flight.job().id(), bytes = size,
                        "batches too large for a shared-memory segment: Flight it is");
                }
                Err(e) if self.forced => {
                    return vec![Err(CallError::NoSharedMemory(format!(
                        "transport shm: cannot make a segment in {}: {e}",
                        sluice_flight::shm_handshake::SHM_DIR
                    ))
                    .status())];
                }
                Err(e) => {
                    tracing::warn!(job = %self.flight.job().id(), error = %e,
                        "cannot make a shared-memory segment: Flight it is");
                }
            }
        }
        if let Some(seg) = &self.segment {
            match seg.put(whole).await {
                Ok(Some(slot)) => {
                    self.flight.job().sent_shm(slot.len);
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
        out.extend(self.flight.messages(d).await);
        out
    }
}
