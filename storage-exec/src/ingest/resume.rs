//! Resuming a failed ingest from an object store: what an earlier run
//! fetched and verified is not downloaded again.
//!
//! An ingest that fails commits nothing: its version is never visible.
//! When its source is an object store, the objects it already fetched,
//! probed, checksummed and wrote are still worth having, because a run of
//! 20,000 objects that an outage of the store stops at 19,000 should not
//! fetch 19,000 again. So a failed ingest from a store flushes what it
//! wrote and keeps a *resume record* in the catalog (tables `resumes` and
//! `resume_chunks`, `crate::resume_tables`; one per dataset): the source it read (with the storage node's share), the
//! chunk runs it filled, and for every object written its key, its
//! identity in the store (location, size, range, and the version stamp its
//! listing gave: ETag and last-modified time), its extent, crc32c
//! and probe. The record owns those chunks (the allocator at open counts
//! them used), but no version names them, so nothing of it is listed or
//! readable.
//!
//! The next ingest of that dataset from the same source takes every entry
//! whose key and identity match a kept object as that object, with no
//! request sent for it, and fetches the rest. Its version's runs are the
//! record's plus its own, and its commit deletes the record in the same
//! catalog transaction (`resume_tables::take_in`). An object whose identity differs
//! (written in the store since: another size, ETag or time) is fetched
//! again. A manifest's row, which is never listed, is never kept, since
//! nothing could prove it unchanged without a request of its own.
//!
//! A record is dropped and its chunks freed when the dataset's next
//! ingest commits (from whatever source), when a failed run from another
//! source replaces it, and by `sluice gc`. A process that dies mid-ingest
//! keeps no record: its chunks are free again at the next open, as
//! before.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use redb::ReadableDatabase;
use sluice_udfs::probe::Probe;

use super::entries::{Entry, KeptObject, Origin};
use super::writer::{Extent, ExtentWriter};
use crate::alloc::ChunkRun;
use crate::catalog::Catalog;
use crate::error::{Result, StorageError};
use crate::resume_tables::{RESUME_CHUNKS, RESUMES, remove_runs};
use crate::space::Reservation;
use crate::store::Store;

/// What a failed ingest kept (see the module docs). Its runs are kept
/// apart, in `resume_chunks`, where the catalog counts them.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Record {
    /// The source, as the version's record would name it.
    source: String,
    objects: Vec<KeptObject>,
    /// The chunks its objects are in.
    #[serde(skip)]
    runs: Vec<ChunkRun>,
}

/// `dataset`'s record, if a failed run left one.
fn record(catalog: &Catalog, dataset: &str) -> Result<Option<Record>> {
    let txn = catalog.db().begin_read().map_err(|e| catalog.err(e))?;
    let table = txn.open_table(RESUMES).map_err(|e| catalog.err(e))?;
    let Some(value) = table.get(dataset).map_err(|e| catalog.err(e))? else {
        return Ok(None);
    };
    let mut record: Record = catalog.decode(value.value())?;
    let chunks = txn.open_table(RESUME_CHUNKS).map_err(|e| catalog.err(e))?;
    for entry in chunks
        .range((dataset, 0)..=(dataset, u64::MAX))
        .map_err(|e| catalog.err(e))?
    {
        let (k, v) = entry.map_err(|e| catalog.err(e))?;
        record.runs.push(ChunkRun {
            start: k.value().1,
            count: v.value(),
        });
    }
    Ok(Some(record))
}

/// Writes `dataset`'s record, durably, in place of any before it; returns
/// the runs of the one before that this one does not hold.
fn save(catalog: &Catalog, dataset: &str, record: &Record) -> Result<Vec<ChunkRun>> {
    let bytes = serde_json::to_vec(record).map_err(|e| catalog.err(e))?;
    let txn = catalog.db().begin_write().map_err(|e| catalog.err(e))?;
    let before = {
        let mut table = txn.open_table(RESUMES).map_err(|e| catalog.err(e))?;
        table
            .insert(dataset, bytes.as_slice())
            .map_err(|e| catalog.err(e))?;
        let mut chunks = txn.open_table(RESUME_CHUNKS).map_err(|e| catalog.err(e))?;
        let before = remove_runs(&mut chunks, dataset).map_err(|e| catalog.err(e))?;
        for run in &record.runs {
            chunks
                .insert((dataset, run.start), run.count)
                .map_err(|e| catalog.err(e))?;
        }
        before
    };
    txn.commit().map_err(|e| catalog.err(e))?;
    Ok(before
        .into_iter()
        .filter(|r| !record.runs.contains(r))
        .collect())
}

