//! The output bytes that all job streams of a node may have in flight
//! together.
//!
//! A reader bounds its own memory (`WINDOWS_RUNNING + WINDOWS_WAITING`
//! windows of about `WINDOW_BYTES` plus a channel of batches), but a node
//! serving 64 trainers would still hold 64 times that. Each window reserves its
//! expected output bytes here before it runs and gives them back once
//! its rows are cut into batches and sent: past the budget, windows wait
//! (first come, first served) instead of growing the process. A window
//! larger than the whole budget takes all of it, so it still runs.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Bytes one permit stands for (permits are counted in `u32`).
const UNIT: u64 = 64 << 10;

/// Output bytes of windows in flight, across the streams of a node.
#[derive(Debug, Clone)]
pub struct WindowBudget {
    permits: Arc<Semaphore>,
    units: u32,
}

/// Bytes of a [`WindowBudget`] held by one window until it is dropped.
#[derive(Debug)]
pub struct Reservation {
    _permit: OwnedSemaphorePermit,
}

impl WindowBudget {
    /// A budget of `bytes` (at least one unit of 64 KiB).
    pub fn new(bytes: u64) -> Self {
        // u32::MAX permits are far below the semaphore's maximum.
        let units = u32::try_from(bytes.div_ceil(UNIT))
            .unwrap_or(u32::MAX)
            .max(1);
        Self {
            permits: Arc::new(Semaphore::new(units as usize)),
            units,
        }
    }

    /// A node's default budget: a quarter of the memory available to the
    /// process now (its memory cgroup's room where that is less), at most
    /// 2 GiB, the windows of 10 readers at full size (each takes
    /// `WINDOWS_RUNNING + WINDOWS_WAITING` windows ahead of the one it
    /// cuts into batches). A server given 1.5 GiB keeps a few hundred MB
    /// of windows in flight, not 2 GiB it does not have.
    pub fn default_bytes() -> u64 {
        match sluice_udfs::host_memory::available() {
            0 => 2 << 30,
            available => (available / 4).clamp(64 << 20, 2 << 30),
        }
    }

    /// The whole budget, in bytes.
    pub fn bytes(&self) -> u64 {
        u64::from(self.units) * UNIT
    }

    /// Bytes not reserved now.
    pub fn available(&self) -> u64 {
        self.permits.available_permits() as u64 * UNIT
    }

    /// Waits until `bytes` (at most the whole budget) are free and holds
    /// them until the reservation is dropped.
    pub async fn reserve(&self, bytes: u64) -> Reservation {
        let units = u32::try_from(bytes.div_ceil(UNIT))
            .unwrap_or(u32::MAX)
            .clamp(1, self.units);
        let permit = Arc::clone(&self.permits)
            .acquire_many_owned(units)
            .await
            .expect("the budget's semaphore is never closed");
        Reservation { _permit: permit }
    }
}

impl Default for WindowBudget {
    /// 2 GiB (a session's budget unless it is given one; `serve` gives
    /// [`WindowBudget::default_bytes`] unless told).
    fn default() -> Self {
        Self::new(2 << 30)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn windows_wait_for_room_and_a_huge_one_takes_all() {
        let budget = WindowBudget::new(1 << 20);
        assert_eq!(budget.bytes(), 1 << 20);
        let a = budget.reserve(600 << 10).await;
        assert_eq!(budget.available(), (1 << 20) - (640 << 10));
        // 600 KiB more do not fit until `a` is dropped.
        let waiting = tokio::time::timeout(Duration::from_millis(50), budget.reserve(600 << 10));
        assert!(waiting.await.is_err());
        drop(a);
        let b = tokio::time::timeout(Duration::from_secs(5), budget.reserve(600 << 10))
            .await
            .expect("room after the drop");
        drop(b);
        // Larger than the budget: all of it, not a wait forever.
        let all = budget.reserve(1 << 40).await;
        assert_eq!(budget.available(), 0);
        drop(all);
        assert_eq!(budget.available(), 1 << 20);
    }
}
