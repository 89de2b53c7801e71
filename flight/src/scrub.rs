//! Scrub and repair of a storage node's objects, as they travel between
//! the coordinator and a node (Flight actions whose bodies are JSON).
//!
//! - [`SCRUB`] with a [`ScrubRequest`]: the node reads back every object
//!   of every version it holds (or of one dataset), at most
//!   `rate_bytes_per_s`, checks each against the crc32c recorded at
//!   ingest, and answers a [`ScrubReport`] naming the objects that do not
//!   match.
//! - [`REPAIR_OBJECT`] with a [`RepairObject`]: the node rewrites one
//!   object's extent in place with the bytes given — only when they are
//!   that object's (their crc32c is the one recorded at ingest) — and
//!   reads it back; it answers a [`Repaired`].

use serde::{Deserialize, Serialize};

/// The action that scrubs a node ([`ScrubRequest`] → [`ScrubReport`]).
pub const SCRUB: &str = "scrub";

/// The action that rewrites one object ([`RepairObject`] → [`Repaired`]).
pub const REPAIR_OBJECT: &str = "repair_object";

/// What to scrub.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScrubRequest {
    /// Only this dataset's versions; `None`: every dataset.
    #[serde(default)]
    pub dataset: Option<String>,
    /// At most this many bytes read a second; `None`: as fast as the
    /// device goes.
    #[serde(default)]
    pub rate_bytes_per_s: Option<u64>,
}

/// An object whose bytes do not match their checksum.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BadObject {
    /// The dataset.
    pub dataset: String,
    /// The version.
    pub version: u64,
    /// The object's key.
    pub key: String,
    /// The crc32c recorded at ingest.
    pub expected_crc32c: u32,
    /// The crc32c of what was read.
    pub actual_crc32c: u32,
}

/// What a scrub found.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ScrubReport {
    /// Versions read.
    pub versions: u64,
    /// Objects read.
    pub objects: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Wall time, seconds.
    pub seconds: f64,
    /// The objects that do not match.
    pub bad: Vec<BadObject>,
}

/// One object's good bytes, for the node holding a bad copy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepairObject {
    /// The dataset.
    pub dataset: String,
    /// The version on the node repaired.
    pub version: u64,
    /// The object's key.
    pub key: String,
    /// Its bytes, base64 (standard alphabet, padded).
    pub data: String,
}

/// What a repair did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Repaired {
    /// The dataset.
    pub dataset: String,
    /// The version.
    pub version: u64,
    /// The object's key.
    pub key: String,
    /// Whether its extent was rewritten (`false`: it read back good
    /// already).
    pub rewritten: bool,
}
