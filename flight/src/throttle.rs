//! [`TokenBucket`]: limits the bytes per second of a link, to test plans
//! under the conditions the planner reasons about.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A token bucket of `rate` bytes per second holding at most `burst` bytes.
#[derive(Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl TokenBucket {
    /// A bucket refilling at `bytes_per_s`, starting full, with a burst of
    /// 50 ms of traffic (at least 256 KiB).
    pub fn new(bytes_per_s: f64) -> Self {
        let burst = (bytes_per_s * 0.05).max(256.0 * 1024.0);
        Self {
            rate: bytes_per_s,
            burst,
            state: Mutex::new((burst, Instant::now())),
        }
    }

    /// The rate, bytes per second.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Takes `bytes`, returning how long the caller must wait before
    /// sending them (zero when the bucket had them). A message larger than
    /// the burst drives the bucket into debt, so the long-run rate holds.
    pub fn reserve(&self, bytes: usize) -> Duration {
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let (tokens, last) = *g;
        let tokens = (tokens + now.duration_since(last).as_secs_f64() * self.rate).min(self.burst)
            - bytes as f64;
        *g = (tokens, now);
        if tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-tokens / self.rate)
        }
    }

    /// Waits until `bytes` may be sent.
    pub async fn take(&self, bytes: usize) {
        let wait = self.reserve(bytes);
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_run_rate_holds() {
        let b = TokenBucket::new(1e6);
        // The burst is free; then each MB costs a second.
        assert_eq!(b.reserve(256 * 1024), Duration::ZERO);
        let w = b.reserve(1_000_000);
        assert!((w.as_secs_f64() - 1.0).abs() < 0.01, "{w:?}");
        let w = b.reserve(500_000);
        assert!((w.as_secs_f64() - 1.5).abs() < 0.01, "{w:?}");
    }
}
