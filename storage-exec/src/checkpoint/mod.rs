//! Checkpoints: named, versioned blobs on the store's device, beside the
//! datasets — what a trainer saves with `torch.save` and loads back.
//!
//! ```text
//!  begin(name) ─► upload id
//!  write(id, offset, pieces)   ×N, on several streams at once ─► chunks + crc32c per extent
//!  commit(id, size) ─► flush device ─► one catalog transaction ─► version v
//!  read(name, v, offset, len) ─► crc-checked extents, several reads in flight
//! ```
//!
//! - A version is visible only once its commit is durable: a writer that
//!   dies mid-stream leaves the previous version readable and nothing
//!   partial listed; its chunks go back to the free space when the upload
//!   is aborted, goes idle past [`CheckpointOptions::idle_timeout`], or the
//!   server restarts (the allocator is rebuilt from committed chunks only).
//! - Each commit of a name adds a version; the newest
//!   [`CheckpointOptions::keep`] are kept, older ones are removed in the same
//!   transaction and their chunks freed.
//! - Every extent (at most one chunk) carries the crc32c of its bytes; a
//!   read checks it and names the checkpoint, version and byte range of a
//!   mismatch.
//! - A version deleted (or retired) while someone reads it can have its
//!   chunks reused under the reader: the checksum turns that into a named
//!   error, never wrong bytes.
//! - Several uploads (the files of every rank of a sharded save) can
//!   commit together in one transaction ([`Checkpoints::commit_group`]):
//!   all of them are listed, or none.
//! - A client on this host moves the bytes through shared memory instead
//!   of Flight ([`shared`]).
//! - Where it gives passes ([`CheckpointOptions::passes`]: a cluster's
//!   storage node trainers can reach), a writer may write one upload's
//!   parts with an upload pass, and a reader read one version with a read
//!   pass the node signed (`sluice_access::read_pass`), neither holding a
//!   node token.
//!
//! Files: [`catalog`] (versions in the catalog), `tables` (its redb
//! tables, created with the catalog's own), [`record`] (a version and its
//! extents), [`upload`] (a version being written), [`shared`] (the
//! same-host path), `scrub` (reading versions back, repairing an
//! extent), `flight` (the Flight protocol over all of it).

pub(crate) mod catalog;
mod flight;
pub mod record;
mod scrub;
pub mod shared;
pub(crate) mod tables;
mod upload;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arrow::buffer::Buffer;
use futures::{Stream, StreamExt};
use sluice_access::{PassHash, ReadPass, ReadPasses, UploadPass};

pub use catalog::Removed;
pub use flight::status;
pub use record::{CheckpointExtent, CheckpointInfo, CheckpointRecord, validate_name};
use shared::Lent;
pub use shared::RegionInfo;
use upload::Upload;

use crate::device::DeviceExt;
use crate::error::{Result, StorageError};
use crate::store::Store;

/// How checkpoints are kept.
#[derive(Debug, Clone)]
pub struct CheckpointOptions {
    /// Versions kept per name (the newest), at least 1.
    pub keep: usize,
    /// An upload with no part in flight for this long is aborted.
    pub idle_timeout: Duration,
    /// Whether a `begin` that asks for one gets an upload pass (a storage
    /// node that trainers can reach: see `sluice_access::pass`).
    pub passes: bool,
}

impl Default for CheckpointOptions {
    fn default() -> Self {
        Self {
            keep: 2,
            idle_timeout: Duration::from_secs(120),
            passes: false,
        }
    }
}

