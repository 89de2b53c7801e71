//! [`BufferPool`]: reusable aligned buffers, some registered with the device.
//!
//! Three kinds of buffer come out of a pool:
//! - *fixed* buffers, allocated when the pool is built and registered with
//!   the device (io_uring fixed buffers, so the kernel skips pinning pages
//!   on every request). They are cut from one allocation, so that with the
//!   page allocator they lie in huge pages even when each is smaller than
//!   one (an O_DIRECT read into them is then a few contiguous segments);
//! - *class* buffers, power-of-two sizes kept on free lists after use, up to
//!   a cap on retained bytes;
//! - *oversize* buffers (larger than the largest class), freed on return.
//!
//! The pool never blocks: when fixed buffers run out a class buffer is
//! used, and when the free lists are empty fresh memory is allocated.
//! Bounding memory in flight is the read scheduler's job, not the pool's:
//! a consumer that holds many batches (a sort) must not deadlock a scan.

use std::collections::BTreeMap;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::aligned::{AlignedBuf, Lender, Slot};
use super::allocator::DmaAllocator;

/// Smallest class: one 4 KiB block.
const MIN_CLASS_SHIFT: u32 = 12;
/// Largest pooled class: 64 MiB; larger buffers are oversize.
const MAX_CLASS_SHIFT: u32 = 26;

/// How a pool is sized.
#[derive(Debug, Clone)]
pub struct PoolOptions {
    /// Alignment of every buffer (the device's block size or more).
    pub align: usize,
    /// Number of buffers registered with the device up front.
    pub fixed_count: usize,
    /// Size of each fixed buffer.
    pub fixed_size: usize,
    /// Most bytes of class buffers kept on free lists.
    pub max_retained_bytes: usize,
}

impl Default for PoolOptions {
    /// 8 fixed buffers of 4 MiB; class buffers kept up to a sixteenth of
    /// the memory available to the process (its memory cgroup's room
    /// where that is less), between 16 and 256 MiB: what the free lists
    /// hold between reads is memory a container's other processes lack.
    fn default() -> Self {
        let available = sluice_udfs::host_memory::available();
        Self {
            align: 4096,
            fixed_count: 8,
            fixed_size: 4 << 20,
            max_retained_bytes: match available {
                0 => 256 << 20,
                a => usize::try_from(a / 16)
                    .unwrap_or(usize::MAX)
                    .clamp(16 << 20, 256 << 20),
            },
        }
    }
}

impl Lender for BufferPool {
    fn release(&self, ptr: NonNull<u8>, cap: usize, slot: Slot) {
        self.give_back(ptr, cap, slot);
    }
}

/// Counters describing a pool's use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Buffers currently on loan.
    pub outstanding: u64,
    /// Bytes currently on loan.
    pub outstanding_bytes: u64,
    /// Fresh allocations made since the pool was built.
    pub allocations: u64,
    /// Loans served from a free list or the fixed set.
    pub reuses: u64,
}

struct FreeLists {
    fixed: Vec<u16>,
    classes: Vec<Vec<NonNull<u8>>>,
    retained_bytes: usize,
    /// Live loans by address (start → capacity), for [`BufferPool::contains`].
    live: BTreeMap<usize, usize>,
}

/// A pool of aligned buffers. Always used behind an `Arc`.
pub struct BufferPool {
    allocator: Arc<dyn DmaAllocator>,
    opts: PoolOptions,
    /// The one allocation the fixed buffers are cut from: buffer `i`
    /// starts `i * fixed_size` bytes in.
    fixed_region: Option<NonNull<u8>>,
    free: Mutex<FreeLists>,
    allocations: AtomicU64,
    reuses: AtomicU64,
    outstanding_bytes: AtomicU64,
}

// SAFETY: the raw pointers are owned allocations only handed out under the
// mutex; the allocator is Send + Sync by its trait bounds.
unsafe impl Send for BufferPool {}
// SAFETY: all shared mutable state is behind the `Mutex` or atomics.
unsafe impl Sync for BufferPool {}

