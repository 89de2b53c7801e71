//! [`ComputeSession`]: the compute side of sluice — it learns the storage
//! nodes' datasets, plans a query with the offload-aware planner, and runs
//! the compute fragment over the storage fragments' streams.
//!
//! Modules:
//! - `nodes`: the storage nodes a session reads: given at start, registered
//!   with the coordinator;
//! - `prepared`: `Prepared`: a statement parsed and optimized against a
//!   snapshot of the datasets, with what placing it needs;
//! - [`replication`]: a dataset spread over several nodes as the session sees
//!   it: the reads that take each key once;
//! - [`output_cache`]: `OutputCache`, the node's cache of deterministic
//!   jobs' output rows (later epochs skip the plan for the rows it holds),
//!   kept by the session for every job it runs;
//! - [`window_budget`]: `WindowBudget`, the output bytes all streams of a
//!   node may have in flight together;
//! - `settings`: what a session is built with (calibration, memory, the
//!   caches, limits, the ledger, the repair of a corrupt replica).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::common::Result;
use datafusion::error::DataFusionError;
use datafusion::execution::context::SQLOptions;
use datafusion::execution::{SendableRecordBatchStream, SessionStateBuilder};
use datafusion::physical_plan::execute_stream;
use datafusion::physical_plan::memory::MemoryStream;
use datafusion::prelude::{SessionConfig, SessionContext};
use sluice_base::fault::external;
use sluice_flight::StorageEndpoint;
use sluice_planner::{CalibrationOptions, DatasetStats, Offload, Planner, Resources};
use sluice_udfs::UdfEnv;
use sluice_udfs::cost::Profiles;
use tokio::sync::Mutex;

use crate::calibration::CalibrationCache;
use crate::compute_schema::{ComputeSchema, base_name};
use crate::engine::NodeChannels;
use crate::error::UnknownDataset;
use crate::replicas::ledger::PartLedger;
use crate::reported::Tally;
use output_cache::OutputCache;
pub use settings::RepairNode;
use window_budget::WindowBudget;

pub use self::prepared::{PlannedQuery, Prepared};
use self::prepared::{Tables, query_runtime};

mod nodes;
pub mod output_cache;
mod prepared;
pub mod replication;
mod settings;
pub mod window_budget;

/// Bytes fetched to measure a link that is neither configured nor limited.
pub const PROBE_BYTES: u64 = 32 << 20;

/// What the compute side is told about its resources (`None`: find out).
#[derive(Debug, Clone, Default)]
pub struct ResourceHints {
    /// Cores a storage node gives fragments (default: what the node says).
    pub storage_cores: Option<f64>,
    /// Cores of this node (default: all).
    pub compute_cores: Option<f64>,
    /// The link, bytes per second (default: the nodes' limits, else a probe).
    pub link_bytes_per_s: Option<f64>,
}

/// The known datasets: latest schemas, merged statistics, the nodes
/// holding each, and the most nodes any dataset is spread over.
#[derive(Default)]
struct Snapshot {
    latest: BTreeMap<String, SchemaRef>,
    stats: HashMap<String, DatasetStats>,
    holders: HashMap<String, Vec<Arc<dyn StorageEndpoint>>>,
    nodes: usize,
}

/// A dataset and the nodes holding its parts.
#[derive(Debug, Clone)]
struct Holding {
    schema: SchemaRef,
    parts: Vec<Part>,
}

/// A node's part of a dataset: its latest version there and statistics.
#[derive(Debug, Clone)]
struct Part {
    node: usize,
    version: u64,
    stats: DatasetStats,
}

#[derive(Debug, Default)]
struct Known {
    datasets: BTreeMap<String, Holding>,
    cores: HashMap<usize, usize>,
    limits: HashMap<usize, Option<f64>>,
    measured: HashMap<usize, Option<f64>>,
    /// Nodes that did not answer the last refresh.
    unreachable: std::collections::BTreeSet<usize>,
}

/// The statement options of user queries: read only.
pub fn read_only() -> SQLOptions {
    SQLOptions::new()
        .with_allow_ddl(false)
        .with_allow_dml(false)
        .with_allow_statements(false)
}

