//! [`OutputCache`]: a compute node's cache of deterministic jobs' output
//! rows, shared by all its jobs.
//!
//! The object cache (on the storage nodes) spares later epochs the device;
//! this one spares them the stages too. A job qualifies when its plan
//! computes the same row for a sample in every epoch
//! ([`sluice_udfs::rebind::same_every_epoch`]: no random UDF, nothing
//! volatile) and its error policy is `skip` or `fail` (under `null` a bad
//! sample's row is a NULL that must be reported again each epoch, and a
//! cached NULL would not be):
//!
//! ```text
//!  a window's samples ─► lookup (sample's node + row, under the job's identity)
//!     every one cached ─► no plan runs: no read, no decode; rows from memory
//!     some missing     ─► the plan runs on those alone ─► their rows cached
//!  rows of both kinds ─► the window's rows by slot (`WindowRows`) ─► batches
//! ```
//!
//! - **Identity**: the job's SQL, error policy, decoding limits and the
//!   dataset versions it pinned (by node). Jobs with the same identity share
//!   entries; a new version is a new identity (old entries age out).
//! - **Entry**: one output row, copied out of its window's batch when it is
//!   admitted (one `take`, outside the lock): a batch of that row alone,
//!   which holds and counts exactly its own bytes. No window batch stays
//!   alive for the part of it that is cached, and no storage read buffer
//!   (a row that passes the raw `data` through lies in one) is kept out of
//!   its pool by the cache. The copy is made once, in the epoch that fills
//!   the cache; a hit is served over the entry's buffers, never copied.
//! - **Bad samples** have no row and are never cached: they are computed,
//!   and reported, every epoch as before.
//! - **Budget and eviction**: [`sluice_flight::Lru`] (scan-resistant); one
//!   mutex over a few map operations per window, never held over work
//!   (the copies are made between two holds: [`insert_owned`]).
//!   A budget of 0 disables it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arrow::array::{RecordBatch, UInt32Array};
use arrow::compute::take_record_batch;
use arrow::error::ArrowError;
use sluice_flight::Lru;
use sluice_flight::lru::insert_owned;

/// One output row: a batch (the job's schema), shared, and the row there.
#[derive(Debug, Clone)]
pub struct CachedRow {
    /// The batch: a window's output, or, once cached, the row's own.
    pub batch: Arc<RecordBatch>,
    /// The row.
    pub row: usize,
}

impl CachedRow {
    /// This row copied out of its batch: a batch of this row alone, over
    /// buffers of its own.
    pub fn own(&self) -> Result<CachedRow, ArrowError> {
        let row = UInt32Array::from(vec![self.row as u32]);
        Ok(CachedRow {
            batch: Arc::new(take_record_batch(&self.batch, &row)?),
            row: 0,
        })
    }
}

/// Counters of the cache, for `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct OutputCacheStats {
    /// Bytes it may hold.
    pub budget: u64,
    /// Bytes its rows count.
    pub bytes: u64,
    /// Rows it holds.
    pub rows: u64,
    /// Samples served from it.
    pub hits: u64,
    /// Samples looked up and computed (bad samples included).
    pub misses: u64,
    /// Rows evicted to stay within the budget.
    pub evictions: u64,
}

/// See the module docs.
#[derive(Debug)]
pub struct OutputCache {
    /// By (identity, sample key).
    rows: Mutex<Lru<(u64, u64), CachedRow>>,
    /// Each identity's number.
    identities: Mutex<HashMap<String, u64>>,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
}

impl Default for OutputCache {
    /// Disabled.
    fn default() -> Self {
        Self::new(0)
    }
}

