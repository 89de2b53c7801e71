//! Resuming a failed ingest from an object store: what an earlier run
//! fetched and verified is not downloaded again.
//!
//! An ingest that fails commits nothing: its version is never visible.
//! When its source is an object store, the objects it already fetched,
//! probed, checksummed and wrote are still worth having, because a run of
//! 20,000 objects that an outage of the store stops at 19,000 should not
//! fetch 19,000 again. So a failed ingest from a store flushes what it
//! wrote and keeps a *resume record* in the catalog (tables `resumes`,
//! `resume_objects` and `resume_chunks`, `crate::resume_tables`; one per
//! dataset): the source it read (with the storage node's share), the
//! chunk runs it filled, and for every object written (a row of its own)
//! its key, its identity in the store (location, size, range, and the
//! version stamp its listing gave: ETag and last-modified time), its
//! extent, crc32c and probe. The record owns those chunks (the allocator
//! at open counts them used), but no version names them, so nothing of it
//! is listed or readable.
//!
//! The next ingest of that dataset from the same source takes every entry
//! whose key and identity match a kept object as that object, with no
//! request sent for it, and fetches the rest. Its version's runs are the
//! record's plus its own, and its commit deletes the record in the same
//! catalog transaction (`resume_tables::take_in`). An object whose
//! identity differs (written in the store since: another size, ETag or
//! time) is fetched again. A manifest's row is never listed: it is kept with the size and
//! stamp its GET answered, and the re-run sends a HEAD for it (a request,
//! but none of its bytes; 32 at once) and takes it when the two match.
//! (A conditional GET, `If-None-Match`, would fold the HEAD and a changed
//! object's GET into one request, but not every S3-compatible store
//! honours it on a GET: the S3 server the tests run does not.)
//!
//! A record is also kept *while* an ingest runs, so that a process killed
//! mid-ingest (`kill -9`, the OOM killer, a lost node) loses only its last
//! seconds: every [`KEEP_EVERY`] at least, and at least 20 times as long
//! as the last such save took (so keeping costs the ingest about 5% at
//! most, however many objects the record holds), the writer waits for its
//! writes and flushes the device ([`ExtentWriter::sync`]), and the record
//! is saved with every object that is now durable (all but those in the
//! chunk still being filled). The chunks it names are ceded by the
//! ingest's reservation to the record
//! ([`crate::space::Reservation::cede`]), so that
//! whatever ends the run, they stay allocated until a commit, a record
//! that replaces this one, or `sluice gc` lets them go; the allocator at
//! the next open counts them used. Chunks pass between owners chunk by
//! chunk ([`crate::alloc::subtract`]): a run that grew since the record
//! was saved is the same chunks and more.
//!
//! A record is dropped and its chunks freed when the dataset's next
//! ingest commits (from whatever source), when a failed run from another
//! source replaces it, and by `sluice gc`.
//!
//! The files: this one, [`Resume`] (a run's side of it: what it takes
//! from the record before it and what it writes); `record`, the record
//! itself in the catalog and what identifies a kept object; `keep`, the
//! records kept while a run goes on.

mod keep;
mod record;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use object_store::path::Path as ObjectPath;
use sluice_udfs::probe::Probe;

use self::keep::KEEP_EVERY;
pub(crate) use self::record::Kept;
use self::record::{Addition, identity, record, unlisted_identity};
use super::entries::{Entry, KeptObject, Origin};
use super::objects::ObjectSource;
use super::writer::{Extent, ExtentWriter};
use crate::alloc::ChunkRun;
use crate::catalog::Catalog;
use crate::error::{Result, StorageError};
use crate::store::Store;

/// HEADs in flight while a re-run tells which of a manifest's kept rows
/// are unchanged.
const HEADS_AT_ONCE: usize = 32;

/// What tells a re-run that a source row's object is the one a run kept.
enum RowId {
    /// Its listing's identity (`record::identity`).
    Listed(String),
    /// A manifest's row, never listed: its object, whose identity is its
    /// GET's (`unlisted_identity`).
    Unlisted(ObjectPath),
    /// Nothing: not an object of a store.
    Unknown,
}

