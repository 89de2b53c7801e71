//! The file backend: `pread`/`pwrite` through the page cache.
//!
//! For filesystems that refuse O_DIRECT (tmpfs, some overlay and network
//! filesystems) and kernels without io_uring. Each request runs on Tokio's
//! blocking pool; a semaphore keeps at most `queue_depth` of them running so
//! that one scan cannot take every blocking thread.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::Semaphore;

use super::{Device, DeviceInfo, DeviceOptions, DeviceStats, Geometry, IoCounters, sync_data};
use crate::buffer::{AlignedBuf, BufferPool, PageAllocator, PoolOptions};
use crate::error::{Result, StorageError};

/// A device read and written with positional syscalls.
#[derive(Debug)]
pub struct FileDevice {
    geometry: Geometry,
    file: Arc<File>,
    depth: usize,
    permits: Semaphore,
    pool: Arc<BufferPool>,
    stats: DeviceStats,
}

impl FileDevice {
    /// Opens `path` (a file or block device) for positional I/O.
    pub fn open(path: &Path, opts: &DeviceOptions) -> Result<Self> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| StorageError::io("open device", path, e))?;
        let geometry = Geometry::of(&file, path, opts.block_size)?;
        // No registration here, so no fixed buffers: everything is pooled by class.
        let pool = BufferPool::new(
            Arc::new(PageAllocator),
            PoolOptions {
                align: opts.pool.align.max(opts.block_size),
                fixed_count: 0,
                ..opts.pool.clone()
            },
        )
        .map_err(|e| StorageError::io("allocate buffer pool for", path, e))?;
        let depth = opts.queue_depth.max(1);
        Ok(Self {
            geometry,
            file: Arc::new(file),
            depth,
            permits: Semaphore::new(depth),
            pool,
            stats: DeviceStats::default(),
        })
    }

    async fn run<F>(
        &self,
        op: &'static str,
        offset: u64,
        buf: AlignedBuf,
        f: F,
    ) -> Result<AlignedBuf>
    where
        F: FnOnce(&File, u64, &mut AlignedBuf) -> std::io::Result<()> + Send + 'static,
    {
        self.geometry.check(offset, buf.len())?;
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|e| StorageError::io(op, &self.geometry.path, std::io::Error::other(e)))?;
        let file = Arc::clone(&self.file);
        let (res, buf) = tokio::task::spawn_blocking(move || {
            let mut buf = buf;
            let res = f(&file, offset, &mut buf);
            (res, buf)
        })
        .await
        .map_err(|e| StorageError::io(op, &self.geometry.path, std::io::Error::other(e)))?;
        res.map_err(|e| StorageError::io(op, &self.geometry.path, e))?;
        Ok(buf)
    }
}

#[async_trait]
impl Device for FileDevice {
    async fn read_at(&self, offset: u64, buf: AlignedBuf) -> Result<AlignedBuf> {
        let buf = self
            .run("read", offset, buf, |file, off, buf| {
                file.read_exact_at(buf.as_mut_slice(), off)
            })
            .await?;
        self.stats.record_read(buf.len());
        Ok(buf)
    }

    async fn write_at(&self, offset: u64, buf: AlignedBuf) -> Result<AlignedBuf> {
        let buf = self
            .run("write", offset, buf, |file, off, buf| {
                file.write_all_at(buf.as_slice(), off)
            })
            .await?;
        self.stats.record_write(buf.len());
        Ok(buf)
    }

    async fn flush(&self) -> Result<()> {
        sync_data(&self.file, &self.geometry.path).await
    }

    fn capacity(&self) -> u64 {
        self.geometry.capacity
    }

    fn block_size(&self) -> usize {
        self.geometry.block_size
    }

    fn parallelism(&self) -> usize {
        self.depth
    }

    fn pool(&self) -> &Arc<BufferPool> {
        &self.pool
    }

    fn takes_any_memory(&self) -> bool {
        true
    }

    fn describe(&self) -> DeviceInfo {
        self.geometry.info("file", false)
    }

    fn stats(&self) -> IoCounters {
        self.stats.snapshot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn passes_the_conformance_suite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev.img");
        super::super::create_device_file(&path, 64 << 20).unwrap();
        let dev = FileDevice::open(&path, &DeviceOptions::default()).unwrap();
        super::super::conformance::run_all(Arc::new(dev)).await;
    }
}
