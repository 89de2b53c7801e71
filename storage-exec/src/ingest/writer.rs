//! [`ExtentWriter`]: packs objects tightly into chunks and writes them.
//!
//! Objects are appended one after another into a run of contiguous chunks,
//! with no padding between them, so consecutive samples are consecutive on
//! the device and a scan reads them in large sequential requests. An object
//! that does not fit in the rest of the current run extends the run with the
//! chunks right after it when they are free, so a large object spans
//! contiguous chunks; otherwise the writer starts a new run elsewhere.
//!
//! Bytes are staged in a chunk-sized aligned buffer; each full chunk becomes
//! one write, and up to the device's parallelism writes are in flight while
//! the next chunk fills. [`ExtentWriter::finish`] writes the last partial
//! chunk (padded to a block), waits for every write and flushes the device.
//! An object can also arrive in pieces ([`ExtentWriter::begin`], then
//! [`ExtentWriter::put`]): ingest streams a large file that way.

use std::sync::Arc;

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;

use crate::alloc::ChunkRun;
use crate::buffer::AlignedBuf;
use crate::device::{Device, DeviceExt};
use crate::error::{Result, StorageError};
use crate::space::Reservation;

/// Where an object landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Extent {
    /// Chunk holding its first byte.
    pub chunk: u64,
    /// Offset of its first byte within that chunk.
    pub offset: u64,
    /// Length in bytes.
    pub length: u64,
}

/// What [`ExtentWriter::sync`] made durable: every object written so far
/// but those in the chunk still being filled.
#[derive(Debug, Clone)]
pub struct Synced {
    /// The runs used so far.
    pub runs: Vec<ChunkRun>,
    /// The staged chunk's byte range on the device, not yet written.
    staged: Option<(u64, u64)>,
    chunk_size: u64,
}

impl Synced {
    /// Whether the object at `extent` is on the device and flushed.
    pub fn holds(&self, extent: &Extent) -> bool {
        let start = extent.chunk * self.chunk_size + extent.offset;
        let end = start + extent.length;
        self.staged.is_none_or(|(s, e)| end <= s || start >= e)
    }
}

/// Appends objects to a device, allocating chunks into a [`Reservation`].
pub struct ExtentWriter {
    device: Arc<dyn Device>,
    alloc: Reservation,
    dataset: String,
    chunk_size: u64,
    runs: Vec<ChunkRun>,
    /// Absolute byte position of the next object, inside the last run.
    cursor: u64,
    /// Absolute end of the last run.
    run_end: u64,
    /// Staging buffer for the chunk that contains `cursor`.
    staging: Option<(u64, AlignedBuf)>,
    /// Bytes still to come of the object begun last.
    pending: u64,
    writes: FuturesUnordered<BoxFuture<'static, Result<()>>>,
    max_in_flight: usize,
}

impl std::fmt::Debug for ExtentWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExtentWriter")
            .field("dataset", &self.dataset)
            .field("runs", &self.runs)
            .field("cursor", &self.cursor)
            .finish()
    }
}

impl ExtentWriter {
    /// A writer for `dataset` allocating into `alloc`.
    pub fn new(
        device: Arc<dyn Device>,
        alloc: Reservation,
        chunk_size: u64,
        dataset: &str,
    ) -> Self {
        let max_in_flight = device.parallelism().clamp(1, 16);
        Self {
            device,
            alloc,
            dataset: dataset.to_owned(),
            chunk_size,
            runs: Vec::new(),
            cursor: 0,
            run_end: 0,
            staging: None,
            pending: 0,
            writes: FuturesUnordered::new(),
            max_in_flight,
        }
    }

    fn full(&self, needed: u64) -> StorageError {
        StorageError::DeviceFull {
            dataset: self.dataset.clone(),
            needed,
            free: self.alloc.free_chunks() * self.chunk_size,
        }
    }

    /// Makes room for `len` bytes at the cursor, extending or starting a run.
    async fn reserve(&mut self, len: u64) -> Result<()> {
        if !self.runs.is_empty() && self.cursor + len <= self.run_end {
            return Ok(());
        }
        if let Some(last) = self.runs.last_mut() {
            let extra = (self.cursor + len - self.run_end).div_ceil(self.chunk_size);
            let next = last.start + last.count;
            if self.alloc.allocate_at(next, extra) {
                last.count += extra;
                self.run_end += extra * self.chunk_size;
                return Ok(());
            }
        }
        // Start a new run: whatever is staged goes out, padded to a block.
        self.flush_staging().await?;
        let count = len.div_ceil(self.chunk_size).max(1);
        let run = self.alloc.allocate(count).ok_or_else(|| self.full(len))?;
        self.cursor = run.start * self.chunk_size;
        self.run_end = (run.start + run.count) * self.chunk_size;
        self.runs.push(run);
        Ok(())
    }