impl RowId {
    fn of(origin: &Origin) -> Self {
        match (identity(origin), origin) {
            (Some(id), _) => Self::Listed(id),
            (
                None,
                Origin::Object {
                    location,
                    range: None,
                    stamp: None,
                    ..
                },
            ) => Self::Unlisted(location.clone()),
            _ => Self::Unknown,
        }
    }
}

/// One run of an ingest, as far as resuming goes: the record an earlier
/// run left (used when it read the same source), and what this run
/// writes of the objects it could keep.
pub(super) struct Resume {
    /// Where records are saved (`None`: not a store's source, which is
    /// never resumed).
    store: Option<Arc<Store>>,
    dataset: String,
    source: String,
    /// Each entry's identity, by source row.
    rows: Vec<RowId>,
    /// The chunks of the earlier run's record, when it read this source
    /// (its objects are rows of the record still, `record`).
    prior_runs: Option<Vec<ChunkRun>>,
    /// The dataset's record is another source's: the first save drops
    /// its objects.
    fresh: bool,
    /// `kept[..saved]` are in the record already.
    saved: usize,
    /// What this run wrote or took over, in source order.
    kept: Vec<KeptObject>,
    /// Objects taken from the earlier run, and their bytes.
    resumed: (u64, u64),
    /// The chunks this run's reservation ceded to the records it saved.
    ceded: Vec<ChunkRun>,
    /// When the last record was saved (or the run began), and how long
    /// until the next.
    kept_at: Instant,
    every: Duration,
}

impl Resume {
    /// [`Resume::read`] on the blocking pool (the record of a large
    /// source is megabytes of JSON), then the HEADs that tell whether a
    /// manifest's kept rows are unchanged: `entries` back, marked. Only a
    /// source in an object store (`remote`) is resumed.
    pub(super) async fn start(
        store: &Arc<Store>,
        dataset: &str,
        source: &str,
        remote: Option<&Arc<ObjectSource>>,
        mut entries: Vec<Entry>,
    ) -> Result<(Vec<Entry>, Self)> {
        let (store, dataset, source) = (Arc::clone(store), dataset.to_owned(), source.to_owned());
        let Some(objects) = remote.cloned() else {
            return Ok((entries, Self::new(None, &dataset, &source)));
        };
        let (mut entries, mut this, recheck) = tokio::task::spawn_blocking(move || {
            let mut this = Self::new(Some(Arc::clone(&store)), &dataset, &source);
            let recheck = this.read(store.catalog(), &mut entries)?;
            Ok::<_, StorageError>((entries, this, recheck))
        })
        .await
        .map_err(|e| StorageError::io("resume", ".", std::io::Error::other(e)))??;
        // A kept row of a manifest is taken when a HEAD finds it as its
        // GET did; otherwise it is fetched.
        let now: Vec<(usize, KeptObject, Option<String>)> = futures::stream::iter(recheck)
            .map(|(row, location, kept)| {
                let objects = Arc::clone(&objects);
                async move {
                    let now = objects.head_stamp(&location).await;
                    let id = now.map(|(size, stamp)| unlisted_identity(&location, size, &stamp));
                    (row, kept, id)
                }
            })
            .buffer_unordered(HEADS_AT_ONCE)
            .collect()
            .await;
        for (row, kept, id) in now {
            if let Some(id) = id.filter(|id| id == &kept.identity) {
                this.rows[row] = RowId::Listed(id);
                this.take(&mut entries[row], kept);
            }
        }
        if this.prior_runs.is_some() {
            tracing::info!(
                "dataset '{}': {} objects ({} bytes) are on the device from the failed run \
                 before; fetching the other {}",
                this.dataset,
                this.resumed.0,
                this.resumed.1,
                entries.len() as u64 - this.resumed.0
            );
        }
        Ok((entries, this))
    }

    fn new(store: Option<Arc<Store>>, dataset: &str, source: &str) -> Self {
        Self {
            store,
            dataset: dataset.to_owned(),
            source: source.to_owned(),
            rows: Vec::new(),
            prior_runs: None,
            fresh: false,
            saved: 0,
            kept: Vec::new(),
            resumed: (0, 0),
            ceded: Vec::new(),
            kept_at: Instant::now(),
            every: KEEP_EVERY,
        }
    }

