//! The compute side's view of storage: dataset tables it can plan over,
//! fragment tables the planner's compute fragment reads, and
//! [`RemoteFragmentExec`], which runs a storage fragment on every storage
//! node holding its dataset — one partition per node; a job's windows run
//! through the plan's [`Feeds`].

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Result, exec_err};
use datafusion::datasource::TableType;
use datafusion::execution::{
    SendableRecordBatchStream, SessionState, SessionStateBuilder, TaskContext,
};
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
    displayable,
};
use futures::{StreamExt, TryStreamExt, stream};
use sluice_flight::StorageEndpoint;
use sluice_flight::endpoint::endpoint_id;
use sluice_planner::StorageFragment;
use sluice_planner::fragment::DatasetScanExec;
use sluice_planner::fragment::filter_pushdown;
use sluice_planner::fragment::link_bytes;
use sluice_udfs::UdfEnv;

use crate::plan_feeds::Feeds;
use crate::reported::Tally;

pub use sluice_planner::fragment::NodeReads;

/// Which node reads which key of a dataset held by several nodes, so that
/// a query reads each key once (`crate::replicas::key_owners`).
#[async_trait]
pub trait ReplicaReads: fmt::Debug + Send + Sync {
    /// What `endpoint` reads.
    async fn take_for(&self, endpoint: &Arc<dyn StorageEndpoint>) -> Result<NodeReads>;
}

fn empty_stream(schema: SchemaRef) -> SendableRecordBatchStream {
    Box::pin(RecordBatchStreamAdapter::new(schema, stream::empty()))
}

/// A dataset as the compute side sees it: its schema, planned over
/// without its extents. Metadata filters are taken exactly (the storage
/// node applies them before reading any object).
#[derive(Debug)]
pub struct RemoteDatasetTable {
    name: String,
    schema: SchemaRef,
}

impl RemoteDatasetTable {
    /// The table of dataset `name`.
    pub fn new(name: String, schema: SchemaRef) -> Self {
        Self { name, schema }
    }
}

#[async_trait]
impl TableProvider for RemoteDatasetTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        Ok(filter_pushdown(filters))
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let schema = match projection {
            Some(p) => Arc::new(self.schema.project(p)?),
            None => Arc::clone(&self.schema),
        };
        Ok(Arc::new(DatasetScanExec::new(
            self.name.clone(),
            projection.cloned(),
            filters.to_vec(),
            limit,
            schema,
        )))
    }
}

/// The output of one storage fragment, as a table of the compute fragment.
#[derive(Debug)]
pub struct FragmentTable {
    fragment: StorageFragment,
    endpoints: Vec<Arc<dyn StorageEndpoint>>,
    udfs: Arc<UdfEnv>,
    compute_cores: usize,
    tally: Arc<Tally>,
    replicas: Option<Arc<dyn ReplicaReads>>,
    on_engine: bool,
    explaining: bool,
}

impl FragmentTable {
    /// The table of `fragment`, run on `endpoints`, counting what arrives
    /// in `tally`; over a replicated dataset each key is read once, as
    /// `replicas` assigns it.
    pub fn new(
        fragment: StorageFragment,
        endpoints: Vec<Arc<dyn StorageEndpoint>>,
        udfs: Arc<UdfEnv>,
        compute_cores: usize,
        tally: Arc<Tally>,
        replicas: Option<Arc<dyn ReplicaReads>>,
    ) -> Self {
        Self {
            fragment,
            endpoints,
            udfs,
            compute_cores,
            tally,
            replicas,
            on_engine: false,
            explaining: false,
        }
    }

    /// The same, its fragment carried by the distributed engine
    /// ([`crate::engine`]) when every node holding the dataset is reached
    /// over the network; the session must be the engine's coordinating
    /// one.
    pub fn on_engine(mut self, on: bool) -> Self {
        self.on_engine = on;
        self
    }

    /// The same, planned to be explained, not run: a node whose share
    /// cannot be listed now (it is down) is shown reading what it holds,
    /// rather than failing the plan (the explanation names it where its
    /// part is timed).
    pub fn explaining(mut self, explaining: bool) -> Self {
        self.explaining = explaining;
        self
    }

