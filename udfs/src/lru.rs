//! [`Lru`]: a map under a byte budget, the eviction policy of the node's
//! caches (raw objects on a storage node, `sluice_storage::cache`; a
//! deterministic job's output rows on a compute node, `sluice_compute`'s
//! output cache; decoded stage results, [`crate::stage_cache`]).
//!
//! - Every entry has a size; the map holds at most `budget` bytes.
//! - Each hit ([`Lru::touch`]) and insert is a tick; the least recently
//!   used entries go first to make room.
//! - **Scan resistance**: an entry used within the last two cache-fulls
//!   of ticks (twice as many ticks as entries) is never evicted, and a new
//!   entry that would need one evicted is refused instead
//!   ([`Lru::admits`]). A cyclic scan of more than fits — an epoch after an
//!   epoch — keeps the part that fits rather than evicting each entry just
//!   before its next use; a working set that moved on still ages out.
//!
//! It holds no lock and does no I/O: its owner keeps it under a mutex for
//! a few map operations, so eviction never waits on a reader.

use std::collections::BTreeMap;
use std::ops::RangeBounds;
use std::sync::Mutex;

/// Puts `items` (each a key, what its value is made from, and the bytes
/// it is estimated at) in `lru`, behind its owner's mutex, between two
/// short holds of the lock: the items [`Lru::admits`] at their estimates
/// are chosen, made into their values by `own` with no lock held (a copy,
/// say: `None` leaves the item out), then inserted at their values' exact
/// sizes where still admitted. Returns the entries evicted.
pub fn insert_owned<K: Ord + Clone, V, T>(
    lru: &Mutex<Lru<K, V>>,
    items: impl IntoIterator<Item = (K, T, u64)>,
    mut own: impl FnMut(T) -> Option<(V, u64)>,
) -> u64 {
    let lock = || lru.lock().unwrap_or_else(|e| e.into_inner());
    let held = lock();
    if held.budget() == 0 {
        return 0;
    }
    let admitted: Vec<_> = items
        .into_iter()
        .filter(|(key, _, estimate)| held.peek(key).is_none() && held.admits(key, *estimate))
        .collect();
    drop(held);
    let owned: Vec<_> = admitted
        .into_iter()
        .filter_map(|(key, item, _)| own(item).map(|(value, len)| (key, value, len)))
        .collect();
    let mut held = lock();
    let mut evicted = 0;
    for (key, value, len) in owned {
        if held.peek(&key).is_none() && held.admits(&key, len) {
            evicted += held.insert(key, value, len);
        }
    }
    evicted
}

#[derive(Debug)]
struct Slot<V> {
    value: V,
    len: u64,
    tick: u64,
}

/// See the module docs.
#[derive(Debug)]
pub struct Lru<K, V> {
    budget: u64,
    entries: BTreeMap<K, Slot<V>>,
    /// Keys by last use.
    order: BTreeMap<u64, K>,
    bytes: u64,
    tick: u64,
}

impl<K: Ord + Clone, V> Lru<K, V> {
    /// An empty map of at most `budget` bytes.
    pub fn new(budget: u64) -> Self {
        Self {
            budget,
            entries: BTreeMap::new(),
            order: BTreeMap::new(),
            bytes: 0,
            tick: 0,
        }
    }

    /// Bytes it may hold.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Bytes it holds.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Entries it holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry at `key`, not marked used.
    pub fn peek(&self, key: &K) -> Option<&V> {
        self.entries.get(key).map(|s| &s.value)
    }

    /// The entry at `key`, marked used (a hit is a tick; a miss is not).
    pub fn touch(&mut self, key: &K) -> Option<&V> {
        let slot = self.entries.get_mut(key)?;
        self.tick += 1;
        let tick = self.tick;
        let old = std::mem::replace(&mut slot.tick, tick);
        self.order.remove(&old);
        self.order.insert(tick, key.clone());
        Some(&slot.value)
    }

