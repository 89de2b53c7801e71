//! The same-host path of checkpoints: bytes through a shared-memory
//! [`Region`] instead of Flight's encoder, HTTP/2 and two socket copies.
//!
//! ```text
//!  write:  client ─ copy ─► region ─► crc32c ─► O_DIRECT from the region ─► chunks
//!          put_open(probe, len) → region; put(region, upload, at, len, offset) ×N
//!  read:   chunks ─► O_DIRECT into the region's pages ─► crc32c there ─► the client parses it in place
//!          get_open(name, version, probe, kept, fill, own_from) → a region of at least the version's size;
//!          get(region, offset, length) ×N, several at once (none when get_open filled it)
//! ```
//!
//! The client proves it shares this host with a [`Probe`] (a file it made
//! in `/dev/shm` holding a nonce), as a trainer does for a job's
//! batches; a client elsewhere (or of another user: the region's file is
//! 0600) is refused with `shm_unavailable` and uses Flight. Who touches
//! which bytes of a region is the protocol's: a range belongs to the
//! server from the request that names it until the answer, and to the
//! client otherwise, so no byte is written by both at once.
//!
//! A put region is the writer's lanes, not one checkpoint: a client keeps
//! it from one save to the next (its pages stay in place) and names the
//! upload with each part. A get region is kept too, by a reader that
//! copied what it needed out of it: the next `get_open` names the
//! regions the client keeps (`kept`), and the server reads the new
//! version into the smallest idle one it fits, so a load's pages are
//! neither allocated, zeroed nor faulted in again (they were the largest
//! fixed cost of a load: the kernel's `shmem_get_folio` under the
//! O_DIRECT read's page pinning). A version no larger than `fill` is read
//! whole before `get_open` answers: a small checkpoint is one request.
//! A region lives until the client closes it or it
//! goes unused past the checkpoints' idle timeout (a client killed -9
//! costs nothing for long). The client unlinks the file
//! once it has mapped it, and the server when it lets the region go, so
//! nothing is left in `/dev/shm` by either side dying.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::StreamExt;
use sluice_flight::shm_handshake::Probe;
use sluice_shm::Region;

use super::Checkpoints;
use super::record::{CheckpointExtent, CheckpointInfo, CheckpointRecord};
use crate::buffer::AlignedBuf;
use crate::device::{Device, DeviceExt};
use crate::error::{Result, StorageError};

/// The largest region a writer may ask for: its lanes' parts, not the
/// checkpoint (which streams through them).
pub const MAX_PUT_REGION: u64 = 1 << 30;

/// What a region is for.
#[derive(Debug)]
enum Use {
    /// Parts of uploads, written by the client.
    Put,
    /// A version, read into it for the client.
    Get { record: Arc<CheckpointRecord> },
}

/// A region lent to a client.
#[derive(Debug)]
pub(super) struct Lent {
    region: Region,
    /// What it is for now: a kept get region is bound to each version
    /// read into it in turn.
    what: Mutex<Use>,
    active: AtomicUsize,
    touched: Mutex<Instant>,
    /// Ranges being read into it now: two requests never write one byte.
    filling: Mutex<Vec<(u64, u64)>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Lent {
    /// Whether no request uses it and none came for `idle`.
    pub(super) fn idle_for(&self, idle: Duration) -> bool {
        self.active.load(Ordering::Acquire) == 0 && lock(&self.touched).elapsed() >= idle
    }
}

/// Counts a request on a region while it runs.
struct InUse(Arc<Lent>);

impl InUse {
    fn new(lent: Arc<Lent>) -> Self {
        lent.active.fetch_add(1, Ordering::AcqRel);
        Self(lent)
    }
}

impl Drop for InUse {
    fn drop(&mut self) {
        *lock(&self.0.touched) = Instant::now();
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A range of a region being filled; let go on drop.
struct Filling<'a> {
    lent: &'a Lent,
    range: (u64, u64),
}

impl<'a> Filling<'a> {
    /// Claims `[lo, hi)`, or says which request holds part of it.
    fn claim(lent: &'a Lent, lo: u64, hi: u64) -> Result<Self, (u64, u64)> {
        let mut held = lock(&lent.filling);
        if let Some(&r) = held.iter().find(|(a, b)| lo < *b && *a < hi) {
            return Err(r);
        }
        held.push((lo, hi));
        Ok(Self {
            lent,
            range: (lo, hi),
        })
    }
}

impl Drop for Filling<'_> {
    fn drop(&mut self) {
        lock(&self.lent.filling).retain(|r| *r != self.range);
    }
}

/// The most kept regions one `get_open` may name.
pub const MAX_KEPT: usize = 64;

/// What `get_open` answers.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GetOpened {
    /// The region the version is read into: one of the kept ones (same
    /// id, already mapped by the client) or a new one.
    pub region: RegionInfo,
    /// The version.
    pub checkpoint: CheckpointInfo,
    /// Whether `region` is one the client keeps.
    pub kept: bool,
    /// Bytes already read into it (the whole version, where it was no
    /// larger than the request's `fill`; else 0).
    pub filled: u64,
    /// Kept regions this server no longer lends (idle past the timeout,
    /// or a restarted server's): the client lets them go.
    pub gone: Vec<String>,
}

