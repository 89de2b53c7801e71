//! [`ObjectCache`]: a node-wide, bounded cache of raw objects.
//!
//! The device is read with O_DIRECT, so nothing is cached by the kernel:
//! without this, a dataset that fits in memory would be read from the
//! device again every epoch while the loaders people compare us with ride
//! the page cache. One cache serves every scan of a store (every job,
//! every epoch, every query), keyed by where an object lies on the device:
//!
//! - **Entry**: an object's bytes, copied out of the read buffer into an
//!   allocation of their own (a slice would pin the whole coalesced read),
//!   after its crc32c was checked — checksums are verified once, on entry.
//!   A hit compares the extent's length and crc32c with the entry's (a
//!   different object at the same place is a miss).
//! - **Invalidation**: when the store frees chunks (a deleted checkpoint or
//!   version), every entry in them goes ([`ObjectCache::forget`]); a freed
//!   chunk's next owner cannot be served its predecessor's bytes.
//! - **Budget and eviction**: at most `budget` bytes, under
//!   [`sluice_flight::Lru`]'s policy: the least recently used entries go
//!   first, but only those unused for two cache-fulls of lookups (so an
//!   epoch over a dataset larger than the cache keeps the part that fits
//!   rather than churning all of it). Each operation holds one mutex for
//!   a few map operations (no I/O, no copy under it): eviction never waits
//!   on a reader, and a miss is exactly the uncached path plus one copy.
//! - **One read per object** ([`ObjectCache::begin_read`]): a scan that
//!   misses registers the objects it is about to read until they have
//!   entered the cache; a scan that misses one of them meanwhile (a job's
//!   next epoch begun ahead while the last windows of this one still read,
//!   two jobs over one dataset) waits for that read and is served from
//!   memory instead of reading the device again. It waits once: a read it
//!   still finds under way then (or objects the cache did not take) it
//!   makes itself. A miss counts a device read, not a lookup.
//! - A budget of 0 disables it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arrow::buffer::Buffer;
use sluice_flight::Lru;
use tokio::sync::watch;

/// Where an object lies and what it must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ObjectKey {
    /// Device offset of its first byte.
    pub offset: u64,
    /// Its length.
    pub len: u64,
    /// Its crc32c, as the catalog recorded it.
    pub crc: u32,
}

#[derive(Debug)]
struct Entry {
    len: u64,
    crc: u32,
    bytes: Buffer,
}

/// The entries, by device offset (range removal for freed chunks).
#[derive(Debug)]
struct State(Lru<u64, Entry>);

impl State {
    /// Whether it holds the object `key` names (a different object at the
    /// same place does not count).
    fn holds(&self, key: &ObjectKey) -> bool {
        self.0
            .peek(&key.offset)
            .is_some_and(|e| e.len == key.len && e.crc == key.crc)
    }
}

/// Counters of a cache, for `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct CacheStats {
    /// Bytes it may hold.
    pub budget: u64,
    /// Bytes it holds.
    pub bytes: u64,
    /// Objects it holds.
    pub objects: u64,
    /// Lookups served from memory.
    pub hits: u64,
    /// Objects read from the device (a lookup that waited for another
    /// scan's read of its objects is a hit).
    pub misses: u64,
    /// Entries dropped to stay within the budget.
    pub evictions: u64,
}

/// See the module docs.
#[derive(Debug)]
pub struct ObjectCache {
    budget: u64,
    state: Mutex<State>,
    /// Reads under way, by device offset: closed when they are done.
    reading: Mutex<HashMap<u64, watch::Receiver<()>>>,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
}

