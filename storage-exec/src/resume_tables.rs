//! The redb tables of what failed ingests kept for their re-runs
//! (`ingest::resume` writes and reads them), and what the catalog and the
//! store do with them: create them at open, count their chunks as used,
//! delete a dataset's when its version commits, drop them all (`sluice
//! gc`). Its own file, beneath both the catalog and the ingest, so that
//! neither imports the other for it.
//!
//! | table | key | value |
//! |---|---|---|
//! | `resumes` | dataset | the record's head: its source, as JSON |
//! | `resume_objects` | (dataset, key) | one kept object, as JSON |
//! | `resume_chunks` | (dataset, first chunk of a run) | chunks in the run |
//!
//! A record's objects are rows of their own so that a save while an
//! ingest runs writes only what it adds.

use redb::{ReadTransaction, ReadableTable, TableDefinition, WriteTransaction};

use crate::alloc::ChunkRun;

pub(crate) const RESUMES: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("resumes");
pub(crate) const RESUME_OBJECTS: TableDefinition<'_, (&str, &str), &[u8]> =
    TableDefinition::new("resume_objects");
pub(crate) const RESUME_CHUNKS: TableDefinition<'_, (&str, u64), u64> =
    TableDefinition::new("resume_chunks");

/// Creates the tables (at catalog open).
pub(crate) fn create_tables(txn: &WriteTransaction) -> Result<(), redb::Error> {
    txn.open_table(RESUMES)?;
    txn.open_table(RESUME_OBJECTS)?;
    txn.open_table(RESUME_CHUNKS)?;
    Ok(())
}

/// The first key of `resume_objects` past `dataset`'s rows: every
/// `(dataset, key)` is below `(dataset + "\0", "")`, and every other
/// dataset's at or above it, so `(dataset, "")..objects_end(dataset)` is
/// exactly its rows.
pub(crate) fn objects_end(dataset: &str) -> String {
    format!("{dataset}\0")
}

/// Removes `dataset`'s kept objects from `table`.
pub(crate) fn remove_objects(
    table: &mut redb::Table<'_, (&'static str, &'static str), &'static [u8]>,
    dataset: &str,
) -> Result<(), redb::Error> {
    let end = objects_end(dataset);
    table.retain_in((dataset, "")..(end.as_str(), ""), |_, _| false)?;
    Ok(())
}

/// Every kept run, with its dataset.
fn all_runs(
    table: &impl ReadableTable<(&'static str, u64), u64>,
) -> Result<Vec<(String, ChunkRun)>, redb::Error> {
    let mut out = Vec::new();
    for entry in table.iter()? {
        let (k, v) = entry?;
        let (dataset, start) = k.value();
        out.push((
            dataset.to_owned(),
            ChunkRun {
                start,
                count: v.value(),
            },
        ));
    }
    Ok(out)
}

/// The chunk runs the records own (to rebuild the allocator at open).
pub(crate) fn chunk_runs(txn: &ReadTransaction) -> Result<Vec<ChunkRun>, redb::Error> {
    let table = txn.open_table(RESUME_CHUNKS)?;
    Ok(all_runs(&table)?.into_iter().map(|(_, r)| r).collect())
}

/// `dataset`'s kept runs, removed from `table`.
pub(crate) fn remove_runs(
    table: &mut redb::Table<'_, (&'static str, u64), u64>,
    dataset: &str,
) -> Result<Vec<ChunkRun>, redb::Error> {
    let runs: Vec<ChunkRun> = table
        .range((dataset, 0)..=(dataset, u64::MAX))?
        .map(|e| {
            e.map(|(k, v)| ChunkRun {
                start: k.value().1,
                count: v.value(),
            })
        })
        .collect::<Result<_, _>>()?;
    for run in &runs {
        table.remove((dataset, run.start))?;
    }
    Ok(runs)
}

/// Deletes `dataset`'s record in `txn` (the commit of its version) and
/// returns its runs that `keep` (the version's runs) does not hold: the
/// caller frees them once `txn` is durable.
pub(crate) fn take_in(
    txn: &WriteTransaction,
    dataset: &str,
    keep: &[ChunkRun],
) -> Result<Vec<ChunkRun>, redb::Error> {
    txn.open_table(RESUMES)?.remove(dataset)?;
    remove_objects(&mut txn.open_table(RESUME_OBJECTS)?, dataset)?;
    let mut chunks = txn.open_table(RESUME_CHUNKS)?;
    let runs = remove_runs(&mut chunks, dataset)?;
    Ok(crate::alloc::subtract(&runs, keep))
}

/// The datasets that have a record.
pub(crate) fn datasets(txn: &ReadTransaction) -> Result<Vec<String>, redb::Error> {
    let table = txn.open_table(RESUMES)?;
    let mut out = Vec::new();
    for entry in table.iter()? {
        out.push(entry?.0.value().to_owned());
    }
    Ok(out)
}

