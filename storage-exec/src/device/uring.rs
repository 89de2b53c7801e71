//! The io_uring backend: O_DIRECT, registered fixed buffers, many requests
//! in flight.
//!
//! One ring per device, owned by a dedicated thread. Callers send requests
//! (offset, buffer, reply channel) over a channel; the thread turns each into
//! a submission queue entry, submits in batches, and reaps completions,
//! sending each buffer back through its oneshot. The thread blocks on the
//! channel only when nothing is in flight, and on the ring otherwise, so a
//! burst of requests costs one `io_uring_enter` per batch rather than one
//! syscall per request.
//!
//! The device file is registered with the ring (`types::Fixed(0)`), and so
//! are the pool's fixed buffers: a request whose buffer is one of them uses
//! `READ_FIXED`/`WRITE_FIXED`, which spares the kernel from pinning pages on
//! every request. Other buffers use plain `READ`/`WRITE`.
//!
//! Short transfers (possible at the end of a device, or for requests larger
//! than one SQE can describe) are continued with a new entry for the rest.

use std::collections::VecDeque;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc;
use std::thread::JoinHandle;

use async_trait::async_trait;
use io_uring::{IoUring, opcode, types};
use tokio::sync::oneshot;

use super::{Device, DeviceInfo, DeviceOptions, DeviceStats, Geometry, IoCounters, sync_data};
use crate::buffer::{AlignedBuf, BufferPool, PageAllocator};
use crate::error::{Result, StorageError};

/// Largest transfer one SQE describes; bigger requests continue in pieces.
const MAX_SQE_BYTES: usize = 1 << 30;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
}

struct Request {
    kind: Kind,
    offset: u64,
    buf: AlignedBuf,
    reply: oneshot::Sender<(std::io::Result<()>, AlignedBuf)>,
}

struct InFlight {
    req: Request,
    done: usize,
}

/// A device driven by io_uring with O_DIRECT.
#[derive(Debug)]
pub struct UringDevice {
    geometry: Geometry,
    file: Arc<File>,
    depth: usize,
    pool: Arc<BufferPool>,
    fixed_buffers: bool,
    stats: Arc<DeviceStats>,
    tx: Option<mpsc::Sender<Request>>,
    thread: Option<JoinHandle<()>>,
}

impl UringDevice {
    /// Opens `path` (a file or block device) with O_DIRECT and starts its ring.
    pub fn open(path: &Path, opts: &DeviceOptions) -> Result<Self> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .map_err(|e| {
                if e.raw_os_error() == Some(libc::EINVAL) {
                    StorageError::DirectIoUnsupported {
                        path: path.to_owned(),
                        source: e,
                    }
                } else {
                    StorageError::io("open device", path, e)
                }
            })?;
        let geometry = Geometry::of(&file, path, opts.block_size)?;
        let depth = opts.queue_depth.clamp(1, 4096);
        let ring = IoUring::new(depth.next_power_of_two() as u32)
            .map_err(StorageError::UringUnavailable)?;
        ring.submitter()
            .register_files(&[file.as_raw_fd()])
            .map_err(StorageError::UringUnavailable)?;

