//! Where I/O memory comes from: the [`DmaAllocator`] contract.

use std::alloc::Layout;
use std::fmt::Debug;
use std::panic::RefUnwindSafe;
use std::ptr::NonNull;

/// A source of memory that devices may read into and write from.
///
/// # Safety
///
/// An implementation promises that a pointer returned by
/// [`allocate`](Self::allocate)`(size, align)`:
/// - is valid for reads and writes of `size` bytes and aligned to `align`;
/// - aliases no other live allocation, until it is passed to
///   [`deallocate`](Self::deallocate);
/// - keeps its address for its whole life: a kernel (io_uring) or a DMA
///   engine (SPDK) may write to it at any moment while an I/O is in flight;
/// - may be deallocated from any thread.
///
/// The pool relies on these promises to hand the memory to the kernel and
/// to wrap it in Arrow buffers shared across threads.
pub unsafe trait DmaAllocator: Debug + Send + Sync + RefUnwindSafe + 'static {
    /// Allocates `size` bytes aligned to `align` (a power of two), or `None`
    /// when the memory is exhausted.
    fn allocate(&self, size: usize, align: usize) -> Option<NonNull<u8>>;

    /// Returns memory to the allocator.
    ///
    /// # Safety
    ///
    /// `ptr` must come from `allocate(size, align)` on this allocator, with
    /// the same `size` and `align`, and must not be used afterwards.
    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, align: usize);

    /// A short name for logs ("heap", "spdk-dma").
    fn name(&self) -> &'static str;
}

/// Aligned memory from the global allocator, for the kernel-driven backends.
#[derive(Debug, Default, Clone, Copy)]
pub struct HeapAllocator;

// SAFETY: `std::alloc::alloc` returns a fresh, unaliased, stably addressed
// block valid for `layout.size()` bytes at `layout.align()`, which may be
// freed from any thread with the same layout; `deallocate`'s caller promises
// that layout.
unsafe impl DmaAllocator for HeapAllocator {
    fn allocate(&self, size: usize, align: usize) -> Option<NonNull<u8>> {
        let layout = Layout::from_size_align(size.max(1), align).ok()?;
        // SAFETY: the layout has a non-zero size (clamped above).
        NonNull::new(unsafe { std::alloc::alloc(layout) })
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, align: usize) {
        // SAFETY: the caller promises `ptr` came from `allocate(size, align)`,
        // which built this same layout (it was valid then, so it is now).
        unsafe {
            let layout = Layout::from_size_align_unchecked(size.max(1), align);
            std::alloc::dealloc(ptr.as_ptr(), layout);
        }
    }

    fn name(&self) -> &'static str {
        "heap"
    }
}
