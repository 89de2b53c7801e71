//! [`Store`]: one data directory — its device, catalog and free space.
//!
//! Opening a store checks the directory's `FORMAT` marker, opens the device
//! and the catalog (redb's file lock makes the directory single-process),
//! then *reclaims*: the chunk allocator is rebuilt from the committed chunk
//! map, so chunks written by an ingest that never committed are free again,
//! and metadata files that no committed version names are deleted.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::alloc::ChunkAllocator;
use crate::catalog::{Catalog, VersionRecord};
use crate::device::{Backend, Device, DeviceOptions, create_device_file, open_device};
use crate::error::{Result, StorageError};
use crate::layout::{CATALOG_FILE, DEVICE_FILE, DataDirFormat, META_DIR};
use crate::space::{Reservation, Space};

/// How to open (or create) a data directory.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// The data directory.
    pub data_dir: PathBuf,
    /// Device backend.
    pub backend: Backend,
    /// A device path to use instead of `DATA_DIR/device.img` (a raw block
    /// device or a file elsewhere); only read when the data dir is created.
    pub device_path: Option<PathBuf>,
    /// Size of a new device file.
    pub device_size: u64,
    /// Chunk size of a new data dir.
    pub chunk_size: u64,
    /// Requests in flight per device.
    pub queue_depth: usize,
    /// io_uring fixed buffers to register.
    pub fixed_buffers: usize,
    /// How to start SPDK, for the `spdk` backend.
    #[cfg(feature = "spdk")]
    pub spdk: Option<crate::device::spdk::SpdkOptions>,
}

impl StoreOptions {
    /// Defaults for `data_dir`: a 16 GiB sparse device, 4 MiB chunks.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            backend: Backend::Auto,
            device_path: None,
            device_size: 16 << 30,
            chunk_size: 4 << 20,
            queue_depth: 32,
            fixed_buffers: 8,
            #[cfg(feature = "spdk")]
            spdk: None,
        }
    }
}

/// Free space and layout, for `sluice info` and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SpaceInfo {
    /// Chunk size in bytes.
    pub chunk_size: u64,
    /// Chunks on the device.
    pub total_chunks: u64,
    /// Chunks not owned by any committed version.
    pub free_chunks: u64,
}

/// What the open-time reclaim found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReclaimReport {
    /// Orphaned metadata files deleted.
    pub metadata_files: u64,
}

/// An open data directory.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    format: DataDirFormat,
    device: Arc<dyn Device>,
    catalog: Catalog,
    space: Space,
    ingest_lock: tokio::sync::Mutex<()>,
    reclaimed: ReclaimReport,
}

impl Store {
    /// Opens `opts.data_dir`, creating it (and its device) when it does not exist.
    pub fn open(opts: &StoreOptions) -> Result<Arc<Self>> {
        let dir = &opts.data_dir;
        std::fs::create_dir_all(dir).map_err(|e| StorageError::io("create data dir", dir, e))?;
        let format = match DataDirFormat::load(dir)? {
            Some(f) => f,
            None => Self::initialise(opts)?,
        };
        let device_opts = DeviceOptions {
            backend: opts.backend,
            block_size: format.block_size as usize,
            queue_depth: opts.queue_depth,
            pool: crate::buffer::PoolOptions {
                align: format.block_size as usize,
                fixed_count: opts.fixed_buffers,
                fixed_size: format.chunk_size as usize,
                ..Default::default()
            },
            #[cfg(feature = "spdk")]
            spdk: opts.spdk.clone(),
        };
        let device = open_device(&Self::device_path(opts, &format), &device_opts)?;
        let catalog = Catalog::open(&dir.join(CATALOG_FILE))?;

        let total = device.capacity() / format.chunk_size;
        let mut alloc = ChunkAllocator::new(total);
        for run in catalog.chunk_runs()? {
            if !alloc.mark_used(run) {
                return Err(StorageError::IncompatibleDataDir {
                    path: dir.clone(),
                    reason: format!(
                        "chunk map claims chunks {}..{} twice or past the device's {total} chunks",
                        run.start,
                        run.start + run.count
                    ),
                });
            }
        }
        let reclaimed = reclaim_metadata(dir, &catalog)?;
        if reclaimed.metadata_files > 0 {
            tracing::info!(
                "{}: removed {} metadata files left by an interrupted ingest",
                dir.display(),
                reclaimed.metadata_files
            );
        }
        Ok(Arc::new(Self {
            dir: dir.clone(),
            format,
            device,
            catalog,
            space: Space::new(alloc),
            ingest_lock: tokio::sync::Mutex::new(()),
            reclaimed,
        }))
    }

