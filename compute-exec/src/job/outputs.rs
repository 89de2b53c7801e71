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
//! - **Entry**: one output row, as (its window's output batch, the row): the
//!   batch's buffers are shared, never copied; an entry counts the batch's
//!   memory over its rows. A window batch stays alive while any of its rows
//!   is cached, so the bytes counted can be below those held when a batch
//!   is partly evicted.
//! - **Bad samples** have no row and are never cached: they are computed,
//!   and reported, every epoch as before.
//! - **Budget and eviction**: [`sluice_flight::Lru`] (scan-resistant); one
//!   mutex over a few map operations per window, never held over work.
//!   A budget of 0 disables it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arrow::array::RecordBatch;
use sluice_flight::Lru;
use sluice_udfs::OnError;

use super::Job;
use super::index::SampleIndex;

/// One cached output row: its window batch and its row there.
#[derive(Debug, Clone)]
pub struct CachedRow {
    /// The window's output batch (the job's schema), shared.
    pub batch: Arc<RecordBatch>,
    /// The row.
    pub row: usize,
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

#[derive(Debug)]
struct State {
    /// By (identity, sample key).
    rows: Lru<(u64, u64), CachedRow>,
    /// Each identity's number.
    identities: HashMap<String, u64>,
}

/// See the module docs.
#[derive(Debug)]
pub struct OutputCache {
    state: Mutex<State>,
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
            state: Mutex::new(State {
                rows: Lru::new(budget),
                identities: HashMap::new(),
            }),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    /// The default budget: an eighth of the memory available now.
    pub fn default_budget() -> u64 {
        sluice_flight::lru::available_memory() / 8
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether it holds anything ever.
    pub fn enabled(&self) -> bool {
        self.lock().rows.budget() > 0
    }

    /// The number of `identity` (see the module docs).
    pub fn identity(&self, identity: &str) -> u64 {
        let mut s = self.lock();
        let next = s.identities.len() as u64;
        *s.identities.entry(identity.to_string()).or_insert(next)
    }

    /// The cached row of each of `keys` under `identity`, if any (each a
    /// hit or a miss).
    pub fn lookup(&self, identity: u64, keys: &[u64]) -> Vec<Option<CachedRow>> {
        let mut s = self.lock();
        let found: Vec<_> = keys
            .iter()
            .map(|&k| s.rows.touch(&(identity, k)).cloned())
            .collect();
        drop(s);
        let hits = found.iter().filter(|r| r.is_some()).count() as u64;
        self.hits.fetch_add(hits, Ordering::Relaxed);
        self.misses
            .fetch_add(keys.len() as u64 - hits, Ordering::Relaxed);
        found
    }

    /// Caches `rows` (each with its sample key and the bytes it counts)
    /// under `identity`, those admitted (see [`Lru::admits`]).
    pub fn insert(&self, identity: u64, rows: impl IntoIterator<Item = (u64, CachedRow, u64)>) {
        let mut s = self.lock();
        if s.rows.budget() == 0 {
            return;
        }
        let mut evicted = 0;
        for (key, row, len) in rows {
            let key = (identity, key);
            if s.rows.peek(&key).is_none() && s.rows.admits(&key, len) {
                evicted += s.rows.insert(key, row, len);
            }
        }
        drop(s);
        self.evictions.fetch_add(evicted, Ordering::Relaxed);
    }

    /// Its counters now.
    pub fn stats(&self) -> OutputCacheStats {
        let s = self.lock();
        OutputCacheStats {
            budget: s.rows.budget(),
            bytes: s.rows.bytes(),
            rows: s.rows.len() as u64,
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
        }
    }
}

/// The bytes one row of `batch` counts: its memory over its rows.
pub fn row_bytes(batch: &RecordBatch) -> u64 {
    (batch.get_array_memory_size() / batch.num_rows().max(1)) as u64
}

impl Job {
    /// The node's output cache and this job's identity in it, when the
    /// job qualifies (see the module docs) and the cache is enabled.
    /// `index` is the job's: its pins name the versions its keys are rows of.
    pub(super) fn output_cache(&self, index: &SampleIndex) -> Option<(Arc<OutputCache>, u64)> {
        let cache = self.session().output_cache();
        if !cache.enabled()
            || self.spec().on_error == OnError::Null
            || !sluice_udfs::rebind::same_every_epoch(self.placed().window())
        {
            return None;
        }
        let pins: Vec<String> = index
            .pins()
            .iter()
            .map(|p| format!("{}@{}", p.node, p.version))
            .collect();
        let identity = format!(
            "{}\n{:?}\n{:?}\n{}",
            self.sql(),
            self.spec().on_error,
            self.session().limits(),
            pins.join(",")
        );
        let id = cache.identity(&identity);
        Some((Arc::clone(cache), id))
    }
}
