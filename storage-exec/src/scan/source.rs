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
use std::fs::File;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BinaryArray, RecordBatch, RecordBatchOptions};
use arrow::buffer::{Buffer, OffsetBuffer, ScalarBuffer};
use arrow::compute::filter_record_batch;
use arrow::datatypes::{Schema, SchemaRef, UInt32Type, UInt64Type};
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Statistics, exec_err};
use datafusion::datasource::source::DataSource;
use datafusion::error::Result as DFResult;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::projection::ProjectionExprs;
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::DisplayFormatType;
use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, MetricBuilder};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::{StreamExt, TryStreamExt, stream};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use sluice_planner::fragment::Take;

use super::reads::{ReadPlan, plan_reads};
use super::take::{TakePart, VersionIndex, take_parts, with_slot};
use super::version::DatasetVersion;
use crate::cache::{Miss, ObjectKey};
use crate::device::DeviceExt;
use crate::error::StorageError;
use crate::metadata::{CHUNK, CRC32C, KEY, LENGTH, OFFSET};

/// Rows per batch of a take that reads no object (a job's index).
const INDEX_BATCH_ROWS: usize = 64 * 1024;

/// A cached object this large (64 KiB) is served as a batch of its own
/// over the cached bytes rather than copied beside its neighbours: past
/// it, the copy costs more than a batch does (~10 µs through a plan).
pub const SHARED_OBJECT: usize = 64 << 10;

/// Tuning of the read path.
#[derive(Debug, Clone)]
pub struct ScanOptions {
    /// Largest coalesced read in bytes.
    pub max_read: u64,
    /// Largest gap between extents bridged by one read.
    pub max_gap: u64,
    /// Reads in flight per partition.
    pub reads_in_flight: usize,
}

impl Default for ScanOptions {
    fn default() -> Self {
        Self {
            max_read: 4 << 20,
            max_gap: 64 << 10,
            reads_in_flight: 8,
        }
    }
}

/// Where an output column comes from.
#[derive(Debug, Clone, Copy)]
enum OutCol {
    /// Position in the metadata batch read (the slot of a take is the
    /// last one).
    Meta(usize),
    /// The `data` column.
    Data,
}

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

/// Reads one row group of the metadata file (blocking).
fn read_row_group(
    version: &DatasetVersion,
    row_group: usize,
    read: &[usize],
    read_schema: &SchemaRef,
    batch_size: usize,
) -> DFResult<Vec<RecordBatch>> {
    if read.is_empty() {
        // No column is needed (count(*) with a limit, say): only row counts.
        let rows = version.parquet.metadata().row_group(row_group).num_rows() as usize;
        let opts = RecordBatchOptions::new().with_row_count(Some(rows));
        return Ok(vec![RecordBatch::try_new_with_options(
            Arc::clone(read_schema),
            vec![],
            &opts,
        )?]);
    }
    let path = &version.metadata_path;
    let file = File::open(path).map_err(|e| StorageError::io("open metadata", path, e))?;
    let mask = ProjectionMask::roots(version.parquet.parquet_schema(), read.iter().copied());
    let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(file, version.parquet.clone())
        .with_row_groups(vec![row_group])
        .with_projection(mask)
        .with_batch_size(batch_size)
        .build()
        .map_err(|source| StorageError::Parquet {
            path: path.clone(),
            source,
        })?;
    let mut out = Vec::new();
    for batch in reader {
        // The file's schema may carry field metadata; use the planned one.
        out.push(batch?.with_schema(Arc::clone(read_schema))?);
    }
    Ok(out)
}

/// Everything a partition's stream needs, shared by its futures.
struct PartitionScan {
    version: Arc<DatasetVersion>,
    read_schema: SchemaRef,
    projected_schema: SchemaRef,
    out: Vec<OutCol>,
    options: ScanOptions,
    batch_size: usize,
    reads: Count,
    read_bytes: Count,
    cache_hits: Count,
}

/// One device read and the metadata rows it serves.
struct ReadJob {
    plan: ReadPlan,
    batch: Arc<RecordBatch>,
    extents: Arc<Vec<(u64, u64)>>,
}

impl PartitionScan {
    /// An output batch: metadata columns from `meta`, `data` if given.
    fn output(&self, meta: &RecordBatch, data: Option<&ArrayRef>) -> DFResult<RecordBatch> {
        let columns: Vec<ArrayRef> = self
            .out
            .iter()
            .map(|c| match (c, data) {
                (OutCol::Meta(i), _) => Ok(Arc::clone(meta.column(*i))),
                (OutCol::Data, Some(data)) => Ok(Arc::clone(data)),
                (OutCol::Data, None) => exec_err!("data column without a read"),
            })
            .collect::<DFResult<_>>()?;
        let opts = RecordBatchOptions::new().with_row_count(Some(meta.num_rows()));
        Ok(RecordBatch::try_new_with_options(
            Arc::clone(&self.projected_schema),
            columns,
            &opts,
        )?)
    }