impl BufferPool {
    /// Builds a pool, allocating the fixed buffers now.
    pub fn new(allocator: Arc<dyn DmaAllocator>, opts: PoolOptions) -> std::io::Result<Arc<Self>> {
        assert!(
            opts.align.is_power_of_two(),
            "alignment must be a power of two"
        );
        let fixed_size = round_up(opts.fixed_size.max(opts.align), opts.align);
        let opts = PoolOptions { fixed_size, ..opts };
        let count = opts.fixed_count.min(u16::MAX as usize);
        let opts = PoolOptions {
            fixed_count: count,
            ..opts
        };
        let fixed_region = if count == 0 {
            None
        } else {
            let bytes = fixed_size.checked_mul(count).ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::OutOfMemory,
                    format!("{count} fixed buffers of {fixed_size} bytes overflow"),
                )
            })?;
            Some(allocator.allocate(bytes, opts.align).ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::OutOfMemory,
                    format!(
                        "{} allocator: no memory for {count} fixed buffers of {fixed_size} bytes",
                        allocator.name()
                    ),
                )
            })?)
        };
        let free = FreeLists {
            fixed: (0..count as u16).rev().collect(),
            classes: vec![Vec::new(); (MAX_CLASS_SHIFT - MIN_CLASS_SHIFT + 1) as usize],
            retained_bytes: 0,
            live: BTreeMap::new(),
        };
        Ok(Arc::new(Self {
            allocator,
            opts,
            fixed_region,
            free: Mutex::new(free),
            allocations: AtomicU64::new(0),
            reuses: AtomicU64::new(0),
            outstanding_bytes: AtomicU64::new(0),
        }))
    }

    /// The allocator's short name ("pages", "spdk-dma").
    pub fn allocator_name(&self) -> &'static str {
        self.allocator.name()
    }

    /// Alignment of every buffer.
    pub fn align(&self) -> usize {
        self.opts.align
    }

    /// The fixed buffers as (address, length), for registering with a device.
    pub fn fixed_regions(&self) -> Vec<(*mut u8, usize)> {
        (0..self.opts.fixed_count as u16)
            .map(|i| (self.fixed_buffer(i).as_ptr(), self.opts.fixed_size))
            .collect()
    }

    /// Where fixed buffer `idx` (below `fixed_count`) starts.
    fn fixed_buffer(&self, idx: u16) -> NonNull<u8> {
        let region = self
            .fixed_region
            .expect("a fixed buffer index implies the fixed region");
        // SAFETY: `idx < fixed_count`, so the offset lies inside the region
        // of `fixed_count * fixed_size` bytes allocated in `new`.
        unsafe { region.add(usize::from(idx) * self.opts.fixed_size) }
    }

    /// Lends a buffer of at least `len` bytes (rounded up to the alignment),
    /// with `len()` set to `len`.
    pub fn get(self: &Arc<Self>, len: usize) -> std::io::Result<AlignedBuf> {
        let want = round_up(len.max(1), self.opts.align);
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let (ptr, cap, slot) = if want <= self.opts.fixed_size && !free.fixed.is_empty() {
            let idx = free.fixed.pop().unwrap_or_default();
            self.reuses.fetch_add(1, Ordering::Relaxed);
            (
                self.fixed_buffer(idx),
                self.opts.fixed_size,
                Slot::Fixed(idx),
            )
        } else if let Some(class) = class_of(want) {
            let cap = 1usize << (class + MIN_CLASS_SHIFT);
            if let Some(ptr) = free.classes[class as usize].pop() {
                free.retained_bytes -= cap;
                self.reuses.fetch_add(1, Ordering::Relaxed);
                (ptr, cap, Slot::Class(class))
            } else {
                (self.fresh(cap)?, cap, Slot::Class(class))
            }
        } else {
            (self.fresh(want)?, want, Slot::Oversize)
        };
        free.live.insert(ptr.as_ptr() as usize, cap);
        drop(free);
        self.outstanding_bytes
            .fetch_add(cap as u64, Ordering::Relaxed);
        let mut buf = AlignedBuf::new(ptr, cap, slot, Arc::clone(self) as Arc<dyn Lender>);
        buf.set_len(len);
        Ok(buf)
    }

    /// A buffer over memory this pool does not own — a shared-memory
    /// region a checkpoint is read into — for a device whose I/O takes
    /// any aligned memory ([`crate::device::Device::takes_any_memory`]).
    /// `owner` keeps the memory alive while the buffer lives; dropping
    /// the buffer frees nothing. Not counted as on loan.
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` initialised
    /// bytes, aligned to [`BufferPool::align`], for as long as `owner`
    /// lives, and no one else may touch those bytes while the buffer
    /// lives (a device writes into them).
    pub unsafe fn borrow(
        self: &Arc<Self>,
        ptr: NonNull<u8>,
        len: usize,
        owner: Arc<dyn std::any::Any + Send + Sync + std::panic::RefUnwindSafe>,
    ) -> AlignedBuf {
        let mut buf = AlignedBuf::new(
            ptr,
            len,
            Slot::Borrowed,
            Arc::clone(self) as Arc<dyn Lender>,
        );
        buf.keep(owner);
        buf.set_len(len);
        buf
    }

    /// True when `ptr` points into a buffer currently on loan from this pool.
    pub fn contains(&self, ptr: *const u8) -> bool {
        let addr = ptr as usize;
        let free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        free.live
            .range(..=addr)
            .next_back()
            .is_some_and(|(start, cap)| addr < start + cap)
    }

    /// Current counters.
    pub fn stats(&self) -> PoolStats {
        let free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        PoolStats {
            outstanding: free.live.len() as u64,
            outstanding_bytes: self.outstanding_bytes.load(Ordering::Relaxed),
            allocations: self.allocations.load(Ordering::Relaxed),
            reuses: self.reuses.load(Ordering::Relaxed),
        }
    }

    fn fresh(&self, cap: usize) -> std::io::Result<NonNull<u8>> {
        let ptr = self
            .allocator
            .allocate(cap, self.opts.align)
            .ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::OutOfMemory,
                    format!(
                        "{} allocator: no memory for a {cap}-byte buffer",
                        self.allocator.name()
                    ),
                )
            })?;
        self.allocations.fetch_add(1, Ordering::Relaxed);
        Ok(ptr)
    }

    fn give_back(&self, ptr: NonNull<u8>, cap: usize, slot: Slot) {
        if slot == Slot::Borrowed {
            return; // never lent from here: its owner frees it
        }
        self.outstanding_bytes
            .fetch_sub(cap as u64, Ordering::Relaxed);
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        free.live.remove(&(ptr.as_ptr() as usize));
        match slot {
            Slot::Fixed(idx) => free.fixed.push(idx),
            Slot::Class(class) if free.retained_bytes + cap <= self.opts.max_retained_bytes => {
                free.retained_bytes += cap;
                free.classes[class as usize].push(ptr);
            }
            Slot::Borrowed => {} // returned above
            Slot::Class(_) | Slot::Oversize => {
                drop(free);
                // SAFETY: `ptr` came from `fresh(cap)` with this alignment and
                // its only owner (the AlignedBuf) is being dropped.
                unsafe { self.allocator.deallocate(ptr, cap, self.opts.align) };
            }
        }
    }
}

impl Drop for BufferPool {
    fn drop(&mut self) {
        let free = self.free.get_mut().unwrap_or_else(|e| e.into_inner());
        for (class, list) in free.classes.iter_mut().enumerate() {
            let cap = 1usize << (class as u32 + MIN_CLASS_SHIFT);
            for ptr in list.drain(..) {
                // SAFETY: retained class buffers came from `fresh(cap)`; no
                // loan is outstanding (each holds an Arc to this pool).
                unsafe { self.allocator.deallocate(ptr, cap, self.opts.align) };
            }
        }
        if let Some(region) = self.fixed_region.take() {
            // SAFETY: the region came from `allocate(fixed_size *
            // fixed_count, align)` in `new`; with the pool dropping no loan
            // of a fixed buffer is outstanding.
            unsafe {
                self.allocator.deallocate(
                    region,
                    self.opts.fixed_size * self.opts.fixed_count,
                    self.opts.align,
                )
            };
        }
    }
}

