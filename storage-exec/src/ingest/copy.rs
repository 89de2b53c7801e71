//! A storage node's side of moving replicas (`sluice_flight::copy`): a
//! new version of a dataset written from the rows of one of its own
//! versions it keeps and the rows another holder sends, held uncommitted
//! under the coordinator's transaction like an ingest part; and the
//! retirement of versions it no longer needs.
//!
//! The rows it keeps are read from its own device by a take of its
//! version (every row but those dropped), as a job reads them, each
//! checked against its crc32c; the rows sent are checked the same way
//! against the crc32c they carry. Both are written afresh into new chunks:
//! a version owns its chunks, so a new version shares none with the one
//! it replaces (which stays, for the jobs that pin it, until retired).
//! Memory holds one batch of objects and the new version's metadata.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, UInt64Array};
use arrow::datatypes::{DataType, Schema, SchemaRef, UInt32Type};
use futures::{Stream, StreamExt};
use sluice_flight::copy::{CopyIn, Retire, Retired};
use sluice_flight::ingest::PreparedPart;
use sluice_flight::{DatasetScanExec, Take};
use sluice_udfs::UdfEnv;

use super::version::{Sealing, seal};
use super::{ExtentWriter, validate_dataset_name};
use crate::error::{Result, StorageError};
use crate::metadata::{CHUNK, CRC32C, DATA, KEY, LENGTH, OFFSET, RESERVED};
use crate::node::StorageNode;

impl StorageNode {
    /// Writes the new version `req` describes from the rows of `req.keep`
    /// not dropped and the rows of `sent` (the dataset's table schema),
    /// and holds it under `req.txn` (see the module docs).
    pub async fn prepare_copy<S, E>(&self, req: &CopyIn, sent: S) -> Result<PreparedPart>
    where
        S: Stream<Item = std::result::Result<RecordBatch, E>> + Send,
        E: std::fmt::Display,
    {
        validate_dataset_name(&req.dataset)?;
        let started = Instant::now();
        let store = Arc::clone(self.store());
        let guard = store.lock_ingest_owned().await;
        let version = store.catalog().next_version(&req.dataset)?;
        let mut copy = Copier {
            dataset: req.dataset.clone(),
            writer: ExtentWriter::new(
                Arc::clone(store.device()),
                store.space_map().reserve(),
                store.chunk_size(),
                &req.dataset,
            ),
            schema: None,
            batches: Vec::new(),
            keys: HashSet::new(),
            bytes: 0,
        };
        if let Some(keep) = req.keep {
            let kept = self.kept_rows(&req.dataset, keep, &req.drop).await?;
            let mut kept = std::pin::pin!(kept);
            while let Some(batch) = kept.next().await {
                copy.append(&batch.map_err(StorageError::DataFusion)?)
                    .await?;
            }
        }
        let mut sent = std::pin::pin!(sent);
        while let Some(batch) = sent.next().await {
            let batch = batch.map_err(|e| StorageError::BadSource {
                path: req.from.clone().into(),
                reason: format!("the rows sent ended with an error: {e}"),
            })?;
            copy.append(&batch).await?;
        }
        let Some(schema) = copy.schema.take() else {
            return Err(StorageError::EmptyIngest(req.dataset.clone()));
        };
        let (runs, reservation) = copy.writer.finish().await?;
        let columns = schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .filter(|n| n != KEY && !RESERVED.contains(&n.as_str()))
            .collect();
        let source = match req.keep {
            Some(v) => format!(
                "version {v} of this node less {} rows, and {}",
                req.drop.len(),
                req.from
            ),
            None => req.from.clone(),
        };
        let prepared = seal(Sealing {
            store,
            guard,
            dataset: req.dataset.clone(),
            version,
            schema,
            batches: copy.batches,
            runs,
            reservation,
            source,
            bytes: copy.bytes,
            skipped: Vec::new(),
            columns,
            started,
        })
        .await?;
        let report = prepared.report();
        let out = PreparedPart {
            version: report.version,
            samples: report.samples,
            bytes: report.bytes,
        };
        tracing::info!(
            "move {}: prepared {} version {} ({} samples) from {}",
            req.txn,
            req.dataset,
            out.version,
            out.samples,
            req.from
        );
        self.pending.hold(&req.txn, prepared)?;
        Ok(out)
    }

    /// The rows of `version` of `dataset` but those of `drop`, every
    /// table column, read from this node's device.
    async fn kept_rows(
        &self,
        dataset: &str,
        version: u64,
        drop: &[u32],
    ) -> Result<datafusion::execution::SendableRecordBatchStream> {
        let record = self.store().catalog().version(dataset, Some(version))?;
        let drop: HashSet<u32> = drop.iter().copied().collect();
        let rows: Arc<[u32]> = (0..record.samples as u32)
            .filter(|r| !drop.contains(r))
            .collect();
        let schema = self
            .table_schema(&format!("{dataset}@{version}"))
            .map_err(|e| StorageError::BadSource {
                path: dataset.into(),
                reason: e.to_string(),
            })?;
        let scan = DatasetScanExec::new(
            dataset.to_string(),
            Some((0..schema.fields().len()).collect()),
            Vec::new(),
            None,
            Arc::clone(&schema),
        )
        .with_take(Some(Take {
            version,
            slots: Arc::clone(&rows),
            rows: Some(rows),
        }));
        let udfs = UdfEnv::new(Default::default());
        let ctx = self.session(&udfs);
        let plan = self
            .bind(&ctx, Arc::new(scan))
            .await
            .map_err(|e| StorageError::BadSource {
                path: dataset.into(),
                reason: e.to_string(),
            })?;
        Ok(self.run(plan, &ctx, &udfs))
    }

