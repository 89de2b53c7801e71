//! The same-host path of checkpoints: bytes through a shared-memory
//! [`Region`] instead of Flight's encoder, HTTP/2 and two socket copies.
//!
//! ```text
//!  write:  client ─ copy ─► region ─► crc32c ─► O_DIRECT from the region ─► chunks
//!          put_open(probe, len) → region; put(region, upload, at, len, offset) ×N
//!  read:   chunks ─► O_DIRECT into the region's pages ─► crc32c there ─► the client parses it in place
//!          get_open(name, version, probe, kept, fill, own_from, own_below, window)
//!            → a region of the version's size, or a window the client streams a larger
//!            one through;
//!          get(region, offset, length, at) ×N, several at once (none when get_open filled it)
//!  group:  get_group(items, probe, kept, fill) → one region, the versions side by side;
//!          get(region, item, offset, length) ×N
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
//!
//! Files: [`put`] (a writer's parts from a region to the device), [`get`]
//! (a version from the device into a region, whole or through a window),
//! [`group`] (many versions into one region: a model's files loaded
//! together, one request for the small ones).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use sluice_flight::shm_handshake::Probe;
use sluice_shm::Region;

use super::Checkpoints;
use super::record::CheckpointRecord;
use crate::error::{Result, StorageError};

mod get;
mod group;
mod put;

pub use get::{GetOpened, GetRequest, MAX_KEPT};
pub use group::{GroupItem, GroupOpened, GroupRequest, MAX_GROUP, PlacedInfo};
pub use put::MAX_PUT_REGION;

/// What a region is for.
#[derive(Debug)]
enum Use {
    /// Parts of uploads, written by the client.
    Put,
    /// Versions, read into it for the client: one at its start, or a
    /// group side by side (`group`).
    Get { items: Arc<[Placed]> },
}

/// A version and where in a get region it lands.
#[derive(Debug)]
pub(super) struct Placed {
    record: Arc<CheckpointRecord>,
    /// The region byte its byte 0 lands on.
    at: u64,
}

impl Placed {
    /// One version at the region's start.
    fn alone(record: Arc<CheckpointRecord>) -> Arc<[Placed]> {
        Arc::new([Placed { record, at: 0 }])
    }
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
                region.prepare(0, len as usize)?;
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

    /// Marks region `region` used now (a writer taking up its kept
    /// region again); an error when it was let go meanwhile.
    pub fn shm_touch(&self, region: &str) -> Result<()> {
        let lent = self.lent(region)?;
        *lock(&lent.touched) = Instant::now();
        Ok(())
    }

    /// Lets region `region` go (its memory is freed once the client
    /// unmaps it too). Unmapping a region of many megabytes takes
    /// milliseconds: that is done on the blocking pool, not the runtime.
    pub async fn shm_close(&self, region: &str) -> Result<()> {
        let lent = lock(&self.lent)
            .remove(region)
            .ok_or_else(|| StorageError::UnknownRegion(region.chars().take(64).collect()))?;
        // A pool that is shutting down gives the region back: it is
        // dropped here then.
        let _ = off_runtime(move || {
            drop(lent);
            Ok(())
        })
        .await;
        Ok(())
    }

    /// Regions lent now.
    pub fn lent_regions(&self) -> usize {
        lock(&self.lent).len()
    }
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
