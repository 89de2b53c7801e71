//! A storage node's side of a feed (`sluice_flight::feed`): a job
//! stream's fragment decoded and bound to a session once ([`LocalFeed`]),
//! then run for every window the compute side asks for — in this process
//! (the embedded default, `serve` with its own data dir), or as the task
//! of an engine query whose windows are its work units
//! ([`crate::engine`], which runs up to `FEED_AHEAD` of them at once).

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;
use sluice_flight::feed::Feed;
use sluice_flight::{LinkError, TokenBucket};
use sluice_planner::fragment::{Take, decode_fragment, with_take};
use sluice_udfs::UdfEnv;

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