    /// The device to open: the one FORMAT names, except that the `spdk`
    /// backend may be told which bdev holds it (`--device bdev:NAME` on an
    /// existing data dir: an AIO bdev over its device file, or the NVMe
    /// namespace a kernel backend used before).
    fn device_path(opts: &StoreOptions, format: &DataDirFormat) -> PathBuf {
        #[cfg(feature = "spdk")]
        if opts.backend == Backend::Spdk
            && let Some(bdev) = opts
                .device_path
                .as_ref()
                .filter(|p| crate::device::spdk::bdev_name(p).is_some())
        {
            return bdev.clone();
        }
        format.device_path(&opts.data_dir)
    }

    fn initialise(opts: &StoreOptions) -> Result<DataDirFormat> {
        let dir = &opts.data_dir;
        let has_catalog = dir.join(CATALOG_FILE).exists();
        if has_catalog {
            return Err(StorageError::IncompatibleDataDir {
                path: dir.clone(),
                reason: "has a catalog but no FORMAT file; not written by this sluice".into(),
            });
        }
        let block_size = 4096u64;
        if opts.chunk_size == 0 || !opts.chunk_size.is_multiple_of(block_size) {
            return Err(StorageError::IncompatibleDataDir {
                path: dir.clone(),
                reason: format!(
                    "chunk size {} must be a positive multiple of {block_size}",
                    opts.chunk_size
                ),
            });
        }
        let device = match &opts.device_path {
            Some(p) => p.clone(),
            None => {
                let size = opts.device_size / opts.chunk_size * opts.chunk_size;
                let path = dir.join(DEVICE_FILE);
                if !path.exists() {
                    create_device_file(&path, size)?;
                }
                PathBuf::from(DEVICE_FILE)
            }
        };
        std::fs::create_dir_all(dir.join(META_DIR))
            .map_err(|e| StorageError::io("create", dir.join(META_DIR), e))?;
        let format = DataDirFormat::new(opts.chunk_size, block_size, device);
        format.store(dir)?;
        Ok(format)
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.dir
    }

    /// The device.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    /// The catalog.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// Chunk size in bytes.
    pub fn chunk_size(&self) -> u64 {
        self.format.chunk_size
    }

    /// What the open-time reclaim removed.
    pub fn reclaimed(&self) -> ReclaimReport {
        self.reclaimed
    }

    /// Free space now.
    pub fn space(&self) -> SpaceInfo {
        SpaceInfo {
            chunk_size: self.format.chunk_size,
            total_chunks: self.space.total_chunks(),
            free_chunks: self.space.free_chunks(),
        }
    }

    /// Absolute path of a metadata file named in a version record.
    pub fn metadata_path(&self, rel: &Path) -> PathBuf {
        self.dir.join(rel)
    }

    /// The free chunks every writer allocates from.
    pub fn space_map(&self) -> &Space {
        &self.space
    }

    pub(crate) async fn lock_ingest(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.ingest_lock.lock().await
    }

    /// Commits a version; its reserved runs become owned by it.
    pub(crate) fn commit(&self, record: &VersionRecord, reserved: Reservation) -> Result<()> {
        self.catalog.commit_version(record)?;
        reserved.keep();
        Ok(())
    }
}

fn reclaim_metadata(dir: &Path, catalog: &Catalog) -> Result<ReclaimReport> {
    let live: std::collections::HashSet<PathBuf> = catalog.metadata_files()?.into_iter().collect();
    let meta = dir.join(META_DIR);
    let mut report = ReclaimReport::default();
    let Ok(datasets) = std::fs::read_dir(&meta) else {
        return Ok(report);
    };
    for ds in datasets.flatten() {
        let Ok(files) = std::fs::read_dir(ds.path()) else {
            continue;
        };
        for f in files.flatten() {
            let rel = PathBuf::from(META_DIR)
                .join(ds.file_name())
                .join(f.file_name());
            if !live.contains(&rel) {
                std::fs::remove_file(f.path())
                    .map_err(|e| StorageError::io("remove orphan", f.path(), e))?;
                report.metadata_files += 1;
            }
        }
    }
    Ok(report)
}
