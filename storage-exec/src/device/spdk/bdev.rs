//! [`OpenBdev`]: one bdev opened for I/O on the SPDK thread, and the
//! submission and completion of reads, writes and flushes on it.
//!
//! A request travels as one boxed [`IoCtx`]: the buffer (whose DMA memory
//! the bdev reads into or writes from), the reply channel and the bdev.
//! `spdk_bdev_read`/`write`/`flush` get the context as their callback
//! argument; the completion callback, on the same thread, frees the
//! `spdk_bdev_io`, unboxes the context and sends the buffer back to the
//! awaiting tokio task. A submission refused with `-ENOMEM` (SPDK's pool of
//! `spdk_bdev_io`s is empty) goes back to the caller, the reactor, to be
//! submitted again after the next poll. The thread's count of I/Os in
//! flight lives here, beside the calls that change it.

use std::cell::Cell;
use std::ffi::{CString, c_int, c_void};

use tokio::sync::oneshot;

use super::ffi::{cstr, errno_text};
use crate::buffer::AlignedBuf;

/// What a request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    Read,
    Write,
    Flush,
}

/// The answer to a request: its status (an errno on failure) and, for
/// reads and writes, the buffer.
pub(super) type Reply = (std::result::Result<(), c_int>, Option<AlignedBuf>);

/// A descriptor and I/O channel of one bdev. Lives on the heap, owned by
/// its `SpdkDevice` through a raw pointer, and touched only on the SPDK
/// thread.
#[derive(Debug)]
pub(super) struct OpenBdev {
    desc: *mut spdk_sys::spdk_bdev_desc,
    channel: *mut spdk_sys::spdk_io_channel,
    /// I/Os of this bdev in flight: it is closed only at zero.
    in_flight: Cell<usize>,
    flush_supported: bool,
}

/// What the SPDK thread found when it opened a bdev.
#[derive(Debug, Clone, Copy)]
pub(super) struct Opened {
    pub block_size: u32,
    pub num_blocks: u64,
    pub buf_align: usize,
}

/// A raw pointer moved to the SPDK thread inside a job.
#[derive(Debug, Clone, Copy)]
pub(super) struct BdevPtr(pub *mut OpenBdev);

// SAFETY: the pointer is only dereferenced on the SPDK thread (every use is
// in a request or a job that thread runs); other threads only carry it.
unsafe impl Send for BdevPtr {}
// SAFETY: as for `Send`: sharing a `&BdevPtr` only lets other threads copy
// the address, never dereference it.
unsafe impl Sync for BdevPtr {}

/// Logs what SPDK says about an open bdev (hot removal, resize).
unsafe extern "C" fn bdev_event(
    kind: spdk_sys::spdk_bdev_event_type,
    bdev: *mut spdk_sys::spdk_bdev,
    _ctx: *mut c_void,
) {
    // SAFETY: SPDK passes the live bdev this event is about.
    let name = unsafe { cstr(spdk_sys::spdk_bdev_get_name(bdev)) };
    match kind {
        spdk_sys::SPDK_BDEV_EVENT_REMOVE => tracing::error!(
            "SPDK bdev {name} is being removed; its I/O will fail until sluice restarts"
        ),
        spdk_sys::SPDK_BDEV_EVENT_RESIZE => {
            tracing::warn!("SPDK bdev {name} was resized; sluice keeps its old capacity")
        }
        _ => tracing::info!("SPDK bdev {name}: event {kind}"),
    }
}

impl OpenBdev {
    /// Opens `name` for reading and writing and gets its I/O channel.
    /// Runs on the SPDK thread.
    pub(super) fn open(name: &str) -> std::result::Result<(Box<Self>, Opened), String> {
        let cname = CString::new(name).map_err(|_| format!("bdev name {name:?} holds a NUL"))?;
        let mut desc = std::ptr::null_mut();
        // SAFETY: on the SPDK thread (caller); `cname` outlives the call;
        // `desc` is a valid out-pointer; the event callback ignores its ctx.
        let rc = unsafe {
            spdk_sys::spdk_bdev_open_ext(
                cname.as_ptr(),
                true,
                Some(bdev_event),
                std::ptr::null_mut(),
                &mut desc,
            )
        };
        if rc != 0 {
            return Err(format!(
                "cannot open bdev {name} ({}){}",
                errno_text(-rc),
                if rc == -libc::ENODEV {
                    ": the config creates no bdev of that name"
                } else {
                    ""
                }
            ));
        }
        // SAFETY: `desc` was just opened on this thread.
        let (bdev, channel) = unsafe {
            (
                spdk_sys::spdk_bdev_desc_get_bdev(desc),
                spdk_sys::spdk_bdev_get_io_channel(desc),
            )
        };
        if channel.is_null() {
            // SAFETY: closing the descriptor opened above, on its thread.
            unsafe { spdk_sys::spdk_bdev_close(desc) };
            return Err(format!("cannot get an I/O channel for bdev {name}"));
        }
        // SAFETY: `bdev` belongs to the open descriptor.
        let opened = unsafe {
            Opened {
                block_size: spdk_sys::spdk_bdev_get_block_size(bdev),
                num_blocks: spdk_sys::spdk_bdev_get_num_blocks(bdev),
                buf_align: spdk_sys::spdk_bdev_get_buf_align(bdev),
            }
        };
        // SAFETY: as above.
        let flush_supported = unsafe {
            spdk_sys::spdk_bdev_io_type_supported(bdev, spdk_sys::SPDK_BDEV_IO_TYPE_FLUSH)
        };
        Ok((
            Box::new(Self {
                desc,
                channel,
                in_flight: Cell::new(0),
                flush_supported,
            }),
            opened,
        ))
    }

