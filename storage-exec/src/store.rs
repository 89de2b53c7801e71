//! [`Store`]: one data directory — its device, catalog and free space.
//!
//! Opening a store checks the directory's `FORMAT` marker, opens the device
//! and the catalog (redb's file lock makes the directory single-process),
//! then rebuilds the chunk allocator from the committed chunk map, so
//! chunks written by an ingest that never committed are free again.
//!
//! **Opening never deletes anything.** A data dir with a `FORMAT` marker
//! must have its catalog: a missing, empty or damaged `catalog.redb` is an
//! error naming the file ([`StorageError::CatalogDamaged`]), never a fresh
//! catalog that would call every dataset's chunks free. Metadata files that
//! no committed version names (left by an interrupted ingest) are counted
//! at open and removed only by [`Store::collect_garbage`] (`sluice gc`), an
//! explicit, logged operation that refuses to run when the catalog names
//! no dataset at all while `meta/` holds files.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::ReadableDatabase;

use crate::alloc::ChunkAllocator;
use crate::cache::ObjectCache;
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
    /// Bytes of the node-wide object cache (`None`: a quarter of the
    /// memory available at open; 0: none).
    pub cache_memory: Option<u64>,
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
            cache_memory: None,
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

/// Metadata files that no committed version names, found at open.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct OrphanReport {
    /// Their paths, relative to the data dir.
    pub metadata_files: Vec<PathBuf>,
}

/// What [`Store::collect_garbage`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct GcReport {
    /// Metadata files removed, relative to the data dir.
    pub removed: Vec<PathBuf>,
    /// Datasets whose failed ingests' kept objects were dropped (their
    /// chunks freed; a re-run fetches everything again).
    pub resume_records: Vec<String>,
}

/// An open data directory.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    format: DataDirFormat,
    device: Arc<dyn Device>,
    catalog: Catalog,
    space: Space,
    ingest_lock: Arc<tokio::sync::Mutex<()>>,
    orphans: OrphanReport,
    cache: Arc<ObjectCache>,
}

