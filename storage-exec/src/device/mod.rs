//! Block devices that hold extents.
//!
//! A [`Device`] is a flat array of bytes addressed in multiples of its block
//! size: a preallocated file or a raw block device. Every backend implements
//! the same small async trait, modelled on `object_store`'s `ObjectStore`:
//! a few required methods, options in a struct, conveniences in
//! [`DeviceExt`], and a [`conformance`] suite that each backend must pass.
//!
//! I/O takes an [`AlignedBuf`] by value and gives it back, so the buffer
//! cannot be touched or freed while the kernel (or a DMA engine) owns it.
//! Buffers come from the device's own [`BufferPool`], because where I/O
//! memory lives is a property of the backend: registered anonymous pages for
//! io_uring, DMA memory for SPDK.
//!
//! Backends:
//! - [`uring`]: io_uring with O_DIRECT and registered fixed buffers, many
//!   requests in flight, completions reaped on a dedicated thread — the
//!   default on Linux;
//! - [`file`]: `pread`/`pwrite` on a blocking pool, for filesystems that
//!   refuse O_DIRECT (tmpfs, some overlay and network filesystems).
//!
//! - [`spdk`] (cargo feature `spdk`): an SPDK bdev, polled in user space by
//!   a thread of its own; its pool uses SPDK's DMA allocator and its
//!   completions are sent back through a oneshot channel, exactly as the
//!   io_uring thread does; [`affinity`] keeps that thread's core for it;
//! - `stats`: I/O counters shared by every backend.

pub mod affinity;
pub mod conformance;
pub mod file;
#[cfg(feature = "spdk")]
pub mod spdk;
mod stats;
pub mod uring;

use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;

use crate::buffer::{AlignedBuf, BufferPool, PoolOptions};
use crate::error::{Result, StorageError};

pub use stats::{DeviceStats, IoCounters};

/// Which backend drives a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// io_uring when the kernel and filesystem allow it, else `file`.
    #[default]
    Auto,
    /// io_uring with O_DIRECT.
    Uring,
    /// pread/pwrite through the page cache.
    File,
    /// An SPDK bdev (built with the `spdk` feature).
    #[cfg(feature = "spdk")]
    Spdk,
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "uring" => Ok(Self::Uring),
            "file" => Ok(Self::File),
            #[cfg(feature = "spdk")]
            "spdk" => Ok(Self::Spdk),
            #[cfg(not(feature = "spdk"))]
            "spdk" => Err(
                "this sluice was built without SPDK: build it with `--features spdk` \
                 and SPDK_DIR pointing at an SPDK build"
                    .into(),
            ),
            other => Err(format!(
                "unknown device backend '{other}' (expected auto, uring, file or spdk)"
            )),
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Uring => "uring",
            Self::File => "file",
            #[cfg(feature = "spdk")]
            Self::Spdk => "spdk",
        })
    }
}

/// How to open a device.
#[derive(Debug, Clone)]
pub struct DeviceOptions {
    /// Backend to use.
    pub backend: Backend,
    /// Block size: alignment of every offset and length (4096 suits O_DIRECT
    /// on every common filesystem and NVMe namespace).
    pub block_size: usize,
    /// Requests the device keeps in flight (io_uring queue depth, pread threads).
    pub queue_depth: usize,
    /// The buffer pool's shape.
    pub pool: PoolOptions,
    /// How to start SPDK, for the `spdk` backend.
    #[cfg(feature = "spdk")]
    pub spdk: Option<spdk::SpdkOptions>,
}

impl Default for DeviceOptions {
    fn default() -> Self {
        Self {
            backend: Backend::Auto,
            block_size: 4096,
            queue_depth: 32,
            pool: PoolOptions::default(),
            #[cfg(feature = "spdk")]
            spdk: None,
        }
    }
}