    /// Releases the channel and closes the descriptor if no I/O of this
    /// bdev is in flight; returns false, touching nothing, if some is (the
    /// caller tries again once the thread is quiet). Runs on the SPDK
    /// thread.
    ///
    /// # Safety
    /// `this` came from `Box::into_raw` of an [`OpenBdev`], and once this
    /// returns true nobody uses it again.
    pub(super) unsafe fn try_close(this: BdevPtr) -> bool {
        // SAFETY: the caller hands over the live box.
        if unsafe { (*this.0).in_flight.get() } > 0 {
            return false;
        }
        // SAFETY: no I/O is in flight on this channel; the channel and
        // descriptor were made on this thread and are released once.
        unsafe {
            let bdev = Box::from_raw(this.0);
            spdk_sys::spdk_put_io_channel(bdev.channel);
            spdk_sys::spdk_bdev_close(bdev.desc);
        }
        true
    }
}

/// One request on its way through SPDK.
pub(super) struct IoCtx {
    pub bdev: BdevPtr,
    pub op: Op,
    pub offset: u64,
    pub len: u64,
    pub buf: Option<AlignedBuf>,
    pub reply: oneshot::Sender<Reply>,
}

thread_local! {
    /// I/Os submitted to SPDK and not yet completed (SPDK thread only).
    static IN_FLIGHT: Cell<usize> = const { Cell::new(0) };
}

/// I/Os of every bdev submitted on this thread and not yet completed.
pub(super) fn in_flight() -> usize {
    IN_FLIGHT.with(Cell::get)
}

/// Submits `ctx` on the SPDK thread; answers at once on a submission
/// error. Hands `ctx` back when SPDK has no `spdk_bdev_io` free
/// (`-ENOMEM`): submit it again after the next poll.
pub(super) fn submit(ctx: Box<IoCtx>) -> Result<(), Box<IoCtx>> {
    let bdev = ctx.bdev.0;
    // SAFETY: on the SPDK thread; the device keeps its `OpenBdev` alive
    // until a close job, which runs after this one and waits for in-flight
    // I/O.
    let open = unsafe { &*bdev };
    let (op, offset, len) = (ctx.op, ctx.offset, ctx.len);
    let raw = Box::into_raw(ctx);
    // SAFETY: `raw` stays valid until `io_done` (or the error path below)
    // reclaims it; the buffer pointer is the DMA memory the context owns,
    // `len` bytes long, and nobody else touches it until the reply.
    let rc = unsafe {
        let buf = (*raw)
            .buf
            .as_mut()
            .map_or(std::ptr::null_mut(), |b| b.as_mut_ptr().cast::<c_void>());
        match op {
            Op::Read | Op::Write => {
                // Same signature: (desc, channel, buf, offset, nbytes, cb, arg).
                let transfer = if op == Op::Read {
                    spdk_sys::spdk_bdev_read
                } else {
                    spdk_sys::spdk_bdev_write
                };
                transfer(
                    open.desc,
                    open.channel,
                    buf,
                    offset,
                    len,
                    Some(io_done),
                    raw.cast(),
                )
            }
            Op::Flush if !open.flush_supported => {
                // Nothing to make durable (a malloc bdev lives in RAM).
                let ctx = Box::from_raw(raw);
                let _ = ctx.reply.send((Ok(()), None));
                return Ok(());
            }
            Op::Flush => spdk_sys::spdk_bdev_flush(
                open.desc,
                open.channel,
                offset,
                len,
                Some(io_done),
                raw.cast(),
            ),
        }
    };
    if rc == 0 {
        open.in_flight.set(open.in_flight.get() + 1);
        IN_FLIGHT.with(|n| n.set(n.get() + 1));
        return Ok(());
    }
    // SAFETY: SPDK did not take `raw` (rc != 0), so it is still ours.
    let ctx = unsafe { Box::from_raw(raw) };
    if rc == -libc::ENOMEM {
        return Err(ctx);
    }
    let IoCtx { buf, reply, .. } = *ctx;
    let _ = reply.send((Err(-rc), buf));
    Ok(())
}

/// SPDK's completion callback for every request.
unsafe extern "C" fn io_done(io: *mut spdk_sys::spdk_bdev_io, success: bool, arg: *mut c_void) {
    // SAFETY: `arg` is the context `submit` leaked for this request, handed
    // back exactly once; `io` is SPDK's and is freed exactly once here.
    let ctx = unsafe {
        spdk_sys::spdk_bdev_free_io(io);
        Box::from_raw(arg.cast::<IoCtx>())
    };
    // SAFETY: the bdev outlives its in-flight I/O (close waits for zero).
    let open = unsafe { &*ctx.bdev.0 };
    open.in_flight.set(open.in_flight.get() - 1);
    IN_FLIGHT.with(|n| n.set(n.get().saturating_sub(1)));
    let IoCtx { buf, reply, .. } = *ctx;
    let status = if success { Ok(()) } else { Err(libc::EIO) };
    // A dropped receiver (the caller was cancelled) just frees the buffer.
    let _ = reply.send((status, buf));
}
