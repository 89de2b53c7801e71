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
/// - is zero-initialised (so no one zeroes it again before the device
///   overwrites it: fresh pages from the kernel or SPDK's zmalloc already are);
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

/// Page-aligned memory from anonymous private mappings, for the
/// kernel-driven backends: the kernel hands out zeroed pages lazily, so a
/// fresh buffer costs no user-space memset on top of the kernel's zeroing.
/// Alignments above a page fall back to the global allocator.
#[derive(Debug, Default, Clone, Copy)]
pub struct PageAllocator;

fn page_size() -> usize {
    // SAFETY: sysconf has no memory effects.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(page).unwrap_or(4096)
}

// SAFETY: mmap(MAP_PRIVATE | MAP_ANONYMOUS) returns a fresh, zero-filled,
// page-aligned mapping that aliases nothing, keeps its address until munmap,
// and may be unmapped from any thread; `alloc_zeroed` gives the same for the
// global allocator. `deallocate`'s caller promises the same size and align,
// so it takes the same branch as `allocate` did.
unsafe impl DmaAllocator for PageAllocator {
    fn allocate(&self, size: usize, align: usize) -> Option<NonNull<u8>> {
        let page = page_size();
        if align > page {
            let layout = Layout::from_size_align(size.max(1), align).ok()?;
            // SAFETY: the layout has a non-zero size (clamped above).
            return NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) });
        }
        let len = size.max(1).div_ceil(page) * page;
        // SAFETY: a new anonymous mapping with no address hint touches no
        // existing memory.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return None;
        }
        NonNull::new(ptr.cast())
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, align: usize) {
        let page = page_size();
        if align > page {
            // SAFETY: the caller promises `ptr` came from `allocate(size,
            // align)`, which used `alloc_zeroed` with this layout.
            unsafe {
                let layout = Layout::from_size_align_unchecked(size.max(1), align);
                std::alloc::dealloc(ptr.as_ptr(), layout);
            }
            return;
        }
        let len = size.max(1).div_ceil(page) * page;
        // SAFETY: the caller promises `ptr` is the start of a mapping of `len`
        // bytes made by `allocate` and no longer used.
        unsafe { libc::munmap(ptr.as_ptr().cast(), len) };
    }

    fn name(&self) -> &'static str {
        "pages"
    }
}
