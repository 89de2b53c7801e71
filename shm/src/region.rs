//! [`Region`]: one flat mapped file in `/dev/shm`, shared with a client on
//! this host for bulk bytes (a checkpoint's parts on their way to the
//! device, a checkpoint read back for the trainer to parse).
//!
//! Unlike a job's [`crate::Segment`], a region has no slots and no header:
//! which byte ranges each side may touch at a time is the protocol's
//! business (the checkpoint protocol hands a range to the server with a
//! request and back with its answer). The file is made like a segment's:
//! `create_new`, mode 0600 (a client of another user cannot open it and
//! falls back to Flight), named `sluice-seg-<pid>-r<n>` so that
//! [`crate::host::sweep`] removes it when a killed server left it. The
//! client unlinks it as soon as it has mapped it; [`Region::unlink`] and
//! drop remove it too, so a client that never came leaves nothing.

use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_flight::shm_handshake::{SEGMENT_PREFIX, SHM_DIR};

use crate::host::sweep;
use crate::prepared::Prepared;

static NEXT: AtomicU64 = AtomicU64::new(0);

/// See the module docs.
#[derive(Debug)]
pub struct Region {
    path: PathBuf,
    /// Kept open to reserve pages ([`Region::reserve`]).
    file: std::fs::File,
    base: *mut u8,
    len: usize,
    /// What [`Region::prepare`] has made ready already.
    prepared: Prepared,
}

// SAFETY: the mapping is owned by the `Region` alone and valid on any
// thread until `drop` unmaps it; the pointer is never handed out past a
// borrow of `self`.
unsafe impl Send for Region {}
// SAFETY: shared access goes through `bytes`/`bytes_mut`, whose callers
// promise (their `# Safety`) that no two of them touch one range at once.
unsafe impl Sync for Region {}

