//! [`EngineFeed`]: a job stream's feed on one storage node (the
//! `sluice_flight::Feed` of a placed plan) carried by the engine — one
//! engine query per (stream, node, plan generation), its windows fed to
//! the node's task as work units while it runs.
//!
//! ```text
//!  this node                                           storage node
//!  DistributedExec ─ NetworkCoalesceExec ══ stage: 2 tasks, both on the node
//!    window(take) ─► WindowSource ─ work unit ─►  t0: WindowsExec: bind once,
//!                                                     run each window (up to
//!                                                     FEED_AHEAD at once)
//!    ◄─ rows, report row (window 1) ◄─────────────    in the order taken
//!    ◄─ rows, report row (window 2)                t1: fed none
//! ```
//!
//! The answers are handed to the windows owed, oldest first
//! ([`super::owed`]), each complete at its report row. A window
//! that failed on the node ends the query with a report carrying its
//! status, so its kind (a checksum mismatch, a dataset not found) is the
//! node's, as over Flight; a query that ends without one (the node died,
//! the link broke) fails every window owed as the node being unavailable.
//! Either way the next window starts a new query.

use std::fmt;
use std::sync::{Arc, Mutex};

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::common::Result;
use datafusion::error::DataFusionError;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_distributed::{NetworkCoalesceExec, WorkUnitFeed};
use futures::StreamExt;
use sluice_base::task::SpawnedTask;
use sluice_flight::{Feed, LinkError, StorageEndpoint};
use sluice_planner::fragment::{
    FragmentPlan, Received, Take, WindowSource, WindowUnit, WindowsExec, split_report,
};
use sluice_udfs::UdfEnv;
use tokio::sync::mpsc;

use super::NodeChannels;
use super::owed::{OwedWindows, answered};
use super::stage_query::run_stage;

/// See the module docs.
pub struct EngineFeed {
    node: String,
    dataset: String,
    fragment: Arc<dyn ExecutionPlan>,
    udfs: Arc<UdfEnv>,
    channels: NodeChannels,
    open: Mutex<Option<Open>>,
}

impl fmt::Debug for EngineFeed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EngineFeed")
            .field("node", &self.node)
            .field("dataset", &self.dataset)
            .finish_non_exhaustive()
    }
}

/// One running engine query of a feed.
struct Open {
    units: mpsc::UnboundedSender<WindowUnit>,
    owed: OwedWindows,
    /// Dropped with the query: aborts the reader, which drops the query's
    /// stream and with it the node's task.
    _reader: SpawnedTask<()>,
}

impl EngineFeed {
    /// The feed of `fragment` (over `dataset`) on `endpoint`, whose bad
    /// samples and stage times go to `udfs`. The query starts at the first
    /// window.
    pub fn new(
        endpoint: &Arc<dyn StorageEndpoint>,
        dataset: &str,
        fragment: Arc<dyn ExecutionPlan>,
        udfs: Arc<UdfEnv>,
    ) -> Self {
        Self {
            node: endpoint.name().to_string(),
            dataset: dataset.to_string(),
            fragment,
            udfs,
            channels: NodeChannels::new(std::slice::from_ref(endpoint)),
            open: Mutex::new(None),
        }
    }

    fn start(&self) -> Open {
        let (source, units) = WindowSource::new();
        let rows_schema = self.fragment.schema();
        let windows = WindowsExec::new(
            self.dataset.clone(),
            vec![self.node.clone(), self.node.clone()],
            FragmentPlan::Planned(Arc::clone(&self.fragment)),
            self.udfs.options,
            Arc::clone(&rows_schema),
            WorkUnitFeed::new(source),
        );
        let owed = OwedWindows::default();
        let query = self.query(Arc::new(windows));
        let reader = SpawnedTask::spawn(read(
            query,
            owed.clone(),
            Arc::clone(&self.udfs),
            self.node.clone(),
            rows_schema,
        ));
        Open {
            units,
            owed,
            _reader: reader,
        }
    }

    /// The engine query over `windows`: its stage under the boundary,
    /// planned by a coordinating session into the engine's plan.
    fn query(
        &self,
        windows: Arc<WindowsExec>,
    ) -> impl Future<Output = Result<SendableRecordBatchStream>> + Send + 'static {
        let channels = self.channels.clone();
        async move {
            // Two tasks, the second fed none (merged into one stream by
            // the coordinating session: see `OneStream`).
            let stage: Arc<dyn ExecutionPlan> =
                Arc::new(NetworkCoalesceExec::try_new(windows, 2, 1)?);
            run_stage(stage, channels).await
        }
    }
}

/// Reads a query's answers into the windows it owes, until it ends; then
/// fails every window still owed with the reason it ended.
async fn read(
    query: impl Future<Output = Result<SendableRecordBatchStream>>,
    owed: OwedWindows,
    udfs: Arc<UdfEnv>,
    node: String,
    rows_schema: SchemaRef,
) {
    let lost = |e: DataFusionError| LinkError::Unavailable {
        node: node.clone(),
        reason: e.to_string(),
    };
    let failed = match query.await {
        Err(e) => lost(e),
        Ok(mut answers) => loop {
            let batch = match answers.next().await {
                None => {
                    break LinkError::Unavailable {
                        node: node.clone(),
                        reason: "the feed ended before answering every window".into(),
                    };
                }
                Some(Err(e)) => break lost(e),
                Some(Ok(b)) => b,
            };
            match split_report(&batch, &rows_schema) {
                Err(e) => break LinkError::Protocol(format!("{node}: {e}")),
                Ok(Received::Rows(rows)) => {
                    if !owed.batch(rows) {
                        break LinkError::Protocol(format!("{node} sent rows no window asked for"));
                    }
                }
                Ok(Received::Report(r)) => {
                    if let Some(f) = r.failed {
                        break LinkError::from_status(&node, &f.status());
                    }
                    // The window's bad samples are the job's before its
                    // last batch is seen to end.
                    udfs.errors.merge(r.bad_total, r.bad);
                    udfs.clock.merge(&node, &r.stages);
                    owed.done();
                }
            }
        },
    };
    owed.fail(failed);
}

#[async_trait]
impl Feed for EngineFeed {
    async fn window(&self, take: &Take) -> Result<SendableRecordBatchStream, LinkError> {
        let Some(unit) = WindowUnit::of(take) else {
            return Err(LinkError::Protocol(
                "a feed's window names its rows (a whole version is read with a fragment)".into(),
            ));
        };
        let (tx, rx) = mpsc::unbounded_channel();
        {
            let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
            // The running query, or (it failed) a new one; a new one that
            // fails at once fails this window with its reason.
            let asked = match open.as_ref() {
                Some(q) => q
                    .owed
                    .ask(&tx, &self.node, || q.units.send(unit.clone()).is_ok()),
                None => Err(LinkError::Protocol("no query yet".into())),
            };
            if asked.is_err() {
                let q = open.insert(self.start());
                q.owed.ask(&tx, &self.node, || q.units.send(unit).is_ok())?;
            }
        }
        Ok(answered(rx, self.fragment.schema(), &self.node))
    }
}