    /// The device reads of `extents` under this scan's options.
    fn plan_reads(&self, extents: &[(u64, u64)]) -> Vec<ReadPlan> {
        plan_reads(
            extents,
            self.version.store.device().block_size() as u64,
            self.options.max_read,
            self.options.max_gap,
            self.batch_size,
        )
    }

    /// Plans the device reads for one metadata batch, in row order.
    fn reads_for(&self, batch: RecordBatch) -> DFResult<Vec<ReadJob>> {
        let col = |name: &str| -> DFResult<&arrow::array::UInt64Array> {
            Ok(batch
                .column(self.read_schema.index_of(name)?)
                .as_primitive::<UInt64Type>())
        };
        let (chunks, offsets, lengths) = (col(CHUNK)?, col(OFFSET)?, col(LENGTH)?);
        let chunk_size = self.version.store.chunk_size();
        let extents: Vec<(u64, u64)> = (0..batch.num_rows())
            .map(|r| {
                (
                    chunks.value(r) * chunk_size + offsets.value(r),
                    lengths.value(r),
                )
            })
            .collect();
        let plans = self.plan_reads(&extents);
        let (batch, extents) = (Arc::new(batch), Arc::new(extents));
        Ok(plans
            .into_iter()
            .map(|plan| ReadJob {
                plan,
                batch: Arc::clone(&batch),
                extents: Arc::clone(&extents),
            })
            .collect())
    }

    fn key_at(&self, batch: &RecordBatch, row: usize) -> String {
        self.read_schema
            .index_of(KEY)
            .ok()
            .map(|i| batch.column(i).as_string::<i32>().value(row).to_owned())
            .unwrap_or_default()
    }

    /// Issues the job's device read (I/O only; no CPU work on the runtime).
    async fn read(&self, job: &ReadJob) -> DFResult<Buffer> {
        let plan = &job.plan;
        if plan.len > i32::MAX as u64 {
            let r = plan.runs[0].rows.start;
            return exec_err!(
                "sample '{}' of dataset '{}' is {} bytes; a Binary column holds at most 2 GiB per batch",
                self.key_at(&job.batch, r),
                self.version.record.dataset,
                job.extents[r].1
            );
        }
        // Plans are block aligned, so the covering read is exactly the plan.
        let (buf, _) = self
            .version
            .store
            .device()
            .read_covering(plan.offset, plan.len)
            .await?;
        self.reads.add(1);
        self.read_bytes.add(plan.len as usize);
        Ok(buf.into_arrow())
    }

    /// The cache keys of the job's objects, in its order.
    fn object_keys(&self, job: &ReadJob) -> DFResult<Vec<ObjectKey>> {
        let crcs = job
            .batch
            .column(self.read_schema.index_of(CRC32C)?)
            .as_primitive::<UInt32Type>();
        let keys: Vec<ObjectKey> = job
            .plan
            .runs
            .iter()
            .flat_map(|run| run.rows.clone())
            .map(|r| {
                let (offset, len) = job.extents[r];
                ObjectKey {
                    offset,
                    len,
                    crc: crcs.value(r),
                }
            })
            .collect();
        Ok(keys)
    }