impl Region {
    /// A new region of exactly `len` bytes (the file's size too, so a
    /// client may open it as a file of that size), zeroed.
    pub fn create(len: usize) -> std::io::Result<Self> {
        // A region larger than what /dev/shm has free is refused here, so
        // the client uses Flight instead (a container's /dev/shm is often
        // 64 MiB); `reserve` still guards each range against a race.
        if let Some(free) = free_bytes(Path::new(SHM_DIR))
            && len as u64 > free
        {
            return Err(std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                format!("{len} bytes do not fit in {SHM_DIR}'s {free} free bytes"),
            ));
        }
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = Path::new(SHM_DIR).join(format!("{SEGMENT_PREFIX}{}-r{n}", std::process::id()));
        let (file, base) = map_new(&path, len)?;
        Ok(Self {
            path,
            file,
            base,
            len,
            prepared: Prepared::new(len),
        })
    }

    /// Where its file is (until unlinked).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Reserves the pages of `[at, at + len)` in `/dev/shm`: a full
    /// `/dev/shm` is this error, not a SIGBUS when a page is first
    /// touched. Whoever writes a range reserves it first (requests
    /// reserve their own ranges, so the kernel zeroes pages on several
    /// threads at once, beside the device's I/O).
    pub fn reserve(&self, at: usize, len: usize) -> std::io::Result<()> {
        self.check(at, len)?;
        if len == 0 {
            return Ok(());
        }
        // SAFETY: a plain syscall on the file descriptor we own.
        let err = unsafe {
            libc::posix_fallocate(self.file.as_raw_fd(), at as libc::off_t, len as libc::off_t)
        };
        match err {
            0 => Ok(()),
            e => Err(std::io::Error::from_raw_os_error(e)),
        }
    }

    /// Faults the pages of `[at, at + len)` into this process's mapping,
    /// writable (`MADV_POPULATE_WRITE`; reserved first where need be).
    ///
    /// An O_DIRECT read into pages not mapped yet faults each one in
    /// while the kernel pins them for the device, and io_uring does that
    /// on the thread that submits, the device's one ring thread: a fresh
    /// 1 GiB region spent most of that thread's time in `shmem_fault`,
    /// and every other request waited behind it. Populated here, on the
    /// caller's thread (the blocking pool, several ranges at once), the
    /// pinning finds the pages in place. A kernel before 5.14 lacks the
    /// advice; there the pages are touched one by one instead.
    pub fn populate(&self, at: usize, len: usize) -> std::io::Result<()> {
        self.check(at, len)?;
        if len == 0 {
            return Ok(());
        }
        let page = page_size();
        let lo = at / page * page;
        let hi = (at + len).div_ceil(page) * page;
        // SAFETY: `[lo, hi)` lies in the mapping (its length rounded up
        // to a page, which `mmap` maps whole); the advice only faults
        // pages in and changes no byte.
        let err =
            unsafe { libc::madvise(self.base.add(lo).cast(), hi - lo, libc::MADV_POPULATE_WRITE) };
        if err == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINVAL) {
            return Err(e);
        }
        for p in (lo.max(at)..at + len).step_by(page) {
            // SAFETY: inside the mapping; an atomic add of 0 writes no
            // new value, so a byte the other side writes at once is
            // never lost or torn (the range is the caller's by the
            // protocol anyway).
            unsafe {
                (*self.base.add(p).cast::<std::sync::atomic::AtomicU8>())
                    .fetch_add(0, std::sync::atomic::Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// [`Region::reserve`] and [`Region::populate`] of `[at, at + len)`,
    /// skipped where an earlier call prepared all of it already (a kept
    /// region read into again: see [`Prepared`]).
    pub fn prepare(&self, at: usize, len: usize) -> std::io::Result<()> {
        self.check(at, len)?;
        if self.is_prepared(at, len) {
            return Ok(());
        }
        self.reserve(at, len)?;
        self.populate(at, len)?;
        self.prepared.mark(at, len);
        Ok(())
    }

    /// Whether [`Region::prepare`] made all of `[at, at + len)` ready
    /// already: a bitmap lookup, so a caller can skip moving the call to
    /// a thread that may block.
    pub fn is_prepared(&self, at: usize, len: usize) -> bool {
        self.prepared.covers(at, len)
    }

    /// Removes its name (the memory stays while either side maps it).
    pub fn unlink(&self) {
        let _ = std::fs::remove_file(&self.path);
    }

    fn check(&self, at: usize, len: usize) -> std::io::Result<()> {
        if at.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "bytes {at}..{} lie outside the {}-byte region {}",
                    at.saturating_add(len),
                    self.len,
                    self.path.display()
                ),
            ));
        }
        Ok(())
    }

    /// The bytes `[at, at + len)`.
    ///
    /// # Safety
    /// The client may write the mapping at any time: the caller must hold
    /// the range by the protocol (the client handed it over and waits for
    /// the answer), and no `bytes_mut` of an overlapping range may live.
    pub unsafe fn bytes(&self, at: usize, len: usize) -> std::io::Result<&[u8]> {
        self.check(at, len)?;
        // SAFETY: inside the mapping (checked above), which lives as long
        // as `self`; exclusive use of the range is the caller's promise.
        Ok(unsafe { std::slice::from_raw_parts(self.base.add(at), len) })
    }

    /// The bytes `[at, at + len)`, to fill.
    ///
    /// # Safety
    /// As for [`Region::bytes`], and no other borrow of an overlapping
    /// range may live.
    #[allow(clippy::mut_from_ref)] // the range's exclusivity is the caller's promise
    pub unsafe fn bytes_mut(&self, at: usize, len: usize) -> std::io::Result<&mut [u8]> {
        self.check(at, len)?;
        // SAFETY: inside the mapping (checked above); the caller holds the
        // range alone.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.base.add(at), len) })
    }
}

/// The size of a page here.
fn page_size() -> usize {
    // SAFETY: a plain query with no pointers.
    match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as usize,
        _ => 4096,
    }
}

/// Bytes free for an unprivileged writer in the file system of `dir`.
fn free_bytes(dir: &Path) -> Option<u64> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: an all-zero `statvfs` is a valid value of the plain C struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a valid out-pointer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail as u64 * st.f_frsize as u64)
}

