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
        let waiting = Instant::now();
        let queued = sink.queued();
        if sink.send(cut).await.is_err() {
            // Gone at the last batch: not every batch was handed on.
            return Ok(());
        }
        observer.sent(queued, waiting.elapsed());
    }
    observer.end();
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use arrow::array::{AsArray, UInt64Array};
    use arrow::datatypes::{DataType, Field, Schema, UInt64Type};
    use arrow::record_batch::RecordBatch;
    use futures::future::{Ready, ready};
    use futures::stream::{self, Iter};

    use super::*;
    use crate::job::pipeline::bad_tally::Unsent;
    use crate::job::window_rows::WindowRows;
    use crate::session::window_budget::WindowBudget;

    /// A reader that keeps every batch, or leaves after `leaves_after`.
    #[derive(Default)]
    struct Kept {
        batches: Mutex<Vec<RankBatch>>,
        leaves_after: Option<usize>,
    }

    impl Sink for Kept {
        async fn send(&self, batch: RankBatch) -> Result<(), Gone> {
            let mut kept = self.batches.lock().unwrap();
            if self.leaves_after.is_some_and(|n| kept.len() >= n) {
                return Err(Gone);
            }
            kept.push(batch);
            Ok(())
        }

        fn queued(&self) -> u64 {
            0
        }
    }

    /// What the stages told their observer, in order.
    #[derive(Default, Clone)]
    struct Told(Arc<Mutex<Vec<String>>>);

    impl Told {
        fn said(&self) -> Vec<String> {
            self.0.lock().unwrap().clone()
        }
    }

    /// An observer that writes down each call; a sample with no row is an
    /// error unless `skips`.
    struct Noting {
        told: Told,
        skips: bool,
    }

    impl Observe for Noting {
        async fn window(&mut self, w: &Fetched) {
            self.told
                .0
                .lock()
                .unwrap()
                .push(format!("window {}", w.start));
        }

        fn missing(
            &mut self,
            missing: &[u32],
            samples: &[u64],
            start: u64,
        ) -> Result<(), JobError> {
            self.told
                .0
                .lock()
                .unwrap()
                .push(format!("missing {missing:?} at {start}"));
            match missing.first() {
                Some(&slot) if !self.skips => Err(JobError::Internal(format!(
                    "sample {} has no row",
                    samples[slot as usize]
                ))),
                _ => Ok(()),
            }
        }

        fn take_bad(&mut self) -> Option<Unsent> {
            None
        }

        fn sent(&mut self, _queued: u64, _waited: Duration) {
            self.told.0.lock().unwrap().push("sent".into());
        }

        fn handed_on(&mut self) {
            self.told.0.lock().unwrap().push("handed on".into());
        }

        fn end(self) {
            self.told.0.lock().unwrap().push("end".into());
        }
    }

    fn schema() -> Arc<Schema> {
        Arc::new(Schema::new(vec![Field::new(
            "sample",
            DataType::UInt64,
            false,
        )]))
    }

    /// A window at `start` whose slot `i` holds the row of sample
    /// `samples[i]`, but for the slots in `holes`.
    async fn window(start: u64, samples: &[u64], holes: &[usize]) -> Fetched {
        let column = UInt64Array::from(samples.to_vec());
        let batch = RecordBatch::try_new(schema(), vec![Arc::new(column)]).unwrap();
        let at = (0..samples.len())
            .map(|i| (!holes.contains(&i)).then_some((0, i)))
            .collect();
        Fetched {
            start,
            samples: samples.to_vec(),
            rows: WindowRows {
                sources: vec![Arc::new(batch)],
                at,
            },
            room: WindowBudget::new(1 << 20).reserve(64).await,
            took: Duration::ZERO,
        }
    }

    type Windows = Iter<std::vec::IntoIter<Ready<Result<Fetched, JobError>>>>;

    fn in_order(
        windows: Vec<Result<Fetched, JobError>>,
    ) -> InOrder<Windows, Result<Fetched, JobError>> {
        InOrder::new(
            stream::iter(windows.into_iter().map(ready).collect::<Vec<_>>()),
            2,
            2,
        )
    }

    fn delivered(sink: &Kept) -> Vec<(u64, u64, Vec<u64>)> {
        sink.batches
            .lock()
            .unwrap()
            .iter()
            .map(|b| {
                let batch = b.rows.to_batch().unwrap();
                let samples = batch.column(0).as_primitive::<UInt64Type>();
                (b.from, b.next_offset, samples.values().to_vec())
            })
            .collect()
    }

    /// A stream of `windows` from position `from` to `to`, cut in batches
    /// of 2, delivered to `sink` under an observer that `skips` samples
    /// with no row: what `deliver` returned, and what it told the observer.
    async fn run(
        windows: Vec<Result<Fetched, JobError>>,
        (from, to): (u64, u64),
        skips: bool,
        sink: &Kept,
    ) -> (Result<(), JobError>, Vec<String>) {
        let told = Told::default();
        let observer = Noting {
            told: told.clone(),
            skips,
        };
        let rebatch = Rebatcher::new(schema(), None, 2, from);
        let out = deliver(in_order(windows), rebatch, to, observer, sink).await;
        (out, told.said())
    }

    #[tokio::test]
    async fn windows_are_cut_into_batches_in_the_epochs_order() {
        let sink = Kept::default();
        let (out, told) = run(
            vec![
                Ok(window(0, &[7, 3, 9], &[]).await),
                Ok(window(3, &[1, 4], &[]).await),
            ],
            (0, 5),
            false,
            &sink,
        )
        .await;
        out.unwrap();
        assert_eq!(
            delivered(&sink),
            vec![(0, 2, vec![7, 3]), (2, 4, vec![9, 1]), (4, 5, vec![4])]
        );
        assert_eq!(
            told,
            [
                "window 0",
                "missing [] at 0",
                "sent",
                "handed on",
                // [9, 1] in the loop; [4], the range's last, at its end.
                "window 3",
                "missing [] at 3",
                "sent",
                "handed on",
                "sent",
                "end",
            ]
        );
    }

    #[tokio::test]
    async fn a_skipped_sample_leaves_no_row_and_the_next_batch_resumes_past_it() {
        let sink = Kept::default();
        let (out, told) = run(
            vec![Ok(window(10, &[5, 6, 8], &[1]).await)],
            (10, 13),
            true,
            &sink,
        )
        .await;
        out.unwrap();
        assert_eq!(delivered(&sink), vec![(10, 13, vec![5, 8])]);
        assert_eq!(
            told,
            ["window 10", "missing [1] at 10", "handed on", "sent", "end"]
        );
    }

    #[tokio::test]
    async fn a_missing_row_the_policy_does_not_skip_fails_the_stream() {
        let sink = Kept::default();
        let (out, told) = run(
            vec![Ok(window(0, &[5, 6], &[0]).await)],
            (0, 2),
            false,
            &sink,
        )
        .await;
        let e = out.unwrap_err();
        assert!(e.to_string().contains("sample 5 has no row"), "{e}");
        assert!(delivered(&sink).is_empty());
        assert_eq!(told, ["window 0", "missing [0] at 0"]);
    }

    #[tokio::test]
    async fn a_windows_error_is_the_streams_and_nothing_after_it_is_sent() {
        let sink = Kept::default();
        let (out, told) = run(
            vec![
                Ok(window(0, &[1, 2], &[]).await),
                Err(JobError::Unavailable {
                    node: "node-b".into(),
                    reason: "connection refused".into(),
                }),
                Ok(window(4, &[3, 4], &[]).await),
            ],
            (0, 6),
            false,
            &sink,
        )
        .await;
        let e = out.unwrap_err();
        assert!(
            matches!(e, JobError::Unavailable { ref node, .. } if node == "node-b"),
            "{e}"
        );
        assert_eq!(delivered(&sink), vec![(0, 2, vec![1, 2])]);
        assert!(!told.contains(&"end".to_string()));
    }

    #[tokio::test]
    async fn a_reader_that_leaves_ends_the_stream_without_an_error() {
        let sink = Kept {
            leaves_after: Some(1),
            ..Kept::default()
        };
        let (out, told) = run(
            vec![
                Ok(window(0, &[1, 2], &[]).await),
                Ok(window(2, &[3, 4], &[]).await),
            ],
            (0, 4),
            false,
            &sink,
        )
        .await;
        out.unwrap();
        assert_eq!(delivered(&sink).len(), 1);
        // The range's last batch is held for its end (`Rebatcher::finish`):
        // the reader left at that send, so the stream did not end with
        // every batch handed on, and its observer is not told it did.
        assert_eq!(
            told,
            [
                "window 0",
                "missing [] at 0",
                "sent",
                "handed on",
                "window 2",
                "missing [] at 2",
                "handed on"
            ]
        );
    }
}