    /// The job's batches: from the cache when it holds all its objects;
    /// else, when it holds some, the cached rows from memory and reads of
    /// the rest only (`may_split`); else one device read, registered with
    /// the cache while under way so that another scan missing these
    /// objects waits for it rather than read them again (one device read
    /// per object; a scan waits at most once).
    fn fetch(
        self: Arc<Self>,
        job: ReadJob,
        permits: Arc<tokio::sync::Semaphore>,
        may_split: bool,
    ) -> futures::future::BoxFuture<'static, DFResult<Vec<RecordBatch>>> {
        Box::pin(async move {
            let cache = Arc::clone(self.version.store.cache());
            let mut may_wait = true;
            loop {
                // A partial hit is a miss here: the read is coalesced.
                let keys = if cache.enabled() {
                    self.object_keys(&job)?
                } else {
                    Vec::new()
                };
                if let Some(objects) = cache.get_all(&keys) {
                    let reader = Arc::clone(&self);
                    return tokio::task::spawn_blocking(move || {
                        reader.assemble_cached(&job, objects)
                    })
                    .await
                    .map_err(|e| DataFusionError::External(Box::new(e)))?;
                }
                if may_split && let Some(parts) = self.split_by_cache(&job, &keys) {
                    let mut out = Vec::new();
                    for part in parts {
                        let permits = Arc::clone(&permits);
                        out.extend(Arc::clone(&self).fetch(part, permits, false).await?);
                    }
                    return Ok(out);
                }
                let permit = Arc::clone(&permits)
                    .acquire_owned()
                    .await
                    .map_err(|e| DataFusionError::External(Box::new(e)))?;
                let reading = match cache.begin_read(&keys, may_wait) {
                    Miss::Read(reading) => reading,
                    Miss::Wait(under_way) => {
                        drop(permit);
                        Miss::wait(under_way).await;
                        may_wait = false;
                        continue;
                    }
                };
                // The read and its checks are a task of their own, begun
                // as the read is registered: the objects reach the cache,
                // and the scans waiting for them wake, whether or not this
                // scan is polled on.
                let reader = Arc::clone(&self);
                return sluice_base::task::to_end(async move {
                    let values = reader.read(&job).await;
                    drop(permit);
                    let values = values?;
                    tokio::task::spawn_blocking(move || {
                        let batches = reader.assemble(&job, values);
                        // In the cache now (or not taken): the scans
                        // waiting for this read look again.
                        drop(reading);
                        batches
                    })
                    .await
                    .map_err(|e| DataFusionError::External(Box::new(e)))?
                })
                .await
                .map_err(|e| DataFusionError::External(Box::new(e)))?;
            }
        })
    }

    /// The job cut where the cache holds some of its objects (`keys`, in
    /// row order) and not others: maximal stretches of consecutive rows
    /// all held or all not, each planned as reads of its own, in row
    /// order; `None` when the cache holds all or none of them.
    fn split_by_cache(&self, job: &ReadJob, keys: &[ObjectKey]) -> Option<Vec<ReadJob>> {
        let held = self.version.store.cache().holds(keys);
        if held.iter().all(|&h| h) || !held.iter().any(|&h| h) {
            return None;
        }
        let rows: Vec<usize> = job.plan.runs.iter().flat_map(|r| r.rows.clone()).collect();
        let mut parts = Vec::new();
        let mut i = 0;
        while i < rows.len() {
            let mut j = i + 1;
            while j < rows.len() && held[j] == held[i] && rows[j] == rows[j - 1] + 1 {
                j += 1;
            }
            let first = rows[i];
            let plans = self.plan_reads(&job.extents[first..rows[j - 1] + 1]);
            for mut plan in plans {
                for run in &mut plan.runs {
                    run.rows = run.rows.start + first..run.rows.end + first;
                }
                parts.push(ReadJob {
                    plan,
                    batch: Arc::clone(&job.batch),
                    extents: Arc::clone(&job.extents),
                });
            }
            i = j;
        }
        Some(parts)
    }

    /// The job's output batches from cached objects (checked when they
    /// entered the cache). An object of [`SHARED_OBJECT`] or more is a
    /// batch of its own whose `data` values buffer is the cached buffer
    /// itself (no copy: a raw-object stream's bytes go from the cache to
    /// the trainer's slot or socket untouched); smaller neighbours of a
    /// run are copied together into one values buffer, where a batch per
    /// object would cost more than the copy.
    fn assemble_cached(&self, job: &ReadJob, objects: Vec<Buffer>) -> DFResult<Vec<RecordBatch>> {
        let mut objects = objects.into_iter();
        let mut out = Vec::with_capacity(job.plan.runs.len());
        for run in &job.plan.runs {
            let run_objects: Vec<Buffer> = objects.by_ref().take(run.rows.len()).collect();
            let mut first = 0;
            while first < run_objects.len() {
                let shared = run_objects[first].len() >= SHARED_OBJECT;
                let end = if shared {
                    first + 1
                } else {
                    run_objects[first..]
                        .iter()
                        .position(|o| o.len() >= SHARED_OBJECT)
                        .map_or(run_objects.len(), |n| first + n)
                };
                let part = &run_objects[first..end];
                let values = if shared {
                    part[0].clone()
                } else {
                    let total: usize = part.iter().map(Buffer::len).sum();
                    let mut values = arrow::buffer::MutableBuffer::with_capacity(total);
                    for o in part {
                        values.extend_from_slice(o.as_slice());
                    }
                    values.into()
                };
                let mut offsets = Vec::with_capacity(part.len() + 1);
                offsets.push(0i32);
                let mut at = 0i32;
                for o in part {
                    at += o.len() as i32;
                    offsets.push(at);
                }
                let data: ArrayRef = Arc::new(BinaryArray::try_new(
                    OffsetBuffer::new(ScalarBuffer::from(offsets)),
                    values,
                    None,
                )?);
                let meta = job.batch.slice(run.rows.start + first, end - first);
                out.push(self.output(&meta, Some(&data))?);
                first = end;
            }
        }
        self.cache_hits
            .add(job.plan.runs.iter().map(|r| r.rows.len()).sum());
        Ok(out)
    }

    /// Checks every extent's crc32c and cuts the read into output batches
    /// whose `data` values buffer is `values` itself (each checked object
    /// also enters the node's cache). CPU work: runs on the blocking pool
    /// while the next read is in flight.
    fn assemble(&self, job: &ReadJob, values: Buffer) -> DFResult<Vec<RecordBatch>> {
        let (plan, batch, extents) = (&job.plan, &job.batch, &job.extents);
        let crcs = batch
            .column(self.read_schema.index_of(CRC32C)?)
            .as_primitive::<UInt32Type>();
        let cache = self.version.store.cache();
        let mut out = Vec::with_capacity(plan.runs.len());
        for run in &plan.runs {
            let mut offsets = Vec::with_capacity(run.rows.len() + 1);
            for r in run.rows.clone() {
                let (start, len) = extents[r];
                let from = (start - plan.offset) as usize;
                let object = &values.as_slice()[from..from + len as usize];
                let actual = crc32c::crc32c(object);
                if actual != crcs.value(r) {
                    return Err(StorageError::ChecksumMismatch {
                        dataset: self.version.record.dataset.clone(),
                        version: self.version.record.version,
                        key: self.key_at(batch, r),
                        expected: crcs.value(r),
                        actual,
                    }
                    .into());
                }
                cache.insert(
                    ObjectKey {
                        offset: start,
                        len,
                        crc: actual,
                    },
                    object,
                );
                offsets.push(from as i32);
            }
            let (last_start, last_len) = extents[run.rows.end - 1];
            offsets.push((last_start + last_len - plan.offset) as i32);
            // The values buffer is the read buffer itself: no copy.
            let data: ArrayRef = Arc::new(BinaryArray::try_new(
                OffsetBuffer::new(ScalarBuffer::from(offsets)),
                values.clone(),
                None,
            )?);
            let meta = batch.slice(run.rows.start, run.rows.len());
            out.push(self.output(&meta, Some(&data))?);
        }
        Ok(out)
    }
}