/// A new file at `path` (mode 0600, refused if the name exists) of `len`
/// bytes, mapped shared, read-write; the file is removed again when the
/// mapping fails. A zero-length file maps one page.
pub(crate) fn map_new(path: &Path, len: usize) -> std::io::Result<(std::fs::File, *mut u8)> {
    // A killed server's files go once per process, before its first
    // file: they cannot come back while this one runs (their pids are
    // gone).
    static SWEEP: Once = Once::new();
    SWEEP.call_once(sweep);
    // `create_new` refuses a file someone else made under the name, and
    // only the server's user may map it: a client of another user cannot
    // open it and uses Flight instead.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    let mapped = (|| {
        file.set_len(len as u64)?;
        // SAFETY: a fresh shared mapping of a file we own; the result is
        // checked against MAP_FAILED. Bytes past the file's end (up to
        // the page) are never touched by the callers, who check bounds.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len.max(1),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(base.cast::<u8>())
    })();
    match mapped {
        Ok(base) => Ok((file, base)),
        Err(e) => {
            let _ = std::fs::remove_file(path);
            Err(e)
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        self.unlink();
        // SAFETY: the mapping `create` made, unmapped once, here.
        // (A zero-length region maps one page: `map_new`.)
        unsafe { libc::munmap(self.base.cast(), self.len.max(1)) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_is_a_file_of_its_size_shared_and_removed_on_drop() {
        let r = Region::create(10_000).unwrap();
        r.reserve(8_192, 1_808).unwrap();
        assert!(r.reserve(8_192, 1_809).is_err());
        let path = r.path().to_owned();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.len(), 10_000);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        // SAFETY: nothing else touches this region in the test.
        unsafe { r.bytes_mut(9_990, 10).unwrap() }.copy_from_slice(b"0123456789");
        let on_disk = std::fs::read(&path).unwrap();
        assert_eq!(&on_disk[9_990..], b"0123456789");
        // SAFETY: as above.
        assert!(unsafe { r.bytes(9_991, 10) }.is_err(), "past the end");
        // SAFETY: as above.
        assert!(unsafe { r.bytes(usize::MAX, 2) }.is_err(), "overflow");
        drop(r);
        assert!(!path.exists());
    }

    #[test]
    fn a_region_larger_than_dev_shm_has_free_is_refused_before_a_file_is_made() {
        let free = free_bytes(Path::new(SHM_DIR)).unwrap();
        let err = Region::create(free as usize + 1).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::StorageFull, "{err}");
        assert!(err.to_string().contains("free bytes"), "{err}");
    }

    #[test]
    fn preparing_reserves_a_range_once() {
        use std::os::unix::fs::MetadataExt;
        let g = crate::prepared::GRANULE;
        let r = Region::create(3 * g).unwrap();
        let blocks = |r: &Region| std::fs::metadata(r.path()).unwrap().blocks() * 512;
        r.prepare(0, 2 * g).unwrap();
        assert!(blocks(&r) >= 2 * g as u64 && blocks(&r) < 3 * g as u64);
        // Its pages punched out behind its back: a second prepare of the
        // range trusts what it did (it is skipped), a wider one is not.
        // SAFETY: a plain syscall on the region's own descriptor.
        let punched = unsafe {
            libc::fallocate(
                r.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                0,
                g as libc::off_t,
            )
        };
        assert_eq!(punched, 0);
        r.prepare(0, 2 * g).unwrap();
        assert!(blocks(&r) < 2 * g as u64, "skipped");
        r.prepare(0, 3 * g).unwrap();
        assert!(blocks(&r) >= 3 * g as u64, "the whole region now");
        assert!(r.prepare(3 * g - 1, 2).is_err(), "past the end");
    }

    #[test]
    fn populating_maps_the_pages_in_and_keeps_the_bytes() {
        let r = Region::create(3 * 4096 + 100).unwrap();
        // SAFETY: nothing else touches this region in the test.
        unsafe { r.bytes_mut(4_000, 5).unwrap() }.copy_from_slice(b"kept!");
        // Not reserved: populating alone makes the pages (a no-op would
        // leave the file one page long in blocks, the one written).
        // An unaligned range, and the whole region; both leave the bytes.
        r.populate(4_001, 8_000).unwrap();
        r.populate(0, r.len()).unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { r.bytes(4_000, 5) }.unwrap(), b"kept!");
        // The pages are in the file now: all of its blocks are allocated.
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(r.path()).unwrap();
        assert!(
            meta.blocks() * 512 >= r.len() as u64,
            "{} blocks",
            meta.blocks()
        );
        assert!(r.populate(r.len() - 1, 2).is_err(), "past the end");
        r.populate(r.len(), 0).unwrap();
    }

    #[test]
    fn an_empty_region_maps() {
        let r = Region::create(0).unwrap();
        assert!(r.is_empty());
        // SAFETY: nothing else touches this region.
        assert_eq!(unsafe { r.bytes(0, 0) }.unwrap(), b"");
    }
}
