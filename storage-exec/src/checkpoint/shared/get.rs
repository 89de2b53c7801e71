//! The read half of the same-host path: `get_open` lends (or rebinds) a
//! region for a version (`get_group` one for many, [`super::group`]), and
//! `get` reads ranges of the version into it,
//! O_DIRECT into its pages where the extent allows, each checked against
//! its crc32c there.
//!
//! A region is the version's size, so the client parses it in place, or
//! (a `window` asked for) a window smaller than the version that the
//! client streams it through: each `get` names where in the region its
//! range lands (`at`), and the client reuses the window's slots once it
//! has copied them out, so a load of any size makes only the window's
//! pages.

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use sluice_flight::shm_handshake::Probe;

use super::group::{GroupOpened, GroupRequest, Layout};
use super::{Filling, InUse, Lent, Placed, RegionInfo, Use, lock, off_runtime};
use crate::checkpoint::Checkpoints;
use crate::checkpoint::record::{CheckpointExtent, CheckpointInfo, CheckpointRecord};
use crate::device::{Device, DeviceExt};
use crate::error::{Result, StorageError};

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
    /// Where not 0, a version of at least this many bytes gets none of
    /// its own after all (it streams through `window`): a mapping of a
    /// whole large version costs a fresh page for each of its bytes.
    pub own_below: u64,
    /// Where not 0, a region of at least this many bytes is enough for a
    /// larger version: the client streams the version through it
    /// (`shm_get`'s `at`). A version of its own (`own_from`) ignores it.
    pub window: u64,
}

impl GetRequest<'_> {
    /// The bytes a region for a version of `size` bytes must hold.
    fn region_size(&self, size: u64) -> u64 {
        if self.window > 0 && !self.owns(size) {
            size.min(self.window)
        } else {
            size
        }
    }

    /// Whether a version of `size` bytes gets a region of its own.
    fn owns(&self, size: u64) -> bool {
        self.own_from > 0 && size >= self.own_from && (self.own_below == 0 || size < self.own_below)
    }
}

