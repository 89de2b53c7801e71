//! Many versions read into one region: a model's files loaded together.
//!
//! A trainer that loads a checkpoint of many files (a layer a file, the
//! optimizer's groups: MLPerf's llama3 layout is 34 a rank) pays a
//! `get_open` for each with one region each: a proof of host, a lookup, a
//! region bound and mapped. `get_group` lends (or rebinds) one region for
//! all of them, the versions side by side at block-aligned places, and
//! reads every one of at most `fill` bytes before it answers, all at once
//! at the device's depth: the small files of a load are one request. The
//! client fetches the larger ones by item (`get`'s `item`) and parses
//! each in place, or copies it out, while the rest arrive. Kept, the
//! region takes the next load of the same shape with its pages in place.

use std::sync::Arc;

use sluice_flight::shm_handshake::Probe;

use super::{MAX_KEPT, Placed, RegionInfo};
use crate::checkpoint::record::{CheckpointInfo, CheckpointRecord};
use crate::error::{Result, StorageError};

/// The most versions one `get_group` may name.
pub const MAX_GROUP: usize = 4096;

/// A place in a region is a multiple of this (O_DIRECT lands there).
const PLACE_ALIGN: u64 = 4096;

/// One version a group asks for.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct GroupItem {
    /// The checkpoint.
    pub name: String,
    /// Its version; the newest when `None`.
    #[serde(default)]
    pub version: Option<u64>,
}

/// What a reader asks `get_group` for.
#[derive(Debug, Clone, Copy)]
pub struct GroupRequest<'a> {
    /// The versions, in the order the answer places them.
    pub items: &'a [GroupItem],
    /// The client's proof that it is on this host.
    pub probe: &'a Probe,
    /// Regions the client keeps from earlier reads, idle now.
    pub kept: &'a [String],
    /// Read every version of at most this many bytes before answering.
    pub fill: u64,
    /// Where not 0, the region holds at most this many bytes: a version
    /// that would take it past them is left out (the client reads it
    /// alone), and none is lent when none fits.
    pub max_bytes: u64,
}

/// Where one version of a group landed.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PlacedInfo {
    /// Its place in the request's list (the item to name in `get` is
    /// its place in the answer's).
    pub index: usize,
    /// The version.
    pub checkpoint: CheckpointInfo,
    /// The region byte its byte 0 is at.
    pub at: u64,
    /// Bytes of it read already (all of it, where it was no larger than
    /// the request's `fill`; else 0).
    pub filled: u64,
}

/// What `get_group` answers.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GroupOpened {
    /// The region the versions are read into (none when none fits
    /// `max_bytes`).
    pub region: Option<RegionInfo>,
    /// The versions placed in it, in the request's order: all of them
    /// unless `max_bytes` left some out.
    pub items: Vec<PlacedInfo>,
    /// Whether `region` is one the client keeps.
    pub kept: bool,
    /// Kept regions this server no longer lends: the client lets them go.
    pub gone: Vec<String>,
}

impl GroupRequest<'_> {
    /// Refuses a group of no versions or too many, or too many kept
    /// regions named.
    pub(super) fn check(&self) -> Result<()> {
        let refused = |reason: String| StorageError::SharedMemory {
            what: self.what(),
            reason,
        };
        if self.items.is_empty() || self.items.len() > MAX_GROUP {
            return Err(refused(format!(
                "{} versions named; 1 to {MAX_GROUP}",
                self.items.len()
            )));
        }
        if self.kept.len() > MAX_KEPT {
            return Err(refused(format!(
                "{} kept regions named; at most {MAX_KEPT}",
                self.kept.len()
            )));
        }
        Ok(())
    }

    /// What the group is, in an error.
    pub(super) fn what(&self) -> String {
        format!("a group of {} checkpoints", self.items.len())
    }
}

/// Versions placed side by side in a region.
pub(super) struct Layout {
    /// Those that fit, in order.
    pub items: Arc<[Placed]>,
    /// Each one's place in the request.
    pub indices: Vec<usize>,
    /// The bytes the region must hold.
    pub end: u64,
}

impl Layout {
    /// Places `records` (the request's, in order) at aligned places, as
    /// many as fit `max_bytes` (0: all): one that would take the region
    /// past them is left out. An empty version takes no room.
    pub(super) fn place(records: Vec<Arc<CheckpointRecord>>, max_bytes: u64) -> Self {
        let mut placed = Vec::with_capacity(records.len());
        let mut indices = Vec::with_capacity(records.len());
        let mut end = 0u64;
        for (index, record) in records.into_iter().enumerate() {
            let at = match record.size {
                0 => end,
                _ => end.next_multiple_of(PLACE_ALIGN),
            };
            if max_bytes > 0 && at + record.size > max_bytes {
                continue;
            }
            end = at + record.size;
            placed.push(Placed { record, at });
            indices.push(index);
        }
        Self {
            items: placed.into(),
            indices,
            end,
        }
    }

    /// The versions of at most `fill` bytes that are not empty: read
    /// before the answer (their place in `items`, their size).
    pub(super) fn small(&self, fill: u64) -> Vec<(usize, u64)> {
        self.items
            .iter()
            .enumerate()
            .filter(|(_, p)| p.record.size > 0 && p.record.size <= fill)
            .map(|(i, p)| (i, p.record.size))
            .collect()
    }

    /// The answer, once `filled` (bytes read of each item) are in.
    pub(super) fn answer(
        &self,
        region: Option<RegionInfo>,
        filled: Vec<u64>,
        kept: bool,
        gone: Vec<String>,
    ) -> GroupOpened {
        let items = self
            .items
            .iter()
            .zip(filled)
            .zip(&self.indices)
            .map(|((p, filled), &index)| PlacedInfo {
                index,
                checkpoint: CheckpointInfo::from(p.record.as_ref()),
                at: p.at,
                filled,
            })
            .collect();
        GroupOpened {
            region,
            items,
            kept,
            gone,
        }
    }
}
