//! The last stages: the fetched windows, in order, put back into batches
//! of the epoch's order (`crate::job::rebatch`, which also runs the
//! job's finish stage as it cuts) and handed to the reader's [`Sink`].
//!
//! While the reader takes its time (a trainer's encoding runs as it
//! receives), the windows go on: those done are held and the next ones
//! start (`InOrder::keep_running`). A reader that leaves ends the stream
//! without an error; it is the stream's caller that notices and stops
//! the windows.

use std::sync::Arc;
use std::time::Instant;

use futures::{Stream, StreamExt};
use tokio::sync::mpsc;

use super::fetch::Fetched;
use super::observe::Observe;
use crate::error::JobError;
use crate::job::in_order::InOrder;
use crate::job::rank_batch::RankBatch;
use crate::job::rebatch::Rebatcher;

/// Where a stream's batches go: the reader's channel, which a Flight
/// response or a shared-memory writer drains.
pub trait Sink: Send + Sync {
    /// Hands `batch` on, waiting for room; `Err(Gone)` when the reader
    /// left.
    fn send(&self, batch: RankBatch) -> impl Future<Output = Result<(), Gone>> + Send;

    /// Batches handed on and not yet taken.
    fn queued(&self) -> u64;
}

/// The reader left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gone;

impl Sink for mpsc::Sender<Result<RankBatch, JobError>> {
    async fn send(&self, batch: RankBatch) -> Result<(), Gone> {
        mpsc::Sender::send(self, Ok(batch)).await.map_err(|_| Gone)
    }

    fn queued(&self) -> u64 {
        (self.max_capacity() - self.capacity()) as u64
    }
}

/// Hands the batches of `windows` (the windows of a stream ending at
/// position `to`, in order) to `sink`, cut by `rebatch`, telling
/// `observer` as it goes. Ends at the stream's end or when the reader
/// leaves; the first error of a window is the stream's.
pub async fn deliver<S, F, O, K>(
    mut windows: InOrder<S, Result<Fetched, JobError>>,
    mut rebatch: Rebatcher,
    to: u64,
    mut observer: O,
    sink: &K,
) -> Result<(), JobError>
where
    S: Stream<Item = F> + Unpin,
    F: Future<Output = Result<Fetched, JobError>> + Send + 'static,
    O: Observe,
    K: Sink,
{
    while let Some(w) = windows.next().await {
        let w = w?;
        observer.window(&w).await;
        let stop = w.start + w.samples.len() as u64;
        // The room is given back when the last batch with a row of this
        // window is gone (sent, or dropped with its reader).
        let missing = rebatch.add(w.rows, w.start, Arc::new(w.room));
        observer.missing(&missing, &w.samples, w.start)?;
        while let Some(mut cut) = rebatch.next(stop >= to)? {
            cut.bad = observer.take_bad();
            let waiting = Instant::now();
            let queued = sink.queued();
            let sent = tokio::select! {
                biased;
                sent = sink.send(cut) => sent,
                never = windows.keep_running() => match never {},
            };
            if sent.is_err() {
                return Ok(());
            }
            observer.sent(queued, waiting.elapsed());
        }
        observer.handed_on();
    }
    if let Some(mut cut) = rebatch.finish(to)? {
        cut.bad = observer.take_bad();
        let _gone = sink.send(cut).await;
    }
    observer.end();
    Ok(())
}