impl OutputCache {
    /// A cache of at most `budget` bytes (0: disabled).
    pub fn new(budget: u64) -> Self {
        Self {
            rows: Mutex::new(Lru::new(budget)),
            identities: Mutex::new(HashMap::new()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    /// The default budget: an eighth of the memory available now.
    pub fn default_budget() -> u64 {
        sluice_udfs::host_memory::available() / 8
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lru<(u64, u64), CachedRow>> {
        self.rows.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether it holds anything ever.
    pub fn enabled(&self) -> bool {
        self.lock().budget() > 0
    }

    /// The number of `identity` (see the module docs).
    pub fn identity(&self, identity: &str) -> u64 {
        let mut ids = self.identities.lock().unwrap_or_else(|e| e.into_inner());
        let next = ids.len() as u64;
        *ids.entry(identity.to_string()).or_insert(next)
    }

    /// The cached row of each of `keys` under `identity`, if any (each a
    /// hit or a miss).
    pub fn lookup(&self, identity: u64, keys: &[u64]) -> Vec<Option<CachedRow>> {
        let mut rows = self.lock();
        let found: Vec<_> = keys
            .iter()
            .map(|&k| rows.touch(&(identity, k)).cloned())
            .collect();
        drop(rows);
        let hits = found.iter().filter(|r| r.is_some()).count() as u64;
        self.hits.fetch_add(hits, Ordering::Relaxed);
        self.misses
            .fetch_add(keys.len() as u64 - hits, Ordering::Relaxed);
        found
    }

    /// Caches `rows` (each with its sample key and its share of its
    /// window batch's bytes, the estimate admission goes by) under
    /// `identity`, those admitted, each copied out of its window batch
    /// (see the module docs) outside the lock ([`insert_owned`]).
    pub fn insert(&self, identity: u64, rows: impl IntoIterator<Item = (u64, CachedRow, u64)>) {
        let items = rows
            .into_iter()
            .map(|(key, row, share)| ((identity, key), row, share));
        let evicted = insert_owned(&self.rows, items, |row| match row.own() {
            Ok(row) => {
                let len = row_bytes(&row.batch);
                Some((row, len))
            }
            Err(e) => {
                // The row is served as it is; only its caching is lost.
                tracing::warn!("output cache: a row not cached: {e}");
                None
            }
        });
        self.evictions.fetch_add(evicted, Ordering::Relaxed);
    }

    /// Its counters now.
    pub fn stats(&self) -> OutputCacheStats {
        let rows = self.lock();
        OutputCacheStats {
            budget: rows.budget(),
            bytes: rows.bytes(),
            rows: rows.len() as u64,
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
        }
    }
}

/// The bytes one row of `batch` counts: its memory over its rows (a
/// cached row's batch is that row alone).
pub fn row_bytes(batch: &RecordBatch) -> u64 {
    (batch.get_array_memory_size() / batch.num_rows().max(1)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{AsArray, BinaryArray};
    use arrow::buffer::{Buffer, OffsetBuffer};
    use arrow::datatypes::BinaryType;

    /// A window batch of `n` rows of 1 KiB, whose values lie in one buffer
    /// of 1 MiB (as rows read into a pooled storage buffer do).
    fn window(n: usize) -> Arc<RecordBatch> {
        let mut big = vec![0u8; 1 << 20];
        for (i, b) in big.iter_mut().enumerate() {
            *b = (i / 1024) as u8;
        }
        let offsets = OffsetBuffer::from_lengths(vec![1024; n]);
        let data = BinaryArray::new(offsets, Buffer::from_vec(big), None);
        Arc::new(RecordBatch::try_from_iter([("data", Arc::new(data) as _)]).unwrap())
    }

    #[test]
    fn a_cached_row_holds_and_counts_its_own_bytes_not_its_window_s() {
        let cache = OutputCache::new(1 << 30);
        let id = cache.identity("job");
        let batch = window(8);
        let share = row_bytes(&batch);
        assert!(share > 100 << 10, "the window's buffer over its 8 rows");
        cache.insert(
            id,
            [1, 5].map(|row| {
                let cached = CachedRow {
                    batch: Arc::clone(&batch),
                    row,
                };
                (row as u64, cached, share)
            }),
        );
        // Nothing in the cache keeps the window batch (or its buffer) alive.
        assert_eq!(Arc::strong_count(&batch), 1);
        let st = cache.stats();
        assert_eq!(st.rows, 2);
        assert!(st.bytes >= 2 * 1024, "{st:?}");
        assert!(
            st.bytes < 4 * 1024 + 1024,
            "each row counts its own bytes: {st:?}"
        );
        let found = cache.lookup(id, &[5, 1, 3]);
        let value = |r: &Option<CachedRow>| {
            r.as_ref()
                .map(|r| r.batch.column(0).as_bytes::<BinaryType>().value(r.row)[0])
        };
        assert_eq!(
            found.iter().map(value).collect::<Vec<_>>(),
            vec![Some(5), Some(1), None]
        );
    }

    #[test]
    fn rows_are_admitted_by_their_share_and_kept_within_the_budget() {
        // Room for about three rows of 1 KiB.
        let cache = OutputCache::new(3 * 1024 + 512);
        let id = cache.identity("job");
        let batch = window(8);
        cache.insert(
            id,
            (0..8).map(|row| {
                let cached = CachedRow {
                    batch: Arc::clone(&batch),
                    row,
                };
                (row as u64, cached, 1024)
            }),
        );
        let st = cache.stats();
        assert!(st.bytes <= st.budget, "{st:?}");
        assert!((1..=3).contains(&st.rows), "{st:?}");
    }
}
