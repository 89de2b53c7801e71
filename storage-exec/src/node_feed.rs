//! A storage node's side of a feed (`sluice_flight::feed`): a job
//! stream's fragment decoded and bound to a session once ([`LocalFeed`]),
//! then run for every window the compute side asks for — in this process
//! (the embedded default, `serve` with its own data dir), or over one
//! Flight `DoExchange` ([`serve`]).
//!
//! Over Flight, up to [`FEED_AHEAD`] windows run at once on the node's
//! cores, each collected whole as soon as it is asked for; they are sent
//! in the order asked, each as a fragment's stream (batches, then the
//! report of what that window added to the feed's bad samples and stage
//! times). The compute side bounds what it asks for (its window budget),
//! so the node holds at most those windows' output.

use std::sync::{Arc, Mutex};

use arrow::array::RecordBatch;
use arrow_flight::FlightData;
use async_trait::async_trait;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;
use futures::{StreamExt, TryStreamExt};
use prost::Message;
use sluice_base::CallError;
use sluice_base::fault::status_of;
use sluice_base::task::SpawnedTask;
use sluice_flight::feed::{FEED_AHEAD, Feed, window_take};
use sluice_flight::messages::{Ticket, TicketKind};
use sluice_flight::stream::{FlightStream, send_reported};
use sluice_flight::{LinkError, TokenBucket};
use sluice_planner::fragment::with_take;
use sluice_planner::fragment::{FailedWith, FragmentReport};
use sluice_planner::fragment::{Take, decode_fragment};
use sluice_udfs::{Limits, UdfEnv, UdfOptions};
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

use crate::node::{IN_PROCESS, StorageNode};

/// A fragment decoded against one session of a node, run per window.
pub struct LocalFeed {
    node: Arc<StorageNode>,
    ctx: SessionContext,
    fragment: Arc<dyn ExecutionPlan>,
    udfs: Arc<UdfEnv>,
    link: Option<Arc<TokenBucket>>,
}

impl LocalFeed {
    /// The feed of the fragment `plan` (datafusion-proto bytes) on `node`,
    /// under `udfs`; its windows' batches paced by `link` if given (an
    /// in-process node's link limit: over Flight the stream paces them).
    pub fn open(
        node: Arc<StorageNode>,
        plan: &[u8],
        udfs: Arc<UdfEnv>,
        link: Option<Arc<TokenBucket>>,
    ) -> Result<Self, LinkError> {
        let ctx = node.session(&udfs);
        let bad = |e: datafusion::error::DataFusionError| LinkError::BadFragment {
            node: IN_PROCESS.into(),
            message: e.to_string(),
        };
        let mut fragment = decode_fragment(plan, &ctx.task_ctx()).map_err(bad)?;
        // A random job's decode stages, from the node's stage cache.
        if udfs.options.cache_stages {
            let cache = sluice_udfs::stage_cache::StageCache::global();
            fragment = sluice_udfs::stage_cache::cache_plan(fragment, cache, &udfs.options.limits)
                .map_err(bad)?;
        }
        node.opened();
        Ok(Self {
            node,
            ctx,
            fragment,
            udfs,
            link,
        })
    }
}

impl std::fmt::Debug for LocalFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalFeed")
            .field("fragment", &self.fragment.name())
            .field("link", &self.link)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Feed for LocalFeed {
    async fn window(&self, take: &Take) -> Result<SendableRecordBatchStream, LinkError> {
        let plan =
            with_take(Arc::clone(&self.fragment), take).map_err(|e| LinkError::BadFragment {
                node: IN_PROCESS.into(),
                message: e.to_string(),
            })?;
        let plan = self.node.bind(&self.ctx, plan).await?;
        let stream = self.node.run(plan, &self.ctx, &self.udfs);
        Ok(match &self.link {
            Some(link) => crate::node::throttled(stream, Arc::clone(link)),
            None => stream,
        })
    }
}

