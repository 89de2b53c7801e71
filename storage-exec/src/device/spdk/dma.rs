//! [`SpdkDma`]: I/O buffers in SPDK's DMA-able memory.
//!
//! Memory from `spdk_dma_zmalloc` is pinned, registered with SPDK's memory
//! map and (with hugepages) physically contiguous per page, so an NVMe
//! controller can DMA straight into it and a bdev never bounces the data
//! through a buffer of its own. The pool's buffers, and so the Arrow
//! buffers a scan makes of them, live in this memory.

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::buffer::DmaAllocator;

/// SPDK's DMA allocator. Counts its live allocations so that the
/// environment is never torn down under a buffer still in use.
#[derive(Debug, Clone)]
pub(super) struct SpdkDma {
    live: Arc<AtomicUsize>,
}

impl SpdkDma {
    /// An allocator counting into `live`, which the runtime checks before
    /// `spdk_env_fini`. Only built once the SPDK environment is up.
    pub(super) fn new(live: Arc<AtomicUsize>) -> Self {
        Self { live }
    }
}

// SAFETY: `spdk_dma_zmalloc` returns zeroed memory of at least `size` bytes
// aligned to `align` (DPDK's `rte_zmalloc`), or null; the memory is pinned,
// so it keeps its address until `spdk_dma_free`; DPDK's heap is guarded by
// its own locks, so allocating and freeing from any thread (tokio's, the
// SPDK thread) is allowed. The environment outlives every allocation: the
// runtime refuses `spdk_env_fini` while `live` is non-zero.
unsafe impl DmaAllocator for SpdkDma {
    fn allocate(&self, size: usize, align: usize) -> Option<NonNull<u8>> {
        // SAFETY: plain allocation call; a null `phys_addr` asks for no
        // physical address.
        let ptr = unsafe { spdk_sys::spdk_dma_zmalloc(size.max(1), align, std::ptr::null_mut()) };
        let ptr = NonNull::new(ptr.cast::<u8>())?;
        self.live.fetch_add(1, Ordering::AcqRel);
        Some(ptr)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, _size: usize, _align: usize) {
        // SAFETY: the caller promises `ptr` came from `allocate` on this
        // allocator, i.e. from `spdk_dma_zmalloc`, and is no longer used.
        unsafe { spdk_sys::spdk_dma_free(ptr.as_ptr().cast()) };
        self.live.fetch_sub(1, Ordering::AcqRel);
    }

    fn name(&self) -> &'static str {
        "spdk-dma"
    }
}
