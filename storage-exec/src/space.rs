//! [`Space`]: the store's free chunks, shared by every writer, and
//! [`Reservation`]: the chunks one writer holds until it commits.
//!
//! Ingests and checkpoint uploads run at the same time, so they allocate
//! from one allocator: a chunk handed to one writer is never handed to
//! another. A writer's chunks stay in its [`Reservation`] until the catalog
//! commit that makes them owned ([`Reservation::keep`]); a writer that
//! fails, is cancelled or is dropped for any reason releases them at once
//! (and a process that dies releases them by not being there at the next
//! open, which rebuilds the allocator from the catalog's chunk map).

use std::sync::{Arc, Mutex, MutexGuard};

use crate::alloc::{ChunkAllocator, ChunkRun};
use crate::cache::ObjectCache;

/// The shared free-space map of one store.
#[derive(Debug, Clone)]
pub struct Space {
    inner: Arc<Mutex<ChunkAllocator>>,
    /// The store's object cache, told of every chunk freed, and the chunk
    /// size that turns chunks into device offsets.
    cache: Option<(Arc<ObjectCache>, u64)>,
}

impl Space {
    /// Space over `alloc` (chunks it marks used are owned).
    pub fn new(alloc: ChunkAllocator) -> Self {
        Self {
            inner: Arc::new(Mutex::new(alloc)),
            cache: None,
        }
    }

    /// The same, forgetting cached objects in chunks it frees.
    pub fn with_cache(mut self, cache: Arc<ObjectCache>, chunk_size: u64) -> Self {
        self.cache = Some((cache, chunk_size));
        self
    }

    fn lock(&self) -> MutexGuard<'_, ChunkAllocator> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Chunks on the device.
    pub fn total_chunks(&self) -> u64 {
        self.lock().total()
    }

    /// Chunks neither owned nor reserved.
    pub fn free_chunks(&self) -> u64 {
        self.lock().free()
    }

    /// An empty reservation to allocate into.
    pub fn reserve(&self) -> Reservation {
        Reservation {
            space: self.clone(),
            runs: Vec::new(),
        }
    }

    /// Returns owned runs to the free space (their owner was deleted).
    pub fn release(&self, runs: &[ChunkRun]) {
        // The cache first: once a chunk is free, a writer may fill it.
        if let Some((cache, chunk)) = &self.cache {
            for run in runs {
                cache.forget(run.start * chunk, (run.start + run.count) * chunk);
            }
        }
        let mut alloc = self.lock();
        for run in runs {
            alloc.release(*run);
        }
    }
}

/// Chunks allocated to one writer and not yet committed; released on drop
/// unless [`kept`](Self::keep).
#[derive(Debug)]
pub struct Reservation {
    space: Space,
    runs: Vec<ChunkRun>,
}

impl Reservation {
    /// Allocates `count` contiguous chunks.
    pub fn allocate(&mut self, count: u64) -> Option<ChunkRun> {
        let run = self.space.lock().allocate(count)?;
        self.runs.push(run);
        Some(run)
    }

    /// Allocates the `count` chunks right at `start` if they are all free.
    pub fn allocate_at(&mut self, start: u64, count: u64) -> bool {
        let ok = self.space.lock().allocate_at(start, count);
        if ok {
            self.runs.push(ChunkRun { start, count });
        }
        ok
    }

    /// Free chunks of the store now (for a "device full" message).
    pub fn free_chunks(&self) -> u64 {
        self.space.free_chunks()
    }

    /// The runs held.
    pub fn runs(&self) -> &[ChunkRun] {
        &self.runs
    }

    /// Chunks held.
    pub fn chunks(&self) -> u64 {
        self.runs.iter().map(|r| r.count).sum()
    }

    /// Hands the chunks of `runs` that this holds to a durable owner
    /// other than a version (an ingest's resume record, saved while the
    /// ingest goes on): they stay allocated when this is dropped.
    pub fn cede(&mut self, runs: &[ChunkRun]) {
        self.runs = crate::alloc::subtract(&self.runs, runs);
    }

    /// Takes back chunks [`cede`](Self::cede)d whose owner was not saved
    /// after all: they are released on drop again.
    pub fn adopt(&mut self, runs: &[ChunkRun]) {
        self.runs.extend_from_slice(runs);
    }

    /// The chunks are owned now (their commit is durable): they stay
    /// allocated when this is dropped.
    pub fn keep(mut self) {
        self.runs.clear();
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.runs.is_empty() {
            self.space.release(&self.runs);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writers_never_share_chunks_and_a_dropped_reservation_frees_its_own() {
        let space = Space::new(ChunkAllocator::new(8));
        let mut a = space.reserve();
        let mut b = space.reserve();
        let ra = a.allocate(3).unwrap();
        let rb = b.allocate(3).unwrap();
        assert!(ra.start + ra.count <= rb.start || rb.start + rb.count <= ra.start);
        assert!(!b.allocate_at(ra.start, 1), "a's chunk is not b's to take");
        assert_eq!(space.free_chunks(), 2);
        drop(b);
        assert_eq!(space.free_chunks(), 5);
        a.keep();
        assert_eq!(space.free_chunks(), 5, "kept chunks stay used");
        space.release(&[ra]);
        assert_eq!(space.free_chunks(), 8);
    }

    /// Ceded chunks outlive the reservation's drop; adopted ones do not.
    #[test]
    fn ceded_chunks_stay_allocated_and_adopted_ones_go_with_the_reservation() {
        let space = Space::new(ChunkAllocator::new(8));
        let mut r = space.reserve();
        let run = r.allocate(4).unwrap();
        let head = ChunkRun {
            start: run.start,
            count: 2,
        };
        r.cede(&[head]);
        assert_eq!(r.chunks(), 2);
        drop(r);
        assert_eq!(space.free_chunks(), 6, "the ceded two stay used");
        let mut r = space.reserve();
        r.adopt(&[head]);
        drop(r);
        assert_eq!(space.free_chunks(), 8);
    }
}