/// The checkpoints of one store (see the module docs).
#[derive(Debug)]
pub struct Checkpoints {
    store: Arc<Store>,
    opts: CheckpointOptions,
    uploads: Mutex<HashMap<String, Arc<Upload>>>,
    /// Shared-memory regions lent to clients on this host, by id.
    lent: Mutex<HashMap<String, Arc<Lent>>>,
    /// The key read passes are signed with (where passes are given).
    read_passes: Option<ReadPasses>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A fresh id for an upload or a region: random, and unique in time.
fn new_id() -> String {
    format!(
        "{:016x}{:016x}",
        getrandom::u64().unwrap_or_default(),
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or_default()
    )
}

impl Checkpoints {
    /// The checkpoints of `store`.
    pub fn new(store: Arc<Store>, opts: CheckpointOptions) -> Arc<Self> {
        let read_passes = opts.passes.then(ReadPasses::new).flatten();
        Arc::new(Self {
            store,
            read_passes,
            opts,
            uploads: Mutex::new(HashMap::new()),
            lent: Mutex::new(HashMap::new()),
        })
    }

    fn uploads(&self) -> MutexGuard<'_, HashMap<String, Arc<Upload>>> {
        lock(&self.uploads)
    }

    /// The store they live in.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Starts writing a new version of `name`; returns the upload id.
    pub fn begin(&self, name: &str) -> Result<String> {
        validate_name(name)?;
        self.expire_idle();
        Ok(self.start(name, None))
    }

    /// [`Self::begin`], with an upload pass for the upload's parts where
    /// this store gives passes ([`CheckpointOptions::passes`]): the
    /// upload id and the pass, to hand to the one writer.
    pub fn begin_with_pass(&self, name: &str) -> Result<(String, Option<String>)> {
        validate_name(name)?;
        self.expire_idle();
        let issued = self.opts.passes.then(PassHash::issue).flatten();
        let (pass, hash) = issued.unzip();
        Ok((self.start(name, hash), pass))
    }

    /// Starts writing a new version of each of `names` (a checkpoint's
    /// files, to commit together with [`Self::commit_group`]); returns
    /// their upload ids in order. Nothing is begun when one name is bad.
    pub fn begin_group(&self, names: &[String]) -> Result<Vec<String>> {
        if let Some(reason) = sluice_flight::checkpoint::requests::group_problem(names) {
            return Err(StorageError::BadUpload {
                name: "(group)".into(),
                reason,
            });
        }
        for name in names {
            validate_name(name)?;
        }
        self.expire_idle();
        Ok(names.iter().map(|name| self.start(name, None)).collect())
    }

    /// A new upload of (a valid) `name`, written with `pass` too when
    /// given; its id.
    fn start(&self, name: &str, pass: Option<PassHash>) -> String {
        let id = new_id();
        let upload = Upload::new(
            name.to_owned(),
            Arc::clone(self.store.device()),
            self.store.chunk_size(),
            self.store.space_map().reserve(),
            pass,
        );
        self.uploads().insert(id.clone(), Arc::new(upload));
        id
    }

    fn upload(&self, id: &str) -> Result<Arc<Upload>> {
        self.uploads()
            .get(id)
            .cloned()
            .ok_or_else(|| StorageError::UnknownUpload(id.chars().take(64).collect()))
    }

    /// Writes the part of upload `id` that starts at `offset`; returns its
    /// length.
    pub async fn write<S, B>(&self, id: &str, offset: u64, pieces: S) -> Result<u64>
    where
        S: Stream<Item = Result<B>> + Send,
        B: std::ops::Deref<Target = [u8]> + Send,
    {
        let upload = self.upload(id)?;
        upload.write_part(offset, pieces).await
    }

    /// [`Self::write`] for a caller that holds `pass`, not a token: only
    /// if the upload was given that pass (else, and for an upload that is
    /// over, [`StorageError::PassRefused`]).
    pub async fn write_with_pass<S, B>(
        &self,
        id: &str,
        pass: &UploadPass,
        offset: u64,
        pieces: S,
    ) -> Result<u64>
    where
        S: Stream<Item = Result<B>> + Send,
        B: std::ops::Deref<Target = [u8]> + Send,
    {
        let refused = || StorageError::PassRefused(id.chars().take(64).collect());
        let upload = self.upload(id).map_err(|_| refused())?;
        if !upload.admits(pass) {
            return Err(refused());
        }
        upload.write_part(offset, pieces).await
    }