impl Store {
    /// Opens `opts.data_dir`, creating it (and its device) when it does not exist.
    pub fn open(opts: &StoreOptions) -> Result<Arc<Self>> {
        let dir = &opts.data_dir;
        std::fs::create_dir_all(dir).map_err(|e| StorageError::io("create data dir", dir, e))?;
        let (format, catalog) = match DataDirFormat::load(dir)? {
            Some(f) => (f, Catalog::open(&dir.join(CATALOG_FILE))?),
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
        let orphans = OrphanReport {
            metadata_files: find_orphans(dir, &catalog)?,
        };
        if !orphans.metadata_files.is_empty() {
            tracing::info!(
                "{}: {} metadata files are named by no committed version (an interrupted \
                 ingest leaves them); `sluice gc` removes them",
                dir.display(),
                orphans.metadata_files.len()
            );
        }
        let cache = Arc::new(ObjectCache::new(
            opts.cache_memory
                .unwrap_or_else(ObjectCache::default_budget),
        ));
        let space = Space::new(alloc).with_cache(Arc::clone(&cache), format.chunk_size);
        Ok(Arc::new(Self {
            dir: dir.clone(),
            format,
            device,
            catalog,
            space,
            cache,
            ingest_lock: Arc::new(tokio::sync::Mutex::new(())),
            orphans,
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

    /// Creates a new data dir: device file, `meta/`, catalog, and last the
    /// `FORMAT` marker, so that a directory with a marker always has its
    /// catalog.
    fn initialise(opts: &StoreOptions) -> Result<(DataDirFormat, Catalog)> {
        let dir = &opts.data_dir;
        if dir.join(CATALOG_FILE).exists() {
            return Err(StorageError::IncompatibleDataDir {
                path: dir.clone(),
                reason: "has a catalog but no FORMAT file; not written by this sluice".into(),
            });
        }
        let meta = dir.join(META_DIR);
        if std::fs::read_dir(&meta).is_ok_and(|mut d| d.next().is_some()) {
            return Err(StorageError::IncompatibleDataDir {
                path: dir.clone(),
                reason: format!(
                    "{} holds dataset metadata but there is no FORMAT file and no catalog; \
                     restore them from a backup (sluice will not start a new data dir over it)",
                    meta.display()
                ),
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
        std::fs::create_dir_all(&meta).map_err(|e| StorageError::io("create", &meta, e))?;
        let catalog = Catalog::create(&dir.join(CATALOG_FILE))?;
        let format = DataDirFormat::new(opts.chunk_size, block_size, device);
        format.store(dir)?;
        Ok((format, catalog))
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

    /// Metadata files no committed version named when the store opened.
    pub fn orphans(&self) -> &OrphanReport {
        &self.orphans
    }

    /// Removes metadata files that no committed version names, logging
    /// each. Holds the ingest lock, so a running ingest's file (not yet
    /// committed) is never taken for an orphan. Refuses when the catalog
    /// names no dataset version while `meta/` holds files: that is a
    /// catalog from elsewhere or an emptied one, not garbage.
    pub async fn collect_garbage(&self) -> Result<GcReport> {
        let _guard = self.lock_ingest().await;
        let orphans = find_orphans(&self.dir, &self.catalog)?;
        if self.catalog.metadata_files()?.is_empty() && !orphans.is_empty() {
            return Err(StorageError::CatalogDamaged {
                path: self.dir.join(CATALOG_FILE),
                reason: format!(
                    "it names no dataset version, yet {} holds {} metadata files; \
                     garbage collection would delete every dataset's metadata",
                    self.dir.join(META_DIR).display(),
                    orphans.len()
                ),
            });
        }
        let mut report = GcReport::default();
        for rel in orphans {
            let path = self.dir.join(&rel);
            std::fs::remove_file(&path).map_err(|e| StorageError::io("remove orphan", &path, e))?;
            tracing::info!(
                "gc: removed {} (named by no committed version)",
                path.display()
            );
            report.removed.push(rel);
        }
        let cat = &self.catalog;
        let txn = cat.db().begin_write().map_err(|e| cat.err(e))?;
        let (datasets, runs) = crate::resume_tables::drop_all(&txn).map_err(|e| cat.err(e))?;
        txn.commit().map_err(|e| cat.err(e))?;
        self.space.release(&runs);
        for d in &datasets {
            tracing::info!("gc: dropped what a failed ingest of '{d}' kept for a re-run");
        }
        report.resume_records = datasets;
        Ok(report)
    }

    /// The datasets whose failed ingests kept objects for a re-run
    /// (`sluice gc` drops them).
    pub fn resume_records(&self) -> Result<Vec<String>> {
        let cat = &self.catalog;
        let txn = cat.db().begin_read().map_err(|e| cat.err(e))?;
        crate::resume_tables::datasets(&txn).map_err(|e| cat.err(e))
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

    /// The node-wide object cache every scan of this store reads through.
    pub fn cache(&self) -> &Arc<ObjectCache> {
        &self.cache
    }

    /// The free chunks every writer allocates from.
    pub fn space_map(&self) -> &Space {
        &self.space
    }

    pub(crate) async fn lock_ingest(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.ingest_lock.lock().await
    }

    /// The ingest lock, held past this call: a prepared ingest keeps it
    /// until it is committed or dropped, so no other ingest takes its
    /// version number meanwhile.
    pub(crate) async fn lock_ingest_owned(&self) -> tokio::sync::OwnedMutexGuard<()> {
        Arc::clone(&self.ingest_lock).lock_owned().await
    }

    /// Commits a version; its reserved runs become owned by it.
    pub(crate) fn commit(&self, record: &VersionRecord, reserved: Reservation) -> Result<()> {
        let freed = self.catalog.commit_version(record)?;
        reserved.keep();
        self.space.release(&freed);
        Ok(())
    }
}

/// Files under `meta/` that no committed version names, relative to `dir`.
fn find_orphans(dir: &Path, catalog: &Catalog) -> Result<Vec<PathBuf>> {
    let live: std::collections::HashSet<PathBuf> = catalog.metadata_files()?.into_iter().collect();
    let meta = dir.join(META_DIR);
    let mut out = Vec::new();
    let Ok(datasets) = std::fs::read_dir(&meta) else {
        return Ok(out);
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
                out.push(rel);
            }
        }
    }
    out.sort();
    Ok(out)
}
