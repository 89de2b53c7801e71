//! [`Prepared`]: which granules of a [`crate::Region`] are known to be
//! reserved in `/dev/shm` and faulted into this process's mapping, so
//! that a region kept between reads is not prepared again for each one.
//!
//! Preparing a range that is already in place still costs the kernel a
//! walk of its pages (`posix_fallocate` looks up every folio, and
//! `MADV_POPULATE_WRITE` every page table entry): about a seventh of the
//! server's CPU while a kept 24-96 MiB window streamed a 1 GiB
//! checkpoint. Pages once reserved and faulted in stay so while the
//! mapping lives (nothing here punches holes), so a granule is marked
//! once the whole of it was prepared, and a range whose granules are all
//! marked is skipped.

use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes a bit stands for.
pub const GRANULE: usize = 1 << 20;

/// See the module docs.
#[derive(Debug)]
pub struct Prepared {
    bits: Vec<AtomicU64>,
    len: usize,
}

impl Prepared {
    /// Nothing prepared of `len` bytes.
    pub fn new(len: usize) -> Self {
        let granules = len.div_ceil(GRANULE);
        Self {
            bits: (0..granules.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            len,
        }
    }

    /// Whether every granule that `[at, at + len)` touches is marked
    /// (an empty range always is).
    pub fn covers(&self, at: usize, len: usize) -> bool {
        let end = at.saturating_add(len).min(self.len);
        if at >= end {
            return true;
        }
        (at / GRANULE..end.div_ceil(GRANULE)).all(|g| self.is_marked(g))
    }

    /// Marks the granules that lie wholly inside `[at, at + len)` (the
    /// last one also where the range reaches the end): those are prepared.
    pub fn mark(&self, at: usize, len: usize) {
        let end = at.saturating_add(len).min(self.len);
        let first = at.div_ceil(GRANULE);
        let last = if end == self.len {
            end.div_ceil(GRANULE)
        } else {
            end / GRANULE
        };
        for g in first..last {
            self.bits[g / 64].fetch_or(1 << (g % 64), Ordering::Release);
        }
    }

    fn is_marked(&self, g: usize) -> bool {
        self.bits[g / 64].load(Ordering::Acquire) & (1 << (g % 64)) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_is_covered_once_every_granule_it_touches_is_marked() {
        let p = Prepared::new(5 * GRANULE + 10);
        assert!(!p.covers(0, 1));
        assert!(p.covers(3, 0), "an empty range");
        p.mark(GRANULE / 2, 2 * GRANULE);
        // Only granule 1 lay wholly inside.
        assert!(p.covers(GRANULE, GRANULE));
        assert!(
            !p.covers(GRANULE / 2, GRANULE),
            "granule 0 was half prepared"
        );
        assert!(
            !p.covers(GRANULE, GRANULE + 1),
            "granule 2 was half prepared"
        );
        p.mark(0, GRANULE);
        p.mark(2 * GRANULE, GRANULE);
        assert!(p.covers(0, 3 * GRANULE));
        assert!(!p.covers(0, 3 * GRANULE + 1));
    }

    #[test]
    fn the_short_last_granule_is_marked_by_a_range_to_the_end() {
        let p = Prepared::new(2 * GRANULE + 10);
        p.mark(2 * GRANULE, 5);
        assert!(!p.covers(2 * GRANULE, 1), "not to the end");
        p.mark(2 * GRANULE, 10);
        assert!(p.covers(2 * GRANULE, 10));
        assert!(p.covers(2 * GRANULE + 5, 100), "clipped to the end");
        let whole = Prepared::new(130 * GRANULE);
        whole.mark(0, 130 * GRANULE);
        assert!(whole.covers(0, 130 * GRANULE), "past one word of bits");
    }
}