impl ObjectCache {
    /// A cache of at most `budget` bytes (0: disabled).
    pub fn new(budget: u64) -> Self {
        Self {
            budget,
            state: Mutex::new(State(Lru::new(budget))),
            reading: Mutex::default(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    /// The default budget: a quarter of the memory available now.
    pub fn default_budget() -> u64 {
        sluice_udfs::host_memory::available() / 4
    }

    /// Whether it holds anything ever.
    pub fn enabled(&self) -> bool {
        self.budget > 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The object at `key`, if cached (and marks it used).
    pub fn get(&self, key: &ObjectKey) -> Option<Buffer> {
        self.get_all(std::slice::from_ref(key))?.pop()
    }

    /// Every object of `keys` (and marks them used), or `None` when any
    /// is missing: a scan's read is served whole from memory or not at
    /// all. One lock for the lot; every key counts as a hit or a miss.
    pub fn get_all(&self, keys: &[ObjectKey]) -> Option<Vec<Buffer>> {
        if !self.enabled() {
            return None;
        }
        let mut s = self.lock();
        if !keys.iter().all(|k| s.holds(k)) {
            return None;
        }
        let out: Vec<Buffer> = keys
            .iter()
            .filter_map(|k| s.0.touch(&k.offset).map(|e| e.bytes.clone()))
            .collect();
        drop(s);
        self.hits.fetch_add(keys.len() as u64, Ordering::Relaxed);
        Some(out)
    }

    /// Which of `keys` it holds now (not a lookup: no hit, no miss, no
    /// use).
    pub fn holds(&self, keys: &[ObjectKey]) -> Vec<bool> {
        if !self.enabled() {
            return vec![false; keys.len()];
        }
        let s = self.lock();
        keys.iter().map(|k| s.holds(k)).collect()
    }

    /// A scan missed `keys` (see [`ObjectCache::get_all`]) and would read
    /// them: [`Miss::Wait`] when `may_wait` and another scan is reading
    /// any of them (look again once those reads are done), else
    /// [`Miss::Read`], registered until its guard drops.
    pub fn begin_read(self: &Arc<Self>, keys: &[ObjectKey], may_wait: bool) -> Miss {
        let mut reading = self.reading.lock().unwrap_or_else(|e| e.into_inner());
        if self.enabled() && may_wait {
            let under_way: Vec<_> = keys
                .iter()
                .filter_map(|k| reading.get(&k.offset).cloned())
                .collect();
            if !under_way.is_empty() {
                return Miss::Wait(under_way);
            }
        }
        let (done, rx) = watch::channel(());
        let mut offsets = Vec::new();
        if self.enabled() {
            self.misses.fetch_add(keys.len() as u64, Ordering::Relaxed);
            for k in keys {
                reading.entry(k.offset).or_insert_with(|| {
                    offsets.push(k.offset);
                    rx.clone()
                });
            }
        }
        Miss::Read(Reading {
            cache: Arc::clone(self),
            offsets,
            done: Some(done),
        })
    }

    /// Whether `key` would be taken in now: not held already, and room
    /// for it (see [`Lru::admits`]: a stale entry at the same place goes
    /// anyway).
    fn admits(s: &State, key: &ObjectKey) -> bool {
        !s.holds(key) && s.0.admits(&key.offset, key.len)
    }

    /// Caches a copy of `bytes` (already checked against `key.crc`) under
    /// `key` if it is admitted, evicting the least recently used entries
    /// to fit. The copy is made only for an object the cache takes, and
    /// outside the lock.
    pub fn insert(&self, key: ObjectKey, bytes: &[u8]) {
        if !self.enabled() || key.len > self.budget / 8 || bytes.len() as u64 != key.len {
            return;
        }
        if !Self::admits(&self.lock(), &key) {
            return;
        }
        let owned = Buffer::from(bytes.to_vec());
        let mut s = self.lock();
        // Asked again: another reader may have changed it meanwhile.
        if !Self::admits(&s, &key) {
            return;
        }
        let entry = Entry {
            len: key.len,
            crc: key.crc,
            bytes: owned,
        };
        let evicted = s.0.insert(key.offset, entry, key.len);
        drop(s);
        self.evictions.fetch_add(evicted, Ordering::Relaxed);
    }

    /// Drops every entry that starts in `start..end` (device offsets of
    /// freed chunks).
    pub fn forget(&self, start: u64, end: u64) {
        if !self.enabled() || start >= end {
            return;
        }
        self.lock().0.remove_range(start..end);
    }

    /// Its counters now.
    pub fn stats(&self) -> CacheStats {
        let s = self.lock();
        CacheStats {
            budget: self.budget,
            bytes: s.0.bytes(),
            objects: s.0.len() as u64,
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
        }
    }
}

/// What a scan that missed does (see [`ObjectCache::begin_read`]).
#[derive(Debug)]
pub enum Miss {
    /// Read the objects from the device; others wait for this read until
    /// the guard drops (after the objects entered the cache).
    Read(Reading),
    /// Other scans are reading some of them: wait for each
    /// ([`Miss::wait`]), then look in the cache again.
    Wait(Vec<watch::Receiver<()>>),
}

impl Miss {
    /// Waits until the reads `receivers` stand for are done.
    pub async fn wait(receivers: Vec<watch::Receiver<()>>) {
        for mut r in receivers {
            // Nothing is ever sent: `changed` ends when the read's guard
            // drops, or at once if it already has.
            let _closed = r.changed().await;
        }
    }
}

/// A read under way: its objects are no longer registered, and the scans
/// waiting for it wake, when it drops.
#[derive(Debug)]
pub struct Reading {
    cache: Arc<ObjectCache>,
    offsets: Vec<u64>,
    done: Option<watch::Sender<()>>,
}

impl Drop for Reading {
    fn drop(&mut self) {
        let mut reading = self.cache.reading.lock().unwrap_or_else(|e| e.into_inner());
        for o in &self.offsets {
            reading.remove(o);
        }
        drop(reading);
        // Closing the channel wakes every waiter.
        drop(self.done.take());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(offset: u64, len: u64) -> ObjectKey {
        ObjectKey {
            offset,
            len,
            crc: crc32c::crc32c(&vec![offset as u8; len as usize]),
        }
    }

    fn put(c: &ObjectCache, offset: u64, len: u64) {
        c.insert(key(offset, len), &vec![offset as u8; len as usize]);
    }

    #[test]
    fn hits_return_the_bytes_and_other_objects_miss() {
        let c = ObjectCache::new(1 << 20);
        put(&c, 4096, 100);
        assert_eq!(c.get(&key(4096, 100)).unwrap().as_slice(), &[0u8; 100][..]);
        // Same place, another length or crc: another object.
        assert!(c.get(&key(4096, 99)).is_none());
        let mut other = key(4096, 100);
        other.crc ^= 1;
        assert!(c.get(&other).is_none());
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.objects, s.bytes), (1, 0, 1, 100));
    }

    #[tokio::test]
    async fn a_second_scan_waits_for_a_read_under_way_and_reads_nothing() {
        let c = Arc::new(ObjectCache::new(1 << 20));
        let keys = [key(0, 10), key(4096, 10)];
        let Miss::Read(first) = c.begin_read(&keys, true) else {
            panic!("nothing is being read yet");
        };
        // Another scan wants one of them: it is told to wait.
        let Miss::Wait(under_way) = c.begin_read(&keys[1..], true) else {
            panic!("the first read is under way");
        };
        let waiter = sluice_base::task::to_end(async move { Miss::wait(under_way).await });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(
            !waiter.is_finished(),
            "it waits while the read is under way"
        );
        put(&c, 0, 10);
        put(&c, 4096, 10);
        drop(first);
        waiter.await.unwrap();
        assert!(c.get_all(&keys[1..]).is_some());
        // Two objects read from the device, once.
        assert_eq!(c.stats().misses, 2);
        // Done: nothing is registered, a later miss reads.
        assert!(matches!(
            c.begin_read(&[key(8192, 10)], true),
            Miss::Read(_)
        ));
        // Asked not to wait, a scan reads even with a read under way.
        let _under_way = c.begin_read(&[key(12288, 10)], true);
        assert!(matches!(
            c.begin_read(&[key(12288, 10)], false),
            Miss::Read(_)
        ));
    }

    #[test]
    fn the_budget_holds_and_the_least_recently_used_go_first() {
        let c = ObjectCache::new(8000);
        for i in 0..8u64 {
            put(&c, i * 4096, 1000);
        }
        // Full, and every entry recent: a newcomer is not admitted (a
        // cyclic scan keeps what fits).
        put(&c, 100 * 4096, 1000);
        assert!(c.get(&key(100 * 4096, 1000)).is_none());
        assert_eq!(c.stats().evictions, 0);
        // Use 0 a while: 1..8 age past the horizon; 1 is the oldest.
        for _ in 0..20 {
            assert!(c.get(&key(0, 1000)).is_some());
        }
        put(&c, 100 * 4096, 1000);
        let s = c.stats();
        assert!(s.bytes <= 8000);
        assert_eq!(s.evictions, 1);
        assert!(c.get(&key(100 * 4096, 1000)).is_some());
        assert!(c.get(&key(0, 1000)).is_some());
        assert!(c.get(&key(4096, 1000)).is_none());
        // An object over an eighth of the budget is never cached.
        put(&c, 200 * 4096, 1001);
        assert!(c.get(&key(200 * 4096, 1001)).is_none());
    }

    #[test]
    fn freed_chunks_are_forgotten() {
        let c = ObjectCache::new(1 << 20);
        put(&c, 0, 10);
        put(&c, 1 << 20, 10);
        put(&c, 2 << 20, 10);
        c.forget(1 << 20, 2 << 20);
        assert!(c.get(&key(0, 10)).is_some());
        assert!(c.get(&key(1 << 20, 10)).is_none());
        assert!(c.get(&key(2 << 20, 10)).is_some());
        assert_eq!(c.stats().bytes, 20);
    }

    #[test]
    fn a_zero_budget_caches_nothing() {
        let c = ObjectCache::new(0);
        put(&c, 0, 10);
        assert!(c.get(&key(0, 10)).is_none());
        assert_eq!(c.stats(), CacheStats::default());
    }
}
