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
//! So when a stream that reads a whole epoch issues its last window, the
//! job begins the same rank's next epoch from offset 0
//! ([`ReadAhead::offer`]), if no reader asked for that epoch yet and the
//! node's window budget has room to spare: a stream like any other, whose
//! batches wait in its channel. A request for exactly that (rank, epoch,
//! offset 0, to the end) takes it over ([`ReadAhead::take`]). One epoch
//! ahead per rank, no more: a read-ahead begins the epoch after its own
//! only once its reader has taken it over ([`NextEpoch`]: when it issued
//! its last window before that, the take-over begins it). A request
//! for any other part of it drops it and starts its own (a resumed or
//! sharded reader). What the read-ahead may hold is bounded as a reader's
//! stream is (its windows in flight and its channel's batches: a stream
//! no one reads stops when its channel is full), and nothing it made
//! counts as delivered until a reader receives it (nor do the bad samples
//! it met: they travel with its batches), so exactly-once and resume are
//! as without it. One not claimed within
//! [`super::pipeline::options::AHEAD_WAIT`], or whose
//! epoch's reader left before the end, is dropped, which stops its windows,
//! and so are a cancelled job's.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sluice_udfs::env::CancelOnDrop;
use tokio::sync::mpsc;

use super::rank_batch::RankBatch;
use crate::error::JobError;

/// A stream's batches as its reader receives them. Dropped (its reader
/// left, or a read-ahead nobody took), it stops the stream's UDFs at their
/// next row there and then: the stream's task, which would notice too,
/// runs on the executor whose threads may all be inside those UDFs.
#[derive(Debug)]
pub struct Batches {
    rx: mpsc::Receiver<Result<RankBatch, JobError>>,
    _stop: CancelOnDrop,
}

impl Batches {
    /// The batches of `rx`, whose stream's UDFs `stop` stops.
    pub fn new(rx: mpsc::Receiver<Result<RankBatch, JobError>>, stop: CancelOnDrop) -> Self {
        Self { rx, _stop: stop }
    }

    /// The next batch, or `None` at the stream's end.
    pub async fn recv(&mut self) -> Option<Result<RankBatch, JobError>> {
        self.rx.recv().await
    }
}

/// When a whole epoch's stream begins its rank's next epoch: once it has
/// issued its last window *and* a reader reads it, whichever comes second
/// ([`NextEpoch::mark`]). A stream a reader asked for is read from the
/// start; a read-ahead is when it is taken over. (Without the second
/// condition a read-ahead that issued its last window would begin the
/// epoch after it, whose offer drops the first, read-ahead and all.)
#[derive(Debug, Default)]
pub struct NextEpoch(AtomicU8);

impl NextEpoch {
    /// The stream issued its last window.
    pub const ISSUED: u8 = 1;
    /// A reader reads the stream.
    pub const READ: u8 = 2;

    /// A stream a reader asked for.
    pub fn read() -> Arc<Self> {
        Arc::new(Self(AtomicU8::new(Self::READ)))
    }

    /// Marks `what` happened; true when this makes both (begin the next
    /// epoch now), once.
    pub fn mark(&self, what: u8) -> bool {
        let before = self.0.fetch_or(what, Ordering::AcqRel);
        before & what == 0 && (before | what) == Self::ISSUED | Self::READ
    }
}

/// A stream begun ahead.
pub type Begun = (Batches, Arc<NextEpoch>);

struct Ahead {
    id: u64,
    rank: u64,
    epoch: u64,
    begun: Begun,
}

/// See the module docs.
#[derive(Default)]
pub struct ReadAhead {
    waiting: Mutex<Vec<Ahead>>,
    /// The (rank, epoch)s readers asked for: never begun ahead again.
    asked: Mutex<HashSet<(u64, u64)>>,
    next: AtomicU64,
}

impl std::fmt::Debug for ReadAhead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys: Vec<(u64, u64)> = self.lock().iter().map(|a| (a.rank, a.epoch)).collect();
        f.debug_struct("ReadAhead").field("waiting", &keys).finish()
    }
}

impl ReadAhead {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Ahead>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `rank`'s `epoch` is begun and waiting.
    pub fn has(&self, rank: u64, epoch: u64) -> bool {
        self.lock()
            .iter()
            .any(|a| a.rank == rank && a.epoch == epoch)
    }

