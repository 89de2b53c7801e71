//! [`ExtentSource`]: the zero-copy scan of a dataset version, as a
//! DataFusion [`DataSource`] behind `DataSourceExec`.
//!
//! Each output partition reads a contiguous range of the metadata file's row
//! groups — or, for a job's take ([`super::take`]), a contiguous part of
//! the rows the job asked for, sliced from the version's metadata in memory
//! in the order asked, with each row's slot as one more column. For every
//! metadata batch it applies the pushed-down filters
//! (exactly: DataFusion drops its own filter above the scan), then the limit,
//! then — only if `data` is projected — plans device reads
//! ([`plan_reads`](super::plan_reads)) and issues them with at most
//! `reads_in_flight` outstanding per partition; the device's own queue depth
//! caps the total across partitions. Outputs keep metadata order.
//!
//! Each read buffer becomes an Arrow buffer as is; every batch cut from it
//! uses that buffer as its `data` values, and the extents' crc32c are
//! checked before a batch leaves the scan. Checked objects enter the
//! store's node-wide [`ObjectCache`](crate::cache::ObjectCache); a read
//! whose objects are all there is served from memory (one copy into the
//! batch's values buffer, no device read, no second crc check).

use std::fmt;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{Schema, SchemaRef};
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Statistics, exec_err};
use datafusion::datasource::source::DataSource;
use datafusion::error::Result as DFResult;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::projection::ProjectionExprs;
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::DisplayFormatType;
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt, TryStreamExt, stream};
use sluice_planner::fragment::Take;

use super::options::ScanOptions;
use super::partition::{OutCol, PartitionScan, apply_filter, read_row_group};
use super::take::{TakePart, VersionIndex, take_parts, with_slot};
use super::version::DatasetVersion;

/// Rows per batch of a take that reads no object (a job's index).
const INDEX_BATCH_ROWS: usize = 64 * 1024;

/// What the partitions read.
#[derive(Debug, Clone)]
enum Parts {
    /// Ranges of the metadata file's row groups.
    RowGroups(Vec<Vec<usize>>),
    /// Parts of a job's take, over the version's metadata in memory.
    Take {
        index: Arc<VersionIndex>,
        parts: Vec<TakePart>,
    },
}

impl Parts {
    fn len(&self) -> usize {
        match self {
            Parts::RowGroups(p) => p.len(),
            Parts::Take { parts, .. } => parts.len(),
        }
    }
}

/// The scan of one dataset version.
#[derive(Debug, Clone)]
pub struct ExtentSource {
    version: Arc<DatasetVersion>,
    read: Vec<usize>,
    read_schema: SchemaRef,
    out: Vec<OutCol>,
    projected_schema: SchemaRef,
    filter: Option<Arc<dyn PhysicalExpr>>,
    fetch: Option<usize>,
    parts: Parts,
    options: ScanOptions,
    metrics: ExecutionPlanMetricsSet,
}

/// What a scan of a version reads and produces.
#[derive(Debug, Clone)]
pub struct ScanColumns {
    /// Table columns to produce (the index past the table's own is the
    /// slot of a job's take).
    pub projection: Vec<usize>,
    /// Metadata columns to read.
    pub read: Vec<usize>,
    /// Their schema.
    pub read_schema: SchemaRef,
    /// Exact filters over `read_schema`.
    pub filter: Option<Arc<dyn PhysicalExpr>>,
}

impl ExtentSource {
    /// A scan of `version` producing and reading `columns`, stopping after
    /// `fetch` rows, split into at most `target_partitions` partitions of
    /// the metadata file's row groups.
    pub fn try_new(
        version: Arc<DatasetVersion>,
        columns: ScanColumns,
        fetch: Option<usize>,
        target_partitions: usize,
        options: ScanOptions,
    ) -> DFResult<Self> {
        let groups = version.parquet.metadata().num_row_groups();
        let n = target_partitions.clamp(1, groups.max(1));
        let parts = Parts::RowGroups(
            (0..n)
                .map(|p| (groups * p / n..groups * (p + 1) / n).collect())
                .collect(),
        );
        Self::with_parts(version, columns, fetch, parts, options)
    }

    /// A job's scan of `take` over `index` (the metadata of `version`),
    /// split into at most `target_partitions` partitions; its metadata
    /// batches carry each row's slot as one more column.
    pub fn take(
        version: Arc<DatasetVersion>,
        index: Arc<VersionIndex>,
        take: &Take,
        mut columns: ScanColumns,
        target_partitions: usize,
        options: ScanOptions,
    ) -> DFResult<Self> {
        let parts = take_parts(take, &index, &version.record.dataset, target_partitions)?;
        columns.read_schema = with_slot(&columns.read_schema);
        Self::with_parts(
            version,
            columns,
            None,
            Parts::Take { index, parts },
            options,
        )
    }

