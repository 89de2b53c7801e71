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
use sluice_planner::fragment::{DatasetScanExec, Take};
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
                copy.append(
                    &batch.map_err(StorageError::DataFusion)?,
                    Checked::ByTheScan,
                )
                .await?;
            }
        }
        let mut sent = std::pin::pin!(sent);
        while let Some(batch) = sent.next().await {
            let batch = batch.map_err(|e| StorageError::BadSource {
                path: req.from.clone().into(),
                reason: format!("the rows sent ended with an error: {e}"),
            })?;
            copy.append(&batch, Checked::Here).await?;
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
            requests: None,
            kept: None,
        })
        .await?;
        let out = prepared.part();
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

/// Where a batch's objects are checked against their crc32c.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Checked {
    /// Rows sent: on arrival, here.
    Here,
    /// Rows kept: the take scan that read them checked each one.
    ByTheScan,
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
    /// Writes `batch`'s objects and keeps its metadata, pointing at their
    /// new extents; each object is checked against its crc32c here, or
    /// was by the scan that read it from this node's device.
    async fn append(&mut self, batch: &RecordBatch, checked: Checked) -> Result<()> {
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
            if checked == Checked::Here && crc32c::crc32c(bytes) != crcs.value(i) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scan::ScanOptions;
    use crate::{IngestOptions, IngestSource, OnError, Store, StoreOptions};
    use arrow::array::BinaryArray;
    use futures::TryStreamExt;
    use sluice_udfs::kernels::npy::{self, DType};

    fn object(i: u8) -> Vec<u8> {
        npy::write(DType::U8, &[64], &[i; 64])
    }

    async fn node(dir: &std::path::Path, objects: u8) -> Arc<StorageNode> {
        let mut opts = StoreOptions::new(dir);
        opts.device_size = 16 << 20;
        opts.chunk_size = 1 << 20;
        let store = Store::open(&opts).unwrap();
        if objects > 0 {
            let src = (1..=objects)
                .map(|i| (format!("o{i}"), object(i)))
                .collect();
            crate::ingest(
                &store,
                "ds",
                IngestSource::Memory(src),
                IngestOptions::with_policy(OnError::Fail),
            )
            .await
            .unwrap();
        }
        StorageNode::new(store, ScanOptions::default(), 1, None).unwrap()
    }

    fn copy(txn: &str, keep: Option<u64>, drop: Vec<u32>) -> CopyIn {
        CopyIn {
            txn: txn.into(),
            dataset: "ds".into(),
            keep,
            drop,
            from: "a test".into(),
        }
    }

    /// (key, bytes) of every row of `version` on `node`.
    async fn rows(node: &StorageNode, version: u64) -> Vec<(String, Vec<u8>)> {
        let batches: Vec<RecordBatch> = node
            .kept_rows("ds", version, &[])
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        let mut out = Vec::new();
        for b in &batches {
            let keys = b.column(0).as_string::<i32>();
            let data = b.column(b.num_columns() - 1).as_binary::<i32>();
            for i in 0..b.num_rows() {
                out.push((keys.value(i).to_string(), data.value(i).to_vec()));
            }
        }
        out.sort();
        out
    }

    fn sent(
        batches: Vec<RecordBatch>,
    ) -> impl Stream<Item = std::result::Result<RecordBatch, String>> + Send {
        futures::stream::iter(batches.into_iter().map(Ok))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_copy_keeps_what_it_is_told_and_refuses_bytes_that_are_not_the_rows() {
        let dir = tempfile::tempdir().unwrap();
        let a = node(&dir.path().join("a"), 4).await;
        let b = node(&dir.path().join("b"), 0).await;
        let all: Vec<RecordBatch> = a
            .kept_rows("ds", 1, &[])
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();

        // b, holding nothing, takes every row a sends.
        let got = b
            .prepare_copy(&copy("t1", None, vec![]), sent(all.clone()))
            .await;
        assert_eq!(got.unwrap().samples, 4);
        b.finish_part("t1", true).await.unwrap().unwrap();
        assert_eq!(rows(&b, 1).await, rows(&a, 1).await);

        // a keeps its version less rows 0 and 2, sent nothing.
        let got = a
            .prepare_copy(&copy("t2", Some(1), vec![0, 2]), sent(vec![]))
            .await;
        assert_eq!(got.unwrap().samples, 2);
        a.finish_part("t2", true).await.unwrap().unwrap();
        let kept = rows(&a, 2).await;
        assert_eq!(kept, [("o2".into(), object(2)), ("o4".into(), object(4))]);

        // A row whose bytes are not the ones its crc32c names: refused,
        // naming it, and nothing held.
        let first = &all[0];
        let data_at = first.num_columns() - 1;
        let mut bad: Vec<Vec<u8>> = (0..first.num_rows())
            .map(|i| first.column(data_at).as_binary::<i32>().value(i).to_vec())
            .collect();
        bad[0][70] ^= 1;
        let mut cols = first.columns().to_vec();
        cols[data_at] = Arc::new(BinaryArray::from_iter_values(bad));
        let corrupt = RecordBatch::try_new(first.schema(), cols).unwrap();
        let err = b
            .prepare_copy(&copy("t3", Some(1), vec![]), sent(vec![corrupt]))
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("do not match their crc32c"),
            "{err}"
        );
        // Its kept rows come first: the key sent twice is refused too.
        let err = b
            .prepare_copy(&copy("t4", Some(1), vec![]), sent(all.clone()))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("sent twice"), "{err}");
        // Rows without `data` are not a table's rows.
        let keys_only = first.project(&[0]).unwrap();
        let err = b
            .prepare_copy(&copy("t5", None, vec![]), sent(vec![keys_only]))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("must be the table's"), "{err}");
        assert!(b.pending.is_empty());
        assert_eq!(b.store().catalog().latest_version("ds").unwrap(), Some(1));

        // Retired: gone, its chunks free, its number never given again.
        let free = a.store().space().free_chunks;
        let r = a
            .retire(&Retire {
                dataset: "ds".into(),
                through: Some(1),
            })
            .unwrap();
        assert_eq!(r.versions, [1]);
        assert!(a.store().space().free_chunks > free);
        assert_eq!(rows(&a, 2).await, kept);
        a.retire(&Retire {
            dataset: "ds".into(),
            through: None,
        })
        .unwrap();
        assert!(a.list().unwrap().is_empty());
        let got = a.prepare_copy(&copy("t6", None, vec![]), sent(all)).await;
        assert_eq!(got.unwrap().version, 3);
    }
}
