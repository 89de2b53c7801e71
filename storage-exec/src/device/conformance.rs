//! The conformance suite every [`Device`] backend must pass.
//!
//! Like `object_store`'s `integration` module: public async functions that
//! take a freshly created device (at least 16 MiB, contents unspecified) and
//! panic with a message on any deviation from the trait's contract. Each
//! backend's tests call [`run_all`]; a new backend (SPDK) calls it too.

use std::sync::Arc;

use futures::future::join_all;

use super::{Device, DeviceExt};
use crate::error::StorageError;

/// Runs every check below in order.
pub async fn run_all(dev: Arc<dyn Device>) {
    geometry(&dev).await;
    write_then_read_back(&dev).await;
    many_requests_in_flight(&dev).await;
    large_request(&dev).await;
    rejects_misaligned_requests(&dev).await;
    rejects_out_of_range_requests(&dev).await;
    buffers_return_to_the_pool(&dev).await;
    read_buffer_becomes_arrow_without_copy(&dev).await;
    borrowed_memory_round_trips(&dev).await;
}

/// `len` pseudo-random bytes from `seed` (xorshift): data that differs at
/// every position, for tests that must catch a misplaced byte.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Capacity, block size and parallelism are sane.
pub async fn geometry(dev: &Arc<dyn Device>) {
    let bs = dev.block_size();
    assert!(bs.is_power_of_two() && bs >= 512, "block size {bs}");
    assert!(
        dev.capacity() >= 16 << 20,
        "capacity {} below 16 MiB",
        dev.capacity()
    );
    assert_eq!(
        dev.capacity() % bs as u64,
        0,
        "capacity not a multiple of the block size"
    );
    assert!(dev.parallelism() >= 1);
    assert!(
        dev.pool().align() >= bs,
        "pool alignment below the block size"
    );
}

/// Bytes written at aligned offsets read back identical, also after flush.
pub async fn write_then_read_back(dev: &Arc<dyn Device>) {
    let bs = dev.block_size();
    let last = dev.capacity() - bs as u64;
    for (i, (offset, len)) in [(0u64, bs), (bs as u64 * 3, bs * 5), (last, bs)]
        .into_iter()
        .enumerate()
    {
        let data = pattern(i as u64 + 1, len);
        dev.write_all_at(offset, &data).await.expect("write");
        let (buf, at) = dev.read_covering(offset, len as u64).await.expect("read");
        assert_eq!(at, 0);
        assert_eq!(buf.as_slice(), &data[..], "read back at {offset}");
    }
    dev.flush().await.expect("flush");
    let (buf, at) = dev
        .read_covering(bs as u64 * 3 + 10, 100)
        .await
        .expect("read covering");
    assert_eq!(at, 10);
    assert_eq!(&buf.as_slice()[at..at + 100], &pattern(2, bs * 5)[10..110]);
}

/// 64 concurrent reads and writes each see their own bytes.
pub async fn many_requests_in_flight(dev: &Arc<dyn Device>) {
    let bs = dev.block_size();
    let base = 1u64 << 20;
    let writes = (0..64u64).map(|i| {
        let dev = Arc::clone(dev);
        async move {
            let data = pattern(100 + i, bs * 2);
            dev.write_all_at(base + i * 2 * bs as u64, &data)
                .await
                .expect("concurrent write");
        }
    });
    join_all(writes).await;
    let reads = (0..64u64).map(|i| {
        let dev = Arc::clone(dev);
        async move {
            let (buf, _) = dev
                .read_covering(base + i * 2 * bs as u64, 2 * bs as u64)
                .await
                .expect("concurrent read");
            assert_eq!(buf.as_slice(), &pattern(100 + i, bs * 2)[..], "request {i}");
        }
    });
    join_all(reads).await;
    let counters = dev.stats();
    assert!(
        counters.reads >= 64 && counters.writes >= 64,
        "counters {counters:?}"
    );
}

/// A request bigger than any fixed buffer works.
pub async fn large_request(dev: &Arc<dyn Device>) {
    let len = 9 << 20;
    let data = pattern(7, len);
    dev.write_all_at(4 << 20, &data).await.expect("large write");
    let (buf, _) = dev
        .read_covering(4 << 20, len as u64)
        .await
        .expect("large read");
    assert!(buf.as_slice() == &data[..], "large read differs");
}

