//! The write half of the same-host path: `put_open` lends a region for a
//! writer's parts, and `put` writes a slot of it to the device as an
//! upload's part, straight from the mapping where the device takes any
//! memory.

use std::sync::Arc;

use sluice_flight::shm_handshake::Probe;

use super::{InUse, Lent, RegionInfo, Use, lock};
use crate::buffer::AlignedBuf;
use crate::checkpoint::Checkpoints;
use crate::device::{Device, DeviceExt};
use crate::error::{Result, StorageError};

/// The largest region a writer may ask for: its lanes' parts, not the
/// checkpoint (which streams through them).
pub const MAX_PUT_REGION: u64 = 1 << 30;

impl Checkpoints {
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