impl Checkpoints {
    /// A region for version `version` of `name` (the newest when `None`),
    /// for a client that proves with `probe` that it is on this host: the
    /// smallest of its `kept` regions that is idle and large enough (the
    /// version's size, or the `window`), bound to this version, or else a
    /// new one. A version of at most `fill` bytes that the region holds
    /// whole is read into it before the answer.
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
        let need = req.region_size(size);
        let items = Placed::alone(record);
        let (region, kept, gone) = self
            .bind(&what, req.probe, req.kept, items, req.owns(size), need)
            .await?;
        let filled = if size <= req.fill && size > 0 && size <= region.size {
            self.shm_get(&region.region, 0, 0, size, None).await
        } else {
            Ok(0)
        };
        let filled = self.unless_failed(&region.region, kept, filled).await?;
        Ok(GetOpened {
            region,
            checkpoint,
            kept,
            filled,
            gone,
        })
    }

    /// The smallest of `kept` that fits `need` bytes, rebound to `items`
    /// (see [`Self::rebind`]), or else a new region lent for them; and
    /// whether it was a kept one, and the ids of `kept` not lent any more.
    async fn bind(
        &self,
        what: &str,
        probe: &Probe,
        kept: &[String],
        items: Arc<[Placed]>,
        own: bool,
        need: u64,
    ) -> Result<(RegionInfo, bool, Vec<String>)> {
        let (rebound, gone) = self.rebind(kept, &items, own, need);
        match rebound {
            Some(region) => Ok((region, true, gone)),
            None => {
                let region = self
                    .lend(what, probe, need, Use::Get { items }, false)
                    .await?;
                Ok((region, false, gone))
            }
        }
    }

    /// `done`, after letting `region` go where it failed and the region
    /// is new: the client never learns a new region's id from an error,
    /// so it goes now, not at the idle timeout.
    async fn unless_failed<T>(&self, region: &str, kept: bool, done: Result<T>) -> Result<T> {
        if done.is_err() && !kept {
            let _ = self.shm_close(region).await;
        }
        done
    }

    /// One region for the versions `req.items` names (each its newest
    /// where no version is given), side by side at aligned places, as
    /// many as fit `req.max_bytes` (see [`Layout::place`]): the smallest
    /// idle kept region that holds them, or a new one; none where none
    /// fits. The versions of at most `req.fill` bytes are read into it
    /// before the answer. An unknown checkpoint fails the whole group,
    /// naming it.
    pub async fn shm_get_group(&self, req: GroupRequest<'_>) -> Result<GroupOpened> {
        req.check()?;
        let records = req
            .items
            .iter()
            .map(|item| self.get(&item.name, item.version).map(Arc::new))
            .collect::<Result<Vec<_>>>()?;
        let layout = Layout::place(records, req.max_bytes);
        if layout.items.is_empty() {
            return Ok(layout.answer(None, Vec::new(), false, Vec::new()));
        }
        let need = layout.end.max(1);
        let (region, kept, gone) = self
            .bind(
                &req.what(),
                req.probe,
                req.kept,
                Arc::clone(&layout.items),
                false,
                need,
            )
            .await?;
        let filled = self.fill(&region.region, &layout, req.fill).await;
        let filled = self.unless_failed(&region.region, kept, filled).await?;
        Ok(layout.answer(Some(region), filled, kept, gone))
    }

    /// Reads every version of `layout` of at most `fill` bytes into
    /// `region`, as many at once as the device takes; the bytes read of
    /// each version.
    async fn fill(&self, region: &str, layout: &Layout, fill: u64) -> Result<Vec<u64>> {
        let depth = self.store.device().parallelism().clamp(1, 8);
        let mut reads = futures::stream::iter(layout.small(fill))
            .map(|(i, size)| async move { (i, self.shm_get(region, i, 0, size, None).await) })
            .buffer_unordered(depth);
        let mut filled = vec![0; layout.items.len()];
        while let Some((i, n)) = reads.next().await {
            filled[i] = n?;
        }
        Ok(filled)
    }

    /// Binds `items` (versions placed in a region) to the smallest
    /// region of `kept` that is a get region, idle and at least `need`
    /// bytes (none where they want one of their `own`); returns it, and
    /// the ids of `kept` that are not lent (any more).
    fn rebind(
        &self,
        kept: &[String],
        items: &Arc<[Placed]>,
        own: bool,
        need: u64,
    ) -> (Option<RegionInfo>, Vec<String>) {
        let lent = lock(&self.lent);
        let mut gone = Vec::new();
        let mut best: Option<(&String, &Arc<Lent>)> = None;
        for id in kept {
            let Some(l) = lent.get(id) else {
                gone.push(id.chars().take(64).collect());
                continue;
            };
            let fits = (l.region.len() as u64) >= need
                && l.active.load(std::sync::atomic::Ordering::Acquire) == 0
                && matches!(*lock(&l.what), Use::Get { .. });
            if fits && !own && best.is_none_or(|(_, b)| l.region.len() < b.region.len()) {
                best = Some((id, l));
            }
        }
        let region = best.map(|(id, l)| {
            *lock(&l.what) = Use::Get {
                items: Arc::clone(items),
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
    /// `item` (its only one, 0, unless it holds a group; clipped to its
    /// size) into the region at `at` (where the version's placing puts
    /// them when `None`), each extent checked against its crc32c;
    /// returns the bytes read. The region's bytes it lands in are the
    /// request's until it answers: another request for any of them is
    /// refused.
    pub async fn shm_get(
        &self,
        region: &str,
        item: usize,
        offset: u64,
        length: u64,
        at: Option<u64>,
    ) -> Result<u64> {
        let lent = self.lent(region)?;
        let (record, base) = match &*lock(&lent.what) {
            Use::Get { items } => match items.get(item) {
                Some(p) => (Arc::clone(&p.record), p.at),
                None => {
                    return Err(StorageError::SharedMemory {
                        what: format!("region {region}"),
                        reason: format!("item {item}: it holds {} versions", items.len()),
                    });
                }
            },
            Use::Put => {
                return Err(StorageError::UnknownRegion(format!(
                    "{region} (it takes parts; reads go to a region from get_open)"
                )));
            }
        };
        let _in_use = InUse::new(Arc::clone(&lent));
        let pos = offset.min(record.size);
        let end = offset.saturating_add(length).min(record.size);
        let place = Place {
            pos,
            at: at.unwrap_or(base + pos),
        };
        let refused = |reason: String| StorageError::SharedMemory {
            what: format!("checkpoint '{}'", record.name),
            reason,
        };
        let (lo, hi) = (place.at, place.at.saturating_add(end - pos));
        if hi > lent.region.len() as u64 {
            return Err(refused(format!(
                "bytes {pos}..{end} at {lo} run past the {}-byte region",
                lent.region.len()
            )));
        }
        let _filling = Filling::claim(&lent, lo, hi).map_err(|(a, b)| {
            refused(format!(
                "region bytes {lo}..{hi} overlap bytes {a}..{b}, which another request is reading"
            ))
        })?;
        let device = Arc::clone(self.store.device());
        let depth = device.parallelism().clamp(1, 8);
        let extents = record.extents_in(pos, end - pos).to_vec();
        let mut reads = futures::stream::iter(extents)
            .map(|e| {
                let span = (pos, end);
                read_extent(
                    Arc::clone(&device),
                    Arc::clone(&lent),
                    &record,
                    e,
                    span,
                    place,
                )
            })
            .buffer_unordered(depth);
        let mut read = 0;
        while let Some(n) = reads.next().await {
            read += n?;
        }
        Ok(read)
    }
}

/// Where a request's bytes land: version byte `pos` at region byte `at`,
/// and the rest after it in order.
#[derive(Debug, Clone, Copy)]
struct Place {
    pos: u64,
    at: u64,
}

impl Place {
    /// The region byte that version byte `v` (at least `pos`) lands on.
    fn of(self, v: u64) -> u64 {
        self.at + (v - self.pos)
    }
}

/// Reads the part of extent `e` inside `span` (`[lo, hi)` of `record`)
/// into the region where `place` puts it; returns its length. An extent
/// wholly inside, landing at an aligned place and a whole number of
/// blocks long (every one but a checkpoint's last, with the client's
/// usual ranges) lands straight in the mapping: the device reads
/// O_DIRECT into the region's pages and the crc32c is checked there. Any
/// other, or a device that needs its own memory (SPDK), goes through an
/// aligned buffer and one copy.
async fn read_extent(
    device: Arc<dyn Device>,
    lent: Arc<Lent>,
    record: &CheckpointRecord,
    e: CheckpointExtent,
    span: (u64, u64),
    place: Place,
) -> Result<u64> {
    let (lo, hi) = (span.0.max(e.offset), span.1.min(e.end()));
    let outside = |err: std::io::Error| StorageError::SharedMemory {
        what: format!("checkpoint '{}'", record.name),
        reason: err.to_string(),
    };
    let dst_at = place.of(lo);
    // Pages reserved (a full /dev/shm is this error, not a SIGBUS) and
    // faulted in here, an extent at a time, so that the next extent's
    // pages are made while this one is read, and not by the device's
    // ring thread as it pins them (`Region::populate`); a kept region's
    // pages are prepared once (`Region::prepare`), and a range prepared
    // already costs no hop to the blocking pool.
    let (at, n) = (dst_at as usize, (hi - lo) as usize);
    if !lent.region.is_prepared(at, n) {
        let preparing = Arc::clone(&lent);
        off_runtime(move || preparing.region.prepare(at, n))
            .await
            .map_err(|err| StorageError::SharedMemory {
                what: format!("checkpoint '{}'", record.name),
                reason: format!("reserving bytes {lo}..{hi} in /dev/shm: {err}"),
            })?;
    }
    let pool = Arc::clone(device.pool());
    let whole = lo == e.offset && hi == e.end();
    let aligned = dst_at.is_multiple_of(pool.align() as u64)
        && e.len.is_multiple_of(device.block_size() as u64);
    if device.takes_any_memory() && whole && aligned && e.len > 0 {
        // SAFETY: the request holds these region bytes (claimed by
        // `shm_get`, the client's until the answer), so they are ours
        // alone; the slice is only turned into a pointer.
        let dst = unsafe { lent.region.bytes_mut(at, n) }.map_err(outside)?;
        let ptr = std::ptr::NonNull::new(dst.as_mut_ptr())
            .ok_or_else(|| outside(std::io::Error::other("a null region")))?;
        let owner: Arc<dyn std::any::Any + Send + Sync + std::panic::RefUnwindSafe> = lent.clone();
        // SAFETY: `ptr` is `e.len` bytes of the mapping, initialised (the
        // kernel zeroed them), aligned to the pool's alignment (the region
        // is page-aligned and `dst_at` a multiple of it, checked above),
        // held by this request alone, and `owner` keeps the mapping alive.
        let buf = unsafe { pool.borrow(ptr, e.len as usize, owner) };
        let buf = device.read_at(e.device, buf).await?;
        record.check(&e, buf.as_slice())?;
        return Ok(e.len);
    }
    let (buf, skip) = device.read_covering(e.device, e.len).await?;
    let bytes = &buf.as_slice()[skip..skip + e.len as usize];
    record.check(&e, bytes)?;
    // SAFETY: as above: these region bytes are this request's alone.
    let dst = unsafe { lent.region.bytes_mut(at, n) }.map_err(outside)?;
    dst.copy_from_slice(&bytes[(lo - e.offset) as usize..(hi - e.offset) as usize]);
    Ok(hi - lo)
}