    /// Whether an entry of `len` bytes at `key` would be taken in now:
    /// room for it, counting what `key` holds now (replaced) and the
    /// entries unused for two cache-fulls of ticks (see the module docs).
    pub fn admits(&self, key: &K, len: u64) -> bool {
        let horizon = self.tick.saturating_sub(2 * self.entries.len() as u64);
        let mut room =
            self.budget.saturating_sub(self.bytes) + self.entries.get(key).map_or(0, |s| s.len);
        for (&used, k) in &self.order {
            if room >= len || used >= horizon {
                break;
            }
            if k != key {
                room += self.entries.get(k).map_or(0, |s| s.len);
            }
        }
        room >= len
    }

    /// Puts `value` of `len` bytes at `key` (replacing what is there),
    /// evicting the least recently used entries to fit; returns how many
    /// it evicted. Ask [`Lru::admits`] first: this takes it in regardless.
    pub fn insert(&mut self, key: K, value: V, len: u64) -> u64 {
        self.remove(&key);
        let mut evicted = 0;
        while self.bytes + len > self.budget {
            let Some((_, k)) = self.order.pop_first() else {
                break;
            };
            if let Some(s) = self.entries.remove(&k) {
                self.bytes -= s.len;
                evicted += 1;
            }
        }
        self.tick += 1;
        let tick = self.tick;
        self.bytes += len;
        self.order.insert(tick, key.clone());
        self.entries.insert(key, Slot { value, len, tick });
        evicted
    }

    /// Removes the entry at `key`.
    pub fn remove(&mut self, key: &K) -> Option<V> {
        let s = self.entries.remove(key)?;
        self.order.remove(&s.tick);
        self.bytes -= s.len;
        Some(s.value)
    }

    /// Removes every entry whose key lies in `range`; returns how many.
    pub fn remove_range<R: RangeBounds<K>>(&mut self, range: R) -> usize {
        let gone: Vec<K> = self.entries.range(range).map(|(k, _)| k.clone()).collect();
        for k in &gone {
            self.remove(k);
        }
        gone.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_go_first_within_the_budget() {
        let mut m = Lru::new(300);
        for k in 0..3u32 {
            assert!(m.admits(&k, 100));
            assert_eq!(m.insert(k, k * 10, 100), 0);
        }
        // Full; 0 is used again, then ticks pass until 1 and 2 are stale.
        assert_eq!(m.touch(&0), Some(&0));
        for _ in 0..6 {
            m.touch(&0);
        }
        assert!(m.admits(&3, 100));
        assert_eq!(m.insert(3, 30, 100), 1);
        assert_eq!(m.peek(&1), None, "the least recently used went");
        assert_eq!(
            (m.peek(&0), m.peek(&2), m.peek(&3)),
            (Some(&0), Some(&20), Some(&30))
        );
        assert_eq!((m.bytes(), m.len()), (300, 3));
    }

    #[test]
    fn a_cyclic_scan_keeps_the_part_that_fits() {
        let mut m = Lru::new(400);
        // Epoch after epoch over 10 entries of 100 bytes: 4 fit.
        for _epoch in 0..5 {
            for k in 0..10u32 {
                if m.touch(&k).is_none() && m.admits(&k, 100) {
                    m.insert(k, (), 100);
                }
            }
        }
        let kept: Vec<u32> = (0..10).filter(|k| m.peek(k).is_some()).collect();
        assert_eq!(kept, vec![0, 1, 2, 3], "the first to fit stay, none churns");
    }

    #[test]
    fn replacing_and_removing_keep_the_byte_count() {
        let mut m = Lru::new(1000);
        m.insert(5u64, "a", 100);
        assert!(m.admits(&5, 1000), "its own bytes count as room");
        m.insert(5, "b", 200);
        m.insert(9, "c", 50);
        m.insert(20, "d", 10);
        assert_eq!((m.bytes(), m.peek(&5)), (260, Some(&"b")));
        assert_eq!(m.remove_range(5..10), 2);
        assert_eq!((m.bytes(), m.len()), (10, 1));
        assert_eq!(m.remove(&20), Some("d"));
        assert!(m.is_empty());
    }
}