/// A block device holding extents.
///
/// Offsets and buffer lengths must be multiples of [`block_size`](Self::block_size);
/// a read fills exactly `buf.len()` bytes or fails.
#[async_trait]
pub trait Device: Debug + Send + Sync + 'static {
    /// Reads `buf.len()` bytes at `offset` into `buf` and hands it back.
    async fn read_at(&self, offset: u64, buf: AlignedBuf) -> Result<AlignedBuf>;

    /// Writes `buf.len()` bytes at `offset` and hands the buffer back.
    async fn write_at(&self, offset: u64, buf: AlignedBuf) -> Result<AlignedBuf>;

    /// Makes every completed write durable.
    async fn flush(&self) -> Result<()>;

    /// Size in bytes.
    fn capacity(&self) -> u64;

    /// Alignment of offsets and lengths.
    fn block_size(&self) -> usize;

    /// How many requests are worth keeping in flight.
    fn parallelism(&self) -> usize;

    /// The pool that buffers for this device come from.
    fn pool(&self) -> &Arc<BufferPool>;

    /// Whether its I/O takes any aligned memory, not only its pool's
    /// (a buffer from [`BufferPool::borrow`]): true where the kernel does
    /// the I/O (`uring`, `file`), false for SPDK, whose DMA engine needs
    /// its own memory.
    fn takes_any_memory(&self) -> bool {
        false
    }

    /// Backend name and path, for logs and `sluice info`.
    fn describe(&self) -> DeviceInfo;

    /// I/O counters since the device was opened.
    fn stats(&self) -> IoCounters;
}

/// What a device is, for display.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeviceInfo {
    /// Backend actually in use ("uring", "file").
    pub backend: &'static str,
    /// Path of the file or block device.
    pub path: PathBuf,
    /// Size in bytes.
    pub capacity: u64,
    /// Block size in bytes.
    pub block_size: usize,
    /// Whether io_uring fixed buffers are registered.
    pub fixed_buffers: bool,
}

/// Conveniences over any [`Device`].
#[async_trait]
pub trait DeviceExt: Device {
    /// A buffer of `len` bytes from the device's pool.
    fn buffer(&self, len: usize) -> Result<AlignedBuf> {
        self.pool()
            .get(len)
            .map_err(|e| StorageError::io("allocate a buffer for", self.describe().path, e))
    }

    /// Reads the block-aligned range covering `[offset, offset + len)` and
    /// returns the buffer with the position of `offset` inside it.
    async fn read_covering(&self, offset: u64, len: u64) -> Result<(AlignedBuf, usize)> {
        let bs = self.block_size() as u64;
        let start = offset / bs * bs;
        let end = (offset + len).div_ceil(bs) * bs;
        let buf = self.buffer((end - start) as usize)?;
        let buf = self.read_at(start, buf).await?;
        Ok((buf, (offset - start) as usize))
    }

    /// Writes `data` at the block-aligned `offset`, padding the last block with zeros.
    async fn write_all_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        let bs = self.block_size();
        let padded = data.len().div_ceil(bs) * bs;
        let mut buf = self.buffer(padded)?;
        let dst = buf.as_mut_slice();
        dst[..data.len()].copy_from_slice(data);
        dst[data.len()..].fill(0);
        self.write_at(offset, buf).await?;
        Ok(())
    }
}

impl<T: Device + ?Sized> DeviceExt for T {}

/// Where a device is and its shape: what every backend checks requests
/// against and reports in [`DeviceInfo`].
#[derive(Debug, Clone)]
pub(crate) struct Geometry {
    pub path: PathBuf,
    pub capacity: u64,
    pub block_size: usize,
}

impl Geometry {
    /// The geometry of the open device `file` at `path`.
    pub fn of(file: &std::fs::File, path: &Path, block_size: usize) -> Result<Self> {
        Ok(Self {
            path: path.to_owned(),
            capacity: device_size(file, path)?,
            block_size,
        })
    }

    /// Checks that a request is block aligned and inside the device.
    pub fn check(&self, offset: u64, len: usize) -> Result<()> {
        let (block_size, capacity) = (self.block_size, self.capacity);
        let device = self.path.display().to_string();
        if !offset.is_multiple_of(block_size as u64) {
            return Err(StorageError::Misaligned {
                device,
                what: "offset",
                value: offset,
                block_size,
            });
        }
        if !len.is_multiple_of(block_size) {
            return Err(StorageError::Misaligned {
                device,
                what: "length",
                value: len as u64,
                block_size,
            });
        }
        if offset
            .checked_add(len as u64)
            .is_none_or(|end| end > capacity)
        {
            return Err(StorageError::OutOfRange {
                device,
                offset,
                len: len as u64,
                capacity,
            });
        }
        Ok(())
    }