/// Unaligned offsets and lengths are refused with `Misaligned`.
pub async fn rejects_misaligned_requests(dev: &Arc<dyn Device>) {
    let buf = dev.pool().get(dev.block_size()).expect("buffer");
    let err = dev
        .read_at(1, buf)
        .await
        .expect_err("unaligned offset must fail");
    assert!(
        matches!(err, StorageError::Misaligned { what: "offset", .. }),
        "{err}"
    );
    let buf = dev.pool().get(100).expect("buffer");
    let err = dev
        .read_at(0, buf)
        .await
        .expect_err("unaligned length must fail");
    assert!(
        matches!(err, StorageError::Misaligned { what: "length", .. }),
        "{err}"
    );
}

/// Requests past the end are refused with `OutOfRange`.
pub async fn rejects_out_of_range_requests(dev: &Arc<dyn Device>) {
    let bs = dev.block_size();
    let buf = dev.pool().get(bs * 2).expect("buffer");
    let err = dev
        .read_at(dev.capacity() - bs as u64, buf)
        .await
        .expect_err("read past the end must fail");
    assert!(matches!(err, StorageError::OutOfRange { .. }), "{err}");
    let buf = dev.pool().get(bs).expect("buffer");
    let err = dev
        .write_at(dev.capacity(), buf)
        .await
        .expect_err("write past the end must fail");
    assert!(matches!(err, StorageError::OutOfRange { .. }), "{err}");
}

/// Every buffer lent for I/O, failed or not, is back in the pool afterwards.
pub async fn buffers_return_to_the_pool(dev: &Arc<dyn Device>) {
    assert_eq!(
        dev.pool().stats().outstanding,
        0,
        "buffers leaked by earlier requests"
    );
}

/// A read buffer becomes an Arrow buffer at the same address, and goes back
/// to the pool when the Arrow buffer is dropped.
pub async fn read_buffer_becomes_arrow_without_copy(dev: &Arc<dyn Device>) {
    let (buf, _) = dev
        .read_covering(0, dev.block_size() as u64)
        .await
        .expect("read");
    let ptr = buf.as_ptr();
    let arrow = buf.into_arrow();
    assert_eq!(arrow.as_ptr(), ptr, "into_arrow copied");
    assert!(dev.pool().contains(ptr));
    drop(arrow);
    assert!(!dev.pool().contains(ptr));
    assert_eq!(dev.pool().stats().outstanding, 0);
}

/// Where the device takes any aligned memory, a buffer borrowed over
/// memory the pool does not own (a shared region) is written from and
/// read into in place, and dropping it frees nothing.
pub async fn borrowed_memory_round_trips(dev: &Arc<dyn Device>) {
    if !dev.takes_any_memory() {
        return;
    }
    let pool = Arc::clone(dev.pool());
    let len = 4 * dev.block_size();
    let layout = std::alloc::Layout::from_size_align(len, pool.align()).expect("layout");
    /// Memory of ours, freed when the last borrowed buffer is gone.
    struct Owned(std::ptr::NonNull<u8>, std::alloc::Layout);
    // SAFETY: the memory is only reached through the buffers' pointers,
    // one at a time in this test.
    unsafe impl Send for Owned {}
    // SAFETY: as above.
    unsafe impl Sync for Owned {}
    impl Drop for Owned {
        fn drop(&mut self) {
            // SAFETY: allocated below with this layout, freed once.
            unsafe { std::alloc::dealloc(self.0.as_ptr(), self.1) };
        }
    }
    // SAFETY: a non-zero size; zeroed, so initialised.
    let raw = unsafe { std::alloc::alloc_zeroed(layout) };
    let ptr = std::ptr::NonNull::new(raw).expect("allocation");
    let owner = Arc::new(Owned(ptr, layout));
    let data = pattern(11, len);
    // SAFETY: `len` bytes allocated above, zeroed, nothing else uses them.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr.as_ptr(), len) };
    let outstanding = pool.stats().outstanding;
    // SAFETY: `ptr` is `len` initialised bytes aligned to the pool, kept
    // alive by `owner`, and only this buffer touches them.
    let buf = unsafe { pool.borrow(ptr, len, owner.clone()) };
    let buf = dev
        .write_at(0, buf)
        .await
        .expect("write from borrowed memory");
    assert_eq!(buf.as_ptr(), ptr.as_ptr());
    drop(buf);
    // SAFETY: as above; no buffer over it is alive now.
    unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, len) };
    // SAFETY: as above.
    let buf = unsafe { pool.borrow(ptr, len, owner.clone()) };
    let buf = dev
        .read_at(0, buf)
        .await
        .expect("read into borrowed memory");
    assert_eq!(buf.as_slice(), &data[..]);
    drop(buf);
    assert_eq!(
        pool.stats().outstanding,
        outstanding,
        "a borrowed buffer was counted"
    );
    assert_eq!(Arc::strong_count(&owner), 1, "the buffers kept their owner");
}
