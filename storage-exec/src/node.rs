//! [`StorageNode`]: runs storage fragments next to the data.
//!
//! A fragment arrives as a physical plan whose leaves are
//! [`DatasetScanExec`]s (see `sluice-flight`). The node binds each to a
//! scan of its own dataset, spreads the work over its cores, and drives
//! the plan on its [`Executor`] of `cores` threads — the storage CPU limit
//! the planner reasons about: its own, or, in `sluice serve` over its own
//! data dir, the one its jobs compute on too (the same cores). A job's scans carry a take (rows of a pinned
//! version): they are bound to the take scan over the version's metadata,
//! which the node loads once and keeps for the next windows. The same node serves the Flight service
//! ([`crate::flight_service`]) and, in `sluice serve`, the compute side of
//! the same process directly ([`StorageEndpoint`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties, Partitioning};
use datafusion::prelude::{SessionConfig, SessionContext};
use futures::StreamExt;
use sluice_base::Executor;
use sluice_flight::{LinkError, NodeInfo, RemoteDataset, TokenBucket};
use sluice_planner::fragment::{DatasetScanExec, Take};
use sluice_udfs::{Site, UdfEnv};
use tokio::sync::mpsc;

use crate::scan::{DatasetTable, DatasetVersion, IndexCache, ScanOptions, parse_table};
use crate::stats::{SAMPLE, dataset_stats};
use crate::store::Store;
use sluice_flight::scrub::{RepairObject, Repaired};

/// Rows per batch a fragment produces: small enough that the compute side
/// can spread a stream over its cores.
pub const FRAGMENT_BATCH_ROWS: usize = 64;

/// Name of the in-process node in messages.
pub const IN_PROCESS: &str = "in-process storage node";

/// A storage node over one store.
#[derive(Debug)]
pub struct StorageNode {
    store: Arc<Store>,
    scan: ScanOptions,
    pub(crate) link: Option<Arc<TokenBucket>>,
    executor: Arc<Executor>,
    listed: Mutex<HashMap<(String, u64), RemoteDataset>>,
    indexes: Arc<IndexCache>,
    /// Where ingests sent to this node may read (none: it takes none).
    pub(crate) ingest_roots: std::sync::OnceLock<Arc<crate::ingest::Confinement>>,
    /// The object-store prefixes those ingests may read (none: no
    /// ingest from object stores).
    pub(crate) ingest_urls: std::sync::OnceLock<crate::ingest::objects::UrlAllow>,
    /// Ingest parts prepared here, awaiting their coordinator's word.
    pub(crate) pending: crate::ingest::PendingIngests,
    /// Fragments run (see [`NodeInfo::fragments`]).
    fragments: std::sync::atomic::AtomicU64,
    /// Fragment streams opened (see [`NodeInfo::streams`]).
    streams: std::sync::atomic::AtomicU64,
}

impl StorageNode {
    /// A node serving `store` with an executor of its own of `cores`
    /// threads for fragments and, if given, its outgoing link limited to
    /// `link_limit` bytes per second.
    pub fn new(
        store: Arc<Store>,
        scan: ScanOptions,
        cores: usize,
        link_limit: Option<f64>,
    ) -> std::io::Result<Arc<Self>> {
        let executor = Executor::new("sluice-storage", cores)?;
        Ok(Self::on(executor, store, scan, link_limit))
    }