    /// The device as shown to users.
    pub fn info(&self, backend: &'static str, fixed_buffers: bool) -> DeviceInfo {
        DeviceInfo {
            backend,
            path: self.path.clone(),
            capacity: self.capacity,
            block_size: self.block_size,
            fixed_buffers,
        }
    }
}

/// `fdatasync` on the blocking pool: makes completed writes durable.
pub(crate) async fn sync_data(file: &Arc<std::fs::File>, path: &Path) -> Result<()> {
    let (file, owned) = (Arc::clone(file), path.to_owned());
    tokio::task::spawn_blocking(move || {
        file.sync_data()
            .map_err(|e| StorageError::io("flush", &owned, e))
    })
    .await
    .map_err(|e| StorageError::io("flush", path, std::io::Error::other(e)))?
}

/// Creates a sparse device file of `size` bytes if `path` does not exist.
pub fn create_device_file(path: &Path, size: u64) -> Result<()> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| StorageError::io("create device file", path, e))?;
    file.set_len(size)
        .map_err(|e| StorageError::io("size device file", path, e))?;
    file.sync_all()
        .map_err(|e| StorageError::io("sync device file", path, e))
}

/// The size of a file or block device.
fn device_size(file: &std::fs::File, path: &Path) -> Result<u64> {
    use std::io::{Seek, SeekFrom};
    let meta = file
        .metadata()
        .map_err(|e| StorageError::io("stat device", path, e))?;
    if meta.is_file() {
        return Ok(meta.len());
    }
    // Block devices report a zero length in metadata; seeking to the end
    // gives their size without an ioctl.
    let mut f = file;
    f.seek(SeekFrom::End(0))
        .map_err(|e| StorageError::io("seek device", path, e))
}

/// Opens the device at `path` with the requested backend.
///
/// `Backend::Auto` tries io_uring with O_DIRECT and falls back to the file
/// backend, with a warning, where the kernel or filesystem refuses either.
pub fn open_device(path: &Path, opts: &DeviceOptions) -> Result<Arc<dyn Device>> {
    #[cfg(feature = "spdk")]
    let is_spdk = opts.backend == Backend::Spdk;
    #[cfg(not(feature = "spdk"))]
    let is_spdk = false;
    if !is_spdk && path.to_str().is_some_and(|p| p.starts_with("bdev:")) {
        return Err(StorageError::Spdk(format!(
            "device {} is an SPDK bdev: open it with --device-backend spdk{}",
            path.display(),
            if cfg!(feature = "spdk") {
                ""
            } else {
                " (this sluice was built without the `spdk` feature)"
            }
        )));
    }
    match opts.backend {
        Backend::Uring => Ok(Arc::new(uring::UringDevice::open(path, opts)?)),
        #[cfg(feature = "spdk")]
        Backend::Spdk => open_spdk(path, opts),
        Backend::File => Ok(Arc::new(file::FileDevice::open(path, opts)?)),
        Backend::Auto => match uring::UringDevice::open(path, opts) {
            Ok(dev) => Ok(Arc::new(dev)),
            Err(
                e @ (StorageError::DirectIoUnsupported { .. } | StorageError::UringUnavailable(_)),
            ) => {
                tracing::warn!("{e}; falling back to the file backend");
                Ok(Arc::new(file::FileDevice::open(path, opts)?))
            }
            Err(e) => Err(e),
        },
    }
}

/// Opens the SPDK bdev a `bdev:NAME` path names.
#[cfg(feature = "spdk")]
fn open_spdk(path: &Path, opts: &DeviceOptions) -> Result<Arc<dyn Device>> {
    let name = spdk::bdev_name(path).ok_or_else(|| {
        StorageError::Spdk(format!(
            "the spdk backend opens SPDK bdevs, named bdev:NAME, not {}; create the \
             data dir with --device bdev:NAME",
            path.display()
        ))
    })?;
    let spdk_opts = opts.spdk.as_ref().ok_or_else(|| {
        StorageError::Spdk(format!(
            "bdev {name}: no SPDK bdev config given (--spdk-config FILE)"
        ))
    })?;
    Ok(Arc::new(spdk::SpdkDevice::open(name, spdk_opts, opts)?))
}
