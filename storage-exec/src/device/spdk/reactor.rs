//! [`Reactor`]: the SPDK thread's poll loop ([`Reactor::serve`]) and what
//! it owns — the [`Msg`]s other threads send it, the submissions SPDK
//! refused for now, the work that waits for quiet — and the exit hook that
//! parks the loop before the C libraries' destructors run.
//!
//! Polling: while any I/O is in flight the thread spins on
//! `spdk_thread_poll` (SPDK's model; an NVMe queue pair or an AIO context
//! is reaped by polling, not by interrupts). On a dedicated core it goes on
//! polling for [`LINGER`] after the last completion, so that a steady
//! stream of requests never pays a futex wake to rouse it; then, and at
//! once on a shared core (where spinning would take the core from the
//! threads that submit, measured 5 to 25% slower on two cores), it sleeps
//! on the channel for at most [`IDLE_POLL`] at a time, so timed pollers
//! (NVMe admin queues, hot-plug) still run and an idle server costs no core.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::bdev::{self, BdevPtr, IoCtx, OpenBdev};
use super::env::Thread;

/// Longest sleep of an idle SPDK thread before it polls again.
const IDLE_POLL: Duration = Duration::from_millis(1);

/// How long the SPDK thread goes on polling after its last piece of work
/// before it sleeps, when its core is its own.
pub(super) const LINGER: Duration = Duration::from_millis(1);

/// Set-up or tear-down work for the SPDK thread.
pub(super) type Job = Box<dyn FnOnce(&mut Reactor) + Send>;

/// What other threads send the SPDK thread.
pub(super) enum Msg {
    /// A read, write or flush to submit.
    Io(Box<IoCtx>),
    /// A closure to run on the thread (opening and closing bdevs).
    Call(Job),
    /// Finish SPDK and end the thread (sent by `runtime::shutdown`).
    Stop,
}

/// Set by [`at_exit`]: the SPDK thread stops touching SPDK and parks.
static EXITING: AtomicBool = AtomicBool::new(false);
/// Set by the SPDK thread once it has parked (or ended).
static PARKED: (Mutex<bool>, Condvar) = (Mutex::new(false), Condvar::new());

/// Runs at process exit (registered with `atexit` when SPDK starts),
/// before the C destructors of the SPDK and DPDK libraries linked into the
/// executable: without it the SPDK thread would go on polling structures
/// those destructors free. A process that shut SPDK down has nothing left
/// to stop.
extern "C" fn at_exit() {
    EXITING.store(true, Ordering::Release);
    let (lock, parked) = &PARKED;
    let guard = lock.lock().unwrap_or_else(|p| p.into_inner());
    // The thread notices within one poll (at most `IDLE_POLL` when idle).
    let _ = parked.wait_timeout_while(guard, Duration::from_secs(1), |p| !*p);
}

/// Registers [`at_exit`]; the loop must be about to run.
pub(super) fn register_exit_hook() {
    // SAFETY: registers a plain `extern "C"` function with no arguments.
    if unsafe { libc::atexit(at_exit) } != 0 {
        tracing::warn!("cannot register SPDK's exit hook; the process may fault at exit");
    }
}

/// Tells [`at_exit`] that the SPDK thread no longer touches SPDK.
pub(super) fn mark_parked() {
    let (lock, parked) = &PARKED;
    *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
    parked.notify_all();
}

/// The SPDK thread's own state, handed to every [`Job`].
#[derive(Default)]
pub(super) struct Reactor {
    /// Submissions SPDK refused for lack of `spdk_bdev_io`s (`-ENOMEM`),
    /// retried in order after the next poll.
    retry: VecDeque<Box<IoCtx>>,
    /// Work to run once nothing is in flight (closing a descriptor).
    when_quiet: Vec<Job>,
}

impl std::fmt::Debug for Reactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reactor")
            .field("in_flight", &bdev::in_flight())
            .field("retry", &self.retry.len())
            .finish()
    }
}

impl Reactor {
    /// Submits `io`, or keeps it for after the next poll if SPDK has no
    /// `spdk_bdev_io` free.
    fn submit(&mut self, io: Box<IoCtx>) {
        if let Err(io) = bdev::submit(io) {
            self.retry.push_back(io);
        }
    }

    /// Handles one message; returns whether it was [`Msg::Stop`].
    fn handle(&mut self, msg: Msg) -> bool {
        match msg {
            Msg::Io(io) => self.submit(io),
            Msg::Call(job) => job(self),
            Msg::Stop => return true,
        }
        false
    }

    /// Closes `bdev` now, or once none of its I/O is in flight.
    ///
    /// # Safety
    /// As [`OpenBdev::try_close`]: the caller hands over the live box.
    pub(super) unsafe fn close(&mut self, bdev: BdevPtr) {
        // SAFETY: the caller's promise.
        if !unsafe { OpenBdev::try_close(bdev) } {
            self.when_quiet.push(Box::new(move |reactor| {
                // SAFETY: still the same live box, on the SPDK thread.
                unsafe { reactor.close(bdev) }
            }));
        }
    }

    /// Drains new work without blocking; returns whether any came and
    /// whether the channel is now closed (a [`Msg::Stop`] or no sender).
    fn drain(&mut self, rx: &Receiver<Msg>, mut closed: bool) -> (bool, bool) {
        let mut received = false;
        while !closed {
            match rx.try_recv() {
                Ok(msg) => {
                    received = true;
                    closed = self.handle(msg);
                }
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => closed = true,
            }
        }
        (received, closed)
    }

    /// Polls SPDK and serves `rx` until [`Msg::Stop`] (or the last sender
    /// gone) with nothing left in flight, or until the process exits, when
    /// it parks for good. `linger`: how long to spin after the last work.
    ///
    /// # Safety
    /// On the SPDK thread `thread`, after its config is loaded.
    pub(super) unsafe fn serve(&mut self, thread: Thread, rx: &Receiver<Msg>, linger: Duration) {
        // When the thread last ran out of work (None: it has work now).
        let mut idle_since: Option<Instant> = None;
        let mut closed = false;
        loop {
            if EXITING.load(Ordering::Acquire) {
                // The process is exiting under us: stop touching SPDK, whose
                // memory the C destructors are about to free.
                mark_parked();
                loop {
                    std::thread::park();
                }
            }
            let (received, now_closed) = self.drain(rx, closed);
            closed = now_closed;
            // SAFETY: `thread` is the current SPDK thread.
            unsafe { spdk_sys::spdk_thread_poll(thread, 0, 0) };
            for _ in 0..self.retry.len() {
                if let Some(io) = self.retry.pop_front() {
                    self.submit(io);
                }
            }
            if bdev::in_flight() > 0 || !self.retry.is_empty() {
                idle_since = None;
                continue;
            }
            for job in std::mem::take(&mut self.when_quiet) {
                job(self);
            }
            if closed {
                return;
            }
            // Lingering starts at the last request or completion; SPDK's
            // timed pollers, which run on every poll, do not restart it.
            if received {
                idle_since = None;
            }
            let idle = *idle_since.get_or_insert_with(Instant::now);
            if idle.elapsed() < linger {
                std::hint::spin_loop();
                continue;
            }
            match rx.recv_timeout(IDLE_POLL) {
                Ok(msg) => {
                    idle_since = None;
                    closed = self.handle(msg);
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => closed = true,
            }
        }
    }
}
