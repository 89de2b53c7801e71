//! [`ReadAhead`]: the next epoch of a rank, begun before its reader asks.
//!
//! A trainer reads epoch after epoch, each a new request. Were each epoch's
//! stream begun only when asked for, every epoch would start on idle cores:
//! the plan prepared and placed, the first window read and decoded, before
//! the first batch — about a tenth of a two-second epoch on two cores, the
//! gap between a loader's steady rate and its rate per epoch. Loaders that
//! run one pipeline across epochs (DALI, tf.data with `repeat`) do not pay
//! it.
//!
//! So when a stream issues its last window, the job begins the same
//! positions of the rank's next epoch ([`ReadAhead::offer`]) — for a
//! stream of the whole epoch always, for part of one (a DataLoader
//! worker's run of the rank's share) when a reader asked for the same
//! part of the epoch before, so the pattern repeats — if no reader asked
//! for those positions of that epoch yet and the node's window budget has
//! room to spare: a stream like any other, whose batches wait in its
//! channel. A request for exactly that [`Span`] takes it over
//! ([`ReadAhead::take`]); a request for other positions of it drops it and
//! starts its own (a resumed reader); other spans of the epoch (the other
//! workers') are kept. What the read-ahead may hold is bounded as a reader's
//! stream is (its windows in flight and its channel's batches: a stream
//! no one reads stops when its channel is full), and nothing it made
//! counts as delivered until a reader receives it, so exactly-once and
//! resume are as without it. One not claimed within [`AHEAD_WAIT`], or whose
//! epoch's reader left before the end, is dropped, which stops its windows,
//! and so are a cancelled job's.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;

use super::error::JobError;
use super::run::Delivery;
use super::stream::Span;

/// How long a read-ahead waits for its reader.
pub const AHEAD_WAIT: Duration = Duration::from_secs(30);

/// Free window budget a read-ahead needs at least to begin (its windows
/// in flight, about [`super::stream::WINDOW_BYTES`] each).
pub const AHEAD_ROOM: u64 = super::stream::IN_FLIGHT as u64 * super::stream::WINDOW_BYTES;

/// A stream's batches as its reader receives them.
pub type Batches = mpsc::Receiver<Result<Delivery, JobError>>;

struct Ahead {
    id: u64,
    span: Span,
    batches: Batches,
}

/// Whether `a` and `b` are of one rank and share a position (of any epoch).
fn overlap(a: &Span, b: &Span) -> bool {
    a.rank == b.rank && a.from < b.to && b.from < a.to
}

/// The spans (`from`, `to`) readers asked for, by (rank, epoch).
type Asked = HashMap<(u64, u64), Vec<(u64, u64)>>;

/// See the module docs.
#[derive(Default)]
pub struct ReadAhead {
    waiting: Mutex<Vec<Ahead>>,
    /// The spans readers asked for, by (rank, epoch): never begun ahead
    /// again.
    asked: Mutex<Asked>,
    next: AtomicU64,
}

impl std::fmt::Debug for ReadAhead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let spans: Vec<Span> = self.lock().iter().map(|a| a.span).collect();
        f.debug_struct("ReadAhead")
            .field("waiting", &spans)
            .finish()
    }
}

impl ReadAhead {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Ahead>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn asked(&self) -> std::sync::MutexGuard<'_, Asked> {
        self.asked.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether some part of `rank`'s `epoch` is begun and waiting.
    pub fn has(&self, rank: u64, epoch: u64) -> bool {
        self.lock()
            .iter()
            .any(|a| a.span.rank == rank && a.span.epoch == epoch)
    }

    /// Whether exactly `span` is begun and waiting.
    pub fn has_span(&self, span: &Span) -> bool {
        self.lock().iter().any(|a| a.span == *span)
    }

