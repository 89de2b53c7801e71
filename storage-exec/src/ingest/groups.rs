//! The objects of a source in load groups, read on the blocking pool a
//! few groups ahead of the writer within a byte budget, in source order:
//! [`loaded`]. Keys repeated in a source are refused here, by name.

use std::sync::Arc;

use futures::{Stream, StreamExt};

use super::entries::{Entry, Origin};
use super::load::{Loaded, STREAM_ABOVE, load};
use super::shard_files::{OpenShards, Readers};
use super::{Confinement, LOAD_GROUP, objects};
use crate::error::{Result, StorageError};

/// Load tasks in flight (each of a group of [`LOAD_GROUP`] objects).
pub(super) const LOAD_TASKS: usize = 4;
/// Bytes of loaded objects held at once, waiting for the writer: a group
/// takes its size in permits (at most all of them) before it is read and
/// gives them back once written, so memory stays near this bound whatever
/// the files' sizes (a file over [`STREAM_ABOVE`] is streamed, and counts
/// as that much).
pub(super) const LOAD_BUDGET: u64 = 256 << 20;
/// Bytes of a store's objects one load group fetches, at most (its last
/// object may bring it past: a group ends after it). With the budget,
/// memory holds the budget's bytes or, at most, one group whose large
/// object takes the whole budget (an object of a store over 16 MiB is
/// fetched whole, not streamed into the device as a local file is).
const GROUP_FETCH_BYTES: u64 = 64 << 20;

/// Marks every entry whose key an earlier entry already has: keys are
/// unique within a version by construction, and a duplicate is refused,
/// named, never silently merged.
pub(super) fn refuse_duplicate_keys(entries: &mut [Entry]) {
    let mut seen: std::collections::HashMap<String, usize> =
        std::collections::HashMap::with_capacity(entries.len());
    for (i, e) in entries.iter_mut().enumerate() {
        match seen.get(&e.key) {
            Some(first) => {
                e.origin = Origin::Refused(format!(
                    "duplicate key: row {} of the source has the same key (keys are unique \
                     within a version; give one a 'key' in the manifest, or rename it)",
                    first + 1
                ));
            }
            None => {
                seen.insert(e.key.clone(), i);
            }
        }
    }
}

/// Bytes a group will hold once loaded, from the files' sizes (not
/// following links; a file that cannot be stat'ed counts as empty and is
/// refused by the loader).
fn group_bytes(group: &[Entry]) -> u64 {
    group
        .iter()
        .map(|e| match &e.origin {
            Origin::Inline(b) | Origin::Fetched { bytes: b, .. } => b.len() as u64,
            Origin::Path(p) => std::fs::symlink_metadata(p)
                .map(|m| m.len().min(STREAM_ABOVE))
                .unwrap_or(0),
            Origin::Range { len, .. } => (*len).min(LOAD_BUDGET),
            // Held whole once fetched (see `GROUP_FETCH_BYTES`).
            Origin::Object {
                size: Some(size), ..
            } => *size,
            // Unknown until fetched (a manifest's row): as small objects
            // are, bounded by the group's count.
            Origin::Object { size: None, .. } => 0,
            // Unknown until its row group is decoded; those decoded are
            // bounded by the row groups `Readers` keeps.
            Origin::Cell { .. } | Origin::ObjectCell { .. } | Origin::Refused(_) => 0,
            // On the device already: nothing is read.
            Origin::Kept(_) => 0,
        })
        .sum()
}

/// `entries` in load groups: a group ends at [`LOAD_GROUP`] entries, or
/// after the object of a store that brings its fetched bytes to
/// [`GROUP_FETCH_BYTES`]. A store's object is held whole once fetched,
/// so a large one rides in a small group, whose bytes (over the budget)
/// then hold every permit until written.
fn load_groups(mut entries: impl Iterator<Item = Entry>) -> impl Iterator<Item = Vec<Entry>> {
    std::iter::from_fn(move || {
        let mut group = Vec::with_capacity(LOAD_GROUP);
        let mut fetched = 0u64;
        while group.len() < LOAD_GROUP && fetched < GROUP_FETCH_BYTES {
            let Some(entry) = entries.next() else { break };
            if let Origin::Object { size, range, .. } = &entry.origin {
                fetched += range
                    .as_ref()
                    .map_or(size.unwrap_or(0), |r| r.end - r.start);
            }
            group.push(entry);
        }
        (!group.is_empty()).then_some(group)
    })
}

/// One load group's objects, each with its key (or why it is refused),
/// and the budget's permits it holds until the writer has taken it.
pub(super) type Group = (
    Vec<(String, std::result::Result<Loaded, String>)>,
    tokio::sync::OwnedSemaphorePermit,
);

/// `entries` loaded in groups, in order: objects are loaded in groups on
/// the blocking pool, a few groups ahead of the writer. Each group first
/// takes its bytes from the load budget, in order (`then` is
/// sequential), and gives them back when the writer has taken the group:
/// a later group never holds permits an earlier one waits for.
pub(super) fn loaded(
    entries: Vec<Entry>,
    shards: OpenShards,
    confine: Option<Arc<Confinement>>,
) -> impl Stream<Item = Result<Group>> {
    let budget = Arc::new(tokio::sync::Semaphore::new(LOAD_BUDGET as usize));
    let shards = Arc::new(Readers {
        files: shards,
        row_groups: Default::default(),
    });
    futures::stream::iter(load_groups(entries.into_iter()))
        .then(move |group| {
            let budget = Arc::clone(&budget);
            async move {
                let (group, bytes) = tokio::task::spawn_blocking(move || {
                    let bytes = group_bytes(&group);
                    (group, bytes)
                })
                .await
                .map_err(|e| StorageError::io("load", ".", std::io::Error::other(e)))?;
                let permits = bytes.clamp(1, LOAD_BUDGET) as u32;
                let permit = budget
                    .acquire_many_owned(permits)
                    .await
                    .map_err(|e| StorageError::io("load", ".", std::io::Error::other(e)))?;
                Ok::<_, StorageError>((group, permit))
            }
        })
        .map(move |ready| {
            let confine = confine.clone();
            let shards = Arc::clone(&shards);
            async move {
                let (group, permit) = ready?;
                let group = objects::fetch_group(group).await?;
                let results = tokio::task::spawn_blocking(move || {
                    group
                        .into_iter()
                        .map(|e| load(e, confine.as_deref(), &shards))
                        .collect::<Vec<_>>()
                })
                .await
                .map_err(|e| StorageError::io("load", ".", std::io::Error::other(e)))?;
                Ok::<_, StorageError>((results, permit))
            }
        })
        .buffered(LOAD_TASKS)
}
