//! The take scan: the rows a job asks for, by row id of a pinned dataset
//! version, in the order it wants them.
//!
//! ```text
//!  Take { version, rows, slots }                    VersionIndex (the version's metadata, in memory)
//!    └─ split into `partitions` contiguous parts ──► take(metadata, rows) + slot column
//!         per part, in request order: exact filters ─► plan_reads (neighbours coalesce)
//!           ─► device reads (bounded in flight) ─► crc32c ─► batches (zero-copy `data`)
//! ```
//!
//! A job resolves its samples once, at submit, into row ids of the version
//! it pins ([`Take::index`]: every row passing the filters, its slot being
//! its row id); after that, each window of an epoch names its rows, and
//! the node slices them out of the version's metadata held in memory —
//! no metadata scan, no key lookup: the cost of a window is the size of
//! the window, whatever the size of the dataset. The extents of rows that
//! follow each other on the device (block shuffle's runs, or an unshuffled
//! epoch) are read together by [`plan_reads`](super::plan_reads).
//!
//! A node keeps the metadata of the last few versions it served
//! ([`IndexCache`]); loading one reads its Parquet file once.

use std::collections::VecDeque;
use std::fs::File;
use std::sync::{Arc, Mutex};

use arrow::array::{ArrayRef, RecordBatch, UInt32Array};
use arrow::compute::{concat_batches, take_record_batch};
use arrow::datatypes::{Schema, SchemaRef};
use datafusion::error::Result as DFResult;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use sluice_planner::fragment::Take;

use super::version::DatasetVersion;
use crate::error::{Result, StorageError};

/// Versions whose metadata a node keeps in memory.
pub const INDEXES_KEPT: usize = 4;

/// A dataset version's metadata, every column, in memory.
#[derive(Debug)]
pub struct VersionIndex {
    /// One row per sample, in row-id order.
    pub metadata: RecordBatch,
}

impl VersionIndex {
    /// Reads the metadata file of `version` (blocking).
    pub fn load(version: &DatasetVersion) -> Result<Self> {
        let path = &version.metadata_path;
        let perr = |source| StorageError::Parquet {
            path: path.clone(),
            source,
        };
        let file = File::open(path).map_err(|e| StorageError::io("open metadata", path, e))?;
        let reader =
            ParquetRecordBatchReaderBuilder::new_with_metadata(file, version.parquet.clone())
                .with_batch_size(64 * 1024)
                .build()
                .map_err(perr)?;
        let batches = reader
            .map(|b| b.and_then(|b| b.with_schema(Arc::clone(&version.metadata_schema))))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| perr(e.into()))?;
        let metadata =
            concat_batches(&version.metadata_schema, &batches).map_err(|e| perr(e.into()))?;
        Ok(Self { metadata })
    }

    /// Rows in the version.
    pub fn rows(&self) -> usize {
        self.metadata.num_rows()
    }

    /// The metadata columns `read` of `rows`, with `slots` appended as the
    /// last column, under `schema` (the read schema plus the slot field).
    pub fn take(
        &self,
        read: &[usize],
        rows: &[u32],
        slots: &[u32],
        schema: &SchemaRef,
    ) -> DFResult<RecordBatch> {
        let projected = self.metadata.project(read)?;
        let indices = UInt32Array::from(rows.to_vec());
        let taken = take_record_batch(&projected, &indices)?;
        let mut columns: Vec<ArrayRef> = taken.columns().to_vec();
        columns.push(Arc::new(UInt32Array::from(slots.to_vec())));
        Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
    }
}

/// One partition of a take: its rows and their slots, in request order.
#[derive(Debug, Clone)]
pub struct TakePart {
    /// Row ids.
    pub rows: Arc<[u32]>,
    /// Their slots.
    pub slots: Arc<[u32]>,
}

/// Splits `take` over `index` into at most `partitions` contiguous parts,
/// refusing row ids the version does not have.
pub fn take_parts(
    take: &Take,
    index: &VersionIndex,
    dataset: &str,
    partitions: usize,
) -> Result<Vec<TakePart>> {
    let n = index.rows();
    let (rows, slots): (Arc<[u32]>, Arc<[u32]>) = match &take.rows {
        Some(rows) => {
            if let Some(&bad) = rows.iter().find(|&&r| r as usize >= n) {
                return Err(StorageError::RowOutOfRange {
                    dataset: dataset.to_string(),
                    version: take.version,
                    row: bad,
                    rows: n,
                });
            }
            (Arc::clone(rows), Arc::clone(&take.slots))
        }
        None => {
            let all: Arc<[u32]> = (0..n as u32).collect();
            (Arc::clone(&all), all)
        }
    };
    let parts = partitions.clamp(1, rows.len().max(1));
    Ok((0..parts)
        .map(|p| {
            let range = rows.len() * p / parts..rows.len() * (p + 1) / parts;
            TakePart {
                rows: Arc::from(&rows[range.clone()]),
                slots: Arc::from(&slots[range]),
            }
        })
        .collect())
}

/// The schema of a take's metadata batches: `read_schema` and the slot.
pub fn with_slot(read_schema: &Schema) -> SchemaRef {
    let mut fields: Vec<_> = read_schema.fields().iter().cloned().collect();
    fields.push(Arc::new(sluice_planner::fragment::slot_field()));
    Arc::new(Schema::new(fields))
}

type Slot = Arc<Mutex<Option<Arc<VersionIndex>>>>;

/// The version indexes of a node, the least recently used evicted past
/// [`INDEXES_KEPT`]. Concurrent first uses of a version load it once.
#[derive(Debug, Default)]
pub struct IndexCache {
    entries: Mutex<VecDeque<((String, u64), Slot)>>,
}

impl IndexCache {
    /// Forgets every version of `dataset` (retired: its numbers are never
    /// reused, but its memory is better given back).
    pub fn forget(&self, dataset: &str) {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|((d, _), _)| d != dataset);
    }

    /// The index of `version`, loaded on first use (blocking).
    pub fn get(&self, version: &DatasetVersion) -> Result<Arc<VersionIndex>> {
        let key = (version.record.dataset.clone(), version.record.version);
        let slot = {
            let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            let slot = match entries.iter().position(|(k, _)| *k == key) {
                Some(i) => entries.remove(i).map(|(_, s)| s).unwrap_or_default(),
                None => Slot::default(),
            };
            entries.push_front((key, Arc::clone(&slot)));
            entries.truncate(INDEXES_KEPT);
            slot
        };
        let mut loaded = slot.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(index) = loaded.as_ref() {
            return Ok(Arc::clone(index));
        }
        let index = Arc::new(VersionIndex::load(version)?);
        *loaded = Some(Arc::clone(&index));
        Ok(index)
    }
}