/// A window run to its end on the node: its batches, or why it failed.
type Ran = Result<Vec<RecordBatch>, Status>;

/// Serves a `DoExchange` as a feed: its first message's descriptor holds
/// the fragment ([`TicketKind::Feed`]), each later message a window.
pub async fn serve(
    node: Arc<StorageNode>,
    limits: Limits,
    mut requests: Streaming<FlightData>,
) -> Result<FlightStream, Status> {
    let first = requests
        .message()
        .await?
        .ok_or_else(|| CallError::bad_request("an exchange with no message"))?;
    let cmd = first.flight_descriptor.map(|d| d.cmd).unwrap_or_default();
    let ticket =
        Ticket::decode(cmd).map_err(|e| CallError::bad_request(format!("bad ticket: {e}")))?;
    let Some(TicketKind::Feed(t)) = ticket.kind else {
        return Err(CallError::bad_request(
            "a DoExchange opens a feed: its first message's descriptor command is a feed ticket",
        ));
    };
    let mut options: UdfOptions = serde_json::from_str(&t.udf_options)
        .map_err(|e| CallError::bad_request(format!("bad UDF options: {e}")))?;
    options.limits = options.limits.capped_by(&limits);
    let udfs = UdfEnv::new(options);
    let feed = Arc::new(
        LocalFeed::open(Arc::clone(&node), &t.plan, Arc::clone(&udfs), None)
            .map_err(Status::from)?,
    );
    let schema = feed.fragment.schema();
    // Windows asked for start at once (FEED_AHEAD of them beyond the one
    // being sent); their results are handed on in the order asked.
    // Each window is a task owned by the answer: the compute side leaving
    // drops the channel and with it the windows still running.
    let (started, runs) = mpsc::channel::<SpawnedTask<Ran>>(FEED_AHEAD);
    let asker = SpawnedTask::spawn(async move {
        loop {
            let run = match requests.message().await {
                Ok(None) | Err(_) => return,
                Ok(Some(m)) => match window_take(&m) {
                    Err(e) => {
                        SpawnedTask::spawn(std::future::ready(Err(CallError::bad_request(e))))
                    }
                    Ok(take) => {
                        let feed = Arc::clone(&feed);
                        SpawnedTask::spawn(async move {
                            let stream = feed.window(&take).await.map_err(Status::from)?;
                            stream.try_collect().await.map_err(|e| status_of(&e, false))
                        })
                    }
                },
            };
            if started.send(run).await.is_err() {
                return;
            }
        }
    });
    // Dropping the answer (the compute side left) stops the UDFs of the
    // windows still running at their next row.
    let stop = udfs.cancel.on_drop();
    let link = node.link().cloned();
    let last = Arc::new(Mutex::new(FragmentReport::default()));
    let runs = futures::stream::unfold(runs, |mut rx| async move {
        rx.recv().await.map(|run| (run, rx))
    });
    let answers = runs
        .then(|run| async move {
            match run.join().await {
                Ok(ran) => ran,
                Err(e) => Err(CallError::encoding(format!("a window's task failed: {e}"))),
            }
        })
        .map(move |ran| {
            let (udfs, last) = (Arc::clone(&udfs), Arc::clone(&last));
            let batches = futures::stream::iter(match ran {
                Ok(batches) => batches.into_iter().map(Ok).collect::<Vec<_>>(),
                Err(s) => vec![Err(datafusion::error::DataFusionError::External(Box::new(
                    s,
                )))],
            });
            send_reported(
                Arc::clone(&schema),
                batches,
                FailedWith::status_of,
                link.clone(),
                move |rows, bytes| {
                    let now = FragmentReport::of(&udfs, rows, bytes);
                    let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
                    let added = now.since(&last);
                    *last = now;
                    added
                },
            )
        })
        .flatten()
        .map(move |m| {
            let _ = (&stop, &asker);
            m
        });
    Ok(Box::pin(answers))
}
