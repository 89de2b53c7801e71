//! Chunk allocation: which chunks of the device are free.
//!
//! The device is cut into fixed-size chunks (a few MiB). A committed dataset
//! version owns a list of chunk *runs* (start, count); everything else is
//! free. The allocator is a bitmap rebuilt at open from the catalog's chunk
//! map — which is how chunks written by an ingest that never committed are
//! reclaimed: nobody owns them, so they are free.
//!
//! Ingest allocates from a private copy ([`ChunkAllocator::clone`]) and
//! publishes its runs at commit; an ingest that fails simply drops its copy.

/// A run of contiguous chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChunkRun {
    /// First chunk.
    pub start: u64,
    /// Number of chunks.
    pub count: u64,
}

/// The chunks of `from` that no run of `minus` holds, as runs in the
/// order of `from`: what an owner lets go when another takes some of its
/// chunks (runs that only overlap count chunk by chunk, so a run that grew
/// since is not mistaken for another).
pub fn subtract(from: &[ChunkRun], minus: &[ChunkRun]) -> Vec<ChunkRun> {
    let mut out = Vec::new();
    for run in from {
        let mut pieces = vec![(run.start, run.start + run.count)];
        for m in minus {
            let (ms, me) = (m.start, m.start + m.count);
            pieces = pieces
                .into_iter()
                .flat_map(|(s, e)| {
                    if me <= s || e <= ms {
                        return vec![(s, e)];
                    }
                    [(s, ms.max(s)), (me.min(e), e)]
                        .into_iter()
                        .filter(|(a, b)| a < b)
                        .collect()
                })
                .collect();
        }
        out.extend(pieces.into_iter().map(|(s, e)| ChunkRun {
            start: s,
            count: e - s,
        }));
    }
    out
}

/// Free-space bitmap over the device's chunks (bit set = used).
#[derive(Debug, Clone)]
pub struct ChunkAllocator {
    bits: Vec<u64>,
    total: u64,
    used: u64,
    /// Where the next search starts (next-fit keeps an ingest sequential).
    hint: u64,
}

impl ChunkAllocator {
    /// An allocator with `total` chunks, all free.
    pub fn new(total: u64) -> Self {
        Self {
            bits: vec![0; total.div_ceil(64) as usize],
            total,
            used: 0,
            hint: 0,
        }
    }

    /// Number of chunks.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Number of free chunks.
    pub fn free(&self) -> u64 {
        self.total - self.used
    }

    fn is_used(&self, chunk: u64) -> bool {
        self.bits[(chunk / 64) as usize] & (1 << (chunk % 64)) != 0
    }

    fn set(&mut self, chunk: u64, used: bool) {
        let word = &mut self.bits[(chunk / 64) as usize];
        let bit = 1u64 << (chunk % 64);
        if used {
            *word |= bit;
        } else {
            *word &= !bit;
        }
    }

    /// Marks a run as used (when loading the catalog). Returns false if any
    /// chunk of it is out of range or already used — a corrupt chunk map.
    pub fn mark_used(&mut self, run: ChunkRun) -> bool {
        let Some(end) = run.start.checked_add(run.count) else {
            return false;
        };
        if end > self.total || (run.start..end).any(|c| self.is_used(c)) {
            return false;
        }
        for c in run.start..end {
            self.set(c, true);
        }
        self.used += run.count;
        true
    }

    /// Frees a run previously allocated or marked.
    pub fn release(&mut self, run: ChunkRun) {
        for c in run.start..run.start + run.count {
            if c < self.total && self.is_used(c) {
                self.set(c, false);
                self.used -= 1;
            }
        }
    }

    /// Claims `count` chunks right at `start` if they are all free.
    pub fn allocate_at(&mut self, start: u64, count: u64) -> bool {
        self.mark_used(ChunkRun { start, count })
    }

    /// Claims `count` contiguous free chunks, searching from the hint (next
    /// fit) and wrapping around once.
    pub fn allocate(&mut self, count: u64) -> Option<ChunkRun> {
        if count == 0 || count > self.free() {
            return None;
        }
        let found = self
            .find_from(self.hint, self.total, count)
            .or_else(|| self.find_from(0, self.hint, count))?;
        let run = ChunkRun {
            start: found,
            count,
        };
        self.mark_used(run);
        self.hint = found + count;
        Some(run)
    }

