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

use futures::StreamExt;
use sluice_flight::shm_handshake::Probe;

use super::{Placed, RegionInfo, Use};
use crate::checkpoint::Checkpoints;
use crate::checkpoint::record::CheckpointInfo;
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

impl Checkpoints {
    /// One region for the versions `req.items` names (each its newest
    /// where no version is given), side by side at aligned places, as
    /// many as fit `req.max_bytes`: the smallest idle kept region that
    /// holds them, or a new one. The versions of at most `req.fill` bytes
    /// are read into it before the answer. An unknown checkpoint fails
    /// the whole group, naming it.
    pub async fn shm_get_group(&self, req: GroupRequest<'_>) -> Result<GroupOpened> {
        let what = format!("a group of {} checkpoints", req.items.len());
        let refused = |reason: String| StorageError::SharedMemory {
            what: what.clone(),
            reason,
        };
        if req.items.is_empty() || req.items.len() > MAX_GROUP {
            return Err(refused(format!(
                "{} versions named; 1 to {MAX_GROUP}",
                req.items.len()
            )));
        }
        if req.kept.len() > super::MAX_KEPT {
            return Err(refused(format!(
                "{} kept regions named; at most {}",
                req.kept.len(),
                super::MAX_KEPT
            )));
        }
        let mut placed = Vec::with_capacity(req.items.len());
        let mut indices = Vec::with_capacity(req.items.len());
        let mut end = 0u64;
        for (index, item) in req.items.iter().enumerate() {
            let record = Arc::new(self.get(&item.name, item.version)?);
            // An empty version takes no room (nothing is read into it).
            let at = match record.size {
                0 => end,
                _ => end.next_multiple_of(PLACE_ALIGN),
            };
            if req.max_bytes > 0 && at + record.size > req.max_bytes {
                continue;
            }
            end = at + record.size;
            placed.push(Placed { record, at });
            indices.push(index);
        }
        if placed.is_empty() {
            return Ok(GroupOpened {
                region: None,
                items: Vec::new(),
                kept: false,
                gone: Vec::new(),
            });
        }
        let items: Arc<[Placed]> = placed.into();
        let (rebound, gone) = self.rebind(req.kept, &items, false, end.max(1));
        let kept = rebound.is_some();
        let region = match rebound {
            Some(region) => region,
            None => {
                let use_ = Use::Get {
                    items: Arc::clone(&items),
                };
                self.lend(&what, req.probe, end.max(1), use_, false).await?
            }
        };
        let filled = match self.fill_group(&region.region, &items, req.fill).await {
            Ok(filled) => filled,
            Err(e) => {
                // The client never learns a new region's id from an error.
                if !kept {
                    let _ = self.shm_close(&region.region).await;
                }
                return Err(e);
            }
        };
        let items = items
            .iter()
            .zip(filled)
            .zip(indices)
            .map(|((p, filled), index)| PlacedInfo {
                index,
                checkpoint: CheckpointInfo::from(p.record.as_ref()),
                at: p.at,
                filled,
            })
            .collect();
        Ok(GroupOpened {
            region: Some(region),
            items,
            kept,
            gone,
        })
    }

    /// Reads every version of `items` of at most `fill` bytes into
    /// `region`, as many at once as the device takes; returns the bytes
    /// read of each.
    async fn fill_group(&self, region: &str, items: &[Placed], fill: u64) -> Result<Vec<u64>> {
        let small: Vec<(usize, u64)> = items
            .iter()
            .enumerate()
            .filter(|(_, p)| p.record.size > 0 && p.record.size <= fill)
            .map(|(i, p)| (i, p.record.size))
            .collect();
        let depth = self.store.device().parallelism().clamp(1, 8);
        let mut reads = futures::stream::iter(small)
            .map(|(i, size)| async move { (i, self.shm_get(region, i, 0, size, None).await) })
            .buffer_unordered(depth);
        let mut filled = vec![0; items.len()];
        while let Some((i, n)) = reads.next().await {
            filled[i] = n?;
        }
        Ok(filled)
    }
}
