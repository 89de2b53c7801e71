//! [`AlignedBuf`]: one block-aligned I/O buffer on loan from a pool.

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use arrow::buffer::Buffer;

/// Where a buffer came from, so it can go back there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Slot {
    Fixed(u16),
    Class(u32),
    Oversize,
    /// Memory the pool does not own (see `BufferPool::borrow`).
    Borrowed,
}

/// What a buffer goes back to when it drops: the pool that lent it.
pub(super) trait Lender: Send + Sync + std::panic::RefUnwindSafe {
    /// Takes back the `cap` bytes at `ptr`, lent from `slot`.
    fn release(&self, ptr: NonNull<u8>, cap: usize, slot: Slot);
}

/// A block-aligned buffer of `capacity()` bytes, of which the first `len()`
/// hold data, borrowed from a [`BufferPool`] and returned to it on drop.
///
/// Invariant: all `capacity()` bytes are initialised (allocators hand out zeroed
/// memory), so any `len <= capacity` exposes initialised bytes.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    cap: usize,
    len: usize,
    slot: Slot,
    pool: Arc<dyn Lender>,
    /// What keeps borrowed memory alive ([`BufferPool::borrow`]).
    owner: Option<Arc<dyn std::any::Any + Send + Sync + std::panic::RefUnwindSafe>>,
}

// SAFETY: an `AlignedBuf` is the unique owner of its memory (the allocator
// contract guarantees no aliasing), which can be freed from any thread; the
// `Arc<BufferPool>` it holds is itself Send + Sync.
unsafe impl Send for AlignedBuf {}
// SAFETY: `&AlignedBuf` only allows reading the initialised bytes; mutation
// needs `&mut`, so sharing references across threads is as safe as `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub(super) fn new(ptr: NonNull<u8>, cap: usize, slot: Slot, pool: Arc<dyn Lender>) -> Self {
        Self {
            ptr,
            cap,
            len: 0,
            slot,
            pool,
            owner: None,
        }
    }

    /// Keeps `owner` (of borrowed memory) alive as long as the buffer.
    pub(super) fn keep(
        &mut self,
        owner: Arc<dyn std::any::Any + Send + Sync + std::panic::RefUnwindSafe>,
    ) {
        self.owner = Some(owner);
    }

    /// Number of bytes holding data.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no bytes hold data.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes available in total.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Sets how many bytes hold data (a device read fills exactly `len`).
    ///
    /// # Panics
    /// If `len > capacity()`.
    pub fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.cap,
            "set_len({len}) beyond capacity {}",
            self.cap
        );
        self.len = len;
    }

    /// The data bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for `cap >= len` initialised bytes (type
        // invariant) and we hold the only owner.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The data bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The whole capacity, mutably (for filling before a write).
    pub fn capacity_mut(&mut self) -> &mut [u8] {
        // SAFETY: all `cap` bytes are initialised (type invariant), access is
        // unique through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.cap) }
    }

    /// Start of the memory (stable for the buffer's life).
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Start of the memory for a device to write into.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The io_uring fixed-buffer index when this buffer lies in memory
    /// registered with the device's ring.
    pub fn fixed_index(&self) -> Option<u16> {
        match self.slot {
            Slot::Fixed(i) => Some(i),
            _ => None,
        }
    }

    /// Turns the data bytes into an Arrow buffer without copying them.
    ///
    /// The Arrow buffer's pointer is this buffer's pointer; the memory goes
    /// back to the pool when the last clone or slice of the Arrow buffer is
    /// dropped.
    pub fn into_arrow(self) -> Buffer {
        let ptr = self.ptr;
        let len = self.len;
        // SAFETY: `ptr` is valid for `len` initialised bytes and stays so
        // while the owner (this `AlignedBuf`, moved into the Arc) lives; the
        // owner frees it only on drop, after Arrow's last reference is gone.
        unsafe { Buffer::from_custom_allocation(ptr, len, Arc::new(self)) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        self.pool.release(self.ptr, self.cap, self.slot);
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("capacity", &self.cap)
            .field("fixed_index", &self.fixed_index())
            .finish()
    }
}