/// What an object of a store is, as far as a re-run can tell without
/// asking the store: its location, size, range and version stamp. `None`
/// for everything else (a local file needs no download; a manifest's row
/// was not listed, so nothing proves it unchanged).
fn identity(origin: &Origin) -> Option<String> {
    match origin {
        Origin::Object {
            location,
            size,
            range,
            stamp: Some(tag),
            ..
        } => Some(format!("{location} {size:?} {range:?} {tag}")),
        Origin::ObjectCell {
            location,
            size,
            row_group,
            row,
            stamp: Some(tag),
            ..
        } => Some(format!("{location} {size} {row_group}/{row} {tag}")),
        _ => None,
    }
}

/// One run of an ingest, as far as resuming goes: the record an earlier
/// run left (used when it read the same source), and what this run
/// writes of the objects it could keep.
pub(super) struct Resume {
    source: String,
    /// Each entry's identity, by source row (empty: not a store's source).
    identities: Vec<Option<String>>,
    /// The earlier run's record, when it read this source.
    prior: Option<Record>,
    /// What this run wrote or took over, in source order.
    kept: Vec<KeptObject>,
    /// Objects taken from the earlier run, and their bytes.
    resumed: (u64, u64),
}

impl Resume {
    /// [`Resume::read`] on the blocking pool (the record of a large
    /// source is megabytes of JSON): `entries` back, marked.
    pub(super) async fn start(
        store: &Arc<Store>,
        dataset: &str,
        source: &str,
        remote: bool,
        mut entries: Vec<Entry>,
    ) -> Result<(Vec<Entry>, Self)> {
        let (store, dataset, source) = (Arc::clone(store), dataset.to_owned(), source.to_owned());
        tokio::task::spawn_blocking(move || {
            let this = Self::read(store.catalog(), &dataset, &source, remote, &mut entries)?;
            Ok((entries, this))
        })
        .await
        .map_err(|e| StorageError::io("resume", ".", std::io::Error::other(e)))?
    }

    /// Reads `dataset`'s record and marks each of `entries` that it holds
    /// as [`Origin::Kept`]. Only a source in an object store (`remote`)
    /// is resumed.
    fn read(
        catalog: &Catalog,
        dataset: &str,
        source: &str,
        remote: bool,
        entries: &mut [Entry],
    ) -> Result<Self> {
        let mut this = Self {
            source: source.to_owned(),
            identities: Vec::new(),
            prior: None,
            kept: Vec::new(),
            resumed: (0, 0),
        };
        if !remote {
            return Ok(this);
        }
        this.identities = entries.iter().map(|e| identity(&e.origin)).collect();
        match record(catalog, dataset)? {
            Some(r) if r.source == source => {
                let by_key: HashMap<&str, &KeptObject> =
                    r.objects.iter().map(|o| (o.key.as_str(), o)).collect();
                for (entry, id) in entries.iter_mut().zip(&this.identities) {
                    let Some(kept) = id.as_ref().and_then(|id| {
                        by_key.get(entry.key.as_str()).filter(|k| &k.identity == id)
                    }) else {
                        continue;
                    };
                    this.resumed.0 += 1;
                    this.resumed.1 += kept.extent.length;
                    entry.origin = Origin::Kept(Box::new((*kept).clone()));
                }
                tracing::info!(
                    "dataset '{dataset}': {} objects ({} bytes) are on the device from the failed \
                     run before; fetching the other {}",
                    this.resumed.0,
                    this.resumed.1,
                    entries.len() as u64 - this.resumed.0
                );
                this.prior = Some(r);
            }
            // Another source's: freed when this run commits or keeps
            // a record of its own.
            _ => {}
        }
        Ok(this)
    }