fn apply_filter(
    filter: &Option<Arc<dyn PhysicalExpr>>,
    batch: RecordBatch,
) -> DFResult<RecordBatch> {
    let Some(filter) = filter else {
        return Ok(batch);
    };
    let mask = filter.evaluate(&batch)?.into_array(batch.num_rows())?;
    let Some(mask) = mask.as_boolean_opt() else {
        return exec_err!("filter did not evaluate to a boolean: {}", mask.data_type());
    };
    Ok(filter_record_batch(&batch, mask)?)
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
        let filter = self.filter.clone();
        let batches = match &self.parts {
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
        };
        let meta = batches
            .map(move |b| b.and_then(|b| apply_filter(&filter, b)))
            .scan(self.fetch, |remaining, b| {
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
            .try_filter(|b| futures::future::ready(b.num_rows() > 0));

        let schema = Arc::clone(&self.projected_schema);
        if !self.wants_data() {
            let out = meta.and_then(move |b| futures::future::ready(scan.output(&b, None)));
            return Ok(Box::pin(RecordBatchStreamAdapter::new(schema, out)));
        }
        // Each job is a read (I/O only; a semaphore keeps `depth` in flight)
        // followed by crc checks and batch assembly on the blocking pool.
        // Two jobs more than `depth` are polled, so verifying one read
        // overlaps the next reads; `buffered` keeps the output in row order.
        let depth = self.options.reads_in_flight.max(1);
        let permits = Arc::new(tokio::sync::Semaphore::new(depth));
        let reader = Arc::clone(&scan);
        let out = meta
            .map(move |b| match b.and_then(|b| scan.reads_for(b)) {
                Ok(jobs) => stream::iter(jobs.into_iter().map(Ok)).left_stream(),
                Err(e) => stream::iter(vec![Err(e)]).right_stream(),
            })
            .flatten()
            .map(move |job: DFResult<ReadJob>| {
                let (reader, permits) = (Arc::clone(&reader), Arc::clone(&permits));
                async move { reader.fetch(job?, permits, true).await }
            })
            .buffered(depth + 2)
            .map_ok(|batches| stream::iter(batches.into_iter().map(Ok)))
            .try_flatten();
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
