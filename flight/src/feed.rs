//! [`Feed`]: a storage fragment bound once on a node and run for window
//! after window of one job stream — one stream per (job stream, storage
//! node), not a round trip, a fragment decoded and a session built per
//! window on every node it touches.
//!
//! A node in this process feeds directly (the storage crate's
//! `LocalFeed`); a node reached by network feeds through the distributed
//! engine (the compute crate's `EngineFeed`: one engine query whose
//! windows are its work units). Both answer in the order asked, and fail a
//! window, and every window queued behind it, with the node's error; the
//! next window starts again (a node restarted mid-job is reached again,
//! see the job's `storage_wait_s`).

use async_trait::async_trait;
use datafusion::execution::SendableRecordBatchStream;

use crate::error::LinkError;
use sluice_planner::fragment::Take;

/// Windows a storage node runs ahead of the one it is sending, per feed.
pub const FEED_AHEAD: usize = 3;

/// A storage fragment bound once on a node, run for each window of a job.
#[async_trait]
pub trait Feed: Send + Sync + std::fmt::Debug {
    /// Runs the fragment over `take`'s rows: the window's output, in one
    /// partition. Windows asked for one after another are answered in
    /// that order, and may run at once.
    async fn window(&self, take: &Take) -> Result<SendableRecordBatchStream, LinkError>;
}