    /// Commits upload `id` as the next version of its name, `size` bytes.
    pub async fn commit(&self, id: &str, size: u64) -> Result<CheckpointInfo> {
        let mut infos = self.commit_group(&[(id.to_owned(), size)]).await?;
        Ok(infos.remove(0))
    }

    /// Commits every upload of `group` (id, size) as the next version of
    /// its name, in one catalog transaction: all become visible at once,
    /// or none does (the files of every rank of a sharded save, with the
    /// save's metadata). Their names must differ.
    pub async fn commit_group(&self, group: &[(String, u64)]) -> Result<Vec<CheckpointInfo>> {
        let uploads = group
            .iter()
            .map(|(id, _)| self.upload(id))
            .collect::<Result<Vec<_>>>()?;
        let names: Vec<&str> = uploads.iter().map(|u| u.name.as_str()).collect();
        if let Some(reason) = sluice_flight::checkpoint::requests::group_problem(&names) {
            return Err(StorageError::BadUpload {
                name: "(group)".into(),
                reason,
            });
        }
        let first = &uploads[0];
        let mut extents = Vec::with_capacity(uploads.len());
        for (upload, (_, size)) in uploads.iter().zip(group) {
            extents.push(upload.sealed_extents(*size)?);
        }
        // One flush makes every part of every upload durable.
        self.store.device().flush().await?;
        let mut held = Vec::with_capacity(uploads.len());
        for upload in &uploads {
            held.push(upload.take_reservation()?);
        }
        {
            let mut map = self.uploads();
            for (id, _) in group {
                map.remove(id);
            }
        }
        let created_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or_default();
        let mut records: Vec<CheckpointRecord> = uploads
            .iter()
            .zip(group)
            .zip(extents)
            .zip(&held)
            .map(
                |(((upload, (_, size)), extents), (runs, _))| CheckpointRecord {
                    name: upload.name.clone(),
                    version: 0,
                    size: *size,
                    created_unix_ms,
                    extents,
                    runs: runs.clone(),
                },
            )
            .collect();
        let removed = self
            .store
            .catalog()
            .commit_checkpoints(&mut records, self.opts.keep)?;
        for (_, reservation) in held {
            reservation.keep();
        }
        self.store.space_map().release(&removed.runs);
        tracing::info!(
            "checkpoint '{}' version {} committed ({} bytes){}{}",
            first.name,
            records[0].version,
            records[0].size,
            match records.len() {
                1 => String::new(),
                n => format!(" with {} more in one transaction", n - 1),
            },
            if removed.versions.is_empty() {
                String::new()
            } else {
                format!("; {} older version(s) retired", removed.versions.len())
            }
        );
        Ok(records.iter().map(CheckpointInfo::from).collect())
    }

    /// Abandons upload `id`: its chunks are free once no part of it is
    /// still being written.
    pub fn abort(&self, id: &str) -> Result<()> {
        self.uploads()
            .remove(id)
            .map(drop)
            .ok_or_else(|| StorageError::UnknownUpload(id.chars().take(64).collect()))
    }

    /// Aborts the uploads idle past the timeout; returns how many.
    pub fn expire_idle(&self) -> usize {
        let idle = self.opts.idle_timeout;
        let mut uploads = self.uploads();
        let before = uploads.len();
        uploads.retain(|id, u| {
            let keep = !u.idle_for(idle);
            if !keep {
                tracing::warn!(
                    "checkpoint '{}': upload {id} idle for {} s, aborted",
                    u.name,
                    idle.as_secs()
                );
            }
            keep
        });
        let expired = before - uploads.len();
        drop(uploads);
        lock(&self.lent).retain(|id, l| {
            let keep = !l.idle_for(idle);
            if !keep {
                tracing::warn!(
                    "checkpoint region {id} idle for {} s, let go",
                    idle.as_secs()
                );
            }
            keep
        });
        expired
    }