/// The compute side over a set of storage nodes.
#[derive(Debug)]
pub struct ComputeSession {
    /// The storage nodes, in the order they became known: given at start,
    /// then as they register. Only ever appended to, so a node's index
    /// (what [`Known`] records) never changes; a node removed is set
    /// apart in `removed`, and one that registered in `checked`.
    endpoints: std::sync::RwLock<Vec<Arc<dyn StorageEndpoint>>>,
    /// Names of the nodes removed (`sluice nodes remove`): no longer read.
    removed: std::sync::RwLock<std::collections::HashSet<String>>,
    /// Names of the nodes that registered rather than being named at
    /// start: each of their parts is read at the version the ledger
    /// names, and only if it names one.
    checked: std::sync::RwLock<std::collections::HashSet<String>>,
    /// The parts of datasets this cluster wrote (see [`PartLedger`]).
    ledger: Arc<PartLedger>,
    profiles: Profiles,
    hints: ResourceHints,
    known: Mutex<Known>,
    query_memory: usize,
    windows: WindowBudget,
    outputs: Arc<OutputCache>,
    limits: sluice_udfs::Limits,
    calibration: Option<CalibrationOptions>,
    calibrations: Arc<CalibrationCache>,
    repair: Option<RepairNode>,
}

/// How long a refresh waits for a storage node's answer.
pub const NODE_ANSWER: std::time::Duration = std::time::Duration::from_secs(2);

/// Memory one query's operators may hold unless told otherwise.
pub const DEFAULT_QUERY_MEMORY: usize = 4 << 30;

impl ComputeSession {
    /// A session over `endpoints`, costing UDFs with `profiles`.
    pub fn new(
        endpoints: Vec<Arc<dyn StorageEndpoint>>,
        profiles: Profiles,
        hints: ResourceHints,
    ) -> Self {
        Self {
            endpoints: std::sync::RwLock::new(endpoints),
            removed: Default::default(),
            checked: Default::default(),
            ledger: Arc::default(),
            profiles,
            hints,
            known: Mutex::new(Known::default()),
            query_memory: DEFAULT_QUERY_MEMORY,
            windows: WindowBudget::default(),
            outputs: Arc::new(OutputCache::default()),
            limits: sluice_udfs::Limits::default(),
            calibration: Some(CalibrationOptions::default()),
            calibrations: Arc::new(CalibrationCache::default()),
            repair: None,
        }
    }

