//! The data directory's layout and its format marker.
//!
//! ```text
//! DATA_DIR/
//!   FORMAT                    JSON: magic, format version, chunk and block size, device
//!   catalog.redb              datasets, versions, chunk map (redb, transactional)
//!   device.img                the file-backed device (unless a raw device is configured)
//!   meta/<dataset>/v<N>.parquet   per-version sample metadata
//! ```
//!
//! `FORMAT` is read before anything else; a directory written by another
//! format version, or one that is not a sluice data dir at all, is refused
//! with a message instead of being misread.

use std::path::{Path, PathBuf};

use crate::error::{Result, StorageError};

/// The only format version this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;
const MAGIC: &str = "sluice-data-dir";

/// Name of the format marker file.
pub const FORMAT_FILE: &str = "FORMAT";
/// Name of the catalog database.
pub const CATALOG_FILE: &str = "catalog.redb";
/// Default device file name inside the data dir.
pub const DEVICE_FILE: &str = "device.img";
/// Directory of per-version metadata files.
pub const META_DIR: &str = "meta";

/// Contents of the `FORMAT` file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DataDirFormat {
    /// Always "sluice-data-dir".
    pub magic: String,
    /// Layout version.
    pub format_version: u32,
    /// Chunk size in bytes.
    pub chunk_size: u64,
    /// Device block size in bytes.
    pub block_size: u64,
    /// Device path: relative paths are inside the data dir.
    pub device: PathBuf,
    /// The sluice that created the directory.
    pub created_by: String,
}

impl DataDirFormat {
    /// A marker for a new data dir.
    pub fn new(chunk_size: u64, block_size: u64, device: PathBuf) -> Self {
        Self {
            magic: MAGIC.into(),
            format_version: FORMAT_VERSION,
            chunk_size,
            block_size,
            device,
            created_by: format!("sluice {}", env!("CARGO_PKG_VERSION")),
        }
    }

    /// Reads and checks `dir/FORMAT`; `Ok(None)` when the file does not exist.
    pub fn load(dir: &Path) -> Result<Option<Self>> {
        let path = dir.join(FORMAT_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(StorageError::io("read", path, e)),
        };
        let incompatible = |reason: String| StorageError::IncompatibleDataDir {
            path: dir.to_owned(),
            reason,
        };
        let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
            incompatible(format!(
                "{FORMAT_FILE} is not valid JSON ({e}); not a sluice data dir?"
            ))
        })?;
        if value.get("magic").and_then(|m| m.as_str()) != Some(MAGIC) {
            return Err(incompatible(format!(
                "{FORMAT_FILE} does not describe a sluice data dir"
            )));
        }
        let version = value
            .get("format_version")
            .and_then(|v| v.as_u64())
            .unwrap_or(0);
        if version != u64::from(FORMAT_VERSION) {
            return Err(incompatible(format!(
                "written in format version {version}, this sluice reads version {FORMAT_VERSION}"
            )));
        }
        let format: Self = serde_json::from_value(value)
            .map_err(|e| incompatible(format!("{FORMAT_FILE} is malformed: {e}")))?;
        if format.chunk_size == 0
            || format.block_size == 0
            || !format.chunk_size.is_multiple_of(format.block_size)
        {
            return Err(incompatible(format!(
                "chunk size {} is not a positive multiple of block size {}",
                format.chunk_size, format.block_size
            )));
        }
        Ok(Some(format))
    }

    /// Writes `dir/FORMAT` atomically (temp file, fsync, rename).
    pub fn store(&self, dir: &Path) -> Result<()> {
        let text =
            serde_json::to_string_pretty(self).map_err(|e| StorageError::IncompatibleDataDir {
                path: dir.to_owned(),
                reason: e.to_string(),
            })?;
        write_atomically(&dir.join(FORMAT_FILE), text.as_bytes())
    }

    /// The device path, resolved against the data dir; an SPDK bdev
    /// (`bdev:NAME`) is a name, not a path, and stays as it is.
    pub fn device_path(&self, dir: &Path) -> PathBuf {
        let is_bdev = self.device.to_str().is_some_and(|d| d.starts_with("bdev:"));
        if self.device.is_absolute() || is_bdev {
            self.device.clone()
        } else {
            dir.join(&self.device)
        }
    }
}

/// Writes `path` so that it either has the old contents or all the new ones:
/// temp file, fsync, rename, fsync of the directory.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).map_err(|e| StorageError::io("create", &tmp, e))?;
    f.write_all(bytes)
        .map_err(|e| StorageError::io("write", &tmp, e))?;
    f.sync_all()
        .map_err(|e| StorageError::io("sync", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| StorageError::io("rename", &tmp, e))?;
    sync_dir(path.parent().unwrap_or(Path::new(".")))
}

/// fsyncs a directory so that a rename inside it is durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StorageError::io("sync directory", dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_other_versions() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(DataDirFormat::load(dir.path()).unwrap(), None);
        let f = DataDirFormat::new(1 << 22, 4096, DEVICE_FILE.into());
        f.store(dir.path()).unwrap();
        assert_eq!(DataDirFormat::load(dir.path()).unwrap(), Some(f.clone()));

        let mut v = serde_json::to_value(&f).unwrap();
        v["format_version"] = 99.into();
        std::fs::write(dir.path().join(FORMAT_FILE), v.to_string()).unwrap();
        let err = DataDirFormat::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("format version 99"), "{err}");

        std::fs::write(dir.path().join(FORMAT_FILE), "garbage").unwrap();
        let err = DataDirFormat::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("not a sluice data dir"), "{err}");
    }
}
