//! [`StorageNode`] as the compute side of the same process reaches it:
//! [`InProcessNode`] (fragments run here, feeds opened here, without the
//! codec's network hop but through its encoding, so a fragment binds to
//! this node's UDFs as a remote one would) and [`StorageEndpoint`] (the
//! calls a compute session makes of any storage node), and
//! [`StorageNode::time_run`], a fragment run for a budget to time it
//! (calibration).

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::error::DataFusionError;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;
use futures::StreamExt;
use sluice_flight::copy::{CopyIn, Retire, Retired};
use sluice_flight::feed::Feed;
use sluice_flight::ingest::{IngestPart, IngestedPart, PreparedPart};
use sluice_flight::scrub::{RepairObject, Repaired, ScrubReport, ScrubRequest};
use sluice_flight::{
    FragmentTiming, InProcessNode, LinkError, NodeInfo, RemoteDataset, StorageEndpoint,
};
use sluice_udfs::UdfEnv;

use crate::node::{IN_PROCESS, StorageNode, execution};
use crate::node_feed::LocalFeed;

impl StorageNode {
    /// Runs a bound fragment as [`StorageNode::run`] does, for at most
    /// `budget`, dropping its rows: the CPU time and rows of calibration.
    /// Its bad samples are counted, not logged as the job's.
    pub async fn time_run(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        ctx: &SessionContext,
        udfs: &Arc<UdfEnv>,
        budget: std::time::Duration,
    ) -> Result<FragmentTiming, LinkError> {
        let started = std::time::Instant::now();
        let cpu = sluice_base::process_cpu_ns();
        let mut stream = self.run(plan, ctx, udfs);
        let mut rows = 0u64;
        let mut complete = true;
        loop {
            let left = budget.saturating_sub(started.elapsed());
            match tokio::time::timeout(left, stream.next()).await {
                Ok(Some(Ok(b))) => rows += b.num_rows() as u64,
                Ok(Some(Err(e))) => {
                    return Err(LinkError::running(IN_PROCESS, &e));
                }
                Ok(None) => break,
                Err(_) => {
                    complete = false;
                    break;
                }
            }
        }
        // Dropped, the stream stops the UDFs at their next row.
        drop(stream);
        let (bad, _) = udfs.errors.snapshot();
        let mut udf_ns = std::collections::BTreeMap::new();
        for s in udfs.clock.snapshot() {
            *udf_ns.entry(s.udf).or_insert(0u64) += s.tally.nanos;
        }
        Ok(FragmentTiming {
            rows,
            bad,
            cpu_ns: sluice_base::process_cpu_ns().saturating_sub(cpu),
            wall_ns: started.elapsed().as_nanos() as u64,
            complete,
            udf_ns,
        })
    }
}

/// `fragment` encoded as it would be sent to a node (see
/// [`StorageNode::open`]).
fn encoded(fragment: Arc<dyn ExecutionPlan>) -> Result<Vec<u8>, LinkError> {
    sluice_planner::fragment::encode_fragment(fragment).map_err(|e| LinkError::BadFragment {
        node: IN_PROCESS.into(),
        message: e.to_string(),
    })
}

#[async_trait]
impl InProcessNode for StorageNode {
    async fn execute(
        &self,
        fragment: Arc<dyn ExecutionPlan>,
        udfs: Arc<UdfEnv>,
    ) -> Result<SendableRecordBatchStream, LinkError> {
        // The fragment's UDF calls were bound to the compute session's
        // UDFs; through the codec, as a remote node receives it, they are
        // bound to this node's (whose time is the storage tier's).
        self.open(&encoded(fragment)?, &udfs).await
    }

    async fn feed(
        self: Arc<Self>,
        fragment: Arc<dyn ExecutionPlan>,
        udfs: Arc<UdfEnv>,
    ) -> Result<Arc<dyn Feed>, LinkError> {
        // Through the codec, as for `execute`: the fragment's UDF calls
        // bound to this node's session (whose time is the storage tier's).
        let bytes = encoded(fragment)?;
        let link = self.link.clone();
        Ok(Arc::new(LocalFeed::open(self, &bytes, udfs, link)?))
    }
}

#[async_trait]
impl StorageEndpoint for StorageNode {
    fn name(&self) -> &str {
        IN_PROCESS
    }

    fn on_this_host(&self) -> bool {
        true
    }

    async fn node_info(&self) -> Result<NodeInfo, LinkError> {
        Ok(self.info())
    }

    // Listing reads the catalog and metadata files: blocking I/O, kept off
    // the caller's (multi-threaded) runtime's async workers.
    async fn datasets(&self) -> Result<Vec<RemoteDataset>, LinkError> {
        tokio::task::block_in_place(|| self.list())
    }

    async fn table_schema(&self, table: &str) -> Result<SchemaRef, LinkError> {
        tokio::task::block_in_place(|| StorageNode::table_schema(self, table))
    }

    fn in_process(self: Arc<Self>) -> Option<Arc<dyn InProcessNode>> {
        Some(self)
    }

    async fn prepare_ingest(&self, part: &IngestPart) -> Result<PreparedPart, LinkError> {
        self.prepare_part(part).await.map_err(execution)
    }

    async fn finish_ingest(
        &self,
        txn: &str,
        commit: bool,
    ) -> Result<Option<IngestedPart>, LinkError> {
        self.finish_part(txn, commit).await.map_err(execution)
    }

    async fn scrub(&self, req: &ScrubRequest) -> Result<ScrubReport, LinkError> {
        crate::scrub::scrub(self.store(), req)
            .await
            .map_err(execution)
    }

    async fn repair_object(&self, req: &RepairObject) -> Result<Repaired, LinkError> {
        self.repair(req).await.map_err(execution)
    }

    async fn copy_in(
        &self,
        req: &CopyIn,
        rows: SendableRecordBatchStream,
    ) -> Result<PreparedPart, LinkError> {
        self.prepare_copy(req, rows).await.map_err(execution)
    }

    async fn retire(&self, req: &Retire) -> Result<Retired, LinkError> {
        StorageNode::retire(self, req).map_err(execution)
    }

    async fn time(
        &self,
        fragment: Arc<dyn ExecutionPlan>,
        udfs: Arc<UdfEnv>,
        budget: std::time::Duration,
    ) -> Result<FragmentTiming, LinkError> {
        // The fragment's UDFs are bound to the query's options; timed, it
        // runs under `udfs`' (the skip policy), so it goes through the
        // codec as it would to a remote node and comes back bound to them.
        let ctx = self.session(&udfs);
        let bad = |e: DataFusionError| LinkError::BadFragment {
            node: IN_PROCESS.into(),
            message: e.to_string(),
        };
        let bytes = encoded(fragment)?;
        let fragment =
            sluice_planner::fragment::decode_fragment(&bytes, &ctx.task_ctx()).map_err(bad)?;
        let plan = self.bind(&ctx, fragment).await?;
        self.time_run(plan, &ctx, &udfs, budget).await
    }

    async fn probe(&self, _bytes: u64) -> Result<Option<f64>, LinkError> {
        Ok(self.link.as_ref().map(|l| l.rate()))
    }
}
