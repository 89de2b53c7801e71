//! The storage node as a worker of the distributed engine
//! (datafusion-distributed): the one module of this crate that names the
//! engine's types.
//!
//! The engine's worker is a gRPC service of its own, served beside the
//! node's Flight service on the same port and behind the same credential
//! check. The tasks it receives are storage fragments
//! ([`sluice_planner::fragment::StorageFragmentExec`]): each runs through this node, decoded in a
//! session of the node where sluice's UDFs bind to the fragment's options
//! (capped by the node's limits), bound to the node's copy of the dataset,
//! and followed by its report ([`sluice_planner::fragment`]).

use std::sync::{Arc, Mutex};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use bytes::Bytes;
use datafusion::common::Result;
use datafusion::error::DataFusionError;
use datafusion::execution::{SendableRecordBatchStream, SessionState};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion_distributed::{DistributedExt, Worker, WorkerQueryContext, WorkerSessionBuilder};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt, stream};
use sluice_flight::Feed;
use sluice_flight::feed::FEED_AHEAD;
use sluice_planner::fragment::{
    FailedWith, FragmentReport, FragmentRunner, LocalRunner, Reported, SluiceCodec, Take,
    link_bytes, report_batch, with_report_column,
};
use sluice_udfs::{Limits, UdfEnv, UdfOptions};
use tokio::sync::OnceCell;

use crate::node::StorageNode;
use crate::node_feed::LocalFeed;

/// `node` as the engine's worker: its tasks' fragments run under its
/// decoding `limits` (a fragment's options may lower them, never raise
/// them). Serve it with `into_worker_server()`.
pub fn worker(node: Arc<StorageNode>, limits: Limits) -> Worker {
    Worker::from_session_builder(NodeSessions {
        runner: Arc::new(NodeRunner { node, limits }),
    })
}

/// Builds the session of each task the node receives: sluice's codec, and
/// the node as the [`FragmentRunner`] its storage fragments run on.
struct NodeSessions {
    runner: Arc<NodeRunner>,
}

#[async_trait]
impl WorkerSessionBuilder for NodeSessions {
    async fn build_session_state(
        &self,
        ctx: WorkerQueryContext,
    ) -> Result<SessionState, DataFusionError> {
        let mut builder = ctx.builder.with_distributed_user_codec(SluiceCodec);
        let runner: Arc<dyn FragmentRunner> = Arc::clone(&self.runner) as _;
        builder
            .config()
            .get_or_insert_default()
            .set_extension(Arc::new(LocalRunner(runner)));
        Ok(builder.build())
    }
}

#[derive(Debug)]
struct NodeRunner {
    node: Arc<StorageNode>,
    limits: Limits,
}

#[async_trait]
impl FragmentRunner for NodeRunner {
    async fn run(&self, plan: &[u8], mut options: UdfOptions) -> Result<Reported> {
        options.limits = options.limits.capped_by(&self.limits);
        let udfs = UdfEnv::new(options);
        let rows = self.node.open(plan, &udfs).await?;
        // Dropping the stream (the consumer left) stops the UDFs at their
        // next row.
        let stop = udfs.cancel.on_drop();
        let schema = rows.schema();
        let rows = rows.map(move |b| {
            let _ = &stop;
            b
        });
        Ok(Reported {
            rows: Box::pin(RecordBatchStreamAdapter::new(schema, rows)),
            report: Box::new(move || FragmentReport::of(&udfs, 0, 0)),
        })
    }

    async fn run_windows(
        &self,
        plan: &[u8],
        mut options: UdfOptions,
        takes: BoxStream<'static, Result<Take>>,
        schema: SchemaRef,
        node: String,
    ) -> Result<SendableRecordBatchStream> {
        options.limits = options.limits.capped_by(&self.limits);
        let udfs = UdfEnv::new(options);
        let link = self.node.link().cloned();
        // Bound once, at the first window (the stage's second task is fed
        // none and binds nothing).
        let feed: Arc<OnceCell<Arc<LocalFeed>>> = Arc::default();
        let (node_, plan) = (Arc::clone(&self.node), Bytes::copy_from_slice(plan));
        let env = Arc::clone(&udfs);
        // Up to FEED_AHEAD windows run at once, each collected whole; they
        // are sent in the order taken.
        let ran = takes
            .map(move |take| {
                let (feed, node, plan, env, link) = (
                    Arc::clone(&feed),
                    Arc::clone(&node_),
                    plan.clone(),
                    Arc::clone(&env),
                    link.clone(),
                );
                async move {
                    let take = take?;
                    let feed = feed
                        .get_or_try_init(|| async {
                            LocalFeed::open(node, &plan, env, link).map(Arc::new)
                        })
                        .await
                        .map_err(DataFusionError::from)?;
                    let rows = feed.window(&take).await.map_err(DataFusionError::from)?;
                    rows.try_collect::<Vec<RecordBatch>>().await
                }
            })
            .buffered(FEED_AHEAD);
        let last = Arc::new(Mutex::new(FragmentReport::default()));
        let out = Arc::clone(&schema);
        let stop = udfs.cancel.on_drop();
        // A failed window ends the stream with a report that carries its
        // status (its kind survives the engine's transport): the windows
        // queued behind it fail with it, as over a feed's exchange.
        let windows = ran
            .scan(false, move |ended, batches| {
                let _ = &stop;
                if *ended {
                    return std::future::ready(None);
                }
                let mut rows = 0u64;
                let mut bytes = 0u64;
                let mut sent: Vec<Result<RecordBatch>> = Vec::new();
                let failed = match batches {
                    Ok(batches) => {
                        for b in batches {
                            rows += b.num_rows() as u64;
                            bytes += link_bytes(&b) as u64;
                            sent.push(with_report_column(b, &out));
                        }
                        None
                    }
                    Err(e) => {
                        *ended = true;
                        Some(FailedWith::of(&e))
                    }
                };
                let now = FragmentReport::of(&udfs, rows, bytes);
                let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
                let mut added = now.since(&last);
                *last = now;
                added.node = node.clone();
                added.failed = failed;
                sent.push(report_batch(&out, &added));
                std::future::ready(Some(stream::iter(sent)))
            })
            .flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, windows)))
    }
}
