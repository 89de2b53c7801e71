//! The SPDK backend: extents read and written through an SPDK bdev, in
//! user space, by polling, with DMA straight into buffers that become Arrow
//! arrays. Built only with the `spdk` cargo feature.
//!
//! ```text
//!  tokio task ──Msg::Io──► sluice-spdk thread ──spdk_bdev_read──► bdev module
//!      ▲                (polls SPDK on a core of its own)      (NVMe/PCIe, AIO,
//!      └──oneshot(AlignedBuf in DMA memory)◄──io_done─────────  io_uring, malloc)
//! ```
//!
//! - [`runtime`]: the process's one SPDK environment and its thread,
//!   started with the first device, shut down once none is left;
//! - [`env`]: on that thread, the env's init, the bdev config loaded as
//!   `spdk_tgt --json` does, and the tear-down;
//! - [`config`]: the bdev config's shape checked before SPDK reads it;
//! - [`reactor`]: the thread's poll loop and the messages it serves;
//! - [`bdev`]: a bdev's descriptor and channel, submission and completion;
//! - [`dma`]: the pool's allocator, `spdk_dma_zmalloc`;
//! - [`ffi`]: SPDK's C strings and errnos as text, the backend's error.
//!
//! A data dir names its SPDK device as `bdev:NAME` (`--device bdev:NAME`
//! when it is created); the bdev must exist in the config given with
//! `--spdk-config`. What the device promises is the [`Device`] contract and
//! the same [`conformance`](super::conformance) suite as every backend.

mod bdev;
mod config;
mod dma;
mod env;
mod ffi;
mod reactor;
mod runtime;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use async_trait::async_trait;
use tokio::sync::oneshot;

use self::bdev::{BdevPtr, IoCtx, Op, OpenBdev};
use self::dma::SpdkDma;
use self::runtime::Runtime;
use super::{Device, DeviceInfo, DeviceOptions, DeviceStats, Geometry, IoCounters};
use crate::buffer::{AlignedBuf, BufferPool, PoolOptions};
use crate::error::{Result, StorageError};

pub use env::BdevInfo;
pub use runtime::{bdevs, core, shutdown};

/// The SPDK version sluice was built against ("26.05").
pub fn version() -> String {
    spdk_sys::version()
}

/// How a device path names an SPDK bdev: `bdev:NAME`.
pub const BDEV_PREFIX: &str = "bdev:";

/// The bdev a device path names, if it is an SPDK one.
pub fn bdev_name(path: &Path) -> Option<&str> {
    path.to_str()?.strip_prefix(BDEV_PREFIX)
}

/// How the SPDK environment is started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpdkOptions {
    /// The bdev config, in SPDK's JSON config format (what `spdk_tgt
    /// --json` reads and `save_config` writes): NVMe controllers over PCIe
    /// on a server, AIO, io_uring or malloc bdevs on a file or in memory.
    pub config: PathBuf,
    /// Memory for DPDK in MiB: hugepages, or anonymous memory in no-huge
    /// mode. I/O buffers come from it.
    pub mem_size_mb: u32,
    /// Run without hugepages (files and malloc bdevs only: an NVMe
    /// controller needs pinned, physically addressed memory).
    pub no_huge: bool,
    /// CPU mask of the SPDK thread's core (DPDK's `-c`), e.g. "0x4".
    pub core_mask: Option<String>,
    /// A hugetlbfs mount other than the default.
    pub hugedir: Option<PathBuf>,
}

impl SpdkOptions {
    /// Defaults for `config`: 1 GiB of hugepages, core 0.
    pub fn new(config: impl Into<PathBuf>) -> Self {
        Self {
            config: config.into(),
            mem_size_mb: 1024,
            no_huge: false,
            core_mask: None,
            hugedir: None,
        }
    }
}

/// A device on an SPDK bdev.
#[derive(Debug)]
pub struct SpdkDevice {
    geometry: Geometry,
    runtime: Arc<Runtime>,
    bdev: BdevPtr,
    depth: usize,
    pool: Arc<BufferPool>,
    stats: DeviceStats,
}