    /// Appends one object and returns its extent.
    pub async fn append(&mut self, bytes: &[u8]) -> Result<Extent> {
        let extent = self.begin(bytes.len() as u64).await?;
        self.put(bytes).await?;
        Ok(extent)
    }

    /// Starts an object of `len` bytes at the cursor and returns its
    /// extent; its bytes follow through [`ExtentWriter::put`], all `len`
    /// of them before the next object begins. An object streamed from a
    /// file this way is never whole in memory.
    pub async fn begin(&mut self, len: u64) -> Result<Extent> {
        if self.pending != 0 {
            return Err(self.unfinished());
        }
        self.reserve(len).await?;
        self.pending = len;
        Ok(Extent {
            chunk: self.cursor / self.chunk_size,
            offset: self.cursor % self.chunk_size,
            length: len,
        })
    }

    fn unfinished(&self) -> StorageError {
        StorageError::io(
            "pack",
            &self.dataset,
            std::io::Error::other(format!(
                "an object is {} byte(s) short of the length it began with",
                self.pending
            )),
        )
    }

    /// Appends the next bytes of the object begun last.
    pub async fn put(&mut self, mut bytes: &[u8]) -> Result<()> {
        if bytes.len() as u64 > self.pending {
            return Err(StorageError::io(
                "pack",
                &self.dataset,
                std::io::Error::other("more bytes than the object began with"),
            ));
        }
        self.pending -= bytes.len() as u64;
        while !bytes.is_empty() {
            let chunk_start = self.cursor / self.chunk_size * self.chunk_size;
            if self
                .staging
                .as_ref()
                .is_none_or(|(start, _)| *start != chunk_start)
            {
                self.flush_staging().await?;
            }
            let buf = match &mut self.staging {
                Some((_, buf)) => buf,
                slot => {
                    let buf = self.device.buffer(self.chunk_size as usize)?;
                    &mut slot.insert((chunk_start, buf)).1
                }
            };
            let at = (self.cursor - chunk_start) as usize;
            let n = bytes.len().min(self.chunk_size as usize - at);
            buf.as_mut_slice()[at..at + n].copy_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            self.cursor += n as u64;
            if self.cursor.is_multiple_of(self.chunk_size) {
                self.flush_staging().await?;
            }
        }
        Ok(())
    }

    /// Sends the staged chunk to the device (up to the cursor, block-padded).
    async fn flush_staging(&mut self) -> Result<()> {
        let Some((start, mut buf)) = self.staging.take() else {
            return Ok(());
        };
        let filled = self.cursor.saturating_sub(start).min(self.chunk_size) as usize;
        let bs = self.device.block_size();
        let padded = filled.div_ceil(bs) * bs;
        if padded == 0 {
            return Ok(());
        }
        buf.as_mut_slice()[filled..padded].fill(0);
        buf.set_len(padded);
        while self.writes.len() >= self.max_in_flight {
            if let Some(res) = self.writes.next().await {
                res?;
            }
        }
        // A task of its own: the write goes on while the next chunk fills.
        let device = Arc::clone(&self.device);
        let write =
            sluice_base::task::to_end(async move { device.write_at(start, buf).await.map(drop) });
        self.writes.push(Box::pin(async move {
            write.await.map_err(|e| {
                StorageError::io("write a chunk", "(task)", std::io::Error::other(e))
            })?
        }));
        Ok(())
    }

    /// Waits for every write sent and flushes the device, without ending
    /// the chunk being filled (its bytes are staged, not written): what an
    /// ingest can promise a re-run while it goes on.
    pub async fn sync(&mut self) -> Result<Synced> {
        while let Some(res) = self.writes.next().await {
            res?;
        }
        self.device.flush().await?;
        Ok(Synced {
            runs: self.runs.clone(),
            staged: self
                .staging
                .as_ref()
                .map(|(start, _)| (*start, *start + self.chunk_size)),
            chunk_size: self.chunk_size,
        })
    }

    /// See [`Reservation::cede`]: chunks a resume record owns now.
    pub fn cede(&mut self, runs: &[ChunkRun]) {
        self.alloc.cede(runs);
    }

    /// See [`Reservation::adopt`]: ceded chunks whose record was not saved.
    pub fn adopt(&mut self, runs: &[ChunkRun]) {
        self.alloc.adopt(runs);
    }

