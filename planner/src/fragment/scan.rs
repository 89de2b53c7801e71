//! [`DatasetScanExec`]: the leaf of a storage fragment as planned on the
//! compute side.
//!
//! The compute node knows a dataset's schema and statistics, not its
//! extents, so it plans a storage fragment over this node: which dataset,
//! which columns, which metadata filters (applied before any object is
//! read) and what limit. The storage node that receives the fragment binds
//! each `DatasetScanExec` to a scan of its own copy of the dataset; the
//! node itself never runs — executing it is an error that says so.
//!
//! A job's scans carry a [`Take`]: the rows of a pinned version to read,
//! by row id, in the order wanted, each with a *slot* that comes back in
//! the virtual column [`SLOT`] — the index past the table's own columns —
//! so that the job can put every row back at its position, whichever node
//! and partition produced it.

use std::fmt;
use std::sync::Arc;

use crate::pipeline::{DATA_COLUMN, storage_capable};
use arrow::datatypes::{DataType, Field, SchemaRef};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Result, exec_err};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};

/// How a dataset scan takes `filters`, on either side: exactly when they
/// read only metadata columns and can run on storage (they are then applied
/// before any object is read); otherwise they stay above the scan.
pub fn filter_pushdown(filters: &[&Expr]) -> Vec<TableProviderFilterPushDown> {
    filters
        .iter()
        .map(|f| {
            let reads_data = f.column_refs().iter().any(|c| c.name == DATA_COLUMN);
            if reads_data || !storage_capable(f) {
                TableProviderFilterPushDown::Unsupported
            } else {
                TableProviderFilterPushDown::Exact
            }
        })
        .collect()
}

/// The virtual column of a job's scans: a row's slot ([`Take`]).
pub const SLOT: &str = "__slot";

/// The field of [`SLOT`].
pub fn slot_field() -> Field {
    Field::new(SLOT, DataType::UInt32, false)
}

/// Rows of one pinned dataset version that a job's scan reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Take {
    /// The version pinned.
    pub version: u64,
    /// Row ids of the version's metadata, in the order wanted; `None`:
    /// every row, in order, its slot being its row id (a job's index).
    pub rows: Option<Arc<[u32]>>,
    /// The slot of each row in `rows` (ignored when `rows` is `None`).
    pub slots: Arc<[u32]>,
}

impl Take {
    /// Every row of `version`, each slotted at its row id.
    pub fn index(version: u64) -> Self {
        Self {
            version,
            rows: None,
            slots: Arc::from(Vec::new()),
        }
    }

    /// `rows` of `version`, each with the slot of `slots` at its place, as
    /// a message carried them; an error when they do not pair up.
    pub fn listed(version: u64, rows: Vec<u32>, slots: Vec<u32>) -> Result<Self, String> {
        if rows.len() != slots.len() {
            return Err(format!("{} rows but {} slots", rows.len(), slots.len()));
        }
        Ok(Self {
            version,
            rows: Some(Arc::from(rows)),
            slots: Arc::from(slots),
        })
    }
}

/// `fragment` with every [`DatasetScanExec`] reading `take`: one window
/// of a job, on the node that holds those rows.
pub fn with_take(fragment: Arc<dyn ExecutionPlan>, take: &Take) -> Result<Arc<dyn ExecutionPlan>> {
    fragment
        .transform_up(|p| match p.downcast_ref::<DatasetScanExec>() {
            Some(scan) => {
                let scan = scan.clone().with_take(Some(take.clone()));
                Ok(Transformed::yes(Arc::new(scan) as Arc<dyn ExecutionPlan>))
            }
            None => Ok(Transformed::no(p)),
        })
        .map(|t| t.data)
}

/// A dataset scan to be bound on a storage node.
#[derive(Debug, Clone)]
pub struct DatasetScanExec {
    /// The dataset.
    pub dataset: String,
    /// Table columns to produce (all when `None`).
    pub projection: Option<Vec<usize>>,
    /// Filters on metadata columns, applied by the scan.
    pub filters: Vec<Expr>,
    /// Rows to stop after.
    pub limit: Option<usize>,
    /// A job's rows (filters still apply), or `None`: a query's scan.
    pub take: Option<Take>,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
}

impl DatasetScanExec {
    /// A scan of `dataset` producing `schema` (the projected schema).
    pub fn new(
        dataset: String,
        projection: Option<Vec<usize>>,
        filters: Vec<Expr>,
        limit: Option<usize>,
        schema: SchemaRef,
    ) -> Self {
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Self {
            dataset,
            projection,
            filters,
            limit,
            take: None,
            schema,
            properties,
        }
    }

    /// The same scan reading `take`.
    pub fn with_take(mut self, take: Option<Take>) -> Self {
        self.take = take;
        self
    }
}

impl DisplayAs for DatasetScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DatasetScanExec: dataset={}", self.dataset)?;
        let names: Vec<&str> = self
            .schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        write!(f, ", columns=[{}]", names.join(", "))?;
        if !self.filters.is_empty() {
            let filters: Vec<String> = self.filters.iter().map(|e| e.to_string()).collect();
            write!(f, ", filters=[{}]", filters.join(", "))?;
        }
        if let Some(l) = self.limit {
            write!(f, ", limit={l}")?;
        }
        if let Some(t) = &self.take {
            match &t.rows {
                Some(rows) => write!(f, ", take={} rows of v{}", rows.len(), t.version)?,
                None => write!(f, ", index of v{}", t.version)?,
            }
        }
        Ok(())
    }
}

impl ExecutionPlan for DatasetScanExec {
    fn name(&self) -> &str {
        "DatasetScanExec"
    }

    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
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
        _partition: usize,
        _context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        exec_err!(
            "DatasetScanExec of {} runs only once a storage node has bound it to its extents",
            self.dataset
        )
    }
}
