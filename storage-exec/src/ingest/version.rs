//! The last step of every way a version is written (an ingest of a
//! source, a copy of rows from another node): its metadata file written
//! and made durable, and the version held as [`Prepared`], to be
//! committed.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use tokio::sync::OwnedMutexGuard;

use super::{IngestReport, Prepared, Skipped};
use crate::alloc::ChunkRun;
use crate::catalog::VersionRecord;
use crate::error::{Result, StorageError};
use crate::layout::{META_DIR, sync_dir};
use crate::metadata::write_metadata;
use crate::space::Reservation;
use crate::store::Store;

/// A version whose objects are on the device, and its metadata rows.
pub(super) struct Sealing {
    pub store: Arc<Store>,
    /// The store's ingest lock, held until the version is committed or
    /// dropped.
    pub guard: OwnedMutexGuard<()>,
    pub dataset: String,
    pub version: u64,
    /// The metadata schema, and its rows (one per sample).
    pub schema: SchemaRef,
    pub batches: Vec<RecordBatch>,
    /// The chunks the objects fill.
    pub runs: Vec<ChunkRun>,
    pub reservation: Reservation,
    /// Where the rows came from, for the version's record.
    pub source: String,
    /// Object bytes.
    pub bytes: u64,
    pub skipped: Vec<Skipped>,
    /// The user columns, by name.
    pub columns: Vec<String>,
    pub started: Instant,
    /// The store's requests and retries, for an object-store source.
    pub requests: Option<super::objects::Counts>,
    /// What to keep for a re-run if the version is dropped uncommitted
    /// (`super::resume`).
    pub kept: Option<super::resume::Kept>,
}

/// Writes `s`'s metadata to `meta/<dataset>/v<N>.parquet` (temp file,
/// fsync, rename, fsync of the directory) and holds the version
/// uncommitted.
pub(super) async fn seal(s: Sealing) -> Result<Prepared> {
    let samples: u64 = s.batches.iter().map(|b| b.num_rows() as u64).sum();
    let rel = PathBuf::from(META_DIR)
        .join(&s.dataset)
        .join(format!("v{}.parquet", s.version));
    let path = s.store.metadata_path(&rel);
    let meta_dir = path.parent().unwrap_or(s.store.data_dir()).to_owned();
    let tmp = path.with_extension("parquet.tmp");
    let (tmp2, path2, dir2, schema, batches) = (
        tmp.clone(),
        path.clone(),
        meta_dir.clone(),
        s.schema,
        s.batches,
    );
    tokio::task::spawn_blocking(move || -> Result<()> {
        std::fs::create_dir_all(&dir2).map_err(|e| StorageError::io("create", &dir2, e))?;
        write_metadata(&tmp2, schema, &batches)?;
        std::fs::rename(&tmp2, &path2).map_err(|e| StorageError::io("rename", &tmp2, e))?;
        sync_dir(&dir2)
    })
    .await
    .map_err(|e| StorageError::io("write metadata", &tmp, std::io::Error::other(e)))??;

    let chunks = s.runs.iter().map(|r| r.count).sum();
    let record = VersionRecord {
        dataset: s.dataset.clone(),
        version: s.version,
        created_unix_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or_default(),
        samples,
        bytes: s.bytes,
        skipped: s.skipped.len() as u64,
        metadata_file: rel,
        runs: s.runs,
        source: s.source,
    };
    let report = IngestReport {
        dataset: s.dataset,
        version: s.version,
        samples,
        bytes: s.bytes,
        chunks,
        skipped: s.skipped,
        columns: s.columns,
        seconds: s.started.elapsed().as_secs_f64(),
        requests: s.requests,
    };
    Ok(Prepared::new(
        s.store,
        record,
        (s.reservation, s.kept),
        path,
        report,
        s.guard,
    ))
}
