//! [`Doorbell`]: how a thread that sleeps in `io_uring_enter` learns that a
//! new request waits in its channel.
//!
//! The io_uring thread sleeps in the kernel until a completion arrives. A
//! request sent meanwhile would otherwise sit in the channel until the next
//! completion — at a depth of 4 reads of 1 MiB, about a millisecond, during
//! which the device has one request fewer in flight than asked. So the ring
//! keeps a poll on an eventfd armed while it sleeps, and a sender that finds
//! the ring asleep writes the eventfd: the poll completes and the thread
//! wakes to submit the request.
//!
//! A wake costs a `write` by the sender, only when the ring thread is
//! asleep: the sender takes the `asleep` flag with a swap, so of many
//! senders during one sleep only the first writes.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

/// An eventfd and the flag that says whether anyone waits on it.
#[derive(Debug)]
pub(crate) struct Doorbell {
    fd: OwnedFd,
    asleep: AtomicBool,
}

impl Doorbell {
    /// A new doorbell (a non-blocking eventfd).
    pub(crate) fn new() -> std::io::Result<Self> {
        // SAFETY: plain syscall; the result is checked before use.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Self {
            // SAFETY: `fd` is a fresh descriptor that nothing else owns.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            asleep: AtomicBool::new(false),
        })
    }

    /// The eventfd the ring polls.
    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The ring thread is about to sleep: rings from now on wake it. Its
    /// caller must look at the channel once more after this, since a request
    /// sent just before found no one asleep.
    pub(crate) fn sleeping(&self) {
        self.asleep.store(true, Ordering::SeqCst);
    }

    /// The ring thread is awake again (no need to ring).
    pub(crate) fn awake(&self) {
        self.asleep.store(false, Ordering::SeqCst);
    }

    /// Wakes the ring thread if it sleeps. Called after a request is sent.
    pub(crate) fn ring(&self) {
        if self.asleep.swap(false, Ordering::SeqCst) {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to our eventfd. A failure
            // (the counter at its maximum) means a wake is pending anyway.
            unsafe { libc::write(self.fd(), std::ptr::from_ref(&one).cast(), 8) };
        }
    }

    /// Resets the eventfd after its poll completed.
    pub(crate) fn clear(&self) {
        let mut count: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64; non-blocking, so an empty
        // counter just returns EAGAIN.
        unsafe { libc::read(self.fd(), std::ptr::from_mut(&mut count).cast(), 8) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(fd: RawFd) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: polls one valid pollfd without waiting.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    }

    #[test]
    fn rings_only_a_sleeper_and_only_once() {
        let bell = Doorbell::new().unwrap();
        bell.ring();
        assert!(!readable(bell.fd()), "nobody asleep: no write");
        bell.sleeping();
        bell.ring();
        assert!(readable(bell.fd()));
        bell.clear();
        assert!(!readable(bell.fd()));
        bell.ring();
        assert!(!readable(bell.fd()), "the first ring took the flag");
        bell.sleeping();
        bell.awake();
        bell.ring();
        assert!(!readable(bell.fd()), "awake again: no write");
    }
}
