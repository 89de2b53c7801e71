//! What a trainer and its server say to set up shared memory (the
//! transport itself is the `sluice-shm` crate): the [`Transport`] a
//! trainer asks for, the [`Probe`] that proves it shares this host's
//! `/dev/shm`, where the stream's segment is ([`SegmentInfo`]), which slot
//! holds a batch ([`SlotRef`]), and the segments a trainer still maps
//! ([`Held`]), which a server may reuse for its next stream.

use serde::{Deserialize, Serialize};

/// Where segments and probes live.
pub const SHM_DIR: &str = "/dev/shm";
/// Prefix of a trainer's probe file.
pub const PROBE_PREFIX: &str = "sluice-probe-";
/// Prefix of a segment file.
pub const SEGMENT_PREFIX: &str = "sluice-seg-";

/// How a trainer asks for shared memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// Shared memory when the probe shows the same host, else Flight.
    #[default]
    Auto,
    /// Shared memory or an error that says why not.
    Shm,
    /// Flight only.
    Flight,
}

/// A trainer's proof that it shares this host's `/dev/shm`: the name of a
/// file it made there and the nonce it wrote in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Probe {
    /// File name under [`SHM_DIR`], starting with [`PROBE_PREFIX`].
    pub name: String,
    /// What the file holds.
    pub nonce: String,
}

/// Where a segment is, as the stream's first control message says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentInfo {
    /// Its path.
    pub path: String,
    /// Its size in bytes.
    pub size: u64,
    /// Slots.
    pub slots: u64,
    /// Bytes per slot.
    pub slot_bytes: u64,
}

/// One slot's batch, as its app metadata names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotRef {
    /// The slot.
    pub slot: u64,
    /// Bytes of the IPC message in it.
    pub len: u64,
}

/// Paths a ticket may name.
const HELD_MAX: usize = 8;

/// What a trainer's ticket says of the segments it maps: the id it gives
/// itself (one per process) and the paths of the segments it still maps.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Held {
    /// The trainer process's id: random, unique per process.
    pub trainer: String,
    /// Segments it maps.
    #[serde(default)]
    pub paths: Vec<String>,
}

impl Held {
    /// Whether it is a well-formed claim (an id of at most 64 characters,
    /// at most eight paths): a malformed one keeps nothing.
    pub fn valid(&self) -> bool {
        !self.trainer.is_empty() && self.trainer.len() <= 64 && self.paths.len() <= HELD_MAX
    }
}
