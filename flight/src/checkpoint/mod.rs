//! The checkpoint protocol of the Flight service trainers reach, and
//! [`CheckpointEndpoint`], what serves it (the storage crate's checkpoint
//! store).
//!
//! ```text
//!  DoAction checkpoint.begin  {"name"}                  → {"upload"}
//!  DoPut    descriptor cmd    {"checkpoint_upload", "offset"}
//!           batches of one LargeBinary column "data": the part's bytes, in order
//!                                                       → PutResult {"bytes"}
//!  DoAction checkpoint.commit {"upload", "size"}        → {"name", "version", "size", …}
//!  DoAction checkpoint.commit_group {"uploads": [{"upload", "size"}, …]}
//!                                                       → one version per upload, in one transaction
//!  DoAction checkpoint.abort  {"upload"}
//!  DoAction checkpoint.stat   {"name", "version"?}      → {"name", "version", "size", …}
//!  DoAction checkpoint.list   {"prefix"}                → [{"name", "version", "size", …}]
//!  DoAction checkpoint.delete {"name", "version"?}      → the versions removed
//!  DoGet    ticket            {"checkpoint", "version", "offset", "length"}
//!           → batches of one LargeBinary column "data": the range's bytes, in order
//! ```
//!
//! A writer sends the parts of one upload on several DoPut streams at
//! once; a reader fetches several ranges of one version on several DoGet
//! streams at once. Both are authenticated like every other call.
//!
//! A client on the server's host moves the bytes through a shared-memory
//! region instead (the same `Probe` as a trainer's; the server's
//! `checkpoint::shared` module):
//!
//! ```text
//!  DoAction checkpoint.shm.put_open {"probe", "size"}     → {"region", "path", "size"}
//!  DoAction checkpoint.shm.put      {"region", "upload", "at", "length", "offset"}
//!           the region's bytes [at, at + length) are the upload's part at offset → {"bytes"}
//!  DoAction checkpoint.shm.get_open {"name", "version"?, "probe", "kept"?: [region], "fill"?,
//!                                    "own_from"?, "own_below"?, "window"?}
//!           → {"region": {"region", "path", "size"}, "checkpoint": {…}, "kept", "filled", "gone"}
//!           the smallest idle kept region the version fits (else a new one; always a new
//!           one of its size from `own_from` bytes and under `own_below`, for a client that
//!           maps it; a region of `window` bytes for a larger version, which the client
//!           streams through it); a version of at most `fill` bytes is read into it before
//!           the answer (`filled`)
//!  DoAction checkpoint.shm.get      {"region", "offset", "length"}
//!           the version's bytes land in the region at the same place → {"bytes"}
//!  DoAction checkpoint.shm.touch    {"region"}  (a kept region taken up again; not found once let go)
//!  DoAction checkpoint.shm.close    {"region"}
//! ```
//!
//! A storage node of a cluster serves the same protocol to its
//! coordinator, which keeps each node's stripes of a checkpoint there as
//! a version of its own ([`node::NodeCheckpoints`], the coordinator's
//! client of it). A trainer may write and read the stripes itself,
//! straight to and from the nodes ([`Direct`], [`DirectRead`]):
//!
//! ```text
//!  DoAction checkpoint.begin {"name", "direct": true}  (to the coordinator)
//!           → {"upload", "direct": {"unit", "replicas", "nodes": [{"url", "upload", "pass"}, …]}}
//!           (no "direct" where a node gave no pass: then the parts go to the coordinator)
//!  DoPut    (to node k) descriptor cmd {"checkpoint_upload": its upload, "offset": in its piece},
//!           header x-sluice-upload-pass: its pass; stripe s goes to nodes s … s+R−1 (mod n)
//!  DoAction checkpoint.commit {"upload", "size"}       (to the coordinator, as ever)
//!  DoAction checkpoint.stat {"name", "version"?, "direct": true}  (to the coordinator)
//!           → {…, "direct": {"unit", "pieces": [{"url", "piece", "version", "stripes", "pass"}, …]}}
//!           (no "direct" where the pieces with a read pass miss a stripe)
//!  DoGet    (to a piece's node) ticket {"type": "checkpoint", "checkpoint": its piece, "version",
//!           "offset", "length"}, header x-sluice-read-pass: its pass; stripe stripes[i] of the
//!           piece at i × unit there
//! ```
//!
//! Files: this one (the protocol), [`data`] (the bytes as batches),
//! [`direct`] (a trainer's layouts to write and read a cluster's stripes
//! itself),
//! [`node`] (a storage node's checkpoints, called over Flight),
//! [`requests`] (the actions' bodies, and what a name may be), [`scrub`]
//! (reading versions back, and repairing an extent).

pub mod data;
pub mod direct;
pub mod node;
pub mod requests;
pub mod scrub;

use std::fmt;

use arrow_flight::FlightData;
use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};
use tonic::Status;

pub use data::data_schema;
pub use direct::{Direct, DirectNode, DirectPiece, DirectRead};

