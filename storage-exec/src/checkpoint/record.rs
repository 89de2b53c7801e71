//! [`CheckpointRecord`]: one committed version of a checkpoint — where its
//! bytes are on the device and their checksums — and the rules for
//! checkpoint names.

use crate::alloc::ChunkRun;
use crate::error::{Result, StorageError};

pub use sluice_flight::checkpoint::requests::MAX_NAME;

/// A run of a checkpoint's bytes on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CheckpointExtent {
    /// Position of its first byte in the checkpoint.
    pub offset: u64,
    /// Byte address on the device (block-aligned).
    pub device: u64,
    /// Length in bytes.
    pub len: u64,
    /// crc32c of the bytes.
    pub crc: u32,
}

impl CheckpointExtent {
    /// Position one past its last byte in the checkpoint.
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// A committed checkpoint version.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CheckpointRecord {
    /// Its name (`prefix/file`).
    pub name: String,
    /// Version, from 1; each commit of a name adds one.
    pub version: u64,
    /// Size in bytes.
    pub size: u64,
    /// Commit time, milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// Its bytes, in order, covering `[0, size)` exactly.
    pub extents: Vec<CheckpointExtent>,
    /// The chunks it owns.
    pub runs: Vec<ChunkRun>,
}

impl CheckpointRecord {
    /// Checks `bytes` read back for extent `e` against its crc32c; a
    /// mismatch names the checkpoint, version and byte range.
    pub fn check(&self, e: &CheckpointExtent, bytes: &[u8]) -> crate::error::Result<()> {
        let actual = crc32c::crc32c(bytes);
        if actual != e.crc {
            return Err(crate::error::StorageError::CheckpointCorrupt {
                name: self.name.clone(),
                version: self.version,
                offset: e.offset,
                end: e.end(),
                expected: e.crc,
                actual,
            });
        }
        Ok(())
    }

    /// The extents that hold some of `[offset, offset + len)`.
    pub fn extents_in(&self, offset: u64, len: u64) -> &[CheckpointExtent] {
        let end = offset.saturating_add(len).min(self.size);
        if end <= offset {
            return &[];
        }
        let first = self.extents.partition_point(|e| e.end() <= offset);
        let last = self.extents.partition_point(|e| e.offset < end);
        &self.extents[first..last.max(first)]
    }
}

pub use sluice_flight::checkpoint::CheckpointInfo;

impl From<&CheckpointRecord> for CheckpointInfo {
    fn from(r: &CheckpointRecord) -> Self {
        Self {
            name: r.name.clone(),
            version: r.version,
            size: r.size,
            created_unix_ms: r.created_unix_ms,
        }
    }
}

/// Checks a checkpoint name: path-like (`run7/epoch3/rank0.pt`), segments
/// of letters, digits, `.`, `_`, `-` and `=`, none empty, `.` or `..`.
pub fn validate_name(name: &str) -> Result<()> {
    match sluice_flight::checkpoint::requests::name_problem(name) {
        None => Ok(()),
        Some(reason) => Err(StorageError::InvalidCheckpointName {
            name: name.chars().take(64).collect(),
            reason,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(offset: u64, len: u64) -> CheckpointExtent {
        CheckpointExtent {
            offset,
            device: 0,
            len,
            crc: 0,
        }
    }

    #[test]
    fn extents_in_a_range_are_the_ones_that_overlap_it() {
        let r = CheckpointRecord {
            name: "a".into(),
            version: 1,
            size: 30,
            created_unix_ms: 0,
            extents: vec![ext(0, 10), ext(10, 10), ext(20, 10)],
            runs: vec![],
        };
        assert_eq!(r.extents_in(0, 30).len(), 3);
        assert_eq!(r.extents_in(10, 1), &[ext(10, 10)]);
        assert_eq!(r.extents_in(9, 2).len(), 2);
        assert_eq!(r.extents_in(29, 100), &[ext(20, 10)]);
        assert!(r.extents_in(30, 5).is_empty());
        assert!(r.extents_in(5, 0).is_empty());
    }

    #[test]
    fn names_are_path_like_and_bounded() {
        for ok in ["model.pt", "run-7/epoch=3/rank_0.pt", "a/b/c"] {
            validate_name(ok).unwrap();
        }
        for bad in ["", "/abs", "a//b", "a/../b", "a/./b", "sp ace", "x/", "ü"] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
        assert!(validate_name(&"a".repeat(513)).is_err());
        let err = validate_name(&format!("{}!", "x".repeat(1000))).unwrap_err();
        assert!(err.to_string().len() < 250, "{err}");
    }
}
