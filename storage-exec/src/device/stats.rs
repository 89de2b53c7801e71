//! I/O counters shared by every backend.

use std::sync::atomic::{AtomicU64, Ordering};

/// Live counters a backend bumps on each completed request.
#[derive(Debug, Default)]
pub struct DeviceStats {
    reads: AtomicU64,
    read_bytes: AtomicU64,
    writes: AtomicU64,
    written_bytes: AtomicU64,
}

/// A snapshot of [`DeviceStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct IoCounters {
    /// Completed reads.
    pub reads: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Completed writes.
    pub writes: u64,
    /// Bytes written.
    pub written_bytes: u64,
}

impl DeviceStats {
    /// Counts one completed read of `bytes`.
    pub fn record_read(&self, bytes: usize) {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.read_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Counts one completed write of `bytes`.
    pub fn record_write(&self, bytes: usize) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.written_bytes
            .fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// The counters now.
    pub fn snapshot(&self) -> IoCounters {
        IoCounters {
            reads: self.reads.load(Ordering::Relaxed),
            read_bytes: self.read_bytes.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            written_bytes: self.written_bytes.load(Ordering::Relaxed),
        }
    }
}
