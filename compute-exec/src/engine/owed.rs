//! [`OwedWindows`]: the windows an engine feed owes, oldest first. The
//! reader of the running query hands each its batches, then its end (its
//! report came) or the failure that ended the query; a window asked for
//! after that failure fails at once, and the feed starts a new query for
//! the next.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::error::DataFusionError;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use tokio::sync::mpsc;

use sluice_flight::LinkError;

/// What the reader hands one window.
#[derive(Debug)]
pub enum Answer {
    /// One of its batches.
    Batch(RecordBatch),
    /// Its report came: it is complete.
    Done,
    /// The transport failed before it was complete.
    Failed(LinkError),
}

/// Where one window's answers go. A window whose channel closes without
/// [`Answer::Done`] failed: it is never taken for complete.
pub type Window = mpsc::UnboundedSender<Answer>;

#[derive(Debug, Default)]
struct Owed {
    windows: VecDeque<Window>,
    failed: Option<LinkError>,
}

/// The windows one transport owes (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct OwedWindows(Arc<Mutex<Owed>>);

impl OwedWindows {
    fn lock(&self) -> MutexGuard<'_, Owed> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Asks for a window (`send` sends the request; false: the transport
    /// is closed), its answers to go to `window`; under the lock the
    /// reader fails the transport with, so a window is answered or
    /// failed, never forgotten.
    pub fn ask(
        &self,
        window: &Window,
        node: &str,
        send: impl FnOnce() -> bool,
    ) -> Result<(), LinkError> {
        let mut owed = self.lock();
        if let Some(e) = &owed.failed {
            return Err(e.clone());
        }
        if !send() {
            return Err(LinkError::Unavailable {
                node: node.to_string(),
                reason: "the feed was closed".into(),
            });
        }
        owed.windows.push_back(window.clone());
        Ok(())
    }

    /// Hands `batch` to the oldest window owed (a window whose reader left
    /// drops it); false: no window is owed.
    pub fn batch(&self, batch: RecordBatch) -> bool {
        match self.lock().windows.front() {
            Some(w) => {
                let _ = w.send(Answer::Batch(batch));
                true
            }
            None => false,
        }
    }

    /// The oldest window owed is complete.
    pub fn done(&self) {
        if let Some(w) = self.lock().windows.pop_front() {
            let _ = w.send(Answer::Done);
        }
    }

    /// The transport ended with `failed`: every window owed fails with it,
    /// and so does every window asked for from now on.
    pub fn fail(&self, failed: LinkError) {
        let mut owed = self.lock();
        for w in owed.windows.drain(..) {
            let _ = w.send(Answer::Failed(failed.clone()));
        }
        owed.failed = Some(failed);
    }
}

/// One window's output (of `schema`, from `node`), as its answers come.
pub fn answered(
    rx: mpsc::UnboundedReceiver<Answer>,
    schema: SchemaRef,
    node: &str,
) -> SendableRecordBatchStream {
    let node = node.to_string();
    let batches = futures::stream::unfold(Some(rx), move |rx| {
        let node = node.clone();
        async move {
            let mut rx = rx?;
            let failed = match rx.recv().await {
                Some(Answer::Batch(b)) => return Some((Ok(b), Some(rx))),
                Some(Answer::Done) => return None,
                Some(Answer::Failed(e)) => e,
                None => LinkError::Unavailable {
                    node,
                    reason: "the feed closed before the window was answered".into(),
                },
            };
            Some((Err(DataFusionError::from(failed)), None))
        }
    });
    Box::pin(RecordBatchStreamAdapter::new(schema, batches))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Int32Array;
    use arrow::datatypes::{DataType, Field, Schema};
    use futures::StreamExt;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![Field::new("x", DataType::Int32, false)]))
    }

    fn batch(v: i32) -> RecordBatch {
        RecordBatch::try_new(schema(), vec![Arc::new(Int32Array::from(vec![v]))]).unwrap()
    }

    fn lost() -> LinkError {
        LinkError::Unavailable {
            node: "n1".into(),
            reason: "reset".into(),
        }
    }

    async fn values(s: SendableRecordBatchStream) -> (Vec<i32>, Option<String>) {
        let mut out = Vec::new();
        let mut s = s;
        while let Some(b) = s.next().await {
            match b {
                Ok(b) => out.extend(
                    b.column(0)
                        .as_any()
                        .downcast_ref::<Int32Array>()
                        .unwrap()
                        .values()
                        .iter()
                        .copied(),
                ),
                Err(e) => return (out, Some(e.to_string())),
            }
        }
        (out, None)
    }

    #[tokio::test]
    async fn windows_are_answered_oldest_first() {
        let owed = OwedWindows::default();
        let (a, ra) = mpsc::unbounded_channel();
        let (b, rb) = mpsc::unbounded_channel();
        owed.ask(&a, "n1", || true).unwrap();
        owed.ask(&b, "n1", || true).unwrap();
        assert!(owed.batch(batch(1)));
        assert!(owed.batch(batch(2)));
        owed.done();
        assert!(owed.batch(batch(3)));
        owed.done();
        assert!(!owed.batch(batch(4)), "nothing is owed any more");
        drop((a, b));
        assert_eq!(
            values(answered(ra, schema(), "n1")).await,
            (vec![1, 2], None)
        );
        assert_eq!(values(answered(rb, schema(), "n1")).await, (vec![3], None));
    }

    #[tokio::test]
    async fn a_failed_transport_fails_every_window_owed_and_asked_for_after() {
        let owed = OwedWindows::default();
        let (a, ra) = mpsc::unbounded_channel();
        owed.ask(&a, "n1", || true).unwrap();
        assert!(owed.batch(batch(7)));
        owed.fail(lost());
        drop(a);
        let (got, err) = values(answered(ra, schema(), "n1")).await;
        assert_eq!(got, vec![7], "what came before the failure is kept");
        assert!(err.unwrap().contains("reset"));
        let (b, _rb) = mpsc::unbounded_channel();
        let mut sent = false;
        let e = owed.ask(&b, "n1", || {
            sent = true;
            true
        });
        assert!(e.is_err() && !sent, "refused before it is sent");
    }

    #[tokio::test]
    async fn a_closed_feed_refuses_the_window_and_a_window_never_done_fails() {
        let owed = OwedWindows::default();
        let (a, _ra) = mpsc::unbounded_channel();
        let e = owed.ask(&a, "n2", || false).unwrap_err();
        assert!(e.to_string().contains("n2"), "{e}");
        assert!(!owed.batch(batch(1)), "the refused window is not owed");
        // Its channel closed without `Done`: never taken for complete.
        let (b, rb) = mpsc::unbounded_channel();
        b.send(Answer::Batch(batch(5))).unwrap();
        drop(b);
        let (got, err) = values(answered(rb, schema(), "n2")).await;
        assert_eq!(got, vec![5]);
        assert!(
            err.unwrap()
                .contains("closed before the window was answered")
        );
    }
}
