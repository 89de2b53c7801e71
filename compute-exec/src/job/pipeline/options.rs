//! Every knob of an epoch's stream, each with its default and the reason
//! for it, in one place: what a window holds, how many run and wait at
//! once, how many batches wait for the reader, how a window retries a
//! storage node it cannot reach, and what an epoch begun ahead may take.
//!
//! Memory per reader is bounded by `WINDOWS_RUNNING + WINDOWS_WAITING + 1`
//! windows of about `WINDOW_BYTES` each and the channel's
//! `CHANNEL_BATCHES` batches, whatever the size of a sample; the windows
//! of all readers together by the node's [`crate::session::window_budget::WindowBudget`].

use std::time::Duration;

/// Output bytes a window aims at: large enough that a window's fixed
/// costs (a message down each feed, a plan run) are small beside its
/// work, small enough that a few of them per reader fit any node.
pub const WINDOW_BYTES: u64 = 32 << 20;

/// Samples a window holds at most (unless a batch is larger): tiny
/// samples would otherwise make windows of tens of thousands of rows,
/// each a long wait for its first batch.
pub const WINDOW_MAX: u64 = 512;

/// The stream's wall time a window aims at, at most, at the pace it
/// measured (`super::pace`; not a window's own round trip, which is about
/// [`WINDOWS_RUNNING`] windows of the stream's time plus its transport's
/// latency): a window is cut as one is done, so a re-plan or a slower link
/// acts within a few of these, and a window is never minutes of work.
pub const WINDOW_TIME: Duration = Duration::from_millis(500);

/// Windows running at once per reader: enough to keep every core of a
/// storage node busy across a window's end (each node splits a window
/// over its cores), few enough that a reader holds little.
pub const WINDOWS_RUNNING: usize = 3;

/// Windows a reader may have beyond [`WINDOWS_RUNNING`], done before an
/// older one and waiting for it (see [`crate::job::in_order::InOrder`]):
/// the cores go on with later windows while one is late.
pub const WINDOWS_WAITING: usize = 3;

/// A window holds at most this share of its stream's positions: twice
/// the [`WINDOWS_RUNNING`] + [`WINDOWS_WAITING`] windows asked for ahead,
/// rounded up to a power of two (1/16), so those never hold most of a short stream and a
/// re-plan (or a slower link than the last window saw) acts on the rest
/// of it. A window is a message down an open feed, so small windows of a
/// short stream cost little.
pub const WINDOW_SHARE: u64 = (2 * (WINDOWS_RUNNING + WINDOWS_WAITING) as u64).next_power_of_two();

/// Batches made ahead of the reader: one being encoded while the next is
/// ready; more would only hold memory a slow reader does not use.
pub const CHANNEL_BATCHES: usize = 2;

/// The first pause of a window that cannot reach a storage node; each
/// next pause is twice as long, at most [`RETRY_MAX`], until the job's
/// `storage_wait_s` has passed since the first failure.
pub const RETRY_FIRST: Duration = Duration::from_millis(250);

/// The longest pause between a window's attempts.
pub const RETRY_MAX: Duration = Duration::from_secs(5);

/// How long an epoch begun ahead waits for its reader (a trainer between
/// epochs evaluates, checkpoints): past it, its windows stop.
pub const AHEAD_WAIT: Duration = Duration::from_secs(30);

/// Free window budget a read-ahead needs at least to begin (the windows
/// it may take ahead, running and held, about [`WINDOW_BYTES`] each):
/// speculative work never takes the room readers' windows need.
pub const AHEAD_ROOM: u64 = (WINDOWS_RUNNING + WINDOWS_WAITING) as u64 * WINDOW_BYTES;