    fn with_parts(
        version: Arc<DatasetVersion>,
        columns: ScanColumns,
        fetch: Option<usize>,
        parts: Parts,
        options: ScanOptions,
    ) -> DFResult<Self> {
        let ScanColumns {
            projection,
            read,
            read_schema,
            filter,
        } = columns;
        let data_index = version.data_index();
        let slot_index = data_index + 1;
        let mut out = Vec::with_capacity(projection.len());
        for &c in &projection {
            if c == data_index {
                out.push(OutCol::Data);
            } else if c == slot_index {
                if !matches!(parts, Parts::Take { .. }) {
                    return exec_err!("the slot column is only read by a job's take");
                }
                out.push(OutCol::Meta(read.len()));
            } else {
                let Some(pos) = read.iter().position(|&r| r == c) else {
                    return exec_err!("column {c} is projected but not read");
                };
                out.push(OutCol::Meta(pos));
            }
        }
        let mut fields: Vec<_> = version.table_schema.fields().iter().cloned().collect();
        fields.push(Arc::new(sluice_planner::fragment::slot_field()));
        let projected_schema = Arc::new(Schema::new(fields).project(&projection)?);
        Ok(Self {
            version,
            read,
            read_schema,
            out,
            projected_schema,
            filter,
            fetch,
            parts,
            options,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    fn wants_data(&self) -> bool {
        self.out.iter().any(|c| matches!(c, OutCol::Data))
    }

    fn rows_in(&self, row_groups: &[usize]) -> usize {
        let meta = self.version.parquet.metadata();
        row_groups
            .iter()
            .map(|&rg| meta.row_group(rg).num_rows() as usize)
            .sum()
    }
}

impl ExtentSource {
    /// Partition `partition`'s metadata batches, unfiltered: its row
    /// groups read from the file, or its part of a take sliced from the
    /// version's metadata in memory.
    fn metadata(
        &self,
        partition: usize,
        batch_size: usize,
    ) -> BoxStream<'static, DFResult<RecordBatch>> {
        match &self.parts {
            Parts::RowGroups(parts) => {
                let (version, read, read_schema) = (
                    Arc::clone(&self.version),
                    self.read.clone(),
                    Arc::clone(&self.read_schema),
                );
                stream::iter(parts[partition].clone())
                    .then(move |rg| {
                        let (version, read, read_schema) =
                            (Arc::clone(&version), read.clone(), Arc::clone(&read_schema));
                        async move {
                            tokio::task::spawn_blocking(move || {
                                read_row_group(&version, rg, &read, &read_schema, batch_size)
                            })
                            .await
                            .map_err(|e| DataFusionError::External(Box::new(e)))?
                        }
                    })
                    .map_ok(|batches| stream::iter(batches.into_iter().map(Ok)))
                    .try_flatten()
                    .boxed()
            }
            Parts::Take { index, parts } => {
                let (index, part) = (Arc::clone(index), parts[partition].clone());
                let (read, read_schema) = (self.read.clone(), Arc::clone(&self.read_schema));
                // Without `data` (a job's index) nothing is read per row:
                // large batches.
                let rows = if self.wants_data() {
                    batch_size.max(1)
                } else {
                    batch_size.max(INDEX_BATCH_ROWS)
                };
                let starts = (0..part.rows.len()).step_by(rows);
                stream::iter(starts)
                    .map(move |at| {
                        let end = (at + rows).min(part.rows.len());
                        index.take(
                            &read,
                            &part.rows[at..end],
                            &part.slots[at..end],
                            &read_schema,
                        )
                    })
                    .boxed()
            }
        }
    }
}

/// `batches` with `filter` applied, and then no more than `fetch` rows
/// (the stream ends there), empty batches dropped.
fn limited(
    batches: BoxStream<'static, DFResult<RecordBatch>>,
    filter: Option<Arc<dyn PhysicalExpr>>,
    fetch: Option<usize>,
) -> impl Stream<Item = DFResult<RecordBatch>> + Send + 'static {
    batches
        .map(move |b| b.and_then(|b| apply_filter(&filter, b)))
        .scan(fetch, |remaining, b| {
            let item = match (b, remaining.as_mut()) {
                (Ok(_), Some(0)) => return futures::future::ready(None),
                (Ok(b), Some(n)) => {
                    let take = b.num_rows().min(*n);
                    *n -= take;
                    Ok(b.slice(0, take))
                }
                (other, None) => other,
                (Err(e), Some(_)) => Err(e),
            };
            futures::future::ready(Some(item))
        })
        .try_filter(|b| futures::future::ready(b.num_rows() > 0))
}

impl DataSource for ExtentSource {
    fn open(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DFResult<SendableRecordBatchStream> {
        if partition >= self.parts.len() {
            return exec_err!("partition {partition} out of range");
        }
        let batch_size = context.session_config().batch_size();
        let scan = Arc::new(PartitionScan {
            version: Arc::clone(&self.version),
            read_schema: Arc::clone(&self.read_schema),
            projected_schema: Arc::clone(&self.projected_schema),
            out: self.out.clone(),
            options: self.options.clone(),
            batch_size,
            reads: MetricBuilder::new(&self.metrics).counter("extent_reads", partition),
            read_bytes: MetricBuilder::new(&self.metrics).counter("extent_bytes", partition),
            cache_hits: MetricBuilder::new(&self.metrics).counter("cache_hits", partition),
        });

        // Metadata batches, filtered, then limited.
        let meta = limited(
            self.metadata(partition, batch_size),
            self.filter.clone(),
            self.fetch,
        );

        let schema = Arc::clone(&self.projected_schema);
        if !self.wants_data() {
            let out = meta.and_then(move |b| futures::future::ready(scan.output(&b, None)));
            return Ok(Box::pin(RecordBatchStreamAdapter::new(schema, out)));
        }
        let out = scan.with_data(meta);
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, out)))
    }

    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = &self.version.record;
        let cols: Vec<&str> = self
            .projected_schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        match t {
            DisplayFormatType::TreeRender => {
                writeln!(f, "dataset={}@{}", r.dataset, r.version)?;
                writeln!(f, "columns=[{}]", cols.join(", "))
            }
            _ => {
                write!(
                    f,
                    "ExtentSource: dataset={}@{}, partitions={}, projection=[{}]",
                    r.dataset,
                    r.version,
                    self.parts.len(),
                    cols.join(", ")
                )?;
                if let Parts::Take { parts, .. } = &self.parts {
                    let rows: usize = parts.iter().map(|p| p.rows.len()).sum();
                    write!(f, ", take={rows}")?;
                }
                if let Some(filter) = &self.filter {
                    write!(f, ", filter={filter}")?;
                }
                if let Some(n) = self.fetch {
                    write!(f, ", fetch={n}")?;
                }
                Ok(())
            }
        }
    }

    fn output_partitioning(&self) -> Partitioning {
        Partitioning::UnknownPartitioning(self.parts.len())
    }

    fn eq_properties(&self) -> EquivalenceProperties {
        EquivalenceProperties::new(Arc::clone(&self.projected_schema))
    }

    fn partition_statistics(&self, partition: Option<usize>) -> DFResult<Arc<Statistics>> {
        let mut stats = Statistics::new_unknown(&self.projected_schema);
        let Parts::RowGroups(partitions) = &self.parts else {
            return Ok(Arc::new(stats));
        };
        if self.filter.is_none() {
            let rows = match partition {
                Some(p) => partitions.get(p).map(|rg| self.rows_in(rg)).unwrap_or(0),
                None => partitions.iter().map(|rg| self.rows_in(rg)).sum(),
            };
            let rows = self.fetch.map_or(rows, |f| rows.min(f));
            stats.num_rows = Precision::Exact(rows);
        }
        Ok(Arc::new(stats))
    }

    fn with_fetch(&self, limit: Option<usize>) -> Option<Arc<dyn DataSource>> {
        let mut s = self.clone();
        s.fetch = limit;
        Some(Arc::new(s))
    }

    fn fetch(&self) -> Option<usize> {
        self.fetch
    }

    fn metrics(&self) -> ExecutionPlanMetricsSet {
        self.metrics.clone()
    }

    fn try_swapping_with_projection(
        &self,
        _projection: &ProjectionExprs,
    ) -> DFResult<Option<Arc<dyn DataSource>>> {
        // The table provider already pushed the logical projection in.
        Ok(None)
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DFResult<TreeNodeRecursion>,
    ) -> DFResult<TreeNodeRecursion> {
        match &self.filter {
            Some(filter) => f(filter),
            None => Ok(TreeNodeRecursion::Continue),
        }
    }
}
