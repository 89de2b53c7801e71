//! Scrub and repair of checkpoint versions on a node, as a cluster's
//! coordinator asks for them (`checkpoint.scrub`, `checkpoint.repair`):
//! every extent of every version under a prefix read back against its
//! crc32c, and a bad extent rewritten with bytes from another holder —
//! only when they are the extent's own (its length and crc32c), so a
//! repair can only restore.

use serde::{Deserialize, Serialize};

/// `checkpoint.scrub`: which versions, how fast.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ScrubCheckpoints {
    /// Names starting with this.
    #[serde(default)]
    pub prefix: String,
    /// At most this many bytes read a second (absent: as fast as the
    /// device goes).
    #[serde(default)]
    pub rate_bytes_per_s: Option<u64>,
}

/// An extent whose bytes do not match its checksum.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BadExtent {
    /// The checkpoint (on the node: a piece's name).
    pub name: String,
    /// Its version there.
    pub version: u64,
    /// The extent's first byte in the version.
    pub offset: u64,
    /// Its length.
    pub len: u64,
    /// The crc32c recorded at its write.
    pub expected_crc32c: u32,
    /// The crc32c of what was read.
    pub actual_crc32c: u32,
}

/// What a checkpoint scrub read and found.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CheckpointScrub {
    /// Versions read.
    pub versions: u64,
    /// Extents read.
    pub extents: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Wall time, seconds.
    pub seconds: f64,
    /// The extents that did not match.
    pub bad: Vec<BadExtent>,
}

/// `checkpoint.repair`: good bytes for one extent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RepairExtent {
    /// The checkpoint.
    pub name: String,
    /// Its version.
    pub version: u64,
    /// The extent's first byte.
    pub offset: u64,
    /// Its bytes, base64.
    pub data: String,
}

/// `checkpoint.repair`'s answer: whether the extent was rewritten (false:
/// it read back good already).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RepairedExtent {
    /// Whether it was written.
    pub rewritten: bool,
}
