//! [`Upload`]: a checkpoint being written — parts arriving on several
//! streams at once, each written straight to freshly allocated chunks.
//!
//! A part is a byte range `[offset, offset + len)` of the checkpoint that
//! arrives as a stream of pieces. Its bytes are staged in chunk-sized
//! aligned buffers; each full buffer is checksummed (crc32c) and written to
//! one chunk of the upload's [`Reservation`] while the next one fills, with
//! a bounded number of writes in flight — so a part never sits whole in
//! memory, and memory per stream is a few chunks. A part's extents join the
//! upload only when all of them are written; the commit checks that the
//! parts cover `[0, size)` exactly once.
//!
//! The chunks stay reserved, not owned, until the catalog commit; an upload
//! that is aborted, expires, or dies with the process gives them back.

use std::ops::Deref;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use futures::stream::FuturesUnordered;
use futures::{Stream, StreamExt};
use sluice_access::{PassHash, UploadPass};

use super::record::CheckpointExtent;
use crate::alloc::ChunkRun;
use crate::buffer::AlignedBuf;
use crate::device::{Device, DeviceExt};
use crate::error::{Result, StorageError};
use crate::space::Reservation;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// See the module docs.
#[derive(Debug)]
pub struct Upload {
    /// The checkpoint name.
    pub name: String,
    device: Arc<dyn Device>,
    chunk_size: u64,
    reservation: Mutex<Option<Reservation>>,
    extents: Mutex<Vec<CheckpointExtent>>,
    active: AtomicUsize,
    touched: Mutex<Instant>,
    /// The hash of the pass its parts may be written with (none: only
    /// callers with a token write it).
    pass: Option<PassHash>,
}

/// Counts a part stream as active while it lives.
struct Active<'a>(&'a Upload);

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.touch();
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Upload {
    /// An upload of `name` allocating into `reservation`, whose parts
    /// may be written with the pass hashed to `pass` too.
    pub fn new(
        name: String,
        device: Arc<dyn Device>,
        chunk_size: u64,
        reservation: Reservation,
        pass: Option<PassHash>,
    ) -> Self {
        Self {
            name,
            device,
            chunk_size,
            reservation: Mutex::new(Some(reservation)),
            extents: Mutex::new(Vec::new()),
            active: AtomicUsize::new(0),
            touched: Mutex::new(Instant::now()),
            pass,
        }
    }

    /// Whether `pass` may write this upload's parts.
    pub fn admits(&self, pass: &UploadPass) -> bool {
        self.pass.as_ref().is_some_and(|h| h.admits(pass))
    }

    fn touch(&self) {
        *lock(&self.touched) = Instant::now();
    }

    /// Whether no part is being written and nothing happened for `idle`.
    pub fn idle_for(&self, idle: std::time::Duration) -> bool {
        self.active.load(Ordering::Acquire) == 0 && lock(&self.touched).elapsed() >= idle
    }

    fn bad(&self, reason: String) -> StorageError {
        StorageError::BadUpload {
            name: self.name.clone(),
            reason,
        }
    }

    /// One more chunk: the one after the last allocated when it is free
    /// (runs stay long), else any.
    fn chunk(&self) -> Result<u64> {
        let mut guard = lock(&self.reservation);
        let res = guard
            .as_mut()
            .ok_or_else(|| self.bad("the upload is already committed".into()))?;
        if let Some(next) = res.runs().last().map(|r| r.start + r.count)
            && res.allocate_at(next, 1)
        {
            return Ok(next);
        }
        let run = res.allocate(1).ok_or_else(|| StorageError::NoSpace {
            what: format!("checkpoint '{}'", self.name),
            needed: self.chunk_size,
            free: res.free_chunks() * self.chunk_size,
        })?;
        Ok(run.start)
    }

    /// Writes the part at `offset` from `pieces`; returns its length. Each
    /// full chunk's checksum and write run as a task of their own while
    /// the next chunk fills.
    pub async fn write_part<S, B>(self: &Arc<Self>, offset: u64, pieces: S) -> Result<u64>
    where
        S: Stream<Item = Result<B>> + Send,
        B: Deref<Target = [u8]> + Send,
    {
        let mut writes = Writes::new(self);
        let chunk = self.chunk_size as usize;
        let mut staged: Option<(AlignedBuf, usize)> = None;
        let mut pos = offset;
        let mut pieces = std::pin::pin!(pieces);
        loop {
            let piece = pieces.next().await.transpose()?;
            self.touch();
            let last = piece.is_none();
            let mut bytes: &[u8] = piece.as_deref().unwrap_or_default();
            while !bytes.is_empty() || (last && staged.is_some()) {
                let (buf, filled) = match &mut staged {
                    Some(s) => s,
                    slot => slot.insert((self.device.buffer(chunk)?, 0)),
                };
                let n = bytes.len().min(chunk - *filled);
                buf.as_mut_slice()[*filled..*filled + n].copy_from_slice(&bytes[..n]);
                *filled += n;
                bytes = &bytes[n..];
                if *filled == chunk || (last && bytes.is_empty()) {
                    let Some((buf, filled)) = staged.take() else {
                        break;
                    };
                    writes.push(pos, buf, filled).await?;
                    pos += filled as u64;
                }
            }
            if last {
                break;
            }
        }
        writes.finish().await?;
        Ok(pos - offset)
    }

    /// The device it writes to.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    /// Bytes per chunk (an extent's most).
    pub fn chunk_size(&self) -> u64 {
        self.chunk_size
    }

    /// Writes the part at `offset` from buffers already staged, each
    /// holding the next `filled` bytes (at most a chunk); returns its
    /// length. The same-host path hands its region's chunks here as
    /// borrowed buffers, so they reach the device without a copy.
    pub async fn write_staged<I>(self: &Arc<Self>, offset: u64, staged: I) -> Result<u64>
    where
        I: IntoIterator<Item = Result<(AlignedBuf, usize)>>,
    {
        let mut writes = Writes::new(self);
        let mut pos = offset;
        for item in staged {
            let (buf, filled) = item?;
            self.touch();
            writes.push(pos, buf, filled).await?;
            pos += filled as u64;
        }
        writes.finish().await?;
        Ok(pos - offset)
    }

    /// Checksums `filled` bytes of `buf` and writes them to a new chunk.
    async fn write_extent(
        &self,
        offset: u64,
        mut buf: AlignedBuf,
        filled: usize,
    ) -> Result<CheckpointExtent> {
        let crc = crc32c::crc32c(&buf.as_slice()[..filled]);
        let bs = self.device.block_size();
        let padded = filled.div_ceil(bs) * bs;
        buf.as_mut_slice()[filled..padded].fill(0);
        buf.set_len(padded);
        let device = self.chunk()? * self.chunk_size;
        self.device.write_at(device, buf).await?;
        Ok(CheckpointExtent {
            offset,
            device,
            len: filled as u64,
            crc,
        })
    }

    /// The extents (in order) once it is checked that no part is being
    /// written and the parts cover `[0, size)` exactly once. Nothing
    /// changes: a group commit checks every upload before it takes any.
    pub fn sealed_extents(&self, size: u64) -> Result<Vec<CheckpointExtent>> {
        if self.active.load(Ordering::Acquire) > 0 {
            return Err(self.bad("parts are still being written; commit after they end".into()));
        }
        let mut extents = lock(&self.extents).clone();
        extents.sort_by_key(|e| e.offset);
        let mut end = 0;
        for e in &extents {
            if e.offset != end {
                return Err(self.bad(if e.offset > end {
                    format!("bytes {end}..{} were never written", e.offset)
                } else {
                    format!("bytes {}..{end} were written twice", e.offset)
                }));
            }
            end = e.end();
        }
        if end != size {
            return Err(self.bad(format!(
                "{end} bytes were written but the commit says {size}"
            )));
        }
        Ok(extents)
    }

    /// Hands over the chunk runs and the reservation holding them (once
    /// its writes are durable: the caller flushed the device).
    pub fn take_reservation(&self) -> Result<(Vec<ChunkRun>, Reservation)> {
        let reservation = lock(&self.reservation)
            .take()
            .ok_or_else(|| self.bad("the upload is already committed".into()))?;
        let runs = merge_runs(reservation.runs());
        Ok((runs, reservation))
    }
}

