//! The checkpoints' part of the catalog: two redb tables beside the
//! datasets' ones.
//!
//! | table | key | value |
//! |---|---|---|
//! | `checkpoints` | (name, version) | [`CheckpointRecord`] as JSON |
//! | `checkpoint_chunks` | first chunk of a run | chunk count |
//! | `checkpoint_last` | name | the highest version ever committed |
//!
//! Version numbers are never reused: `checkpoint_last` outlives deletes, so
//! a reader holding "version 3" never gets a different checkpoint under
//! that number after version 3 was deleted and the name written again.
//!
//! A commit inserts the new version and its chunks, and removes the
//! versions past the retention count with their chunks, in one durable
//! write transaction: after a crash either the new version is there and the
//! old ones it replaced are gone, or nothing changed. redb serialises write
//! transactions, so two writers of one name get consecutive versions.

use redb::{ReadableDatabase, ReadableTable};

use super::record::{CheckpointInfo, CheckpointRecord};
use super::tables::{CHECKPOINT_CHUNKS, CHECKPOINT_LAST, CHECKPOINTS};
use crate::alloc::ChunkRun;
use crate::catalog::Catalog;
use crate::error::{Result, StorageError};

/// What a commit or a delete changed.
#[derive(Debug, Default)]
pub struct Removed {
    /// Versions removed.
    pub versions: Vec<CheckpointInfo>,
    /// Chunks they owned, free once the transaction is durable.
    pub runs: Vec<ChunkRun>,
}

impl Catalog {
    fn versions_of<T: ReadableTable<(&'static str, u64), &'static [u8]>>(
        &self,
        table: &T,
        name: &str,
    ) -> Result<Vec<CheckpointRecord>> {
        let mut out = Vec::new();
        for entry in table
            .range((name, 0)..=(name, u64::MAX))
            .map_err(|e| self.err(e))?
        {
            let (_, v) = entry.map_err(|e| self.err(e))?;
            out.push(self.decode(v.value())?);
        }
        Ok(out)
    }

    /// Commits each of `records` as the next version of its name (their
    /// `version`s are set here) and removes the versions past the newest
    /// `keep` of each name, in one transaction.
    pub fn commit_checkpoints(
        &self,
        records: &mut [CheckpointRecord],
        keep: usize,
    ) -> Result<Removed> {
        let txn = self.db().begin_write().map_err(|e| self.err(e))?;
        let mut removed = Removed::default();
        {
            let mut table = txn.open_table(CHECKPOINTS).map_err(|e| self.err(e))?;
            let mut chunks = txn.open_table(CHECKPOINT_CHUNKS).map_err(|e| self.err(e))?;
            let mut last = txn.open_table(CHECKPOINT_LAST).map_err(|e| self.err(e))?;
            for record in records.iter_mut() {
                let existing = self.versions_of(&table, &record.name)?;
                // A catalog from before `checkpoint_last` has only its records.
                let highest = last
                    .get(record.name.as_str())
                    .map_err(|e| self.err(e))?
                    .map(|v| v.value())
                    .into_iter()
                    .chain(existing.last().map(|r| r.version))
                    .max()
                    .unwrap_or(0);
                record.version = highest + 1;
                last.insert(record.name.as_str(), record.version)
                    .map_err(|e| self.err(e))?;
                let bytes = serde_json::to_vec(&*record).map_err(|e| self.err(e))?;
                table
                    .insert((record.name.as_str(), record.version), bytes.as_slice())
                    .map_err(|e| self.err(e))?;
                for run in &record.runs {
                    chunks
                        .insert(run.start, run.count)
                        .map_err(|e| self.err(e))?;
                }
                let drop_n = (existing.len() + 1).saturating_sub(keep.max(1));
                for old in existing.iter().take(drop_n) {
                    self.remove_version(&mut table, &mut chunks, old, &mut removed)?;
                }
            }
        }
        txn.commit().map_err(|e| self.err(e))?;
        Ok(removed)
    }

    fn remove_version(
        &self,
        table: &mut redb::Table<'_, (&'static str, u64), &'static [u8]>,
        chunks: &mut redb::Table<'_, u64, u64>,
        old: &CheckpointRecord,
        removed: &mut Removed,
    ) -> Result<()> {
        table
            .remove((old.name.as_str(), old.version))
            .map_err(|e| self.err(e))?;
        for run in &old.runs {
            chunks.remove(run.start).map_err(|e| self.err(e))?;
        }
        removed.versions.push(old.into());
        removed.runs.extend_from_slice(&old.runs);
        Ok(())
    }

    /// One version of a checkpoint: the newest when `version` is `None`.
    pub fn checkpoint(&self, name: &str, version: Option<u64>) -> Result<CheckpointRecord> {
        let txn = self.db().begin_read().map_err(|e| self.err(e))?;
        let table = txn.open_table(CHECKPOINTS).map_err(|e| self.err(e))?;
        let found = match version {
            Some(v) => table
                .get((name, v))
                .map_err(|e| self.err(e))?
                .map(|b| self.decode(b.value()))
                .transpose()?,
            None => self.versions_of(&table, name)?.pop(),
        };
        found.ok_or_else(|| StorageError::UnknownCheckpoint {
            name: name.chars().take(64).collect(),
            version,
        })
    }

    /// Every version of every checkpoint whose name starts with `prefix`,
    /// by name then version.
    pub fn checkpoints(&self, prefix: &str) -> Result<Vec<CheckpointInfo>> {
        let txn = self.db().begin_read().map_err(|e| self.err(e))?;
        let table = txn.open_table(CHECKPOINTS).map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for entry in table.range((prefix, 0)..).map_err(|e| self.err(e))? {
            let (k, v) = entry.map_err(|e| self.err(e))?;
            if !k.value().0.starts_with(prefix) {
                break;
            }
            let rec: CheckpointRecord = self.decode(v.value())?;
            out.push(CheckpointInfo::from(&rec));
        }
        Ok(out)
    }