use crate::stream::FlightStream;

/// Prefix of every checkpoint action.
pub const ACTION_PREFIX: &str = "checkpoint.";

/// The actions, with their descriptions (for `ListActions`).
pub const ACTIONS: [(&str, &str); 19] = [
    (
        "checkpoint.begin",
        "start writing a checkpoint version: {name, direct?, pass?} → {upload, direct?, pass?}",
    ),
    (
        "checkpoint.begin_group",
        "start writing versions of several checkpoints, to commit together: {names, direct?} → {uploads, direct?}",
    ),
    (
        "checkpoint.open_uploads",
        "which of these uploads are still open: {uploads} → {open}",
    ),
    (
        "checkpoint.read_pass",
        "a storage node's pass to read one version with no token: {name, version?} → {version, pass?}",
    ),
    (
        "checkpoint.commit",
        "make an upload's parts the next version: {upload, size}",
    ),
    (
        "checkpoint.commit_group",
        "make several uploads versions in one transaction: {uploads: [{upload, size}]}",
    ),
    ("checkpoint.abort", "abandon an upload: {upload}"),
    (
        "checkpoint.shm.put_open",
        "a shared-memory region for a writer's parts, same host: {probe, size}",
    ),
    (
        "checkpoint.shm.put",
        "write a region's bytes as an upload's part: {region, upload, at, length, offset}",
    ),
    (
        "checkpoint.shm.get_open",
        "a shared-memory region for a version, same host: {name, version?, probe, kept?, fill?, own_from?, own_below?, window?}",
    ),
    (
        "checkpoint.shm.get_group",
        "one shared-memory region for several versions side by side, same host: {items: [{name, version?}], probe, kept?, fill?, max_bytes?}",
    ),
    (
        "checkpoint.shm.get",
        "read a range of a version into its region: {region, item?, offset, length, at?}",
    ),
    (
        "checkpoint.shm.touch",
        "mark a kept region used now (not found once let go): {region}",
    ),
    ("checkpoint.shm.close", "let a region go: {region}"),
    (
        "checkpoint.stat",
        "one version (newest by default): {name, version?, direct?} → {name, version, size, created_unix_ms, direct?}",
    ),
    (
        "checkpoint.list",
        "every version of the checkpoints under a prefix: {prefix}",
    ),
    (
        "checkpoint.delete",
        "delete a version, or all of a name: {name, version?}",
    ),
    (
        "checkpoint.scrub",
        "read every version under a prefix back against its crc32c: {prefix, rate_bytes_per_s?}",
    ),
    (
        "checkpoint.repair",
        "rewrite one extent with its own bytes: {name, version, offset, data (base64)}",
    ),
];

/// What a listing shows of a version (and `checkpoint.stat`,
/// `checkpoint.commit` answer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointInfo {
    /// Its name.
    pub name: String,
    /// Its version.
    pub version: u64,
    /// Size in bytes.
    pub size: u64,
    /// Commit time, milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
}

/// The command of a DoPut descriptor: which upload, and where the part
/// starts in the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PutCommand {
    /// The upload id `checkpoint.begin` answered.
    pub checkpoint_upload: String,
    /// Position of the part's first byte.
    pub offset: u64,
}

/// A DoGet ticket for a range of one checkpoint version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetTicket {
    /// The checkpoint name.
    pub checkpoint: String,
    /// Its version (from `checkpoint.stat`, so every range reads the same one).
    pub version: u64,
    /// First byte.
    #[serde(default)]
    pub offset: u64,
    /// Bytes wanted (clipped to the size).
    pub length: u64,
}

impl PutCommand {
    /// The command in `bytes`, if they are one.
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        serde_json::from_slice(bytes).ok()
    }
}

/// What serves checkpoints behind a Flight service.
#[async_trait]
pub trait CheckpointEndpoint: Send + Sync + fmt::Debug {
    /// Writes one part (the rest of a DoPut stream) and returns its length.
    async fn put(
        &self,
        command: PutCommand,
        data: BoxStream<'static, Result<FlightData, Status>>,
    ) -> Result<u64, Status>;

    /// Streams a range of a version.
    async fn get(&self, ticket: GetTicket) -> Result<FlightStream, Status>;

    /// Every version of the checkpoints whose names start with `prefix`
    /// (REST's listing).
    async fn versions(&self, prefix: &str) -> Result<Vec<CheckpointInfo>, Status>;

    /// Deletes one version of `name`, or every one; those deleted (REST's
    /// delete).
    async fn remove(&self, name: &str, version: Option<u64>)
    -> Result<Vec<CheckpointInfo>, Status>;

    /// Uploads in progress (a gauge).
    fn pending_uploads(&self) -> usize;

    /// Shared-memory regions lent to clients (a gauge; none where the
    /// bytes never travel that way).
    fn lent_regions(&self) -> usize {
        0
    }

    /// Answers a `checkpoint.*` action with a JSON body.
    async fn action(&self, kind: &str, body: &[u8]) -> Result<Bytes, Status>;
}
