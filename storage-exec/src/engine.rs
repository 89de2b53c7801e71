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

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::common::Result;
use datafusion::error::DataFusionError;
use datafusion::execution::SessionState;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion_distributed::{DistributedExt, Worker, WorkerQueryContext, WorkerSessionBuilder};
use futures::StreamExt;
use sluice_planner::fragment::FragmentReport;
use sluice_planner::fragment::SluiceCodec;
use sluice_planner::fragment::{FragmentRunner, LocalRunner, Reported};
use sluice_udfs::{Limits, UdfEnv, UdfOptions};

use crate::node::{StorageNode, throttled};

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
        let rows = self
            .node
            .open(plan, &udfs)
            .await
            .map_err(|s| DataFusionError::External(Box::new(s)))?;
        let rows = match self.node.link().cloned() {
            Some(link) => throttled(rows, link),
            None => rows,
        };
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
}