    /// The nodes holding `table` (`dataset`, or `dataset@N`) as last
    /// listed, each with the version a job reading it now pins: the
    /// node's latest, or N.
    pub async fn pins(&self, table: &str) -> Vec<(Arc<dyn StorageEndpoint>, u64)> {
        let known = self.known.lock().await;
        let endpoints = self.indexed();
        let (base, named) = match table.rsplit_once('@') {
            Some((d, v)) => (d, v.parse().ok()),
            None => (table, None),
        };
        known
            .datasets
            .get(base)
            .map(|h| {
                h.parts
                    .iter()
                    .map(|p| {
                        let version = named.unwrap_or(p.version);
                        (Arc::clone(&endpoints[p.node]), version)
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The datasets known, with their merged statistics.
    pub async fn datasets(&self) -> Vec<(String, SchemaRef, DatasetStats)> {
        let snap = self.snapshot().await;
        snap.latest
            .into_iter()
            .map(|(name, schema)| {
                let stats = snap.stats[&name].clone();
                (name, schema, stats)
            })
            .collect()
    }

    /// The nodes holding dataset `name`, each with the latest version it
    /// holds (what a job submitted now pins).
    pub async fn versions(&self, name: &str) -> Vec<(String, u64)> {
        let known = self.known.lock().await;
        let endpoints = self.indexed();
        known.datasets.get(name).map_or_else(Vec::new, |h| {
            h.parts
                .iter()
                .map(|p| (endpoints[p.node].name().to_string(), p.version))
                .collect()
        })
    }

    /// The known datasets as the planner and the session's tables need them.
    async fn snapshot(&self) -> Snapshot {
        let known = self.known.lock().await;
        let endpoints = self.indexed();
        let mut snap = Snapshot {
            nodes: 1,
            ..Snapshot::default()
        };
        for (name, h) in &known.datasets {
            let parts: Vec<DatasetStats> = h.parts.iter().map(|p| p.stats.clone()).collect();
            let mut stats = DatasetStats::merge(&parts);
            // Each key of a replicated version is on `replicas` nodes.
            if let Some(layout) = self.ledger.layout(name).filter(|l| {
                l.replicas > 1
                    && h.parts
                        .iter()
                        .all(|p| l.wrote(endpoints[p.node].name(), p.version))
            }) {
                stats.samples /= u64::from(layout.replicas);
                stats.bytes /= u64::from(layout.replicas);
            }
            snap.latest.insert(name.clone(), Arc::clone(&h.schema));
            snap.stats.insert(name.clone(), stats);
            snap.holders.insert(
                name.clone(),
                h.parts
                    .iter()
                    .map(|p| Arc::clone(&endpoints[p.node]))
                    .collect(),
            );
            snap.nodes = snap.nodes.max(h.parts.len());
        }
        snap
    }

    /// The resources to plan with.
    pub async fn resources(&self, nodes: usize) -> Resources {
        let mut known = self.known.lock().await;
        let endpoints = self.indexed();
        let cores = sluice_planner::resources::machine_cores() as f64;
        let storage_cores = self.hints.storage_cores.unwrap_or_else(|| {
            known
                .cores
                .values()
                .copied()
                .min()
                .map_or(cores, |c| c as f64)
        });
        let (link, source) = if let Some(l) = self.hints.link_bytes_per_s {
            (Some(l), "configured")
        } else if known.limits.values().any(Option::is_some) {
            (
                Some(known.limits.values().flatten().sum::<f64>()),
                "node limit",
            )
        } else {
            let mut total = None;
            let mut measured_any = false;
            for (i, e) in endpoints.iter().enumerate() {
                if self.is_removed(e) {
                    continue;
                }
                let m = match known.measured.get(&i) {
                    Some(m) => *m,
                    None => {
                        let m = e.probe(PROBE_BYTES).await.ok().flatten();
                        known.measured.insert(i, m);
                        m
                    }
                };
                if let Some(m) = m {
                    measured_any = true;
                    total = Some(total.unwrap_or(0.0) + m);
                }
            }
            (
                total,
                if measured_any {
                    "measured"
                } else {
                    "in-process"
                },
            )
        };
        // A configured link or node limit models separate machines on
        // purpose (the placement benchmarks); otherwise nodes in this
        // process or on this host share its cores.
        let modelled = self.hints.link_bytes_per_s.is_some()
            || self.hints.storage_cores.is_some()
            || known.limits.values().any(Option::is_some);
        let colocated =
            (!modelled && !endpoints.is_empty() && endpoints.iter().all(|e| e.on_this_host()))
                .then(|| "every storage node runs on this machine".to_owned());
        Resources {
            storage_nodes: nodes.max(1),
            storage_cores,
            compute_cores: self.hints.compute_cores.unwrap_or(cores),
            link_bytes_per_s: link,
            link_source: source.into(),
            colocated,
        }
    }

    /// Parses and optimizes `sql` against the datasets the nodes hold now,
    /// with the UDF options of `udfs`; [`Prepared::place`] places it (or a
    /// plan derived from it).
    pub async fn prepare(&self, sql: &str, udfs: &Arc<UdfEnv>) -> Result<Prepared> {
        self.prepare_with(sql, udfs, false).await
    }

    /// [`ComputeSession::prepare`] for a query: its storage fragments
    /// cross hosts on the distributed engine ([`crate::engine`]).
    async fn prepare_query(&self, sql: &str, udfs: &Arc<UdfEnv>) -> Result<Prepared> {
        self.prepare_with(sql, udfs, true).await
    }

    async fn prepare_with(
        &self,
        sql: &str,
        udfs: &Arc<UdfEnv>,
        on_engine: bool,
    ) -> Result<Prepared> {
        crate::statement_limits::check_statement_size(sql)?;
        self.refresh().await.map_err(DataFusionError::from)?;
        let Snapshot {
            latest,
            mut stats,
            mut holders,
            nodes,
        } = self.snapshot().await;
        let schema_of = latest.clone();
        let resources = self.resources(nodes).await;
        let compute_cores = resources.compute_cores.max(1.0) as usize;
        let config = SessionConfig::new()
            .with_information_schema(true)
            .with_target_partitions(compute_cores);
        let runtime = query_runtime(self.query_memory)?;
        let builder = SessionStateBuilder::new()
            .with_config(config)
            .with_runtime_env(runtime)
            .with_default_features()
            .with_physical_optimizer_rule(Arc::new(crate::cooperative::YieldAfterJoins));
        let endpoints = self.endpoints();
        let on_engine = on_engine && endpoints.iter().any(|e| e.credential().is_some());
        let state = if on_engine {
            crate::engine::coordinating(builder, NodeChannels::new(&endpoints))?
        } else {
            builder
        }
        .build();
        let ctx = SessionContext::new_with_state(state);
        sluice_udfs::register(&ctx, udfs);
        let schema = Arc::new(ComputeSchema::new(latest, holders.clone(), endpoints));
        if let Some(catalog) = ctx.catalog("datafusion") {
            let _previous = catalog.register_schema("public", Arc::clone(&schema) as _);
        }
        let logical = match ctx.state().create_logical_plan(sql).await {
            Ok(plan) => plan,
            // A statement that names a table no node holds fails here; the
            // catalog recorded the name it could not find (a typed error,
            // not a reading of DataFusion's message).
            Err(e) => {
                return Err(schema
                    .missing()
                    .map_or(e, |name| external(UnknownDataset(name))));
            }
        };
        read_only().verify_plan(&logical)?;
        let plan = ctx
            .execute_logical_plan(logical)
            .await?
            .into_optimized_plan()?;
        // Versions the query named (`pets@2`) are planned with the latest
        // version's statistics and run where the dataset is.
        for table in schema.versions() {
            let base = base_name(&table);
            if let Some(s) = stats.get(base).cloned() {
                stats.insert(table.clone(), s);
            }
            if let Some(h) = holders.get(base).cloned() {
                holders.insert(table, h);
            }
        }
        Ok(Prepared {
            plan,
            planner: Planner {
                profiles: self.profiles.clone(),
                resources,
                stats,
                calibrations: HashMap::new(),
                delivery: HashMap::new(),
            },
            calibration: self.calibration,
            calibrations: Arc::clone(&self.calibrations),
            query_memory: self.query_memory,
            tables: Tables {
                replicas: self.replica_reads(&holders, &schema_of).await,
                holders,
                udfs: Arc::clone(udfs),
                compute_cores,
                tally: Arc::new(Tally::default()),
                on_engine,
                explaining: false,
            },
            ctx,
        })
    }

    /// Plans `sql` under `offload` with the UDF options of `udfs`.
    pub async fn plan(
        &self,
        sql: &str,
        offload: Offload,
        udfs: &Arc<UdfEnv>,
    ) -> Result<PlannedQuery> {
        let prepared = self.prepare_query(sql, udfs).await?;
        prepared.place(prepared.plan.clone(), offload).await
    }

    /// Plans `sql` as [`ComputeSession::plan`] does, calibrating whatever
    /// `offload` is (when calibration is on): what EXPLAIN shows.
    pub async fn explain(
        &self,
        sql: &str,
        offload: Offload,
        udfs: &Arc<UdfEnv>,
    ) -> Result<PlannedQuery> {
        let mut prepared = self.prepare_query(sql, udfs).await?;
        prepared.tables.explaining = true;
        prepared
            .place_with(prepared.plan.clone(), offload, true)
            .await
    }

    /// Plans and runs `sql`; `EXPLAIN sql` answers the placement and the
    /// compute fragment's physical plan.
    pub async fn execute(
        &self,
        sql: &str,
        offload: Offload,
        udfs: &Arc<UdfEnv>,
    ) -> Result<SendableRecordBatchStream> {
        if let Some(inner) = crate::explain::explained(sql) {
            let q = self.explain(inner, offload, udfs).await?;
            let batch = crate::explain::explain_batch(&q.explanation, &q.plan)?;
            let schema = batch.schema();
            return Ok(Box::pin(MemoryStream::try_new(vec![batch], schema, None)?));
        }
        let q = self.plan(sql, offload, udfs).await?;
        execute_stream(q.plan, q.ctx.task_ctx())
    }
}