/// The extent writes of one part: each a task of its own (checksum and
/// write), a bounded number in flight; the part's extents join the
/// upload only when all of them are written. Counts the part as active.
struct Writes<'a> {
    upload: &'a Arc<Upload>,
    _active: Active<'a>,
    max_in_flight: usize,
    running: FuturesUnordered<tokio::task::JoinHandle<Result<CheckpointExtent>>>,
    done: Vec<CheckpointExtent>,
}

impl<'a> Writes<'a> {
    fn new(upload: &'a Arc<Upload>) -> Self {
        upload.active.fetch_add(1, Ordering::AcqRel);
        Self {
            upload,
            _active: Active(upload),
            max_in_flight: upload.device.parallelism().clamp(1, 8),
            running: FuturesUnordered::new(),
            done: Vec::new(),
        }
    }

    /// Starts writing `filled` bytes of `buf` as the extent at `start`,
    /// once fewer than the bound are running.
    async fn push(&mut self, start: u64, buf: AlignedBuf, filled: usize) -> Result<()> {
        while self.running.len() >= self.max_in_flight {
            if let Some(done) = self.running.next().await {
                self.done.push(joined(done)?);
            }
        }
        let this = Arc::clone(self.upload);
        self.running.push(sluice_base::task::to_end(async move {
            this.write_extent(start, buf, filled).await
        }));
        Ok(())
    }

    /// Waits for every write and adds the part's extents to the upload.
    async fn finish(mut self) -> Result<()> {
        while let Some(done) = self.running.next().await {
            self.done.push(joined(done)?);
        }
        lock(&self.upload.extents).extend(std::mem::take(&mut self.done));
        Ok(())
    }
}

/// The result of a spawned write (a panic in one is an I/O error).
fn joined<T>(done: std::result::Result<Result<T>, tokio::task::JoinError>) -> Result<T> {
    done.map_err(|e| {
        StorageError::io(
            "write a checkpoint extent",
            "(task)",
            std::io::Error::other(e),
        )
    })?
}

/// Runs sorted, with neighbours merged.
fn merge_runs(runs: &[ChunkRun]) -> Vec<ChunkRun> {
    let mut sorted = runs.to_vec();
    sorted.sort_by_key(|r| r.start);
    let mut out: Vec<ChunkRun> = Vec::with_capacity(sorted.len());
    for r in sorted {
        match out.last_mut() {
            Some(l) if l.start + l.count == r.start => l.count += r.count,
            _ => out.push(r),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neighbouring_runs_merge() {
        let r = |start, count| ChunkRun { start, count };
        assert_eq!(
            merge_runs(&[r(5, 1), r(1, 2), r(3, 1), r(9, 1)]),
            vec![r(1, 3), r(5, 1), r(9, 1)]
        );
    }
}