    /// The fragment as one stage of the engine: each node's task reads
    /// what the node reads.
    async fn engine_stage(
        &self,
        physical: Arc<dyn ExecutionPlan>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let mut reads = Vec::with_capacity(self.endpoints.len());
        for e in &self.endpoints {
            let r = match &self.replicas {
                Some(r) => match r.take_for(e).await {
                    Ok(r) => r,
                    // Explained, not run: shown reading what it holds.
                    Err(_) if self.explaining => NodeReads::Whole,
                    Err(e) => return Err(e),
                },
                None => NodeReads::Whole,
            };
            reads.push((Arc::clone(e), r));
        }
        crate::engine::fragment_stage(
            &self.fragment.dataset,
            physical,
            reads,
            &self.udfs,
            &self.tally,
        )
    }
}

#[async_trait]
impl TableProvider for FragmentTable {
    fn schema(&self) -> SchemaRef {
        Arc::new(self.fragment.plan.schema().as_arrow().clone())
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        // The fragment is planned in one partition; the storage node
        // spreads it over its own cores once bound.
        let Some(state) = state.as_any().downcast_ref::<SessionState>() else {
            return exec_err!("fragment tables need a DataFusion SessionState");
        };
        let config = state.config().clone().with_target_partitions(1);
        let single = SessionStateBuilder::new_from_existing(state.clone())
            .with_config(config)
            .build();
        let physical = single
            .query_planner()
            .create_physical_plan(&self.fragment.plan, &single)
            .await?;
        let remote =
            !self.endpoints.is_empty() && self.endpoints.iter().all(|e| e.credential().is_some());
        let mut plan: Arc<dyn ExecutionPlan> = if self.on_engine && remote {
            self.engine_stage(physical).await?
        } else {
            let mut fragment = RemoteFragmentExec::new(
                self.fragment.dataset.clone(),
                physical,
                self.endpoints.clone(),
                Arc::clone(&self.udfs),
                Arc::clone(&self.tally),
            );
            fragment.replicas = self.replicas.clone();
            Arc::new(fragment)
        };
        if let Some(p) = projection {
            let schema = plan.schema();
            let exprs: Vec<(Arc<dyn PhysicalExpr>, String)> = p
                .iter()
                .map(|&i| {
                    let f = schema.field(i);
                    let col: Arc<dyn PhysicalExpr> = Arc::new(
                        datafusion::physical_expr::expressions::Column::new(f.name(), i),
                    );
                    (col, f.name().clone())
                })
                .collect();
            plan = Arc::new(ProjectionExec::try_new(exprs, plan)?);
        }
        if plan.output_partitioning().partition_count() < self.compute_cores {
            plan = Arc::new(RepartitionExec::try_new(
                plan,
                Partitioning::RoundRobinBatch(self.compute_cores),
            )?);
        }
        Ok(plan)
    }
}

pub use crate::plan_feeds::Takes;

/// Runs a storage fragment on each storage node holding its dataset; its
/// partition `i` is node `i`'s stream. With [`Takes`] (a job's window), each
/// node's scans read the rows named for it, through the node's feed (one
/// per node for every window of this placed plan), and a node named in
/// none sends nothing.
#[derive(Debug, Clone)]
pub struct RemoteFragmentExec {
    dataset: String,
    fragment: Arc<dyn ExecutionPlan>,
    endpoints: Vec<Arc<dyn StorageEndpoint>>,
    udfs: Arc<UdfEnv>,
    tally: Arc<Tally>,
    takes: Option<Takes>,
    /// Over a replicated dataset, which node reads which key when no
    /// window's takes say (a query).
    replicas: Option<Arc<dyn ReplicaReads>>,
    feeds: Arc<Feeds>,
    properties: Arc<PlanProperties>,
}

/// `plan` (a job's placed compute fragment) bound to one stream: its
/// UDF calls and guards, and those of every storage fragment it sends, to
/// `udfs` (the stream's epoch, bad-sample log and cancel: see
/// [`sluice_udfs::rebind`]); each [`RemoteFragmentExec`] counting into
/// `tally` through feeds of its own.
pub fn for_stream(
    plan: Arc<dyn ExecutionPlan>,
    udfs: &Arc<UdfEnv>,
    tally: &Arc<Tally>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let bound = plan
        .transform_up(|p| {
            let Some(remote) = p.downcast_ref::<RemoteFragmentExec>() else {
                return sluice_udfs::rebind::rebind_node(p, udfs);
            };
            let mut r = remote.clone();
            r.fragment = sluice_udfs::rebind::rebind_plan(Arc::clone(&r.fragment), udfs)?;
            r.udfs = Arc::clone(udfs);
            r.tally = Arc::clone(tally);
            r.feeds = Arc::default();
            r.takes = None;
            Ok(Transformed::yes(Arc::new(r) as Arc<dyn ExecutionPlan>))
        })?
        .data;
    // The compute side's decode stages under random ones, from the node's
    // stage cache (the storage side wraps its own fragment when it opens).
    if udfs.options.cache_stages {
        let cache = sluice_udfs::stage_cache::StageCache::global();
        return sluice_udfs::stage_cache::cache_plan(bound, cache, &udfs.options.limits);
    }
    Ok(bound)
}

