//! Shared-memory segments kept for a trainer between its streams.
//!
//! A segment made per stream costs every epoch its pages: the server's
//! first write into each page of a fresh tmpfs file allocates and zeroes
//! it, the trainer's first read of it faults it into its mapping, and the
//! stream's end unmaps and frees them all again — for a stream of a few
//! hundred MB, a fifth of its time. So a stream that ends (read to its
//! end, its segment mapped by the trainer) leaves its segment here, under
//! the trainer's id, and the trainer's next stream takes it back if the
//! trainer still maps it (its ticket names the segments it holds,
//! [`Held`]) and its batches fit the slots:
//!
//! ```text
//!  stream ends ─► keep(trainer, segment)   at most KEEP_MAX kept, each KEEP_FOR
//!  next ticket {held: {trainer, paths}} ─► take: same trainer, a path it holds,
//!                                           slots that fit ─► reused (no new pages)
//!  expired / evicted / process ends ─► dropped: RETIRED set, unmapped
//! ```
//!
//! A trainer that leaves mid-stream (killed, or stopped reading) keeps
//! nothing: its segment goes with its stream. A dropped segment marks
//! itself retired in its header ([`crate::segment::RETIRED_AT`]) so the
//! trainer lets go of its own mapping too. Slots the trainer still holds
//! from the earlier stream stay USED and are skipped until it frees them.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_flight::shm_handshake::Held;

use crate::segment::Segment;

/// How long a segment waits for its trainer's next stream.
pub const KEEP_FOR: Duration = Duration::from_secs(10);
/// Segments kept at once on this process, over all trainers.
pub const KEEP_MAX: usize = 4;
struct Entry {
    trainer: String,
    segment: Arc<Segment>,
    until: Instant,
}

/// The segments kept for trainers between streams.
#[derive(Default)]
pub struct KeptSegments {
    entries: Mutex<Vec<Entry>>,
}

impl std::fmt::Debug for KeptSegments {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeptSegments")
            .field("kept", &self.len())
            .finish()
    }
}

impl KeptSegments {
    /// This process's.
    pub fn global() -> &'static KeptSegments {
        static KEPT: std::sync::OnceLock<KeptSegments> = std::sync::OnceLock::new();
        KEPT.get_or_init(KeptSegments::default)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Drops the segments whose wait is over.
    pub fn expire(&self) {
        let now = Instant::now();
        // Dropped outside the lock: unmapping takes time.
        let gone: Vec<Entry> = {
            let mut entries = self.lock();
            let (gone, kept) = std::mem::take(&mut *entries)
                .into_iter()
                .partition(|e| e.until <= now);
            *entries = kept;
            gone
        };
        drop(gone);
    }

    /// A segment kept for `held`'s trainer, one it still maps, whose slots
    /// hold a message of `bytes` and are no larger than a fresh segment's
    /// for it would be twice over.
    pub fn take(&self, held: &Held, bytes: usize) -> Option<Arc<Segment>> {
        if !held.valid() {
            return None;
        }
        self.expire();
        let fresh = Segment::slot_bytes_for(bytes);
        let mut entries = self.lock();
        let at = entries.iter().position(|e| {
            e.trainer == held.trainer
                && held.paths.iter().any(|p| Path::new(p) == e.segment.path())
                && (fresh..=2 * fresh).contains(&e.segment.slot_bytes())
        })?;
        Some(entries.swap_remove(at).segment)
    }

    /// Keeps `segment` for `held`'s trainer for [`KEEP_FOR`] (the oldest
    /// kept goes beyond [`KEEP_MAX`]); with a tokio runtime, a timer
    /// drops it then even if no stream comes.
    pub fn keep(&'static self, held: &Held, segment: Arc<Segment>) {
        if !held.valid() {
            return;
        }
        let evicted = {
            let mut entries = self.lock();
            entries.push(Entry {
                trainer: held.trainer.clone(),
                segment,
                until: Instant::now() + KEEP_FOR,
            });
            let over = entries.len().saturating_sub(KEEP_MAX);
            entries.sort_by_key(|e| e.until);
            entries.drain(..over).collect::<Vec<_>>()
        };
        drop(evicted);
        if tokio::runtime::Handle::try_current().is_ok() {
            sluice_base::task::detach(async move {
                tokio::time::sleep(KEEP_FOR + Duration::from_millis(10)).await;
                self.expire();
            });
        }
    }

    /// Segments kept now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segment::RETIRED_AT;
    use std::os::fd::AsRawFd;

    fn held(trainer: &str, seg: &Segment) -> Held {
        Held {
            trainer: trainer.into(),
            paths: vec![seg.info().path],
        }
    }

    #[test]
    fn a_kept_segment_goes_back_only_to_its_trainer_that_maps_it_and_fits() {
        let kept: &'static KeptSegments = Box::leak(Box::default());
        let seg = Arc::new(Segment::for_batch(1 << 20).unwrap().unwrap());
        let path = seg.info().path;
        kept.keep(&held("t1", &seg), Arc::clone(&seg));
        assert_eq!(kept.len(), 1);
        // Another trainer, a path it does not hold, batches too large or
        // far smaller: nothing.
        assert!(kept.take(&held("t2", &seg), 1 << 20).is_none());
        let elsewhere = Held {
            trainer: "t1".into(),
            paths: vec!["/dev/shm/sluice-seg-0-0".into()],
        };
        assert!(kept.take(&elsewhere, 1 << 20).is_none());
        assert!(kept.take(&held("t1", &seg), 4 << 20).is_none());
        assert!(kept.take(&held("t1", &seg), 100 << 10).is_none());
        // Its trainer, batches that fit: the same segment.
        let back = kept.take(&held("t1", &seg), 1 << 20).unwrap();
        assert_eq!(back.info().path, path);
        assert!(kept.is_empty());
        // A malformed claim keeps nothing.
        let bad = Held {
            trainer: String::new(),
            paths: vec![],
        };
        kept.keep(&bad, back);
        assert!(kept.is_empty());
    }

    #[test]
    fn at_most_keep_max_are_kept_and_a_dropped_one_says_it_is_retired() {
        let kept: &'static KeptSegments = Box::leak(Box::default());
        let first = Segment::for_batch(64 << 10).unwrap().unwrap();
        // The trainer's own mapping of the first segment, as it would map it.
        let file = std::fs::File::open(first.info().path).unwrap();
        let size = first.info().size as usize;
        // SAFETY: a read-only shared mapping of the segment's file, `size`
        // bytes long, checked against MAP_FAILED; unmapped below.
        let theirs = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(theirs, libc::MAP_FAILED);
        let retired = || {
            // SAFETY: RETIRED_AT is inside the header of the live mapping.
            unsafe { std::ptr::read_volatile(theirs.cast::<u8>().add(RETIRED_AT)) }
        };
        assert_eq!(retired(), 0);
        kept.keep(&held("t", &first), Arc::new(first));
        for _ in 0..KEEP_MAX {
            let seg = Segment::for_batch(64 << 10).unwrap().unwrap();
            kept.keep(&held("t", &seg), Arc::new(seg));
        }
        assert_eq!(kept.len(), KEEP_MAX);
        // The oldest went: dropped, and its header says so to the trainer.
        assert_eq!(retired(), 1);
        // SAFETY: the mapping made above, unmapped once.
        unsafe { libc::munmap(theirs, size) };
    }
}
