//! The first stage: a rank's positions `from..to` cut into windows of
//! whole batches, each sized by what the windows before it measured
//! ([`Sizing`]): the first one batch, then about [`WINDOW_BYTES`] of
//! output and at most [`WINDOW_TIME`] of the stream's time at its pace
//! (`super::pace`), at most [`WINDOW_MAX`] samples and a
//! [`WINDOW_SHARE`]th of the stream.
//!
//! A window is cut when the stream asks for the next one (after the
//! windows before it began, not when they end): its length follows the
//! windows done by then.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::Stream;

use crate::job::order::Worker;

use super::options::{WINDOW_BYTES, WINDOW_MAX, WINDOW_SHARE, WINDOW_TIME};

/// The positions `from..to` of `worker`'s part of rank `rank`'s share
/// of `epoch`.
#[derive(Debug, Clone, Copy)]
pub struct Span {
    /// The rank.
    pub rank: u64,
    /// The rank's worker (its every Nth batch), or the whole share.
    pub worker: Worker,
    /// The epoch.
    pub epoch: u64,
    /// The first position.
    pub from: u64,
    /// The position after the last.
    pub to: u64,
}

/// What the windows done measured, for the next window's length and
/// reservation: the last one's output bytes per sample and the stream's
/// pace (`super::pace`), its wall time per sample (0: none done yet).
#[derive(Debug, Clone, Default)]
pub struct Sizing(Arc<[AtomicU64; 2]>);

impl Sizing {
    /// Output bytes per sample of the last window done (0: none yet).
    pub fn bytes_per_sample(&self) -> u64 {
        self.0[0].load(Ordering::Relaxed)
    }

    /// Notes a window done: its output bytes per sample and the stream's
    /// pace, in nanoseconds per sample.
    pub fn measured(&self, bytes_per_sample: u64, ns_per_sample: u64) {
        self.0[0].store(bytes_per_sample.max(1), Ordering::Relaxed);
        self.0[1].store(ns_per_sample.max(1), Ordering::Relaxed);
    }

    /// The next window's length for batches of `batch` in a stream of
    /// `span` positions (see [`window_len`]); one batch before any window
    /// is done.
    fn next_len(&self, batch: u64, span: u64) -> u64 {
        match self.bytes_per_sample() {
            0 => batch.max(1),
            each => window_len(batch, each, self.0[1].load(Ordering::Relaxed), span),
        }
    }
}

/// Samples the next window of a stream of `span` positions holds, for
/// batches of `batch`, when a sample's output takes `bytes_per_sample`
/// and the stream spends `ns_per_sample` of wall time per sample (0: not
/// known yet): about [`WINDOW_BYTES`] and at most [`WINDOW_TIME`], at most
/// [`WINDOW_MAX`] samples and a [`WINDOW_SHARE`]th of the span, in whole
/// batches, at least one.
pub fn window_len(batch: u64, bytes_per_sample: u64, ns_per_sample: u64, span: u64) -> u64 {
    let batch = batch.max(1);
    let fits = WINDOW_BYTES / bytes_per_sample.max(1);
    let in_time = match ns_per_sample {
        0 => u64::MAX,
        ns => WINDOW_TIME.as_nanos() as u64 / ns,
    };
    let share = span / WINDOW_SHARE;
    (fits.min(in_time).min(WINDOW_MAX).min(share) / batch).max(1) * batch
}

/// The windows of `span` as `(start, stop)`, for batches of `batch`,
/// sized by `sizing`; `on_last` runs when the last one is cut (the whole
/// epoch's stream begins the next epoch then: see `crate::job::ahead`).
pub fn windows(
    span: Span,
    batch: u64,
    sizing: Sizing,
    on_last: Option<Box<dyn FnOnce() + Send>>,
) -> impl Stream<Item = (u64, u64)> + Send + Unpin {
    let Span { from, to, .. } = span;
    let mut on_last = on_last;
    futures::stream::iter(std::iter::from_fn({
        let mut start = from;
        move || {
            if start >= to {
                return None;
            }
            let stop = start
                .saturating_add(sizing.next_len(batch, to - from))
                .min(to);
            if stop >= to
                && let Some(last) = on_last.take()
            {
                last();
            }
            let window = (start, stop);
            start = stop;
            Some(window)
        }
    }))
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    #[test]
    fn windows_hold_whole_batches_of_about_window_bytes() {
        let long = 1 << 20;
        // Tiny samples: the most samples a window holds.
        assert_eq!(window_len(64, 100, 0, long), WINDOW_MAX);
        assert_eq!(window_len(100, 100, 0, long), 500);
        // 786 KB tensors: 42 fit, in batches of 16.
        assert_eq!(window_len(16, 786_432, 0, long), 32);
        // A batch over the budget is still one batch.
        assert_eq!(window_len(256, 1 << 20, 0, long), 256);
        assert_eq!(window_len(0, 0, 0, long), WINDOW_MAX);
        // 10 ms a sample: 50 fit in half a second, in whole batches of 16.
        assert_eq!(window_len(16, 100, 10_000_000, long), 48);
        // A second a sample: still one batch.
        assert_eq!(window_len(16, 100, 1_000_000_000, long), 16);
        // A stream of 480: a sixteenth of it, in whole batches of 8.
        assert_eq!(window_len(8, 100, 0, 480), 24);
        // Shorter than sixteen batches: one batch a window.
        assert_eq!(window_len(8, 100, 0, 80), 8);
    }

    #[tokio::test]
    async fn the_first_window_is_one_batch_and_later_ones_follow_what_was_measured() {
        let span = Span {
            rank: 0,
            worker: Worker::ALL,
            epoch: 0,
            from: 10,
            to: 10_000,
        };
        let sizing = Sizing::default();
        let last = Arc::new(AtomicU64::new(0));
        let on_last = {
            let last = Arc::clone(&last);
            Box::new(move || {
                last.fetch_add(1, Ordering::Relaxed);
            })
        };
        let mut w = windows(span, 8, sizing.clone(), Some(on_last));
        assert_eq!(w.next().await, Some((10, 18)));
        // 64 KiB a sample: 512 fit in 32 MiB, a sixteenth of the span is 624.
        sizing.measured(1 << 16, 1);
        assert_eq!(w.next().await, Some((18, 530)));
        let rest: Vec<_> = w.collect().await;
        assert_eq!(
            rest.last().unwrap().1,
            10_000,
            "the span's end, not a batch past it"
        );
        assert!(
            rest.windows(2).all(|p| p[0].1 == p[1].0),
            "no gap, no overlap"
        );
        assert_eq!(
            last.load(Ordering::Relaxed),
            1,
            "told once, at the last window"
        );
    }
}