    /// Writes what is staged, waits for every write, flushes the device and
    /// returns the chunk runs used, still reserved until the commit that
    /// owns them.
    pub async fn finish(mut self) -> Result<(Vec<ChunkRun>, Reservation)> {
        if self.pending != 0 {
            return Err(self.unfinished());
        }
        self.flush_staging().await?;
        while let Some(res) = self.writes.next().await {
            res?;
        }
        self.device.flush().await?;
        Ok((self.runs, self.alloc))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::ChunkAllocator;
    use crate::device::{DeviceExt, DeviceOptions, create_device_file, file::FileDevice};
    use crate::space::Space;

    fn space(chunks: u64) -> Reservation {
        Space::new(ChunkAllocator::new(chunks)).reserve()
    }

    async fn device(size: u64) -> (tempfile::TempDir, Arc<dyn Device>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.img");
        create_device_file(&path, size).unwrap();
        (
            dir,
            Arc::new(FileDevice::open(&path, &DeviceOptions::default()).unwrap()),
        )
    }

    #[tokio::test]
    async fn packs_objects_tightly_and_spans_chunks() {
        let (_d, dev) = device(1 << 20).await;
        let chunk = 64 * 1024;
        let mut w = ExtentWriter::new(Arc::clone(&dev), space(16), chunk, "t");
        let a = vec![1u8; 1000];
        let b = vec![2u8; 150_000]; // spans three chunks
        let c = vec![3u8; 10];
        let ea = w.append(&a).await.unwrap();
        let eb = w.append(&b).await.unwrap();
        let ec = w.append(&c).await.unwrap();
        assert_eq!((ea.chunk, ea.offset), (0, 0));
        assert_eq!((eb.chunk, eb.offset), (0, 1000));
        assert_eq!(ec.chunk * chunk + ec.offset, 151_000);
        let (runs, _held) = w.finish().await.unwrap();
        assert_eq!(runs, vec![ChunkRun { start: 0, count: 3 }]);
        for (e, want) in [(ea, &a), (eb, &b), (ec, &c)] {
            let (buf, at) = dev
                .read_covering(e.chunk * chunk + e.offset, e.length)
                .await
                .unwrap();
            assert_eq!(&buf.as_slice()[at..at + e.length as usize], &want[..]);
        }
    }

    /// A sync mid-ingest makes every object before the chunk being filled
    /// readable, holds none in that chunk, and leaves the writer to go on:
    /// the objects after it land whole.
    #[tokio::test]
    async fn a_sync_holds_what_is_written_and_the_writer_goes_on() {
        let (_d, dev) = device(1 << 20).await;
        let chunk = 64 * 1024;
        let mut w = ExtentWriter::new(Arc::clone(&dev), space(16), chunk, "t");
        let a = vec![1u8; 100_000]; // chunks 0 and 1
        let b = vec![2u8; 1_000]; // in chunk 1, staged
        let ea = w.append(&a).await.unwrap();
        let eb = w.append(&b).await.unwrap();
        let synced = w.sync().await.unwrap();
        assert_eq!(synced.runs, vec![ChunkRun { start: 0, count: 2 }]);
        assert!(!synced.holds(&ea), "a ends in the staged chunk");
        assert!(!synced.holds(&eb));
        let c = vec![3u8; 40_000]; // fills chunk 1, into chunk 2
        let ec = w.append(&c).await.unwrap();
        let synced = w.sync().await.unwrap();
        assert!(synced.holds(&ea) && synced.holds(&eb) && !synced.holds(&ec));
        for (e, want) in [(ea, &a), (eb, &b)] {
            let (buf, at) = dev
                .read_covering(e.chunk * chunk + e.offset, e.length)
                .await
                .unwrap();
            assert_eq!(&buf.as_slice()[at..at + e.length as usize], &want[..]);
        }
        let (runs, _held) = w.finish().await.unwrap();
        assert_eq!(runs, vec![ChunkRun { start: 0, count: 3 }]);
        let (buf, at) = dev
            .read_covering(ec.chunk * chunk + ec.offset, ec.length)
            .await
            .unwrap();
        assert_eq!(&buf.as_slice()[at..at + ec.length as usize], &c[..]);
    }

    #[tokio::test]
    async fn an_object_in_pieces_lands_as_one() {
        let (_d, dev) = device(1 << 20).await;
        let chunk = 64 * 1024;
        let mut w = ExtentWriter::new(Arc::clone(&dev), space(16), chunk, "t");
        let whole: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        w.append(&[9; 10]).await.unwrap();
        let e = w.begin(whole.len() as u64).await.unwrap();
        assert!(
            w.begin(1).await.is_err(),
            "a second object before the first ends"
        );
        for piece in whole.chunks(70_001) {
            w.put(piece).await.unwrap();
        }
        assert!(
            w.put(&[1]).await.is_err(),
            "a byte past the object's length"
        );
        w.finish().await.unwrap();
        let (buf, at) = dev
            .read_covering(e.chunk * chunk + e.offset, e.length)
            .await
            .unwrap();
        assert_eq!(&buf.as_slice()[at..at + whole.len()], &whole[..]);
    }

    #[tokio::test]
    async fn device_full_is_an_error_naming_the_dataset() {
        let (_d, dev) = device(1 << 20).await;
        let mut w = ExtentWriter::new(dev, space(2), 64 * 1024, "big");
        w.append(&vec![0u8; 100_000]).await.unwrap();
        let err = w.append(&vec![0u8; 100_000]).await.unwrap_err();
        assert!(matches!(err, StorageError::DeviceFull { .. }), "{err}");
        assert!(err.to_string().contains("'big'"), "{err}");
    }
}