/// What a reader asks `get_open` for.
#[derive(Debug, Clone, Copy)]
pub struct GetRequest<'a> {
    /// The checkpoint.
    pub name: &'a str,
    /// Its version; the newest when `None`.
    pub version: Option<u64>,
    /// The client's proof that it is on this host.
    pub probe: &'a Probe,
    /// Regions the client keeps from earlier reads, idle now.
    pub kept: &'a [String],
    /// Read a version of at most this many bytes before answering.
    pub fill: u64,
    /// Where not 0, a version of at least this many bytes gets a region
    /// of its own, of its exact size, and no kept one: the client maps
    /// it as a file (`torch.load(mmap=True)`) and hands its pages over.
    pub own_from: u64,
}

/// Where a client finds the region it was lent.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RegionInfo {
    /// Its id, for the requests that use it.
    pub region: String,
    /// The file to map (the client unlinks it once mapped).
    pub path: String,
    /// Its size.
    pub size: u64,
}

impl Checkpoints {
    /// Lends a new region of `len` bytes to the client of `probe`; with
    /// `reserved`, its pages are reserved at once (the client writes
    /// them). The file is made and its pages zeroed on the blocking pool,
    /// not on the runtime serving requests.
    async fn lend(
        &self,
        what: &str,
        probe: &Probe,
        len: u64,
        use_: Use,
        reserved: bool,
    ) -> Result<RegionInfo> {
        let refused = |reason: String| StorageError::SharedMemory {
            what: what.to_owned(),
            reason,
        };
        sluice_shm::host::verify(probe).map_err(refused)?;
        let region = off_runtime(move || {
            let region = Region::create(len as usize)?;
            if reserved {
                // The client writes every page, and the device writes
                // them from this mapping: in place on both sides at once.
                region.reserve(0, len as usize)?;
                region.populate(0, len as usize)?;
            }
            Ok(region)
        })
        .await
        .map_err(|e| refused(format!("a {len}-byte region in /dev/shm: {e}")))?;
        let id = super::new_id();
        let info = RegionInfo {
            region: id.clone(),
            path: region.path().display().to_string(),
            size: len,
        };
        let lent = Arc::new(Lent {
            region,
            what: Mutex::new(use_),
            active: AtomicUsize::new(0),
            touched: Mutex::new(Instant::now()),
            filling: Mutex::new(Vec::new()),
        });
        lock(&self.lent).insert(id, lent);
        Ok(info)
    }

    fn lent(&self, id: &str) -> Result<Arc<Lent>> {
        lock(&self.lent)
            .get(id)
            .cloned()
            .ok_or_else(|| StorageError::UnknownRegion(id.chars().take(64).collect()))
    }

    /// A region of `len` bytes for a writer's parts, for a client that
    /// proves with `probe` that it is on this host. Its pages are
    /// reserved at once: the client writes them.
    pub async fn shm_put_open(&self, probe: &Probe, len: u64) -> Result<RegionInfo> {
        let what = "a checkpoint writer's parts";
        if len == 0 || len > MAX_PUT_REGION {
            return Err(StorageError::SharedMemory {
                what: what.into(),
                reason: format!(
                    "a region of {len} bytes: between 1 and {MAX_PUT_REGION} bytes, \
                     the parts in flight, not the whole checkpoint"
                ),
            });
        }
        self.lend(what, probe, len, Use::Put, true).await
    }