    /// Notes the object of source row `row`, accepted at `extent`.
    pub(super) fn accepted(
        &mut self,
        row: u64,
        key: &str,
        probe: &Probe,
        extent: &Extent,
        crc: u32,
    ) {
        let Some(Some(identity)) = self.identities.get(row as usize) else {
            return;
        };
        self.kept.push(KeptObject {
            key: key.to_owned(),
            identity: identity.clone(),
            extent: *extent,
            crc,
            probe: probe.clone(),
        });
    }

    /// Objects taken from the earlier run, and their bytes.
    pub(super) fn resumed(&self) -> (u64, u64) {
        self.resumed
    }

    /// The chunks the version takes over from the earlier run's record:
    /// all of it, when this run resumed it.
    pub(super) fn prior_runs(&self) -> Vec<ChunkRun> {
        self.prior
            .as_ref()
            .map(|r| r.runs.clone())
            .unwrap_or_default()
    }

    /// What a record of this run holds once its objects are in `runs`
    /// (with what the earlier run kept and this one did not reach); `None`
    /// when there is nothing to keep.
    pub(super) fn into_kept(mut self, runs: Vec<ChunkRun>) -> Option<Kept> {
        if self.identities.is_empty() {
            return None;
        }
        if let Some(prior) = self.prior.take() {
            let reached: HashSet<String> = self.kept.iter().map(|k| k.key.clone()).collect();
            self.kept.extend(
                prior
                    .objects
                    .into_iter()
                    .filter(|o| !reached.contains(&o.key)),
            );
        }
        if self.kept.is_empty() {
            return None;
        }
        Some(Kept(Record {
            source: self.source,
            objects: self.kept,
            runs,
        }))
    }

    /// This run failed with `error`: what it wrote is flushed and kept in
    /// the record for the next, and `error` is returned. Nothing is kept
    /// when the flush itself fails.
    pub(super) async fn keep_failed(
        self,
        store: &Arc<Store>,
        dataset: &str,
        writer: ExtentWriter,
        error: StorageError,
    ) -> StorageError {
        if self.identities.is_empty() {
            return error;
        }
        let (runs, reservation) = match writer.finish().await {
            Ok(done) => done,
            Err(e) => {
                tracing::warn!("dataset '{dataset}': nothing kept for a re-run: {e}");
                return error;
            }
        };
        let mut all_runs = self.prior_runs();
        all_runs.extend(runs);
        if let Some(kept) = self.into_kept(all_runs) {
            // On the blocking pool: JSON and a durable catalog write.
            let (store, dataset) = (Arc::clone(store), dataset.to_owned());
            let saved = tokio::task::spawn_blocking(move || {
                kept.save(&store, &dataset, reservation, "the ingest failed");
            });
            if let Err(e) = saved.await {
                tracing::warn!("nothing kept for a re-run: {e}");
            }
        }
        error
    }
}

/// A run's objects, to keep for the next run if its version is not
/// committed: after its failure, or when its prepared version is dropped
/// (a peer's part failed on a cluster).
pub(crate) struct Kept(Record);

impl Kept {
    /// Saves the record in place of any before it, and keeps
    /// `reservation`'s chunks (now the record's); frees the runs of the
    /// record before that this one does not hold. Whatever fails, the
    /// ingest's own error stands: this only logs.
    pub(super) fn save(self, store: &Store, dataset: &str, reservation: Reservation, why: &str) {
        let (objects, bytes) = (
            self.0.objects.len(),
            self.0.objects.iter().map(|k| k.extent.length).sum::<u64>(),
        );
        match save(store.catalog(), dataset, &self.0) {
            Ok(freed) => {
                reservation.keep();
                store.space_map().release(&freed);
                tracing::warn!(
                    "dataset '{dataset}': {why}; {objects} objects ({bytes} bytes) it verified \
                     are kept for a re-run from the same source"
                );
            }
            Err(e) => tracing::warn!("dataset '{dataset}': nothing kept for a re-run: {e}"),
        }
    }
}