    /// Keeps `batches`, the stream of `rank`'s `epoch` from offset 0, for
    /// its reader; returns its id for [`ReadAhead::expire`].
    pub fn offer(&self, rank: u64, epoch: u64, begun: Begun) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut waiting = self.lock();
        waiting.retain(|a| a.rank != rank);
        waiting.push(Ahead {
            id,
            rank,
            epoch,
            begun,
        });
        id
    }

    /// A reader asks for `rank`'s `epoch` (`whole`: from offset 0 to the
    /// end): the stream begun for it, if it was and `whole`; a stream
    /// begun for it and not taken is dropped.
    pub fn take(&self, rank: u64, epoch: u64, whole: bool) -> Option<Begun> {
        self.asked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((rank, epoch));
        let mut waiting = self.lock();
        let at = waiting
            .iter()
            .position(|a| a.rank == rank && a.epoch == epoch)?;
        let begun = waiting.swap_remove(at).begun;
        whole.then_some(begun)
    }

    /// Whether a reader asked for `rank`'s `epoch`.
    pub fn was_asked(&self, rank: u64, epoch: u64) -> bool {
        self.asked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&(rank, epoch))
    }

    /// Drops `rank`'s `epoch` if it is waiting (its windows stop).
    pub fn forget(&self, rank: u64, epoch: u64) {
        self.lock().retain(|a| (a.rank, a.epoch) != (rank, epoch));
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

    #[test]
    fn the_next_epoch_begins_once_when_issued_and_read() {
        let asked = NextEpoch::read();
        assert!(asked.mark(NextEpoch::ISSUED));
        assert!(!asked.mark(NextEpoch::ISSUED) && !asked.mark(NextEpoch::READ));
        // A read-ahead that issued its last window waits for its reader.
        let ahead = NextEpoch::default();
        assert!(!ahead.mark(NextEpoch::ISSUED));
        assert!(ahead.mark(NextEpoch::READ));
        assert!(!ahead.mark(NextEpoch::READ));
    }

    type Sender = mpsc::Sender<Result<RankBatch, JobError>>;

    /// A stream's channel: its sender, its batches, and the flag that
    /// stops its UDFs.
    fn stream() -> (Sender, Batches, sluice_udfs::env::Cancel) {
        let (tx, rx) = mpsc::channel(1);
        let cancel = sluice_udfs::env::Cancel::default();
        (tx, Batches::new(rx, cancel.on_drop()), cancel)
    }

    #[test]
    fn a_read_ahead_is_claimed_once_by_its_rank_and_epoch() {
        let ahead = ReadAhead::default();
        let (tx, rx, _) = stream();
        let id = ahead.offer(0, 3, (rx, Arc::default()));
        assert!(ahead.has(0, 3));
        assert!(ahead.take(1, 3, true).is_none() && ahead.take(0, 2, true).is_none());
        assert!(ahead.take(0, 3, true).is_some());
        assert!(ahead.take(0, 3, true).is_none(), "claimed twice");
        assert!(ahead.was_asked(0, 3) && ahead.was_asked(1, 3) && !ahead.was_asked(0, 4));
        // A request for part of an epoch drops what was begun for it, and
        // its UDFs stop then, not when its task next runs.
        let (tx5, rx5, stop5) = stream();
        ahead.offer(5, 0, (rx5, Arc::default()));
        assert!(ahead.take(5, 0, false).is_none());
        assert!(tx5.is_closed() && !ahead.has(5, 0) && stop5.is_cancelled());
        // Dropped (expired, forgotten): its producer sees the channel close.
        let (tx2, rx2, stop2) = stream();
        let id2 = ahead.offer(0, 4, (rx2, Arc::default()));
        ahead.expire(id);
        assert!(ahead.has(0, 4), "expiring a claimed one drops nothing");
        assert!(!stop2.is_cancelled());
        ahead.expire(id2);
        assert!(tx2.is_closed() && !ahead.has(0, 4) && stop2.is_cancelled());
        let (tx3, rx3, _) = stream();
        ahead.offer(2, 1, (rx3, Arc::default()));
        ahead.forget(2, 0);
        assert!(!tx3.is_closed(), "another epoch is kept");
        ahead.forget(2, 1);
        assert!(tx3.is_closed());
        drop(tx);
    }
}