    /// Deletes the versions `req` names; their chunks are free at once,
    /// their metadata files removed, and what this node had cached of them
    /// forgotten.
    pub fn retire(&self, req: &Retire) -> Result<Retired> {
        let store = self.store();
        let gone = store.catalog().retire(&req.dataset, req.through)?;
        let runs: Vec<_> = gone.iter().flat_map(|v| v.runs.iter().copied()).collect();
        store.space_map().release(&runs);
        self.forget(&req.dataset);
        for v in &gone {
            let path = store.metadata_path(&v.metadata_file);
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(
                    "retired {} version {}: cannot remove {} ({e}); `sluice gc` removes it",
                    v.dataset,
                    v.version,
                    path.display()
                );
            }
        }
        let out = Retired {
            versions: gone.iter().map(|v| v.version).collect(),
            bytes: gone.iter().map(|v| v.bytes).sum(),
            chunks: runs.iter().map(|r| r.count).sum(),
        };
        tracing::info!(
            "retired {} versions {:?}: {} bytes, {} chunks freed",
            req.dataset,
            out.versions,
            out.bytes,
            out.chunks
        );
        Ok(out)
    }
}

/// The new version being written.
struct Copier {
    dataset: String,
    writer: ExtentWriter,
    /// The metadata schema (the table's less `data`), from the first
    /// batch; every later one must have it.
    schema: Option<SchemaRef>,
    batches: Vec<RecordBatch>,
    keys: HashSet<String>,
    bytes: u64,
}

impl Copier {
    /// Writes `batch`'s objects (each checked against its crc32c) and
    /// keeps its metadata, pointing at their new extents.
    async fn append(&mut self, batch: &RecordBatch) -> Result<()> {
        let schema = self.metadata_schema(batch.schema_ref())?;
        let at = |name: &str| schema.index_of(name).map_err(StorageError::Arrow);
        let (chunk, offset, length, crc) = (at(CHUNK)?, at(OFFSET)?, at(LENGTH)?, at(CRC32C)?);
        let data_at = batch.num_columns() - 1;
        let data = batch.column(data_at).as_binary::<i32>();
        let keys = batch.column(0).as_string::<i32>();
        let crcs = batch.column(crc).as_primitive::<UInt32Type>();
        let n = batch.num_rows();
        let (mut chunks, mut offsets, mut lengths) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        for i in 0..n {
            let key = keys.value(i);
            let bad = |reason: String| StorageError::BadSample {
                dataset: self.dataset.clone(),
                key: key.to_string(),
                reason,
            };
            if data.is_null(i) {
                return Err(bad("its object was not sent".into()));
            }
            let bytes = data.value(i);
            if crc32c::crc32c(bytes) != crcs.value(i) {
                return Err(bad("its bytes do not match their crc32c".into()));
            }
            if !self.keys.insert(key.to_string()) {
                return Err(bad(
                    "the key is sent twice (keys are unique within a version)".into(),
                ));
            }
            let extent = self.writer.append(bytes).await?;
            chunks.push(extent.chunk);
            offsets.push(extent.offset);
            lengths.push(extent.length);
            self.bytes += extent.length;
        }
        let mut columns: Vec<ArrayRef> = batch.columns()[..data_at].to_vec();
        columns[chunk] = Arc::new(UInt64Array::from(chunks));
        columns[offset] = Arc::new(UInt64Array::from(offsets));
        columns[length] = Arc::new(UInt64Array::from(lengths));
        self.batches
            .push(RecordBatch::try_new(Arc::clone(&schema), columns)?);
        Ok(())
    }

    /// The metadata schema of rows in `table` (the table schema: `key`,
    /// the metadata columns, then `data`), the same for every batch.
    fn metadata_schema(&mut self, table: &SchemaRef) -> Result<SchemaRef> {
        let fields = table.fields();
        let shaped = fields.first().is_some_and(|f| f.name() == KEY)
            && fields
                .last()
                .is_some_and(|f| f.name() == DATA && f.data_type() == &DataType::Binary);
        if !shaped {
            return Err(StorageError::BadSource {
                path: self.dataset.clone().into(),
                reason: format!(
                    "rows sent must be the table's ({KEY}, …, {DATA}); got {:?}",
                    fields.iter().map(|f| f.name()).collect::<Vec<_>>()
                ),
            });
        }
        let meta = Arc::new(Schema::new(fields[..fields.len() - 1].to_vec()));
        match &self.schema {
            None => {
                self.schema = Some(Arc::clone(&meta));
                Ok(meta)
            }
            Some(s) if same_columns(s, &meta) => Ok(Arc::clone(s)),
            Some(s) => Err(StorageError::BadSource {
                path: self.dataset.clone().into(),
                reason: format!(
                    "rows with other columns than the version's: {:?}, not {:?}",
                    meta.fields().iter().map(|f| f.name()).collect::<Vec<_>>(),
                    s.fields().iter().map(|f| f.name()).collect::<Vec<_>>()
                ),
            }),
        }
    }
}

/// Whether two schemas have the same columns (names and types; a
/// nullability the wire may have changed aside).
fn same_columns(a: &Schema, b: &Schema) -> bool {
    a.fields().len() == b.fields().len()
        && a.fields()
            .iter()
            .zip(b.fields())
            .all(|(x, y)| x.name() == y.name() && x.data_type() == y.data_type())
}