    /// Writes the bytes `[at, at + len)` of region `region` as the part of
    /// upload `upload` that starts at `offset`; returns its length. The
    /// range is the client's again once this answers.
    pub async fn shm_put(
        &self,
        region: &str,
        upload: &str,
        at: u64,
        len: u64,
        offset: u64,
    ) -> Result<u64> {
        let lent = self.lent(region)?;
        if !matches!(*lock(&lent.what), Use::Put) {
            return Err(StorageError::UnknownRegion(format!(
                "{region} (it reads a checkpoint; parts go to a region from put_open)"
            )));
        }
        let upload = self.upload(upload)?;
        let (at, len) = (at as usize, len as usize);
        // SAFETY: only bounds are checked here; no bytes are borrowed.
        unsafe { lent.region.bytes(at, len) }.map_err(|e| StorageError::BadUpload {
            name: upload.name.clone(),
            reason: e.to_string(),
        })?;
        let _in_use = InUse::new(Arc::clone(&lent));
        let device = Arc::clone(upload.device());
        let chunk = upload.chunk_size() as usize;
        let in_place =
            device.takes_any_memory() && (at as u64).is_multiple_of(device.pool().align() as u64);
        let staged = (0..len)
            .step_by(chunk.max(1))
            .map(|lo| stage(&device, &lent, at + lo, chunk.min(len - lo), in_place));
        upload.write_staged(offset, staged).await
    }

    /// A region holding version `version` of `name` (the newest when
    /// `None`) once `shm_get` has filled it, for a client that proves
    /// with `probe` that it is on this host: the smallest of its `kept`
    /// regions that is idle and large enough, bound to this version, or
    /// else a new one. A version of at most `fill` bytes is read into it
    /// before the answer.
    pub async fn shm_get_open(&self, req: GetRequest<'_>) -> Result<GetOpened> {
        let record = Arc::new(self.get(req.name, req.version)?);
        let checkpoint = CheckpointInfo::from(record.as_ref());
        let what = format!("checkpoint '{}' version {}", record.name, record.version);
        if req.kept.len() > MAX_KEPT {
            return Err(StorageError::SharedMemory {
                what,
                reason: format!("{} kept regions named; at most {MAX_KEPT}", req.kept.len()),
            });
        }
        let size = record.size;
        let own = req.own_from > 0 && size >= req.own_from;
        let (rebound, gone) = self.rebind(req.kept, &record, own);
        let kept = rebound.is_some();
        let region = match rebound {
            Some(region) => region,
            None => {
                self.lend(&what, req.probe, size, Use::Get { record }, false)
                    .await?
            }
        };
        let filled = if size <= req.fill && size > 0 {
            match self.shm_get(&region.region, 0, size).await {
                Ok(n) => n,
                Err(e) => {
                    // The client never learns a new region's id from an
                    // error: let it go now, not at the idle timeout.
                    if !kept {
                        let _ = self.shm_close(&region.region);
                    }
                    return Err(e);
                }
            }
        } else {
            0
        };
        Ok(GetOpened {
            region,
            checkpoint,
            kept,
            filled,
            gone,
        })
    }

    /// Binds `record` to the smallest region of `kept` that is a get
    /// region, idle and large enough (none where it wants one of its
    /// `own`); returns it, and the ids of `kept` that are not lent (any
    /// more).
    fn rebind(
        &self,
        kept: &[String],
        record: &Arc<CheckpointRecord>,
        own: bool,
    ) -> (Option<RegionInfo>, Vec<String>) {
        let lent = lock(&self.lent);
        let mut gone = Vec::new();
        let mut best: Option<(&String, &Arc<Lent>)> = None;
        for id in kept {
            let Some(l) = lent.get(id) else {
                gone.push(id.chars().take(64).collect());
                continue;
            };
            let fits = (l.region.len() as u64) >= record.size
                && l.active.load(Ordering::Acquire) == 0
                && matches!(*lock(&l.what), Use::Get { .. });
            if fits && !own && best.is_none_or(|(_, b)| l.region.len() < b.region.len()) {
                best = Some((id, l));
            }
        }
        let region = best.map(|(id, l)| {
            *lock(&l.what) = Use::Get {
                record: Arc::clone(record),
            };
            *lock(&l.touched) = Instant::now();
            RegionInfo {
                region: id.clone(),
                path: l.region.path().display().to_string(),
                size: l.region.len() as u64,
            }
        });
        (region, gone)
    }

