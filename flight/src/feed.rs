//! [`Feed`]: a storage fragment bound once on a node and run for window
//! after window of one job stream — one stream per (job stream, storage
//! node), where each window used to cost a Flight round trip, a fragment
//! decoded and a session built on every node it touched.
//!
//! Over Flight a feed is one `DoExchange` ([`RemoteFeed`]):
//!
//! ```text
//!  compute side                                      storage node
//!  FlightData{descriptor: Ticket::Feed(fragment)} ─►  decode, session, UDFs: once
//!  FlightData{app_metadata: WindowTicket}         ─►  bind the take, run ─┐ up to
//!  FlightData{app_metadata: WindowTicket}         ─►  bind the take, run ─┤ FEED_AHEAD
//!                     ◄─ schema, batches, report  (window 1)              │ at once
//!                     ◄─ schema, batches, report  (window 2, in order) ◄──┘
//! ```
//!
//! Each window's answer is the stream every fragment sends
//! ([`crate::stream::send_reported`]): its batches, then a report of the
//! bad samples and stage time it met — what that window added, the feed's
//! UDFs counting for all its windows. The compute side hands batches to
//! the oldest window not yet reported. A failed window ends the exchange
//! with its status: it and every window queued behind it fail with that
//! error, and the next window opens a new exchange (a node restarted
//! mid-job is reached again, see the job's `storage_wait_s`). Dropping the
//! feed cancels the exchange; the node stops its UDFs at their next row.

use std::sync::{Arc, Mutex};

use arrow::datatypes::SchemaRef;
use arrow_flight::decode::{DecodedPayload, FlightDataDecoder};
use arrow_flight::{FlightData, FlightDescriptor};
use async_trait::async_trait;
use bytes::Bytes;
use datafusion::execution::SendableRecordBatchStream;
use futures::StreamExt;
use prost::Message;
use sluice_base::task::SpawnedTask;
use sluice_udfs::UdfEnv;
use tokio::sync::mpsc;

use crate::error::LinkError;
use crate::link::Link;
use crate::messages::{FragmentTicket, Ticket, TicketKind, WindowTicket};
use crate::stream::read_reported;
use crate::windows::{OwedWindows, answered};
use sluice_planner::fragment::Take;

/// Windows a storage node runs ahead of the one it is sending, per feed.
pub const FEED_AHEAD: usize = 3;

/// A storage fragment bound once on a node, run for each window of a job.
#[async_trait]
pub trait Feed: Send + Sync + std::fmt::Debug {
    /// Runs the fragment over `take`'s rows: the window's output, in one
    /// partition. Windows asked for one after another are answered in
    /// that order, and may run at once.
    async fn window(&self, take: &Take) -> Result<SendableRecordBatchStream, LinkError>;
}

/// The message asking for `take`'s window.
pub fn window_message(take: &Take) -> Result<FlightData, LinkError> {
    let Some(rows) = &take.rows else {
        return Err(LinkError::Protocol(
            "a feed's window names its rows (a whole version is read with a fragment)".into(),
        ));
    };
    let ticket = WindowTicket {
        version: take.version,
        rows: rows.to_vec(),
        slots: take.slots.to_vec(),
    };
    Ok(FlightData::new().with_app_metadata(Bytes::from(ticket.encode_to_vec())))
}

/// The take a window message asks for.
pub fn window_take(message: &FlightData) -> Result<Take, String> {
    let t = WindowTicket::decode(message.app_metadata.clone())
        .map_err(|e| format!("bad window ticket: {e}"))?;
    Take::listed(t.version, t.rows, t.slots).map_err(|e| format!("bad window ticket: {e}"))
}

/// One open `DoExchange`.
#[derive(Debug)]
struct Exchange {
    requests: mpsc::UnboundedSender<FlightData>,
    owed: OwedWindows,
    /// Held to be dropped with the exchange: dropping it (the response
    /// stream) aborts the reader, which cancels the call on the node.
    _reader: SpawnedTask<()>,
}

/// A feed on a storage node over Flight (see the module docs).
#[derive(Debug)]
pub struct RemoteFeed {
    link: Link,
    ticket: FragmentTicket,
    udfs: Arc<UdfEnv>,
    schema: SchemaRef,
    open: Mutex<Option<Exchange>>,
}