    /// Reads the dataset's record in `catalog` and marks each of
    /// `entries` that it holds, by key and identity, as [`Origin::Kept`];
    /// returns the rows of a manifest (never listed) that it holds by key,
    /// for a HEAD to tell.
    fn read(
        &mut self,
        catalog: &Catalog,
        entries: &mut [Entry],
    ) -> Result<Vec<(usize, ObjectPath, KeptObject)>> {
        self.rows = entries.iter().map(|e| RowId::of(&e.origin)).collect();
        let mut recheck = Vec::new();
        match record(catalog, &self.dataset)? {
            Some(r) if r.source == self.source => {
                let by_key: HashMap<&str, &KeptObject> =
                    r.objects.iter().map(|o| (o.key.as_str(), o)).collect();
                for (row, entry) in entries.iter_mut().enumerate() {
                    let Some(&kept) = by_key.get(entry.key.as_str()) else {
                        continue;
                    };
                    match &self.rows[row] {
                        RowId::Listed(id) if id == &kept.identity => {
                            self.take(entry, kept.clone());
                        }
                        RowId::Unlisted(location)
                            if kept.identity.starts_with(&format!("{location} unlisted ")) =>
                        {
                            recheck.push((row, location.clone(), kept.clone()));
                        }
                        _ => {}
                    }
                }
                self.prior_runs = Some(r.runs);
            }
            // Another source's: freed when this run commits or keeps
            // a record of its own.
            Some(_) => self.fresh = true,
            None => {}
        }
        Ok(recheck)
    }

    /// `entry` is `kept`, on the device from the earlier run.
    fn take(&mut self, entry: &mut Entry, kept: KeptObject) {
        self.resumed.0 += 1;
        self.resumed.1 += kept.extent.length;
        entry.origin = Origin::Kept(Box::new(kept));
    }

    /// Notes the object of source row `row`, accepted at `extent`; a
    /// manifest's row with the `stamp` its GET answered.
    pub(super) fn accepted(
        &mut self,
        row: u64,
        key: &str,
        probe: &Probe,
        extent: &Extent,
        crc: u32,
        stamp: Option<&str>,
    ) {
        let identity = match (self.rows.get(row as usize), stamp) {
            (Some(RowId::Listed(identity)), _) => identity.clone(),
            (Some(RowId::Unlisted(location)), Some(stamp)) => {
                unlisted_identity(location, extent.length, stamp)
            }
            _ => return,
        };
        self.kept.push(KeptObject {
            key: key.to_owned(),
            identity,
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
        self.prior_runs.clone().unwrap_or_default()
    }

    /// What this run adds to the dataset's record once all its objects
    /// are durable in `runs` (the record keeps what the earlier run kept
    /// and this one did not reach); `None` when there is nothing to keep.
    pub(super) fn into_kept(mut self, runs: Vec<ChunkRun>) -> Option<Kept> {
        if self.store.is_none()
            || (self.kept.is_empty() && self.prior_runs.is_none() && self.saved == 0)
        {
            return None;
        }
        let objects = self.kept.split_off(self.saved);
        Some(Kept(Addition {
            source: self.source,
            fresh: self.fresh,
            objects,
            runs,
        }))
    }

    /// This run failed with `error`: what it wrote is flushed and kept in
    /// the record for the next, and `error` is returned. When the flush
    /// itself fails, the record keeps only what the saves while the run
    /// went on put in it.
    pub(super) async fn keep_failed(
        self,
        store: &Arc<Store>,
        dataset: &str,
        writer: ExtentWriter,
        error: StorageError,
    ) -> StorageError {
        if self.store.is_none() {
            return error;
        }
        let (runs, reservation) = match writer.finish().await {
            Ok(done) => done,
            Err(e) => {
                tracing::warn!(
                    "dataset '{dataset}': nothing more kept for a re-run (the device failed: \
                     {e})"
                );
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