    /// Keeps `batches`, the stream of `span`, for its reader (dropping
    /// any other waiting for one of its positions); returns its id for
    /// [`ReadAhead::expire`].
    pub fn offer(&self, span: Span, batches: Batches) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut waiting = self.lock();
        waiting.retain(|a| !overlap(&a.span, &span));
        waiting.push(Ahead { id, span, batches });
        id
    }

    /// A reader asks for `span`: the stream begun for exactly it, if one
    /// was; one begun for other positions of its epoch that it shares a
    /// position with is dropped.
    pub fn take(&self, span: &Span) -> Option<Batches> {
        self.asked()
            .entry((span.rank, span.epoch))
            .or_default()
            .push((span.from, span.to));
        let mut waiting = self.lock();
        let claimed = waiting
            .iter()
            .position(|a| a.span == *span)
            .map(|at| waiting.swap_remove(at).batches);
        waiting.retain(|a| a.span.epoch != span.epoch || !overlap(&a.span, span));
        claimed
    }

    /// Whether a reader asked for any of `span`'s positions of its epoch.
    pub fn was_asked(&self, span: &Span) -> bool {
        self.asked()
            .get(&(span.rank, span.epoch))
            .is_some_and(|spans| {
                spans
                    .iter()
                    .any(|&(from, to)| from < span.to && span.from < to)
            })
    }

    /// Whether a reader asked for exactly `span`'s positions of the epoch
    /// before `span`'s: a part of an epoch read again.
    pub fn repeats(&self, span: &Span) -> bool {
        span.epoch > 0
            && self
                .asked()
                .get(&(span.rank, span.epoch - 1))
                .is_some_and(|spans| spans.contains(&(span.from, span.to)))
    }

    /// Drops `span` if it is waiting (its windows stop).
    pub fn forget(&self, span: &Span) {
        self.lock().retain(|a| a.span != *span);
    }

    /// Drops read-ahead `id` if it is still waiting.
    pub fn expire(&self, id: u64) {
        self.lock().retain(|a| a.id != id);
    }

    /// Drops everything waiting.
    pub fn clear(&self) {
        self.lock().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(rank: u64, epoch: u64, from: u64, to: u64) -> Span {
        Span {
            rank,
            epoch,
            from,
            to,
        }
    }

    #[test]
    fn a_read_ahead_is_claimed_once_by_its_span() {
        let ahead = ReadAhead::default();
        let (tx, rx) = mpsc::channel(1);
        let id = ahead.offer(span(0, 3, 0, 100), rx);
        assert!(ahead.has(0, 3) && ahead.has_span(&span(0, 3, 0, 100)));
        assert!(ahead.take(&span(1, 3, 0, 100)).is_none());
        assert!(ahead.take(&span(0, 2, 0, 100)).is_none());
        assert!(ahead.take(&span(0, 3, 0, 100)).is_some());
        assert!(ahead.take(&span(0, 3, 0, 100)).is_none(), "claimed twice");
        assert!(ahead.was_asked(&span(0, 3, 50, 60)) && ahead.was_asked(&span(1, 3, 0, 100)));
        assert!(!ahead.was_asked(&span(0, 4, 0, 100)));
        // A request for other positions of the epoch drops what was begun.
        let (tx5, rx5) = mpsc::channel::<Result<Delivery, JobError>>(1);
        ahead.offer(span(5, 0, 0, 100), rx5);
        assert!(ahead.take(&span(5, 0, 3, 100)).is_none());
        assert!(tx5.is_closed() && !ahead.has(5, 0));
        // Dropped (expired, forgotten): its producer sees the channel close.
        let (tx2, rx2) = mpsc::channel::<Result<Delivery, JobError>>(1);
        let id2 = ahead.offer(span(0, 4, 0, 100), rx2);
        ahead.expire(id);
        assert!(ahead.has(0, 4), "expiring a claimed one drops nothing");
        ahead.expire(id2);
        assert!(tx2.is_closed() && !ahead.has(0, 4));
        let (tx3, rx3) = mpsc::channel::<Result<Delivery, JobError>>(1);
        ahead.offer(span(2, 1, 0, 100), rx3);
        ahead.forget(&span(2, 0, 0, 100));
        assert!(!tx3.is_closed(), "another epoch is kept");
        ahead.forget(&span(2, 1, 0, 100));
        assert!(tx3.is_closed());
        drop(tx);
    }

    #[test]
    fn the_workers_of_a_rank_each_have_their_part_begun() {
        // Two DataLoader workers share rank 0's 100 positions: 0..48 and
        // 48..100. Each part is begun, kept beside the other, and claimed
        // by its own worker.
        let ahead = ReadAhead::default();
        let (w0, w1) = (span(0, 1, 0, 48), span(0, 1, 48, 100));
        for (w, epoch) in [(w0, 0), (w1, 0)] {
            ahead.take(&Span { epoch, ..w });
        }
        assert!(ahead.repeats(&w0) && ahead.repeats(&w1));
        assert!(!ahead.repeats(&span(0, 1, 0, 100)) && !ahead.repeats(&span(0, 0, 0, 48)));
        let (tx0, rx0) = mpsc::channel::<Result<Delivery, JobError>>(1);
        let (tx1, rx1) = mpsc::channel::<Result<Delivery, JobError>>(1);
        ahead.offer(w0, rx0);
        ahead.offer(w1, rx1);
        assert!(ahead.has_span(&w0) && ahead.has_span(&w1));
        assert!(ahead.take(&w1).is_some());
        assert!(!tx0.is_closed(), "the other worker's part is kept");
        assert!(ahead.take(&w0).is_some());
        assert!(ahead.was_asked(&span(0, 1, 40, 50)));
        // An offer drops a waiting one that shares positions with it.
        let (tx2, rx2) = mpsc::channel::<Result<Delivery, JobError>>(1);
        ahead.offer(span(0, 2, 0, 48), rx2);
        let (_tx3, rx3) = mpsc::channel::<Result<Delivery, JobError>>(1);
        ahead.offer(span(0, 3, 0, 100), rx3);
        assert!(tx2.is_closed());
        drop((tx0, tx1));
    }
}