    /// First start `s` with `from <= s < to` of `count` free chunks.
    fn find_from(&self, from: u64, to: u64, count: u64) -> Option<u64> {
        let mut start = from;
        let mut len = 0;
        let mut c = from;
        while c < self.total {
            if len == 0 && start >= to {
                return None;
            }
            // Skip whole used words quickly.
            if c.is_multiple_of(64) && len == 0 && self.bits[(c / 64) as usize] == u64::MAX {
                c += 64;
                start = c;
                continue;
            }
            if self.is_used(c) {
                len = 0;
                start = c + 1;
            } else {
                len += 1;
                if len == count {
                    return Some(start);
                }
            }
            c += 1;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn run(start: u64, count: u64) -> ChunkRun {
        ChunkRun { start, count }
    }

    /// Chunk by chunk: a run that grew is the same chunks plus more, a
    /// run cut in the middle leaves both ends, disjoint runs stay whole.
    #[test]
    fn subtract_counts_chunks_not_runs() {
        assert_eq!(subtract(&[run(10, 5)], &[run(10, 7)]), []);
        assert_eq!(subtract(&[run(10, 7)], &[run(10, 5)]), [run(15, 2)]);
        assert_eq!(
            subtract(&[run(0, 10)], &[run(3, 2)]),
            [run(0, 3), run(5, 5)]
        );
        assert_eq!(
            subtract(&[run(0, 4), run(20, 2)], &[run(2, 20)]),
            [run(0, 2)]
        );
        assert_eq!(subtract(&[run(0, 4)], &[run(8, 2)]), [run(0, 4)]);
        assert_eq!(subtract(&[run(0, 4)], &[]), [run(0, 4)]);
    }

    #[test]
    fn allocates_contiguous_runs_and_reuses_released_space() {
        let mut a = ChunkAllocator::new(10);
        let r1 = a.allocate(4).unwrap();
        assert_eq!(r1, ChunkRun { start: 0, count: 4 });
        assert!(a.allocate_at(4, 2));
        assert!(!a.allocate_at(5, 1), "already used");
        let r2 = a.allocate(4).unwrap();
        assert_eq!(r2.start, 6);
        assert_eq!(a.free(), 0);
        assert!(a.allocate(1).is_none());
        a.release(r1);
        assert_eq!(a.free(), 4);
        assert_eq!(
            a.allocate(3).unwrap().start,
            0,
            "wraps around to freed space"
        );
        assert!(a.allocate(2).is_none(), "only one free chunk left");
    }

    #[test]
    fn rejects_overlapping_or_out_of_range_marks() {
        let mut a = ChunkAllocator::new(100);
        assert!(a.mark_used(ChunkRun {
            start: 10,
            count: 5
        }));
        assert!(!a.mark_used(ChunkRun {
            start: 14,
            count: 2
        }));
        assert!(!a.mark_used(ChunkRun {
            start: 99,
            count: 2
        }));
        assert!(!a.mark_used(ChunkRun {
            start: u64::MAX,
            count: 2
        }));
        assert_eq!(a.free(), 95);
    }

    proptest! {
        #[test]
        fn runs_never_overlap_and_free_count_is_exact(ops in proptest::collection::vec((1u64..20, any::<bool>()), 1..200)) {
            let mut a = ChunkAllocator::new(300);
            let mut live: Vec<ChunkRun> = Vec::new();
            for (count, release) in ops {
                if release && !live.is_empty() {
                    let r = live.remove(count as usize % live.len());
                    a.release(r);
                } else if let Some(r) = a.allocate(count) {
                    prop_assert!(r.start + r.count <= 300);
                    for o in &live {
                        prop_assert!(r.start + r.count <= o.start || o.start + o.count <= r.start, "{r:?} overlaps {o:?}");
                    }
                    live.push(r);
                }
                let used: u64 = live.iter().map(|r| r.count).sum();
                prop_assert_eq!(a.free(), 300 - used);
            }
        }
    }
}
