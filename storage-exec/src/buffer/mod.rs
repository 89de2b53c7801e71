//! Aligned I/O buffers and the pool they come from.
//!
//! Every byte read from a device lands in an [`AlignedBuf`] taken from the
//! device's [`BufferPool`]. The buffer is handed to the device *by value*
//! for the duration of an I/O (the kernel or a DMA engine writes into it
//! while the request is in flight) and handed back on completion, the
//! pattern of `tokio-uring`'s `IoBuf`. After a read the buffer can become an
//! [`arrow::buffer::Buffer`] without a copy ([`AlignedBuf::into_arrow`]):
//! the Arrow buffer owns the `AlignedBuf`, and dropping the last Arrow
//! reference returns the memory to the pool.
//!
//! Where the memory comes from is the [`DmaAllocator`]'s business: the
//! kernel's anonymous pages for the `uring` and `file` backends, SPDK's DMA allocator
//! for the SPDK backend. Callers never see the difference.
//!
//! Modules:
//! - `aligned`: `AlignedBuf`: one block-aligned I/O buffer on loan from a
//!   pool;
//! - `allocator`: where I/O memory comes from: the `DmaAllocator` contract;
//! - `pool`: `BufferPool`: reusable aligned buffers, some registered with the
//!   device.

mod aligned;
mod allocator;
mod pool;

pub use aligned::AlignedBuf;
pub use allocator::{DmaAllocator, PageAllocator};
pub use pool::{BufferPool, PoolOptions, PoolStats};