        let pool_opts = crate::buffer::PoolOptions {
            align: opts.pool.align.max(opts.block_size),
            ..opts.pool.clone()
        };
        let pool = BufferPool::new(Arc::new(PageAllocator), pool_opts)
            .map_err(|e| StorageError::io("allocate buffer pool for", path, e))?;
        let iovecs: Vec<libc::iovec> = pool
            .fixed_regions()
            .into_iter()
            .map(|(base, len)| libc::iovec {
                iov_base: base.cast(),
                iov_len: len,
            })
            .collect();
        let fixed_buffers = if iovecs.is_empty() {
            false
        } else {
            // SAFETY: the iovecs describe the pool's fixed buffers, which live
            // as long as the pool; the pool outlives the ring because the ring
            // thread holds an Arc to it and drops the ring first.
            match unsafe { ring.submitter().register_buffers(&iovecs) } {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(
                        "{}: registering io_uring fixed buffers failed ({e}); using plain reads",
                        path.display()
                    );
                    false
                }
            }
        };

        let (tx, rx) = mpsc::channel();
        let stats = Arc::new(DeviceStats::default());
        let thread_stats = Arc::clone(&stats);
        let thread_pool = Arc::clone(&pool);
        let thread = std::thread::Builder::new()
            .name(format!(
                "sluice-uring-{}",
                path.file_name()
                    .map(|n| n.to_string_lossy())
                    .unwrap_or_default()
            ))
            .spawn(move || {
                ring_loop(ring, rx, depth, fixed_buffers, &thread_stats);
                drop(thread_pool);
            })
            .map_err(|e| StorageError::io("start io_uring thread for", path, e))?;

        Ok(Self {
            geometry,
            file: Arc::new(file),
            depth,
            pool,
            fixed_buffers,
            stats,
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    async fn submit(&self, kind: Kind, offset: u64, buf: AlignedBuf) -> Result<AlignedBuf> {
        self.geometry.check(offset, buf.len())?;
        let (reply, rx) = oneshot::channel();
        let tx = self
            .tx
            .as_ref()
            .ok_or_else(|| closed(&self.geometry.path))?;
        tx.send(Request {
            kind,
            offset,
            buf,
            reply,
        })
        .map_err(|_| closed(&self.geometry.path))?;
        let (res, buf) = rx.await.map_err(|_| closed(&self.geometry.path))?;
        let op = match kind {
            Kind::Read => "read",
            Kind::Write => "write",
        };
        res.map_err(|e| StorageError::io(op, &self.geometry.path, e))?;
        Ok(buf)
    }
}

fn closed(path: &Path) -> StorageError {
    StorageError::io(
        "submit to",
        path,
        std::io::Error::new(
            std::io::ErrorKind::BrokenPipe,
            "io_uring thread has stopped",
        ),
    )
}

/// Builds the SQE for the untransferred rest of a request.
fn entry_for(slot: usize, f: &mut InFlight, fixed_buffers: bool) -> io_uring::squeue::Entry {
    let remaining = f.req.buf.len() - f.done;
    let len = remaining.min(MAX_SQE_BYTES) as u32;
    let offset = f.req.offset + f.done as u64;
    let fixed = if fixed_buffers {
        f.req.buf.fixed_index()
    } else {
        None
    };
    // SAFETY: `done <= len()`, so the pointer stays inside the buffer, which
    // the in-flight table owns until the completion is reaped.
    let ptr = unsafe { f.req.buf.as_mut_ptr().add(f.done) };
    let fd = types::Fixed(0);
    let entry = match (f.req.kind, fixed) {
        (Kind::Read, Some(idx)) => opcode::ReadFixed::new(fd, ptr, len, idx)
            .offset(offset)
            .build(),
        (Kind::Read, None) => opcode::Read::new(fd, ptr, len).offset(offset).build(),
        (Kind::Write, Some(idx)) => opcode::WriteFixed::new(fd, ptr, len, idx)
            .offset(offset)
            .build(),
        (Kind::Write, None) => opcode::Write::new(fd, ptr, len).offset(offset).build(),
    };
    entry.user_data(slot as u64)
}

/// What a completion of `res` means for request `f`: done (its result),
/// or `None` when a short transfer goes on from where it stopped.
fn outcome(f: &mut InFlight, res: i32) -> Option<std::io::Result<()>> {
    if res < 0 {
        return Some(Err(std::io::Error::from_raw_os_error(-res)));
    }
    if res == 0 && f.done < f.req.buf.len() {
        return Some(Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!(
                "transfer ended after {} of {} bytes",
                f.done,
                f.req.buf.len()
            ),
        )));
    }
    f.done += res as usize;
    (f.done >= f.req.buf.len()).then_some(Ok(()))
}

/// The ring itself failed: every request in flight gets the error.
fn fail_all(slots: &mut [Option<InFlight>], e: &std::io::Error) {
    for slot in slots.iter_mut() {
        if let Some(f) = slot.take() {
            let err = std::io::Error::new(e.kind(), format!("io_uring_enter: {e}"));
            let _ = f.req.reply.send((Err(err), f.req.buf));
        }
    }
}