    /// A node serving `store` whose fragments run on `executor` (shared
    /// with the other roles of this process: its threads are the node's
    /// cores), its outgoing link limited to `link_limit` bytes per second
    /// if given.
    pub fn on(
        executor: Arc<Executor>,
        store: Arc<Store>,
        scan: ScanOptions,
        link_limit: Option<f64>,
    ) -> Arc<Self> {
        Arc::new(Self {
            store,
            scan,
            link: link_limit.map(|r| Arc::new(TokenBucket::new(r))),
            executor,
            listed: Mutex::new(HashMap::new()),
            indexes: Arc::new(IndexCache::default()),
            ingest_roots: std::sync::OnceLock::new(),
            ingest_urls: std::sync::OnceLock::new(),
            pending: crate::ingest::PendingIngests::new(sluice_flight::ingest::PREPARED_TTL),
            fragments: std::sync::atomic::AtomicU64::new(0),
            streams: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// The store.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// The link limit, if any.
    pub fn link(&self) -> Option<&Arc<TokenBucket>> {
        self.link.as_ref()
    }

    /// Cores and link limit.
    pub fn info(&self) -> NodeInfo {
        NodeInfo {
            cores: self.executor.threads(),
            link_limit: self.link.as_ref().map(|l| l.rate()),
            cpu_ns: sluice_base::process_cpu_ns(),
            fragments: self.fragments.load(std::sync::atomic::Ordering::Relaxed),
            streams: self.streams.load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// The datasets held here, with their schemas and statistics. A
    /// version's listing is computed once (it reads the metadata file);
    /// later calls only ask the catalog which version is the latest. A
    /// dataset whose metadata cannot be read is left out, with a warning
    /// naming the file: one damaged dataset hides no other, and a query
    /// naming it gets the error ([`StorageNode::table_schema`]).
    pub fn list(&self) -> Result<Vec<RemoteDataset>, LinkError> {
        let catalog = self.store.catalog();
        let mut out = Vec::new();
        for name in catalog.dataset_names().map_err(execution)? {
            let Some(version) = catalog.latest_version(&name).map_err(execution)? else {
                continue;
            };
            let key = (name.clone(), version);
            let cached = self
                .listed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&key)
                .cloned();
            let listed = match cached {
                Some(d) => d,
                None => {
                    let opened =
                        DatasetVersion::open(Arc::clone(&self.store), &name, Some(version))
                            .and_then(|v| Ok((dataset_stats(&v, SAMPLE)?, v)));
                    let (stats, v) = match opened {
                        Ok(x) => x,
                        Err(e) => {
                            tracing::warn!(
                                "dataset '{name}' version {version} is unavailable: {e}"
                            );
                            continue;
                        }
                    };
                    let d = RemoteDataset {
                        name,
                        version,
                        schema: Arc::clone(&v.table_schema),
                        stats,
                    };
                    self.listed
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(key, d.clone());
                    d
                }
            };
            out.push(listed);
        }
        Ok(out)
    }

    /// Forgets what this node lists and keeps in memory of `dataset`'s
    /// versions (some were retired).
    pub(crate) fn forget(&self, dataset: &str) {
        self.listed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(d, _), _| d != dataset);
        self.indexes.forget(dataset);
    }

    /// The schema of `table` (`dataset` or `dataset@N`).
    pub fn table_schema(&self, table: &str) -> Result<SchemaRef, LinkError> {
        let (dataset, version) = parse_table(table).map_err(|message| LinkError::BadFragment {
            node: IN_PROCESS.into(),
            message,
        })?;
        match DatasetVersion::open(Arc::clone(&self.store), dataset, version) {
            Ok(v) => Ok(Arc::clone(&v.table_schema)),
            Err(crate::StorageError::UnknownDataset(_)) => Err(LinkError::DatasetNotFound {
                dataset: table.to_string(),
                node: IN_PROCESS.into(),
            }),
            Err(e) => Err(execution(e)),
        }
    }

    /// Counts a fragment stream opened: a fragment decoded and bound to a
    /// session (a query's, or a job stream's feed).
    pub fn opened(&self) {
        self.streams
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// A session whose functions are bound to `udfs` and whose scans use
    /// this node's cores: the registry fragments are decoded against.
    pub fn session(&self, udfs: &Arc<UdfEnv>) -> SessionContext {
        let config = SessionConfig::new()
            .with_target_partitions(self.executor.threads())
            .with_batch_size(FRAGMENT_BATCH_ROWS);
        // Its UDFs' time is the storage tier's (a remote client files it
        // under the name it knows this node by).
        crate::session::session_context_with_config(
            Arc::clone(&self.store),
            self.scan.clone(),
            &udfs.at(Site::storage(IN_PROCESS)),
            config,
        )
    }

    /// Runs a fragment sent to this node (`plan`, encoded) under `udfs`:
    /// decoded in a session of this node, where its UDF calls bind to
    /// `udfs`, then bound and run, its batches paced by the node's link
    /// limit if it has one. What an engine task and a fragment run in this
    /// process both do.
    pub async fn open(
        &self,
        plan: &[u8],
        udfs: &Arc<UdfEnv>,
    ) -> Result<SendableRecordBatchStream, LinkError> {
        let ctx = self.session(udfs);
        let plan =
            sluice_planner::fragment::decode_fragment(plan, &ctx.task_ctx()).map_err(|e| {
                LinkError::BadFragment {
                    node: IN_PROCESS.into(),
                    message: e.to_string(),
                }
            })?;
        self.opened();
        let plan = self.bind(&ctx, plan).await?;
        let stream = self.run(plan, &ctx, udfs);
        Ok(match self.link.clone() {
            Some(link) => throttled(stream, link),
            None => stream,
        })
    }

    /// Binds every [`DatasetScanExec`] of `fragment` to a scan of this
    /// node's dataset, and spreads the result over the node's cores.
    pub async fn bind(
        &self,
        ctx: &SessionContext,
        fragment: Arc<dyn ExecutionPlan>,
    ) -> Result<Arc<dyn ExecutionPlan>, LinkError> {
        let mut scans = Vec::new();
        let _ = fragment.apply(|p| {
            if let Some(s) = p.downcast_ref::<DatasetScanExec>() {
                scans.push(s.clone());
            }
            Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
        });
        let mut bound = Vec::new();
        let state = ctx.state();
        for s in &scans {
            if !ctx.table_exist(s.dataset.as_str()).unwrap_or(false) {
                return Err(LinkError::DatasetNotFound {
                    dataset: s.dataset.clone(),
                    node: IN_PROCESS.into(),
                });
            }
            let bad = |e: DataFusionError| LinkError::BadFragment {
                node: IN_PROCESS.into(),
                message: e.to_string(),
            };
            let mut plan = match &s.take {
                None => {
                    let table = ctx.table_provider(s.dataset.as_str()).await.map_err(bad)?;
                    table
                        .scan(&state, s.projection.as_ref(), &s.filters, s.limit)
                        .await
                        .map_err(bad)?
                }
                Some(take) => self.take_scan(ctx, s, take).await?,
            };
            if plan.output_partitioning().partition_count() < self.executor.threads() {
                plan = Arc::new(
                    RepartitionExec::try_new(
                        plan,
                        Partitioning::RoundRobinBatch(self.executor.threads()),
                    )
                    .map_err(bad)?,
                );
            }
            bound.push(plan);
        }
        let mut next = bound.into_iter();
        fragment
            .transform_up(|p| {
                if p.is::<DatasetScanExec>() {
                    let b = next.next().ok_or_else(|| {
                        DataFusionError::Internal("scan count changed while binding".into())
                    })?;
                    return Ok(Transformed::yes(b));
                }
                Ok(Transformed::no(p))
            })
            .map(|t| t.data)
            .map_err(|e| LinkError::BadFragment {
                node: IN_PROCESS.into(),
                message: e.to_string(),
            })
    }

    /// Binds a job's scan: `take` over the version it pinned, whose
    /// metadata the node keeps in memory once loaded.
    async fn take_scan(
        &self,
        ctx: &SessionContext,
        scan: &DatasetScanExec,
        take: &Take,
    ) -> Result<Arc<dyn ExecutionPlan>, LinkError> {
        let (dataset, _) =
            parse_table(&scan.dataset).map_err(|message| LinkError::BadFragment {
                node: IN_PROCESS.into(),
                message,
            })?;
        let pinned = format!("{dataset}@{}", take.version);
        let bad = |e: DataFusionError| LinkError::BadFragment {
            node: IN_PROCESS.into(),
            message: e.to_string(),
        };
        let provider = match ctx.table_provider(pinned.as_str()).await {
            Ok(p) => p,
            Err(_) => {
                return Err(LinkError::DatasetNotFound {
                    dataset: pinned,
                    node: IN_PROCESS.into(),
                });
            }
        };
        let Some(table) = provider.downcast_ref::<DatasetTable>() else {
            return Err(LinkError::BadFragment {
                node: IN_PROCESS.into(),
                message: format!("{pinned} is not a dataset table"),
            });
        };
        let version = Arc::clone(table.version());
        let indexes = Arc::clone(&self.indexes);
        let index = tokio::task::spawn_blocking(move || indexes.get(&version))
            .await
            .map_err(|e| LinkError::internal(IN_PROCESS, e.to_string()))?
            .map_err(execution)?;
        let plan = table
            .take_scan(
                &ctx.state(),
                index,
                take,
                scan.projection.as_ref(),
                &scan.filters,
            )
            .map_err(bad)?;
        let names = |s: &SchemaRef| -> Vec<String> {
            s.fields().iter().map(|f| f.name().clone()).collect()
        };
        if names(&plan.schema()) != names(&scan.schema()) {
            return Err(LinkError::BadFragment {
                node: IN_PROCESS.into(),
                message: format!(
                    "{pinned} has other columns than the job was planned with ({:?}, not {:?})",
                    names(&plan.schema()),
                    names(&scan.schema())
                ),
            });
        }
        Ok(plan)
    }

    /// Runs a bound fragment on the node's executor, all partitions merged,
    /// with at most a few batches buffered ahead of the reader.
    pub fn run(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        ctx: &SessionContext,
        udfs: &Arc<UdfEnv>,
    ) -> SendableRecordBatchStream {
        self.fragments
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let schema = plan.schema();
        let task = ctx.task_ctx();
        // A built-in function's panic is a named sample under the job's
        // policy, reported back with the UDFs' bad samples.
        let guarded = sluice_udfs::panic_guard::guard_plan(Arc::clone(&plan), udfs);
        let (tx, rx) = mpsc::channel::<DFResult<RecordBatch>>(4);
        sluice_base::task::detach_on(self.executor.handle(), async move {
            let plan = match guarded {
                Ok(plan) => plan,
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            };
            let plan: Arc<dyn ExecutionPlan> = Arc::new(CoalescePartitionsExec::new(plan));
            let stream = match plan.execute(0, task) {
                Ok(s) => s,
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            };
            // A panic in an operator must fail the fragment: dropped, the
            // sender would end the stream as if every row had been sent.
            let mut stream = std::pin::pin!(sluice_flight::stream::guard_panics(
                stream,
                "storage fragment"
            ));
            while let Some(item) = stream.next().await {
                let failed = item.is_err();
                if tx.send(item).await.is_err() || failed {
                    return;
                }
            }
        });
        let batches =
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) });
        Box::pin(RecordBatchStreamAdapter::new(schema, batches))
    }
}

/// `stream`, each batch waiting for its bytes on `link` (an in-process
/// node's link limit).
pub(crate) fn throttled(
    stream: SendableRecordBatchStream,
    link: Arc<TokenBucket>,
) -> SendableRecordBatchStream {
    let schema = stream.schema();
    let paced = stream.then(move |item| {
        let link = Arc::clone(&link);
        async move {
            if let Ok(b) = &item {
                link.take(sluice_planner::fragment::link_bytes(b)).await;
            }
            item
        }
    });
    Box::pin(RecordBatchStreamAdapter::new(schema, paced))
}

impl StorageNode {
    /// Rewrites the object `req` names with its bytes (base64).
    pub async fn repair(&self, req: &RepairObject) -> crate::Result<Repaired> {
        use base64::Engine;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(&req.data)
            .map_err(|e| crate::StorageError::BadRepair {
                dataset: req.dataset.clone(),
                version: req.version,
                key: req.key.clone(),
                reason: format!("the bytes are not base64: {e}"),
            })?;
        crate::scrub::repair(self.store(), &req.dataset, req.version, &req.key, &bytes).await
    }
}

/// A storage error as the link reports it.
pub(crate) fn execution(e: crate::StorageError) -> LinkError {
    LinkError::execution(IN_PROCESS, &e)
}
