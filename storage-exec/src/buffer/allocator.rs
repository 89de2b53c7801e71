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
///
/// Buffers of 2 MiB and more are mapped at a 2 MiB boundary and marked
/// `MADV_HUGEPAGE`, so that (with transparent huge pages in `madvise` or
/// `always` mode, the common defaults) the kernel backs them with huge
/// pages: an O_DIRECT read into one is then a few physically contiguous
/// segments instead of one per 4 KiB page. Measured on a virtio disk
/// (`docs/benchmarks.md`), 1 MiB reads at depth 4 ran 2.8 times faster into
/// huge-page buffers than into 4 KiB pages, which the device split into
/// many more requests. The first touch of such a buffer may make the kernel
/// compact memory to find a huge page; the pool keeps buffers for reuse, so
/// that is paid once per buffer, not per read.
#[derive(Debug, Default, Clone, Copy)]
pub struct PageAllocator;

/// Size of a transparent huge page on x86-64 and arm64 (4 KiB granules).
const HUGE_PAGE: usize = 2 << 20;

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
        if len < HUGE_PAGE {
            return map_anonymous(len);
        }
        // Map one huge page more than needed, keep the 2 MiB-aligned `len`
        // bytes inside and unmap the rest.
        let raw = map_anonymous(len + HUGE_PAGE)?.as_ptr() as usize;
        let start = raw.next_multiple_of(HUGE_PAGE);
        let (head, tail) = (start - raw, raw + HUGE_PAGE - start);
        // SAFETY: both ranges lie inside the mapping just made, outside the
        // `len` bytes kept, and are page-aligned (`raw`, `start` and `len`
        // are page multiples).
        unsafe {
            if head > 0 {
                libc::munmap(raw as *mut libc::c_void, head);
            }
            if tail > 0 {
                libc::munmap((start + len) as *mut libc::c_void, tail);
            }
            // Advice only: without transparent huge pages this fails
            // harmlessly and the buffer is made of small pages.
            libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
        NonNull::new(start as *mut u8)
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

/// A fresh anonymous private mapping of `len` bytes (a page multiple).
fn map_anonymous(len: usize) -> Option<NonNull<u8>> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The `VmFlags` line of the mapping that holds `addr`, from
    /// /proc/self/smaps.
    fn vm_flags(addr: usize) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ')
                && let Some((lo, hi)) = range.split_once('-')
                && let (Ok(lo), Ok(hi)) =
                    (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            {
                inside = (lo..hi).contains(&addr);
                continue;
            }
            if inside && let Some(flags) = line.strip_prefix("VmFlags:") {
                return flags.trim().to_owned();
            }
        }
        panic!("no mapping holds {addr:#x}");
    }

    #[test]
    fn large_buffers_are_huge_page_aligned_zeroed_and_advised() {
        let a = PageAllocator;
        for size in [HUGE_PAGE, 3 << 20, 8 << 20] {
            let ptr = a.allocate(size, 4096).unwrap();
            let addr = ptr.as_ptr() as usize;
            assert_eq!(addr % HUGE_PAGE, 0, "{size}");
            // SAFETY: `allocate` promises `size` readable, writable bytes.
            let bytes = unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), size) };
            assert!(bytes.iter().all(|&b| b == 0));
            bytes.fill(0xAB);
            let flags = vm_flags(addr);
            let thp = std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists();
            assert!(!thp || flags.split(' ').any(|f| f == "hg"), "{flags}");
            // SAFETY: from `allocate(size, 4096)` above, not used again.
            unsafe { a.deallocate(ptr, size, 4096) };
        }
    }

    #[test]
    fn small_buffers_stay_on_small_pages() {
        let a = PageAllocator;
        let ptr = a.allocate(128 << 10, 4096).unwrap();
        let flags = vm_flags(ptr.as_ptr() as usize);
        assert!(!flags.split(' ').any(|f| f == "hg"), "{flags}");
        // SAFETY: from `allocate` above, not used again.
        unsafe { a.deallocate(ptr, 128 << 10, 4096) };
    }
}