impl RemoteFeed {
    /// A feed of `ticket`'s fragment (output `schema`) on `link`'s
    /// node; bad samples and stage times it reports go to `udfs`. The
    /// exchange opens at the first window.
    pub(crate) fn new(
        link: Link,
        ticket: FragmentTicket,
        udfs: Arc<UdfEnv>,
        schema: SchemaRef,
    ) -> Self {
        Self {
            link,
            ticket,
            udfs,
            schema,
            open: Mutex::new(None),
        }
    }

    /// Opens a new exchange: its first message, and the task that reads
    /// its answers.
    fn start(&self) -> Exchange {
        let (requests, asked) = mpsc::unbounded_channel();
        let ticket = Ticket {
            kind: Some(TicketKind::Feed(self.ticket.clone())),
        };
        let first = FlightData {
            flight_descriptor: Some(FlightDescriptor::new_cmd(ticket.encode_to_vec())),
            ..Default::default()
        };
        // The receiver is alive: this cannot fail.
        let _ = requests.send(first);
        let owed = OwedWindows::default();
        let asked =
            futures::stream::unfold(
                asked,
                |mut rx| async move { rx.recv().await.map(|m| (m, rx)) },
            );
        let reader = SpawnedTask::spawn(read(
            self.link.clone(),
            asked,
            owed.clone(),
            Arc::clone(&self.udfs),
        ));
        Exchange {
            requests,
            owed,
            _reader: reader,
        }
    }
}

/// Reads an exchange's answers into the windows it owes, until it ends;
/// then fails every window still owed with the reason it ended.
async fn read(
    link: Link,
    asked: impl futures::Stream<Item = FlightData> + Send + 'static,
    owed: OwedWindows,
    udfs: Arc<UdfEnv>,
) {
    let failed = match link.inner.clone().do_exchange(asked).await {
        Err(s) => link.status(&s),
        Ok(answers) => {
            let node = link.node.clone();
            let done = owed.clone();
            // A report ends its window: the window's bad samples are the
            // job's before its last batch is seen to end.
            let data = read_reported(answers.into_inner(), move |r| {
                udfs.errors.merge(r.bad_total, r.bad);
                udfs.clock.merge(&node, &r.stages);
                done.done();
            });
            let mut decoded = std::pin::pin!(FlightDataDecoder::new(data));
            loop {
                match decoded.next().await {
                    None => {
                        break LinkError::Unavailable {
                            node: link.node.clone(),
                            reason: "the feed ended before answering every window".into(),
                        };
                    }
                    Some(Err(e)) => break link.flight(e),
                    Some(Ok(d)) => {
                        let DecodedPayload::RecordBatch(batch) = d.payload else {
                            continue;
                        };
                        if !owed.batch(batch) {
                            break LinkError::Protocol(format!(
                                "{} sent rows no window asked for",
                                link.node
                            ));
                        }
                    }
                }
            }
        }
    };
    owed.fail(failed);
}

#[async_trait]
impl Feed for RemoteFeed {
    async fn window(&self, take: &Take) -> Result<SendableRecordBatchStream, LinkError> {
        let message = window_message(take)?;
        let (tx, rx) = mpsc::unbounded_channel();
        {
            let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
            // The open exchange, or (it failed) a new one; a new one that
            // fails at once fails this window with its reason.
            let node = &self.link.node;
            let asked = match open.as_ref() {
                Some(ex) => ex
                    .owed
                    .ask(&tx, node, || ex.requests.send(message.clone()).is_ok()),
                None => Err(LinkError::Protocol("no exchange yet".into())),
            };
            if asked.is_err() {
                let ex = open.insert(self.start());
                ex.owed
                    .ask(&tx, node, || ex.requests.send(message).is_ok())?;
            }
        }
        Ok(answered(rx, Arc::clone(&self.schema), &self.link.node))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_message_carries_its_take() {
        let take = Take {
            version: 7,
            rows: Some(Arc::from(vec![5u32, 1, 9])),
            slots: Arc::from(vec![0u32, 2, 1]),
        };
        let back = window_take(&window_message(&take).unwrap()).unwrap();
        assert_eq!(back, take);
    }

    #[test]
    fn a_window_names_its_rows_and_a_slot_for_each() {
        let index = Take::index(3);
        let err = window_message(&index).unwrap_err().to_string();
        assert!(err.contains("names its rows"), "{err}");
        let lopsided = WindowTicket {
            version: 1,
            rows: vec![1, 2],
            slots: vec![0],
        };
        let m = FlightData::new().with_app_metadata(Bytes::from(lopsided.encode_to_vec()));
        let err = window_take(&m).unwrap_err();
        assert!(err.contains("2 rows but 1 slots"), "{err}");
    }
}