    /// Reads bytes `[offset, offset + length)` of the region's version
    /// into the region at the same place (clipped to its size), each
    /// extent checked against its crc32c; returns the bytes read.
    pub async fn shm_get(&self, region: &str, offset: u64, length: u64) -> Result<u64> {
        let lent = self.lent(region)?;
        let record = match &*lock(&lent.what) {
            Use::Get { record } => Arc::clone(record),
            Use::Put => {
                return Err(StorageError::UnknownRegion(format!(
                    "{region} (it takes parts; reads go to a region from get_open)"
                )));
            }
        };
        let _in_use = InUse::new(Arc::clone(&lent));
        let pos = offset.min(record.size);
        let end = offset.saturating_add(length).min(record.size);
        let refused = |reason: String| StorageError::SharedMemory {
            what: format!("checkpoint '{}'", record.name),
            reason,
        };
        let _filling = Filling::claim(&lent, pos, end).map_err(|(a, b)| {
            refused(format!(
                "bytes {pos}..{end} overlap bytes {a}..{b}, which another request is reading"
            ))
        })?;
        let device = Arc::clone(self.store.device());
        let depth = device.parallelism().clamp(1, 8);
        let extents = record.extents_in(pos, end - pos).to_vec();
        let mut reads = futures::stream::iter(extents)
            .map(|e| read_extent(Arc::clone(&device), Arc::clone(&lent), &record, e, pos, end))
            .buffer_unordered(depth);
        let mut read = 0;
        while let Some(n) = reads.next().await {
            read += n?;
        }
        Ok(read)
    }

    /// Marks region `region` used now (a writer taking up its kept
    /// region again); an error when it was let go meanwhile.
    pub fn shm_touch(&self, region: &str) -> Result<()> {
        let lent = self.lent(region)?;
        *lock(&lent.touched) = Instant::now();
        Ok(())
    }

    /// Lets region `region` go (its memory is freed once the client
    /// unmaps it too).
    pub fn shm_close(&self, region: &str) -> Result<()> {
        lock(&self.lent)
            .remove(region)
            .map(drop)
            .ok_or_else(|| StorageError::UnknownRegion(region.chars().take(64).collect()))
    }

    /// Regions lent now.
    pub fn lent_regions(&self) -> usize {
        lock(&self.lent).len()
    }
}

