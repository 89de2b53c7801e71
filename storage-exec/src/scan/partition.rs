//! One partition of an [`ExtentSource`](super::ExtentSource)'s scan: its
//! metadata row groups read ([`read_row_group`]), filtered
//! ([`apply_filter`]), and, where `data` is projected, its device reads
//! planned, issued, checked against their crc32c and cut into output
//! batches over the read buffers, or served from the object cache
//! ([`PartitionScan`]).

use std::fs::File;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BinaryArray, RecordBatch, RecordBatchOptions};
use arrow::buffer::{Buffer, OffsetBuffer, ScalarBuffer};
use arrow::compute::filter_record_batch;
use arrow::datatypes::{SchemaRef, UInt32Type, UInt64Type};
use datafusion::common::{DataFusionError, exec_err};
use datafusion::error::Result as DFResult;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::metrics::Count;
use futures::{Stream, StreamExt, TryStreamExt, stream};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use super::options::ScanOptions;
use super::reads::{ReadPlan, plan_reads};
use super::version::DatasetVersion;
use crate::cache::{Miss, ObjectKey};
use crate::device::DeviceExt;
use crate::error::StorageError;
use crate::metadata::{CHUNK, CRC32C, KEY, LENGTH, OFFSET};

/// Where an output column comes from.
#[derive(Debug, Clone, Copy)]
pub(super) enum OutCol {
    /// Position in the metadata batch read (the slot of a take is the
    /// last one).
    Meta(usize),
    /// The `data` column.
    Data,
}

/// A cached object this large (64 KiB) is served as a batch of its own
/// over the cached bytes rather than copied beside its neighbours: past
/// it, the copy costs more than a batch does (~10 µs through a plan).
pub const SHARED_OBJECT: usize = 64 << 10;

/// Reads one row group of the metadata file (blocking).
pub(super) fn read_row_group(
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
pub(super) struct PartitionScan {
    pub(super) version: Arc<DatasetVersion>,
    pub(super) read_schema: SchemaRef,
    pub(super) projected_schema: SchemaRef,
    pub(super) out: Vec<OutCol>,
    pub(super) options: ScanOptions,
    pub(super) batch_size: usize,
    pub(super) reads: Count,
    pub(super) read_bytes: Count,
    pub(super) cache_hits: Count,
}

/// One device read and the metadata rows it serves.
struct ReadJob {
    plan: ReadPlan,
    batch: Arc<RecordBatch>,
    extents: Arc<Vec<(u64, u64)>>,
}

impl PartitionScan {
    /// The output of metadata batches `meta` that project `data`: each
    /// becomes its device reads (I/O only; a semaphore keeps
    /// `reads_in_flight` of them in flight), each followed by crc checks
    /// and batch assembly on the blocking pool. Two reads more than that
    /// are polled, so verifying one read overlaps the next reads;
    /// `buffered` keeps the output in row order.
    pub(super) fn with_data(
        self: Arc<Self>,
        meta: impl Stream<Item = DFResult<RecordBatch>> + Send + 'static,
    ) -> impl Stream<Item = DFResult<RecordBatch>> + Send + 'static {
        let depth = self.options.reads_in_flight.max(1);
        let permits = Arc::new(tokio::sync::Semaphore::new(depth));
        let reader = Arc::clone(&self);
        meta.map(move |b| match b.and_then(|b| self.reads_for(b)) {
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
        .try_flatten()
    }

    /// An output batch: metadata columns from `meta`, `data` if given.
    pub(super) fn output(
        &self,
        meta: &RecordBatch,
        data: Option<&ArrayRef>,
    ) -> DFResult<RecordBatch> {
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

pub(super) fn apply_filter(
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