    /// Removes one version of `name`, or all of them.
    pub fn delete_checkpoint(&self, name: &str, version: Option<u64>) -> Result<Removed> {
        let txn = self.db().begin_write().map_err(|e| self.err(e))?;
        let mut removed = Removed::default();
        {
            let mut table = txn.open_table(CHECKPOINTS).map_err(|e| self.err(e))?;
            let mut chunks = txn.open_table(CHECKPOINT_CHUNKS).map_err(|e| self.err(e))?;
            let doomed: Vec<_> = self
                .versions_of(&table, name)?
                .into_iter()
                .filter(|r| version.is_none_or(|v| v == r.version))
                .collect();
            if doomed.is_empty() {
                return Err(StorageError::UnknownCheckpoint {
                    name: name.chars().take(64).collect(),
                    version,
                });
            }
            for old in &doomed {
                self.remove_version(&mut table, &mut chunks, old, &mut removed)?;
            }
        }
        txn.commit().map_err(|e| self.err(e))?;
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(name: &str, start: u64) -> CheckpointRecord {
        CheckpointRecord {
            name: name.into(),
            version: 0,
            size: 5,
            created_unix_ms: 1,
            extents: vec![],
            runs: vec![ChunkRun { start, count: 1 }],
        }
    }

    /// (name, version) of every version under `prefix`.
    fn listed(cat: &Catalog, prefix: &str) -> Vec<(String, u64)> {
        cat.checkpoints(prefix)
            .unwrap()
            .into_iter()
            .map(|i| (i.name, i.version))
            .collect()
    }

    #[test]
    fn versions_count_up_old_ones_retire_and_chunks_are_tracked() {
        let dir = tempfile::tempdir().unwrap();
        let cat = Catalog::create(&dir.path().join("c.redb")).unwrap();
        let mut a1 = record("run/a.pt", 0);
        assert!(
            cat.commit_checkpoints(std::slice::from_mut(&mut a1), 2)
                .unwrap()
                .runs
                .is_empty()
        );
        let mut a2 = record("run/a.pt", 1);
        cat.commit_checkpoints(std::slice::from_mut(&mut a2), 2)
            .unwrap();
        let mut b = record("run/b.pt", 2);
        cat.commit_checkpoints(std::slice::from_mut(&mut b), 2)
            .unwrap();
        let mut a3 = record("run/a.pt", 3);
        let removed = cat
            .commit_checkpoints(std::slice::from_mut(&mut a3), 2)
            .unwrap();
        assert_eq!((a1.version, a2.version, a3.version), (1, 2, 3));
        assert_eq!(removed.runs, vec![ChunkRun { start: 0, count: 1 }]);
        assert_eq!(cat.checkpoint("run/a.pt", None).unwrap().version, 3);
        assert!(cat.checkpoint("run/a.pt", Some(1)).is_err());
        assert_eq!(
            listed(&cat, "run/"),
            vec![
                ("run/a.pt".into(), 2),
                ("run/a.pt".into(), 3),
                ("run/b.pt".into(), 1)
            ]
        );
        assert!(cat.checkpoints("zzz").unwrap().is_empty());
        assert_eq!(cat.chunk_runs().unwrap().len(), 3);
        let gone = cat.delete_checkpoint("run/a.pt", None).unwrap();
        assert_eq!(gone.versions.len(), 2);
        assert_eq!(
            cat.chunk_runs().unwrap(),
            vec![ChunkRun { start: 2, count: 1 }]
        );
        let err = cat.delete_checkpoint("run/a.pt", None).unwrap_err();
        assert!(err.to_string().contains("run/a.pt"), "{err}");
        // Written again after every version was deleted: a new number.
        let mut a4 = record("run/a.pt", 4);
        cat.commit_checkpoints(std::slice::from_mut(&mut a4), 2)
            .unwrap();
        assert_eq!(a4.version, 4);
        let mut b2 = record("run/b.pt", 5);
        cat.commit_checkpoints(std::slice::from_mut(&mut b2), 2)
            .unwrap();
        cat.delete_checkpoint("run/b.pt", Some(2)).unwrap();
        let mut b3 = record("run/b.pt", 6);
        cat.commit_checkpoints(std::slice::from_mut(&mut b3), 2)
            .unwrap();
        assert_eq!(b3.version, 3, "version 2 was deleted, not free to reuse");
    }

    #[test]
    fn a_group_commits_every_name_in_one_transaction() {
        let dir = tempfile::tempdir().unwrap();
        let cat = Catalog::create(&dir.path().join("c.redb")).unwrap();
        let mut first = [record("s/1/__0.distcp", 0), record("s/1/.metadata", 1)];
        cat.commit_checkpoints(&mut first, 1).unwrap();
        let mut again = [record("s/1/__0.distcp", 2), record("s/1/__1.distcp", 3)];
        let removed = cat.commit_checkpoints(&mut again, 1).unwrap();
        assert_eq!((again[0].version, again[1].version), (2, 1));
        assert_eq!(removed.runs, vec![ChunkRun { start: 0, count: 1 }]);
        assert_eq!(
            listed(&cat, "s/1/"),
            vec![
                ("s/1/.metadata".into(), 1),
                ("s/1/__0.distcp".into(), 2),
                ("s/1/__1.distcp".into(), 1)
            ]
        );
    }
}