/// `plan` (a placed compute fragment) with every [`RemoteFragmentExec`]
/// reading `takes`: one window of a job. The nodes above them are rebuilt,
/// so the plan runs afresh.
pub fn with_takes(plan: Arc<dyn ExecutionPlan>, takes: &Takes) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|p| {
        let Some(remote) = p.downcast_ref::<RemoteFragmentExec>() else {
            return Ok(Transformed::no(p));
        };
        let mut r = remote.clone();
        r.takes = Some(Arc::clone(takes));
        Ok(Transformed::yes(Arc::new(r) as Arc<dyn ExecutionPlan>))
    })
    .map(|t| t.data)
}

impl RemoteFragmentExec {
    /// A fragment over `dataset`, run on `endpoints`, counting what
    /// arrives in `tally`.
    pub fn new(
        dataset: String,
        fragment: Arc<dyn ExecutionPlan>,
        endpoints: Vec<Arc<dyn StorageEndpoint>>,
        udfs: Arc<UdfEnv>,
        tally: Arc<Tally>,
    ) -> Self {
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(fragment.schema()),
            Partitioning::UnknownPartitioning(endpoints.len().max(1)),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Self {
            dataset,
            fragment,
            endpoints,
            udfs,
            tally,
            takes: None,
            replicas: None,
            feeds: Arc::new(Feeds::default()),
            properties,
        }
    }

    /// The storage fragment's physical plan.
    pub fn fragment(&self) -> &Arc<dyn ExecutionPlan> {
        &self.fragment
    }
}

impl DisplayAs for RemoteFragmentExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nodes: Vec<&str> = self.endpoints.iter().map(|e| e.name()).collect();
        let plan = displayable(self.fragment.as_ref()).one_line().to_string();
        write!(
            f,
            "RemoteFragmentExec: dataset={}, nodes=[{}], fragment={}",
            self.dataset,
            nodes.join(", "),
            plan.trim_end()
        )
    }
}

impl ExecutionPlan for RemoteFragmentExec {
    fn name(&self) -> &str {
        "RemoteFragmentExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let schema = self.fragment.schema();
        let Some(endpoint) = self.endpoints.get(partition).cloned() else {
            if self.endpoints.is_empty() && partition == 0 {
                return exec_err!("no storage node holds dataset {}", self.dataset);
            }
            return exec_err!("RemoteFragmentExec has no partition {partition}");
        };
        let take = match &self.takes {
            None => None,
            Some(takes) => match takes.get(&endpoint_id(&endpoint)) {
                None => {
                    let empty = stream::empty();
                    return Ok(Box::pin(RecordBatchStreamAdapter::new(schema, empty)));
                }
                Some(take) => Some(take.clone()),
            },
        };
        let fragment = Arc::clone(&self.fragment);
        let dataset = self.dataset.clone();
        let udfs = Arc::clone(&self.udfs);
        let feeds = Arc::clone(&self.feeds);
        let tally = Arc::clone(&self.tally);
        let replicas = self.replicas.clone().filter(|_| take.is_none());
        let batches = stream::once(async move {
            let fragment = match replicas {
                // A query over a dataset on several nodes: each key once.
                Some(r) => match r.take_for(&endpoint).await? {
                    NodeReads::Whole => fragment,
                    NodeReads::Take(mine) => sluice_planner::fragment::with_take(fragment, &mine)?,
                    NodeReads::Nothing => return Ok(empty_stream(fragment.schema())),
                },
                None => fragment,
            };
            match take {
                Some(take) => {
                    feeds
                        .window(&endpoint, &dataset, &fragment, &udfs, &take)
                        .await
                }
                None => crate::on_node::run_fragment(&endpoint, &dataset, fragment, udfs).await,
            }
            .map_err(datafusion::error::DataFusionError::from)
        })
        .try_flatten()
        .inspect_ok(move |b| {
            tally.rows.fetch_add(b.num_rows() as u64, Ordering::Relaxed);
            tally
                .bytes
                .fetch_add(link_bytes(b) as u64, Ordering::Relaxed);
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            schema,
            batches.boxed(),
        )))
    }
}
