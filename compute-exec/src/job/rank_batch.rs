//! [`RankBatch`]: a batch of a rank's stream as the job hands it to its
//! reader — its rows (not yet made into one batch), the positions it
//! covers, the offset to resume after it, the bad samples met since the
//! batch before, and the room its windows hold in the node's window
//! budget ([`Room`]).

use std::sync::Arc;

use arrow::array::RecordBatch;
use sluice_base::BadSample;
use sluice_flight::gather::Gathered;

use crate::error::JobError;

/// What a batch keeps alive besides its rows' memory: its windows' room
/// in the node's window budget (a `Reservation`), given back when the
/// last batch with a row of the window is gone.
pub type Room = Arc<dyn std::any::Any + Send + Sync>;

/// A batch of a rank's stream: the positions it covers and the offset to
/// resume after it.
#[derive(Clone)]
pub struct RankBatch {
    /// The rows, not yet made into a batch (see [`Gathered`]).
    pub rows: Gathered,
    /// Its windows' room, given back when the last batch of each is gone.
    pub(in crate::job) _rooms: Vec<Room>,
    /// The first position it covers.
    pub from: u64,
    /// The offset after it: ask for this one to resume.
    pub next_offset: u64,
    /// The bad samples its stream met since the batch before (how
    /// many, and the first ones): counted in the job's log when a reader
    /// receives it, so a stream no one reads (a read-ahead never claimed,
    /// a reader gone) counts nothing.
    pub(in crate::job) bad: Option<(u64, Vec<BadSample>)>,
}

impl std::fmt::Debug for RankBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankBatch")
            .field("rows", &self.rows.num_rows())
            .field("from", &self.from)
            .field("next_offset", &self.next_offset)
            .finish()
    }
}

impl RankBatch {
    /// Rows.
    pub fn num_rows(&self) -> usize {
        self.rows.num_rows()
    }

    /// The rows as a batch (each value copied once: readers that encode
    /// the rows for a trainer use [`Gathered::encode`] instead).
    pub fn batch(&self) -> Result<RecordBatch, JobError> {
        self.rows
            .to_batch()
            .map_err(|e| JobError::Internal(format!("cannot make a batch of its rows: {e}")))
    }
}
