//! [`run_query`]: a query planned and executed on the query runtime, its
//! batches handed to the service runtime through a small channel; and
//! [`plan_on`], planning alone there (a job, a query's placement).
//!
//! `sluice serve` answers REST, Flight control calls and `/healthz` on
//! the process's main runtime. A query's operators (a sort, a join, a
//! decode UDF evaluated on the compute side) are CPU work that runs
//! wherever its stream is polled, and DataFusion spawns its operators'
//! tasks on the runtime that polls: left on the main runtime, two decode
//! queries stall `/healthz` for seconds, and a query timeout, polled by the
//! same busy workers, fires minutes late. Here the whole query — planning
//! included — runs on the runtime jobs already compute on
//! ([`crate::job::Jobs::handle`]); the service side only moves finished
//! batches, so it stays responsive and its deadline fires on time.
//!
//! The query stops when its reader does: dropping the returned stream
//! closes the channel, the driving task sees it at once (it waits on the
//! closed channel beside the next batch) and drops the plan, which aborts
//! every task DataFusion spawned for it; the task is aborted too, in case
//! it is still planning. A panic in an operator is caught and becomes the
//! query's error, naming what panicked: a stream that ends early never
//! reads as a complete result.

use std::panic::AssertUnwindSafe;

use arrow::record_batch::RecordBatch;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::{FutureExt, StreamExt};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

/// Batches in the channel between the query runtime and the service
/// runtime: enough to keep both busy, few enough to bound memory.
const BATCHES_AHEAD: usize = 2;

/// `work` spawned on `runtime`, aborted when the set is dropped (a
/// `JoinSet` of one: tokio's own owner of spawned work, as DataFusion's
/// `SpawnedTask` is, but on the runtime named rather than the current).
fn owned_on<F>(runtime: &Handle, work: F) -> JoinSet<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    let mut set = JoinSet::new();
    set.spawn_on(work, runtime);
    set
}

/// The error for a panic caught while running a query.
fn panicked(payload: &Box<dyn std::any::Any + Send>) -> DataFusionError {
    DataFusionError::Execution(format!(
        "the query failed: an operator panicked: {}",
        sluice_udfs::udf::panic_message(payload)
    ))
}

/// Runs `work` (planning a query or a job) on `runtime` and answers its
/// output; dropping the returned future aborts it. A panic comes back as
/// an error message naming it.
pub async fn plan_on<T, F>(runtime: &Handle, work: F) -> std::result::Result<T, String>
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    let (tx, rx) = oneshot::channel();
    let _task = owned_on(runtime, async move {
        let _ = tx.send(AssertUnwindSafe(work).catch_unwind().await);
    });
    match rx.await {
        Ok(Ok(out)) => Ok(out),
        Ok(Err(payload)) => Err(format!(
            "planning panicked: {}",
            sluice_udfs::udf::panic_message(&payload)
        )),
        Err(_) => Err("the query runtime is shutting down".into()),
    }
}