    /// Uploads in progress.
    pub fn pending_uploads(&self) -> usize {
        self.uploads().len()
    }

    /// Those of `ids` that are uploads still open here.
    pub fn open_uploads(&self, ids: &[String]) -> Vec<String> {
        let uploads = self.uploads();
        ids.iter()
            .filter(|id| uploads.contains_key(id.as_str()))
            .cloned()
            .collect()
    }

    /// Expires idle uploads every quarter of the timeout, for as long as
    /// `this` lives (call from within a tokio runtime).
    pub fn spawn_reaper(this: &Arc<Self>) {
        let weak = Arc::downgrade(this);
        let period = (this.opts.idle_timeout / 4).max(Duration::from_millis(100));
        sluice_base::task::detach(async move {
            let mut tick = tokio::time::interval(period);
            loop {
                tick.tick().await;
                let Some(this) = weak.upgrade() else { break };
                this.expire_idle();
            }
        });
    }

    /// Every version of the checkpoints whose names start with `prefix`.
    pub fn list(&self, prefix: &str) -> Result<Vec<CheckpointInfo>> {
        self.store.catalog().checkpoints(prefix)
    }

    /// One version (the newest when `version` is `None`).
    pub fn get(&self, name: &str, version: Option<u64>) -> Result<CheckpointRecord> {
        self.store.catalog().checkpoint(name, version)
    }

    /// A read pass for one version of `name` (the newest when `version`
    /// is `None`): that version and the pass, which reads it for
    /// `sluice_access::read_pass::READ_PASS_TTL`; no pass where this store
    /// gives none.
    pub fn read_pass(&self, name: &str, version: Option<u64>) -> Result<(u64, Option<String>)> {
        let record = self.get(name, version)?;
        let pass = self.read_passes.as_ref();
        Ok((record.version, pass.map(|k| k.issue(name, record.version))))
    }

    /// Whether `pass` reads version `version` of `name` here now.
    pub fn admits_read(&self, pass: &ReadPass, name: &str, version: u64) -> bool {
        self.read_passes
            .as_ref()
            .is_some_and(|k| k.admits(pass, name, version))
    }

    /// Deletes one version of `name`, or all; their space is free at once.
    pub fn delete(&self, name: &str, version: Option<u64>) -> Result<Vec<CheckpointInfo>> {
        let removed = self.store.catalog().delete_checkpoint(name, version)?;
        self.store.space_map().release(&removed.runs);
        Ok(removed.versions)
    }

    /// The bytes `[offset, offset + len)` of `record` (clipped to its
    /// size), as buffers in order, each checked against its extent's crc32c;
    /// up to the device's parallelism reads are in flight.
    pub fn read(
        &self,
        record: Arc<CheckpointRecord>,
        offset: u64,
        len: u64,
    ) -> impl Stream<Item = Result<Buffer>> + Send + 'static {
        let device = Arc::clone(self.store.device());
        let depth = device.parallelism().clamp(1, 8);
        let end = offset.saturating_add(len).min(record.size);
        let extents = record.extents_in(offset, len).to_vec();
        futures::stream::iter(extents)
            .map(move |e| {
                let device = Arc::clone(&device);
                let record = Arc::clone(&record);
                async move {
                    let (buf, at) = device.read_covering(e.device, e.len).await?;
                    record.check(&e, &buf.as_slice()[at..at + e.len as usize])?;
                    let lo = offset.max(e.offset) - e.offset;
                    let hi = end.min(e.end()) - e.offset;
                    Ok(buf
                        .into_arrow()
                        .slice_with_length(at + lo as usize, (hi - lo) as usize))
                }
            })
            .buffered(depth)
    }
}
