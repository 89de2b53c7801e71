//! A stream's pace: the wall time it spends per sample delivered, over
//! its last [`PACE_WINDOWS`] windows, measured from one window reaching
//! the stream's observer (in order) to the next, less the time it was
//! blocked on its reader's channel. It sizes the next window
//! (`super::windows::Sizing`).
//!
//! Not a window's own round trip: [`WINDOWS_RUNNING`] windows run at
//! once, so each one's round trip is about that many windows of the
//! stream's time, plus whatever latency its transport adds. Sized by the
//! round trip, a plane with more latency per window cut smaller windows,
//! paid more fixed cost per sample, and went slower still (the engine
//! kept one-batch windows where the feeds grew theirs: docs/benchmarks.md,
//! "The data plane"). The pace counts a transport's latency only where it
//! slows the stream. A reader's pauses are not the stream's: an epoch
//! begun ahead waits for its reader with its channel full, and a window
//! sized by that wait would be one batch when the reader comes.
//!
//! [`WINDOWS_RUNNING`]: super::options::WINDOWS_RUNNING

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Windows the pace is measured over: enough that a burst of windows
/// done together (one was late, the ones after it waited) averages with
/// the wait that made it.
pub const PACE_WINDOWS: usize = 4;

/// See the module docs.
#[derive(Debug, Default)]
pub struct Pace {
    /// When the last window reached the observer.
    last: Option<Instant>,
    /// Time blocked on the reader's channel since.
    blocked: Duration,
    /// The last windows' (wall time since the window before, samples).
    recent: VecDeque<(Duration, u64)>,
}

impl Pace {
    /// Notes `waited` blocked on the reader's channel.
    pub fn blocked(&mut self, waited: Duration) {
        self.blocked += waited;
    }

    /// Notes a window of `samples` reaching the observer at `now`, after
    /// `took` of wall time from its start to its rows; the stream's pace
    /// since, in nanoseconds per sample (at least 1). The first window
    /// has no window before it: its own round trip stands for it.
    pub fn window(&mut self, samples: u64, took: Duration, now: Instant) -> u64 {
        let blocked = std::mem::take(&mut self.blocked);
        let since = match self.last.replace(now) {
            Some(before) => now
                .saturating_duration_since(before)
                .saturating_sub(blocked),
            None => took,
        };
        if self.recent.len() == PACE_WINDOWS {
            self.recent.pop_front();
        }
        self.recent.push_back((since, samples));
        let (time, n) = self
            .recent
            .iter()
            .fold((Duration::ZERO, 0), |(t, n), &(d, s)| (t + d, n + s));
        (time.as_nanos() / u128::from(n.max(1))).clamp(1, u128::from(u64::MAX)) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_first_window_is_paced_by_its_round_trip_later_ones_by_the_stream() {
        let mut pace = Pace::default();
        let t0 = Instant::now();
        // 32 samples in 320 ms: 10 ms a sample.
        assert_eq!(pace.window(32, 320 * MS, t0), 10_000_000);
        // The next 32 reached the observer 64 ms later, though their own
        // round trip was 300 ms (three windows run at once): the two
        // windows together took 384 ms for 64 samples.
        assert_eq!(pace.window(32, 300 * MS, t0 + 64 * MS), 6_000_000);
    }

    #[test]
    fn a_burst_after_a_late_window_averages_with_the_wait() {
        let mut pace = Pace::default();
        let t0 = Instant::now();
        let mut at = t0;
        pace.window(64, 128 * MS, at);
        // Steady: a window of 64 every 128 ms (2 ms a sample).
        for _ in 0..PACE_WINDOWS {
            at += 128 * MS;
            assert_eq!(pace.window(64, 384 * MS, at), 2_000_000);
        }
        // One window late by 256 ms, then the two done behind it arrive
        // at once: over the last four windows, still 2 ms a sample.
        at += 384 * MS;
        assert_eq!(pace.window(64, 640 * MS, at), 3_000_000);
        assert_eq!(pace.window(64, 384 * MS, at), 2_500_000);
        assert_eq!(pace.window(64, 384 * MS, at), 2_000_000);
        // The burst leaves the measure as the steady windows come back.
        at += 128 * MS;
        assert_eq!(pace.window(64, 384 * MS, at), 2_000_000);
    }

    #[test]
    fn time_blocked_on_the_reader_is_not_the_streams() {
        let mut pace = Pace::default();
        let t0 = Instant::now();
        assert_eq!(pace.window(32, 64 * MS, t0), 2_000_000);
        // An epoch begun ahead: its channel full for 10 s until the
        // reader came, then the next window 64 ms of work later.
        pace.blocked(Duration::from_secs(10));
        let at = t0 + Duration::from_secs(10) + 64 * MS;
        assert_eq!(pace.window(32, 64 * MS, at), 2_000_000);
    }

    #[test]
    fn windows_at_one_instant_still_give_a_pace() {
        let mut pace = Pace::default();
        let t0 = Instant::now();
        assert_eq!(pace.window(0, Duration::ZERO, t0), 1);
        assert_eq!(pace.window(16, Duration::ZERO, t0), 1);
    }
}