/// Reads the part of extent `e` inside `[lo, hi)` of `record` into the
/// region at the same place; returns its length. An extent wholly inside,
/// aligned and a whole number of blocks long (every one but a
/// checkpoint's last, with the client's usual ranges) lands straight in
/// the mapping: the device reads O_DIRECT into the region's pages and the
/// crc32c is checked there. Any other, or a device that needs its own
/// memory (SPDK), goes through an aligned buffer and one copy.
async fn read_extent(
    device: Arc<dyn Device>,
    lent: Arc<Lent>,
    record: &CheckpointRecord,
    e: CheckpointExtent,
    lo: u64,
    hi: u64,
) -> Result<u64> {
    let (lo, hi) = (lo.max(e.offset), hi.min(e.end()));
    let outside = |err: std::io::Error| StorageError::SharedMemory {
        what: format!("checkpoint '{}'", record.name),
        reason: err.to_string(),
    };
    // Pages reserved (a full /dev/shm is this error, not a SIGBUS) and
    // faulted in here, an extent at a time, so that the next extent's
    // pages are made while this one is read, and not by the device's
    // ring thread as it pins them (`Region::populate`).
    let preparing = Arc::clone(&lent);
    let (at, n) = (lo as usize, (hi - lo) as usize);
    off_runtime(move || {
        preparing.region.reserve(at, n)?;
        preparing.region.populate(at, n)
    })
    .await
    .map_err(|err| StorageError::SharedMemory {
        what: format!("checkpoint '{}'", record.name),
        reason: format!("reserving bytes {lo}..{hi} in /dev/shm: {err}"),
    })?;
    let pool = Arc::clone(device.pool());
    let whole = lo == e.offset && hi == e.end();
    let aligned = e.offset.is_multiple_of(pool.align() as u64)
        && e.len.is_multiple_of(device.block_size() as u64);
    if device.takes_any_memory() && whole && aligned && e.len > 0 {
        // SAFETY: the request holds `[lo, hi)` (claimed above, the
        // client's until the answer), so these bytes are ours alone; the
        // slice is only turned into a pointer.
        let dst = unsafe { lent.region.bytes_mut(lo as usize, e.len as usize) }.map_err(outside)?;
        let ptr = std::ptr::NonNull::new(dst.as_mut_ptr())
            .ok_or_else(|| outside(std::io::Error::other("a null region")))?;
        let owner: Arc<dyn std::any::Any + Send + Sync + std::panic::RefUnwindSafe> = lent.clone();
        // SAFETY: `ptr` is `e.len` bytes of the mapping, initialised (the
        // kernel zeroed them), aligned to the pool's alignment (the region
        // is page-aligned and `e.offset` a multiple of it, checked above),
        // held by this request alone, and `owner` keeps the mapping alive.
        let buf = unsafe { pool.borrow(ptr, e.len as usize, owner) };
        let buf = device.read_at(e.device, buf).await?;
        record.check(&e, buf.as_slice())?;
        return Ok(e.len);
    }
    let (buf, at) = device.read_covering(e.device, e.len).await?;
    let bytes = &buf.as_slice()[at..at + e.len as usize];
    record.check(&e, bytes)?;
    // SAFETY: as above: `[lo, hi)` is this request's alone.
    let dst = unsafe { lent.region.bytes_mut(lo as usize, (hi - lo) as usize) }.map_err(outside)?;
    dst.copy_from_slice(&bytes[(lo - e.offset) as usize..(hi - e.offset) as usize]);
    Ok(hi - lo)
}

/// Runs `work` (making a region's file, zeroing its pages) on the
/// blocking pool: a few milliseconds per range that must not hold up the
/// runtime serving other requests.
async fn off_runtime<T: Send + 'static>(
    work: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(std::io::Error::other)?
}

/// The `n` bytes at `at` of a put region as a buffer for one extent's
/// write: the mapping itself where the device takes any memory and they
/// are whole blocks at an aligned place (`in_place`), else a copy in a
/// buffer of the device's, padded to a block (a part's tail; SPDK).
fn stage(
    device: &Arc<dyn Device>,
    lent: &Arc<Lent>,
    at: usize,
    n: usize,
    in_place: bool,
) -> Result<(AlignedBuf, usize)> {
    let outside = |reason: String| StorageError::SharedMemory {
        what: "a checkpoint writer's parts".into(),
        reason,
    };
    // SAFETY: the client handed these bytes over with the request and
    // waits for its answer, which comes after every extent's write has
    // ended; `bytes` checks bounds.
    let piece = unsafe { lent.region.bytes(at, n) }.map_err(|e| outside(e.to_string()))?;
    let bs = device.block_size();
    if in_place && n.is_multiple_of(bs) && n > 0 {
        let ptr = std::ptr::NonNull::new(piece.as_ptr().cast_mut())
            .ok_or_else(|| outside("a null region".into()))?;
        let owner: Arc<dyn std::any::Any + Send + Sync + std::panic::RefUnwindSafe> = lent.clone();
        // SAFETY: `n` initialised bytes of the mapping, aligned (the region
        // is page-aligned and `at` a multiple of the alignment, checked by
        // the caller), the request's alone until its answer, only read by
        // the device, and kept mapped by `owner`.
        return Ok((unsafe { device.pool().borrow(ptr, n, owner) }, n));
    }
    let mut buf = device.buffer(n.div_ceil(bs) * bs)?;
    buf.as_mut_slice()[..n].copy_from_slice(piece);
    Ok((buf, n))
}