/// Deletes every record in `txn` (`sluice gc`); returns their datasets
/// and the runs to free once `txn` is durable.
pub(crate) fn drop_all(
    txn: &WriteTransaction,
) -> Result<(Vec<String>, Vec<ChunkRun>), redb::Error> {
    let mut records = txn.open_table(RESUMES)?;
    let mut names = Vec::new();
    for entry in records.iter()? {
        names.push(entry?.0.value().to_owned());
    }
    let mut objects = txn.open_table(RESUME_OBJECTS)?;
    for name in &names {
        records.remove(name.as_str())?;
        remove_objects(&mut objects, name)?;
    }
    let mut chunks = txn.open_table(RESUME_CHUNKS)?;
    let runs = all_runs(&chunks)?;
    for (dataset, run) in &runs {
        chunks.remove((dataset.as_str(), run.start))?;
    }
    Ok((names, runs.into_iter().map(|(_, r)| r).collect()))
}

#[cfg(test)]
mod tests {
    use redb::ReadableDatabase;

    use super::*;
    use crate::catalog::Catalog;

    fn keep(cat: &Catalog, dataset: &str, runs: &[ChunkRun]) {
        let txn = cat.db().begin_write().unwrap();
        {
            txn.open_table(RESUMES)
                .unwrap()
                .insert(dataset, b"{}".as_slice())
                .unwrap();
            let mut objects = txn.open_table(RESUME_OBJECTS).unwrap();
            for key in ["k1", "k2"] {
                objects.insert((dataset, key), b"{}".as_slice()).unwrap();
            }
            let mut chunks = txn.open_table(RESUME_CHUNKS).unwrap();
            for r in runs {
                chunks.insert((dataset, r.start), r.count).unwrap();
            }
        }
        txn.commit().unwrap();
    }

    fn objects(cat: &Catalog) -> Vec<(String, String)> {
        let txn = cat.db().begin_read().unwrap();
        let table = txn.open_table(RESUME_OBJECTS).unwrap();
        table
            .iter()
            .unwrap()
            .map(|e| {
                let (k, _) = e.unwrap();
                let (d, key) = k.value();
                (d.to_owned(), key.to_owned())
            })
            .collect()
    }

    /// Kept runs count as used at open; a commit of the dataset takes
    /// them and frees only those its version does not hold; gc drops
    /// the rest.
    #[test]
    fn kept_runs_are_owned_until_a_commit_or_gc_lets_them_go() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.redb");
        let cat = Catalog::create(&path).unwrap();
        let (a, b, c) = (
            ChunkRun { start: 0, count: 2 },
            ChunkRun { start: 4, count: 1 },
            ChunkRun { start: 9, count: 3 },
        );
        keep(&cat, "x", &[a, b]);
        keep(&cat, "y", &[c]);
        drop(cat);
        let cat = Catalog::open(&path).unwrap();
        let mut runs = cat.chunk_runs().unwrap();
        runs.sort_by_key(|r| r.start);
        assert_eq!(runs, [a, b, c]);

        let txn = cat.db().begin_write().unwrap();
        let freed = take_in(&txn, "x", &[a]).unwrap();
        txn.commit().unwrap();
        assert_eq!(freed, [b], "the version holds a; b is free again");
        assert_eq!(cat.chunk_runs().unwrap(), [c]);
        assert_eq!(
            objects(&cat),
            [("y".to_owned(), "k1".to_owned()), ("y".into(), "k2".into())]
        );

        let txn = cat.db().begin_write().unwrap();
        let (names, runs) = drop_all(&txn).unwrap();
        txn.commit().unwrap();
        assert_eq!((names, runs), (vec!["y".to_owned()], vec![c]));
        assert!(cat.chunk_runs().unwrap().is_empty());
        assert!(objects(&cat).is_empty());
        assert!(
            datasets(&cat.db().begin_read().unwrap())
                .unwrap()
                .is_empty()
        );
    }

    /// A dataset's rows end where its name does: a commit of `x` leaves
    /// `x2`'s and `x-1`'s objects (names that begin with it, or sort
    /// right after it).
    #[test]
    fn a_commit_takes_its_own_datasets_objects_only() {
        let dir = tempfile::tempdir().unwrap();
        let cat = Catalog::create(&dir.path().join("c.redb")).unwrap();
        for d in ["x", "x2", "x-1", "w"] {
            keep(&cat, d, &[]);
        }
        let txn = cat.db().begin_write().unwrap();
        take_in(&txn, "x", &[]).unwrap();
        txn.commit().unwrap();
        let left: Vec<String> = objects(&cat).into_iter().map(|(d, _)| d).collect();
        assert_eq!(left, ["w", "w", "x-1", "x-1", "x2", "x2"]);
    }
}