fn ring_loop(
    mut ring: IoUring,
    rx: mpsc::Receiver<Request>,
    depth: usize,
    fixed_buffers: bool,
    stats: &DeviceStats,
) {
    let mut slots: Vec<Option<InFlight>> = (0..depth).map(|_| None).collect();
    let mut free: Vec<usize> = (0..depth).rev().collect();
    let mut resubmit: VecDeque<usize> = VecDeque::new();
    let mut in_flight = 0usize;
    let mut open = true;

    loop {
        // Continuations of short transfers first, then new requests.
        while let Some(slot) = resubmit.pop_front() {
            let Some(f) = slots[slot].as_mut() else {
                continue;
            };
            let entry = entry_for(slot, f, fixed_buffers);
            // SAFETY: the buffer behind the entry lives in `slots[slot]` until
            // its completion is reaped below; the queue has room because at
            // most `depth` entries (the ring's size) are ever outstanding.
            if unsafe { ring.submission().push(&entry) }.is_err() {
                resubmit.push_front(slot);
                break;
            }
        }
        while open && !free.is_empty() {
            // Block for work only when nothing is in flight.
            let next = if in_flight == 0 && resubmit.is_empty() {
                rx.recv().map_err(|_| mpsc::TryRecvError::Disconnected)
            } else {
                rx.try_recv()
            };
            let req = match next {
                Ok(req) => req,
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            };
            let slot = free.pop().unwrap_or_default();
            let f = slots[slot].insert(InFlight { req, done: 0 });
            let entry = entry_for(slot, f, fixed_buffers);
            // SAFETY: as above — the buffer is owned by `slots[slot]` until
            // the completion for `slot` is reaped.
            if unsafe { ring.submission().push(&entry) }.is_err() {
                resubmit.push_back(slot);
            }
            in_flight += 1;
        }
        if in_flight == 0 {
            if open {
                continue;
            }
            return;
        }
        if let Err(e) = ring.submit_and_wait(1) {
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            fail_all(&mut slots, &e);
            return;
        }
        for cqe in ring.completion() {
            let (slot, res) = (cqe.user_data() as usize, cqe.result());
            let Some(f) = slots[slot].as_mut() else {
                continue;
            };
            match outcome(f, res) {
                None => resubmit.push_back(slot),
                Some(result) => {
                    if let Some(f) = slots[slot].take() {
                        if result.is_ok() {
                            match f.req.kind {
                                Kind::Read => stats.record_read(f.done),
                                Kind::Write => stats.record_write(f.done),
                            }
                        }
                        let _ = f.req.reply.send((result, f.req.buf));
                    }
                    free.push(slot);
                    in_flight -= 1;
                }
            }
        }
    }
}

#[async_trait]
impl Device for UringDevice {
    async fn read_at(&self, offset: u64, buf: AlignedBuf) -> Result<AlignedBuf> {
        self.submit(Kind::Read, offset, buf).await
    }

    async fn write_at(&self, offset: u64, buf: AlignedBuf) -> Result<AlignedBuf> {
        self.submit(Kind::Write, offset, buf).await
    }

    async fn flush(&self) -> Result<()> {
        sync_data(&self.file, &self.geometry.path).await
    }

    fn capacity(&self) -> u64 {
        self.geometry.capacity
    }

    fn block_size(&self) -> usize {
        self.geometry.block_size
    }

    fn parallelism(&self) -> usize {
        self.depth
    }

    fn pool(&self) -> &Arc<BufferPool> {
        &self.pool
    }

    fn takes_any_memory(&self) -> bool {
        true
    }

    fn describe(&self) -> DeviceInfo {
        self.geometry.info("uring", self.fixed_buffers)
    }

    fn stats(&self) -> IoCounters {
        self.stats.snapshot()
    }
}

impl Drop for UringDevice {
    fn drop(&mut self) {
        // Closing the channel lets the thread finish what is in flight and exit.
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn passes_the_conformance_suite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev.img");
        super::super::create_device_file(&path, 64 << 20).unwrap();
        let opts = DeviceOptions {
            queue_depth: 16,
            pool: crate::buffer::PoolOptions {
                fixed_count: 4,
                fixed_size: 1 << 20,
                ..Default::default()
            },
            ..Default::default()
        };
        match UringDevice::open(&path, &opts) {
            Ok(dev) => super::super::conformance::run_all(Arc::new(dev)).await,
            Err(e @ StorageError::DirectIoUnsupported { .. }) => {
                eprintln!(
                    "SKIPPED: uring conformance: {e} (the temp dir's filesystem refuses O_DIRECT)"
                );
            }
            Err(e) => panic!("{e}"),
        }
    }
}
