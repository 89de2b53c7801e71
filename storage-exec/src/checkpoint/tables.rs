//! The checkpoints' redb tables (see [`super::catalog`] for what each
//! holds), created with the catalog's own when it opens, and the chunk
//! runs they own, which the catalog adds to the datasets' when the
//! allocator is rebuilt.

use redb::{ReadTransaction, ReadableTable, TableDefinition, WriteTransaction};

use crate::alloc::ChunkRun;

pub(crate) const CHECKPOINTS: TableDefinition<'_, (&str, u64), &[u8]> =
    TableDefinition::new("checkpoints");
pub(crate) const CHECKPOINT_CHUNKS: TableDefinition<'_, u64, u64> =
    TableDefinition::new("checkpoint_chunks");
pub(crate) const CHECKPOINT_LAST: TableDefinition<'_, &str, u64> =
    TableDefinition::new("checkpoint_last");

/// Creates the tables (at catalog open).
pub(crate) fn create_tables(txn: &WriteTransaction) -> Result<(), redb::Error> {
    txn.open_table(CHECKPOINTS)?;
    txn.open_table(CHECKPOINT_CHUNKS)?;
    txn.open_table(CHECKPOINT_LAST)?;
    Ok(())
}

/// The chunk runs checkpoints own.
pub(crate) fn chunk_runs(txn: &ReadTransaction) -> Result<Vec<ChunkRun>, redb::Error> {
    let table = txn.open_table(CHECKPOINT_CHUNKS)?;
    let mut out = Vec::new();
    for entry in table.iter()? {
        let (k, v) = entry?;
        out.push(ChunkRun {
            start: k.value(),
            count: v.value(),
        });
    }
    Ok(out)
}
