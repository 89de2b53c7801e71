//! [`OpenShards`]: the shard files an ingest reads objects from, kept
//! open between objects.
//!
//! A shard's objects are read one `pread` each; opening the shard for each
//! of them (and closing it) would cost three more system calls per object
//! than the pread itself, more than unpacked files cost. The last
//! [`OpenShards::KEEP`] shards opened stay open: loads run a few groups
//! ahead in shard order, so they hit.

use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct OpenShards {
    open: Mutex<VecDeque<(PathBuf, Arc<File>)>>,
    /// Files read under another file's name for the whole ingest: an
    /// inflated `.tar.gz` under the shard's path.
    pinned: Vec<(PathBuf, Arc<File>)>,
}

impl OpenShards {
    /// Shards kept open.
    const KEEP: usize = 8;

    /// Reads `file` whenever `path` is asked for, for as long as this
    /// lives.
    pub(crate) fn pinned(files: Vec<(PathBuf, Arc<File>)>) -> Self {
        Self {
            open: Mutex::default(),
            pinned: files,
        }
    }

    /// `len` bytes at `offset` of `path`, opened by `open` if it is not
    /// open already.
    pub(crate) fn read(
        &self,
        path: &Path,
        offset: u64,
        len: u64,
        open: impl FnOnce() -> Result<File, String>,
    ) -> Result<Vec<u8>, String> {
        let file = self.file(path, open)?;
        let mut out = vec![0u8; len as usize];
        file.read_exact_at(&mut out, offset).map_err(|e| {
            format!(
                "cannot read bytes {offset}..{} of {}: {e}",
                offset + len,
                path.display()
            )
        })?;
        Ok(out)
    }

    fn file(
        &self,
        path: &Path,
        open: impl FnOnce() -> Result<File, String>,
    ) -> Result<Arc<File>, String> {
        if let Some((_, f)) = self.pinned.iter().find(|(p, _)| p == path) {
            return Ok(Arc::clone(f));
        }
        let lock = || self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, f)) = lock().iter().find(|(p, _)| p == path) {
            return Ok(Arc::clone(f));
        }
        let file = Arc::new(open()?);
        let mut open = lock();
        open.push_back((path.to_owned(), Arc::clone(&file)));
        while open.len() > Self::KEEP {
            open.pop_front();
        }
        Ok(file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_is_opened_once_for_its_objects() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.tar");
        std::fs::write(&path, b"0123456789").unwrap();
        let shards = OpenShards::default();
        let opens = std::cell::Cell::new(0);
        let open = || {
            opens.set(opens.get() + 1);
            File::open(&path).map_err(|e| e.to_string())
        };
        assert_eq!(shards.read(&path, 2, 3, open).unwrap(), b"234");
        assert_eq!(shards.read(&path, 7, 3, open).unwrap(), b"789");
        assert_eq!(opens.get(), 1);
        let past = shards.read(&path, 8, 5, open).unwrap_err();
        assert!(
            past.contains("bytes 8..13") && past.contains("s.tar"),
            "{past}"
        );
    }
}