impl fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferPool")
            .field("allocator", &self.allocator.name())
            .field("opts", &self.opts)
            .field("stats", &self.stats())
            .finish()
    }
}

fn round_up(v: usize, align: usize) -> usize {
    v.div_ceil(align) * align
}

/// The class index whose size is the smallest power of two >= `len`.
fn class_of(len: usize) -> Option<u32> {
    let shift = len
        .next_power_of_two()
        .trailing_zeros()
        .max(MIN_CLASS_SHIFT);
    (shift <= MAX_CLASS_SHIFT).then(|| shift - MIN_CLASS_SHIFT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::PageAllocator;

    fn pool(fixed: usize) -> Arc<BufferPool> {
        BufferPool::new(
            Arc::new(PageAllocator),
            PoolOptions {
                align: 4096,
                fixed_count: fixed,
                fixed_size: 8192,
                max_retained_bytes: 1 << 20,
            },
        )
        .unwrap()
    }

    #[test]
    fn buffers_are_aligned_and_return_to_the_pool() {
        let p = pool(1);
        let a = p.get(100).unwrap();
        assert_eq!(a.len(), 100);
        assert_eq!(a.capacity(), 8192);
        assert_eq!(a.fixed_index(), Some(0));
        let b = p.get(100).unwrap();
        assert_eq!(
            b.fixed_index(),
            None,
            "fixed set exhausted, falls back to a class"
        );
        assert_eq!(b.as_ptr() as usize % 4096, 0);
        assert_eq!(p.stats().outstanding, 2);
        drop(a);
        drop(b);
        assert_eq!(p.stats().outstanding, 0);
        let c = p.get(5000).unwrap();
        assert_eq!(c.fixed_index(), Some(0), "fixed buffer reused");
        assert_eq!(p.stats().reuses, 2);
    }

    #[test]
    fn arrow_buffer_shares_memory_and_returns_it_on_drop() {
        let p = pool(0);
        let mut b = p.get(4096).unwrap();
        b.as_mut_slice()[..3].copy_from_slice(b"abc");
        let ptr = b.as_ptr();
        let arrow = b.into_arrow();
        assert_eq!(arrow.as_ptr(), ptr);
        assert!(p.contains(ptr));
        let slice = arrow.slice(1);
        drop(arrow);
        assert_eq!(&slice.as_slice()[..2], b"bc");
        assert!(p.contains(slice.as_ptr()));
        drop(slice);
        assert!(!p.contains(ptr));
        assert_eq!(p.stats().outstanding, 0);
    }

    #[test]
    fn class_sizes_round_up_to_powers_of_two() {
        assert_eq!(class_of(1), Some(0));
        assert_eq!(class_of(4096), Some(0));
        assert_eq!(class_of(4097), Some(1));
        assert_eq!(class_of(64 << 20), Some(MAX_CLASS_SHIFT - MIN_CLASS_SHIFT));
        assert_eq!(class_of((64 << 20) + 1), None);
    }
}