/// Runs `plan` (which plans a query and returns its stream) on `runtime`
/// and answers the stream of its batches, to be read on the caller's
/// runtime. Planning errors come back from this call; see the module docs
/// for how the query stops.
pub async fn run_query<F>(runtime: &Handle, plan: F) -> Result<SendableRecordBatchStream>
where
    F: Future<Output = Result<SendableRecordBatchStream>> + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Result<RecordBatch>>(BATCHES_AHEAD);
    let (planned_tx, planned_rx) = oneshot::channel();
    let drive = async move {
        let planned = AssertUnwindSafe(plan).catch_unwind().await;
        let mut batches = match planned {
            Ok(Ok(batches)) => batches,
            Ok(Err(e)) => {
                let _ = planned_tx.send(Err(e));
                return;
            }
            Err(payload) => {
                let _ = planned_tx.send(Err(panicked(&payload)));
                return;
            }
        };
        if planned_tx.send(Ok(batches.schema())).is_err() {
            return;
        }
        loop {
            let next = tokio::select! {
                biased;
                () = tx.closed() => return,
                next = AssertUnwindSafe(batches.next()).catch_unwind() => next,
            };
            let (item, last) = match next {
                Ok(Some(item)) => {
                    let last = item.is_err();
                    (item, last)
                }
                Ok(None) => return,
                Err(payload) => (Err(panicked(&payload)), true),
            };
            if tx.send(item).await.is_err() || last {
                return;
            }
        }
    };
    let task = owned_on(runtime, drive);
    let schema = match planned_rx.await {
        Ok(planned) => planned?,
        Err(_) => {
            return Err(DataFusionError::Execution(
                "the query's task ended before it was planned (the query runtime is \
                 shutting down)"
                    .into(),
            ));
        }
    };
    let batches = futures::stream::unfold((rx, task), |(mut rx, task)| async move {
        let item = rx.recv().await?;
        Some((item, (rx, task)))
    });
    Ok(Box::pin(RecordBatchStreamAdapter::new(schema, batches)))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use arrow::array::Int32Array;
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn schema() -> arrow::datatypes::SchemaRef {
        Arc::new(Schema::new(vec![Field::new("x", DataType::Int32, false)]))
    }

    fn batch(x: i32) -> Result<RecordBatch> {
        Ok(RecordBatch::try_new(
            schema(),
            vec![Arc::new(Int32Array::from(vec![x]))],
        )?)
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    }

    #[tokio::test]
    async fn batches_cross_runtimes_in_order() {
        let rt = runtime();
        let on_query_runtime = Arc::new(AtomicBool::new(false));
        let seen = Arc::clone(&on_query_runtime);
        let id = rt.handle().id();
        let stream = run_query(rt.handle(), async move {
            seen.store(Handle::current().id() == id, Ordering::Relaxed);
            let s = futures::stream::iter((0..5).map(batch));
            Ok(Box::pin(RecordBatchStreamAdapter::new(schema(), s)) as SendableRecordBatchStream)
        })
        .await
        .unwrap();
        let got: Vec<RecordBatch> = stream.map(|b| b.unwrap()).collect().await;
        assert_eq!(got.len(), 5);
        assert!(
            on_query_runtime.load(Ordering::Relaxed),
            "planned on the caller's runtime"
        );
        rt.shutdown_background();
    }

    #[tokio::test]
    async fn a_panic_is_an_error_never_a_short_stream() {
        let rt = runtime();
        let stream = run_query(rt.handle(), async {
            let s = futures::stream::iter(0..3).map(|i| {
                assert!(i < 1, "offsets must be monotonically increasing");
                batch(i)
            });
            Ok(Box::pin(RecordBatchStreamAdapter::new(schema(), s)) as SendableRecordBatchStream)
        })
        .await
        .unwrap();
        let got: Vec<Result<RecordBatch>> = stream.collect().await;
        assert_eq!(got.len(), 2);
        assert!(got[0].is_ok());
        let e = got[1].as_ref().unwrap_err().to_string();
        assert!(e.contains("panicked") && e.contains("monotonically"), "{e}");

        let e = run_query(rt.handle(), async { panic!("planner blew up") })
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("planner blew up"), "{e}");
        rt.shutdown_background();
    }

    #[tokio::test]
    async fn dropping_the_stream_stops_the_query() {
        let rt = runtime();
        let dropped = Arc::new(AtomicBool::new(false));
        struct Flag(Arc<AtomicBool>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let flag = Flag(Arc::clone(&dropped));
        let mut stream = run_query(rt.handle(), async move {
            // A query that never ends by itself.
            let s = futures::stream::unfold(flag, |flag| async move {
                tokio::time::sleep(Duration::from_millis(1)).await;
                Some((batch(1), flag))
            });
            Ok(Box::pin(RecordBatchStreamAdapter::new(schema(), s)) as SendableRecordBatchStream)
        })
        .await
        .unwrap();
        stream.next().await.unwrap().unwrap();
        drop(stream);
        for _ in 0..200 {
            if dropped.load(Ordering::Relaxed) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(dropped.load(Ordering::Relaxed), "the query kept running");
        rt.shutdown_background();
    }
}