impl SpdkDevice {
    /// Opens bdev `name`, starting SPDK with `spdk` if it is not running.
    pub fn open(name: &str, spdk: &SpdkOptions, opts: &DeviceOptions) -> Result<Self> {
        let runtime = runtime::runtime(spdk)?;
        let pool = BufferPool::new(
            Arc::new(SpdkDma::new(Arc::clone(&runtime.dma_live))),
            PoolOptions {
                fixed_count: 0,
                ..opts.pool.clone()
            },
        )
        .map_err(|e| StorageError::Spdk(format!("bdev {name}: {e}")))?;
        let owned = name.to_owned();
        let (bdev, opened) = runtime
            .call(move |_| OpenBdev::open(&owned).map(|(b, o)| (BdevPtr(Box::into_raw(b)), o)))?
            .map_err(|msg| {
                let known: Vec<&str> = runtime.bdevs().iter().map(|b| b.name.as_str()).collect();
                StorageError::Spdk(format!(
                    "{msg} (the config {} creates: {})",
                    spdk.config.display(),
                    if known.is_empty() {
                        "no bdevs".to_owned()
                    } else {
                        known.join(", ")
                    }
                ))
            })?;
        runtime.devices.fetch_add(1, Ordering::AcqRel);
        // From here on, dropping `device` closes the bdev.
        let mut device = Self {
            geometry: Geometry {
                path: PathBuf::from(format!("{BDEV_PREFIX}{name}")),
                capacity: 0,
                block_size: opts.block_size,
            },
            runtime: Arc::clone(&runtime),
            bdev,
            depth: opts.queue_depth.max(1),
            pool,
            stats: DeviceStats::default(),
        };
        let bs = opts.block_size as u64;
        let lba = u64::from(opened.block_size);
        if lba == 0 || !bs.is_multiple_of(lba) {
            return Err(StorageError::Spdk(format!(
                "bdev {name} has {lba}-byte blocks, which do not divide sluice's {bs}-byte blocks"
            )));
        }
        let align = opts.pool.align.max(opts.block_size);
        if opened.buf_align > align {
            return Err(StorageError::Spdk(format!(
                "bdev {name} wants buffers aligned to {} bytes, more than sluice's {align}",
                opened.buf_align
            )));
        }
        device.geometry.capacity = opened.num_blocks * lba / bs * bs;
        // Make the pool's fixed buffers now, in DMA memory, so a missing
        // hugepage reservation shows at open rather than on the first read.
        let fixed = opts.pool.fixed_count;
        if fixed > 0 {
            let warm: Vec<AlignedBuf> = (0..fixed)
                .filter_map(|_| device.pool.get(opts.pool.fixed_size).ok())
                .collect();
            if warm.len() < fixed {
                return Err(StorageError::Spdk(format!(
                    "bdev {name}: SPDK's DMA memory cannot hold {fixed} buffers of {} bytes; \
                     raise --spdk-mem",
                    opts.pool.fixed_size
                )));
            }
        }
        Ok(device)
    }

    async fn request(
        &self,
        op: Op,
        offset: u64,
        len: u64,
        buf: Option<AlignedBuf>,
    ) -> Result<Option<AlignedBuf>> {
        let (tx, rx) = oneshot::channel();
        let ctx = Box::new(IoCtx {
            bdev: self.bdev,
            op,
            offset,
            len,
            buf,
            reply: tx,
        });
        self.runtime.submit_io(ctx)?;
        let what = match op {
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
        };
        let (status, buf) = rx.await.map_err(|_| {
            StorageError::io(
                what,
                &self.geometry.path,
                std::io::Error::other("the SPDK thread stopped"),
            )
        })?;
        status.map_err(|errno| {
            StorageError::io(
                what,
                &self.geometry.path,
                std::io::Error::from_raw_os_error(errno),
            )
        })?;
        Ok(buf)
    }
}

impl SpdkDevice {
    /// A checked read or write of the whole buffer, counted.
    async fn transfer(&self, op: Op, offset: u64, buf: AlignedBuf) -> Result<AlignedBuf> {
        let len = buf.len();
        self.geometry.check(offset, len)?;
        let buf = self
            .request(op, offset, len as u64, Some(buf))
            .await?
            .expect("a read or write hands its buffer back");
        if op == Op::Read {
            self.stats.record_read(len);
        } else {
            self.stats.record_write(len);
        }
        Ok(buf)
    }
}

impl Drop for SpdkDevice {
    fn drop(&mut self) {
        let bdev = self.bdev;
        // SAFETY: the box is handed to the close job and never used again
        // by this device; the job runs on the SPDK thread.
        let closed = self
            .runtime
            .call(move |reactor| unsafe { reactor.close(bdev) });
        if let Err(e) = closed {
            tracing::warn!("{}: {e}", self.geometry.path.display());
        }
        self.runtime.devices.fetch_sub(1, Ordering::AcqRel);
    }
}

#[async_trait]
impl Device for SpdkDevice {
    async fn read_at(&self, offset: u64, buf: AlignedBuf) -> Result<AlignedBuf> {
        self.transfer(Op::Read, offset, buf).await
    }

    async fn write_at(&self, offset: u64, buf: AlignedBuf) -> Result<AlignedBuf> {
        self.transfer(Op::Write, offset, buf).await
    }

    async fn flush(&self) -> Result<()> {
        self.request(Op::Flush, 0, self.geometry.capacity, None)
            .await
            .map(drop)
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

    fn describe(&self) -> DeviceInfo {
        self.geometry.info("spdk", false)
    }

    fn stats(&self) -> IoCounters {
        self.stats.snapshot()
    }
}
