//! The catalog: datasets, their committed versions, and the chunk map.
//!
//! Kept in redb, an embedded transactional key-value store, in three tables:
//!
//! | table | key | value |
//! |---|---|---|
//! | `versions` | (dataset, version) | [`VersionRecord`] as JSON |
//! | `datasets` | dataset | latest version |
//! | `chunks` | first chunk of a run | (count, version) + dataset, as JSON |
//! | `retired` | dataset | the highest version retired |
//!
//! Checkpoints keep their versions and chunks in two tables of their own
//! (see `checkpoint::catalog`), and a failed ingest from an object store
//! what it kept for a re-run in two (`resume_tables`); the chunk map at
//! open is the union of all three kinds.
//!
//! A version becomes visible in one write transaction that inserts all
//! three; before that commit nothing refers to its chunks or its metadata
//! file, so a crash leaves no partial version and the store's open-time
//! reclaim finds its chunks free. Reads cost one point lookup or a range
//! over one dataset's versions: nothing here is linear in samples.

use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use crate::alloc::ChunkRun;
use crate::error::{Result, StorageError};
use sluice_udfs::udf::panic_message;

const VERSIONS: TableDefinition<'_, (&str, u64), &[u8]> = TableDefinition::new("versions");
const DATASETS: TableDefinition<'_, &str, u64> = TableDefinition::new("datasets");
const CHUNKS: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("chunks");
const RETIRED: TableDefinition<'_, &str, u64> = TableDefinition::new("retired");

/// A committed dataset version.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VersionRecord {
    /// Dataset name.
    pub dataset: String,
    /// Version number, from 1.
    pub version: u64,
    /// Commit time, milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// Number of samples.
    pub samples: u64,
    /// Total object bytes.
    pub bytes: u64,
    /// Samples skipped at ingest.
    pub skipped: u64,
    /// Metadata file, relative to the data dir.
    pub metadata_file: PathBuf,
    /// Chunk runs holding the version's extents.
    pub runs: Vec<ChunkRun>,
    /// Where it was ingested from.
    pub source: String,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct ChunkOwner {
    count: u64,
    dataset: String,
    version: u64,
}

/// The catalog database.
#[derive(Debug)]
pub struct Catalog {
    db: Database,
    path: PathBuf,
}

impl Catalog {
    /// Creates the catalog of a new data dir at `path` (an existing
    /// catalog there is opened instead, as [`Catalog::open`] does).
    pub fn create(path: &Path) -> Result<Self> {
        if path.exists() {
            return Self::open(path);
        }
        let db = Database::create(path).map_err(|e| open_error(path, e))?;
        Self::with_tables(db, path)
    }

    /// Opens the catalog of an existing data dir. A missing or empty file
    /// is refused (redb would initialise a fresh, empty database in it),
    /// and the file's checksums are verified first, so that a damaged
    /// catalog is an error naming the file, never a panic or a silently
    /// empty data dir.
    pub fn open(path: &Path) -> Result<Self> {
        let damaged = |reason: String| StorageError::CatalogDamaged {
            path: path.to_owned(),
            reason,
        };
        match std::fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(damaged("the file is missing".into()));
            }
            Err(e) => return Err(StorageError::io("stat", path, e)),
            Ok(m) if !m.is_file() => return Err(damaged("not a regular file".into())),
            Ok(m) if m.len() == 0 => return Err(damaged("the file is empty (0 bytes)".into())),
            Ok(_) => {}
        }
        // redb documents that an open of a file damaged outside redb may
        // panic; the check on open reports corruption as an error, and the
        // panic guard covers what it does not.
        let opened = std::panic::catch_unwind(|| {
            redb::Builder::new()
                .set_check_integrity_on_open(true)
                .open(path)
        });
        let db = match opened {
            Ok(Ok(db)) => db,
            Ok(Err(redb::DatabaseError::DatabaseAlreadyOpen)) => {
                return Err(StorageError::DataDirLocked {
                    path: path.parent().unwrap_or(path).to_owned(),
                });
            }
            Ok(Err(e)) => return Err(damaged(format!("unreadable ({e})"))),
            Err(panic) => {
                return Err(damaged(format!(
                    "unreadable (the database engine failed on it: {})",
                    panic_message(&panic)
                )));
            }
        };
        let cat = Self::with_tables(db, path).map_err(|e| match e {
            StorageError::Catalog { message, .. } => damaged(format!("unreadable ({message})")),
            other => other,
        })?;
        // Every record must decode: a catalog whose chunk map or version
        // records are garbage is as damaged as one redb refuses.
        let verified =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cat.verify_records()));
        match verified {
            Ok(Ok(())) => Ok(cat),
            Ok(Err(e)) => Err(damaged(format!("a record is unreadable ({e})"))),
            Err(panic) => Err(damaged(format!(
                "unreadable (the database engine failed on it: {})",
                panic_message(&panic)
            ))),
        }
    }

    /// Creates the tables this version of sluice uses when missing (a
    /// catalog from before checkpoints has no checkpoint tables).
    fn with_tables(db: Database, path: &Path) -> Result<Self> {
        let cat = Self {
            db,
            path: path.to_owned(),
        };
        let txn = cat.db.begin_write().map_err(|e| cat.err(e))?;
        txn.open_table(VERSIONS).map_err(|e| cat.err(e))?;
        txn.open_table(DATASETS).map_err(|e| cat.err(e))?;
        txn.open_table(CHUNKS).map_err(|e| cat.err(e))?;
        txn.open_table(RETIRED).map_err(|e| cat.err(e))?;
        crate::checkpoint::tables::create_tables(&txn).map_err(|e| cat.err(e))?;
        crate::resume_tables::create_tables(&txn).map_err(|e| cat.err(e))?;
        txn.commit().map_err(|e| cat.err(e))?;
        Ok(cat)
    }

    /// Reads every record once: versions, latest pointers, the chunk map.
    fn verify_records(&self) -> Result<()> {
        self.chunk_runs()?;
        self.metadata_files()?;
        for name in self.dataset_names()? {
            self.version(&name, None)?;
        }
        Ok(())
    }

    pub(crate) fn db(&self) -> &Database {
        &self.db
    }

    pub(crate) fn err(&self, e: impl std::fmt::Display) -> StorageError {
        StorageError::Catalog {
            path: self.path.clone(),
            message: e.to_string(),
        }
    }

    pub(crate) fn decode<T: serde::de::DeserializeOwned>(&self, bytes: &[u8]) -> Result<T> {
        serde_json::from_slice(bytes).map_err(|e| self.err(format!("corrupt record: {e}")))
    }

    /// Names of all datasets, sorted.
    pub fn dataset_names(&self) -> Result<Vec<String>> {
        let txn = self.db.begin_read().map_err(|e| self.err(e))?;
        let table = txn.open_table(DATASETS).map_err(|e| self.err(e))?;
        let mut names = Vec::new();
        for entry in table.iter().map_err(|e| self.err(e))? {
            let (k, _) = entry.map_err(|e| self.err(e))?;
            names.push(k.value().to_owned());
        }
        Ok(names)
    }

    /// The latest version number of `dataset`, if it exists.
    pub fn latest_version(&self, dataset: &str) -> Result<Option<u64>> {
        let txn = self.db.begin_read().map_err(|e| self.err(e))?;
        self.number(&txn, DATASETS, dataset)
    }

    /// `dataset`'s number in `table` (a latest or a retired version).
    fn number(
        &self,
        txn: &redb::ReadTransaction,
        table: TableDefinition<'_, &str, u64>,
        dataset: &str,
    ) -> Result<Option<u64>> {
        let table = txn.open_table(table).map_err(|e| self.err(e))?;
        Ok(table
            .get(dataset)
            .map_err(|e| self.err(e))?
            .map(|v| v.value()))
    }

    /// The number the next version of `dataset` takes: one past its
    /// latest and past any it retired, so that a number once given is
    /// never given to other rows (caches on either side key by it).
    pub fn next_version(&self, dataset: &str) -> Result<u64> {
        let txn = self.db.begin_read().map_err(|e| self.err(e))?;
        let latest = self.number(&txn, DATASETS, dataset)?.unwrap_or(0);
        let retired = self.number(&txn, RETIRED, dataset)?.unwrap_or(0);
        Ok(latest.max(retired) + 1)
    }

    /// Deletes `dataset`'s versions up to `through` (all when `None`) in
    /// one transaction: their records, their chunk map entries, and the
    /// latest pointer when none is left. Returns the records deleted (their
    /// chunks and metadata files are the caller's to free).
    pub fn retire(&self, dataset: &str, through: Option<u64>) -> Result<Vec<VersionRecord>> {
        let gone: Vec<VersionRecord> = self
            .versions(dataset)?
            .into_iter()
            .filter(|v| through.is_none_or(|t| v.version <= t))
            .collect();
        let Some(highest) = gone.iter().map(|v| v.version).max() else {
            return Ok(gone);
        };
        let txn = self.db.begin_write().map_err(|e| self.err(e))?;
        {
            let mut versions = txn.open_table(VERSIONS).map_err(|e| self.err(e))?;
            let mut chunks = txn.open_table(CHUNKS).map_err(|e| self.err(e))?;
            for v in &gone {
                versions
                    .remove((dataset, v.version))
                    .map_err(|e| self.err(e))?;
                for run in &v.runs {
                    chunks.remove(run.start).map_err(|e| self.err(e))?;
                }
            }
            let left = versions
                .range((dataset, 0)..=(dataset, u64::MAX))
                .map_err(|e| self.err(e))?
                .next_back()
                .transpose()
                .map_err(|e| self.err(e))?
                .map(|(k, _)| k.value().1);
            let mut datasets = txn.open_table(DATASETS).map_err(|e| self.err(e))?;
            match left {
                Some(latest) => datasets.insert(dataset, latest),
                None => datasets.remove(dataset),
            }
            .map_err(|e| self.err(e))?;
            let mut retired = txn.open_table(RETIRED).map_err(|e| self.err(e))?;
            let before = retired
                .get(dataset)
                .map_err(|e| self.err(e))?
                .map_or(0, |v| v.value());
            retired
                .insert(dataset, before.max(highest))
                .map_err(|e| self.err(e))?;
        }
        txn.commit().map_err(|e| self.err(e))?;
        Ok(gone)
    }

    /// One version of a dataset: the latest when `version` is `None`.
    pub fn version(&self, dataset: &str, version: Option<u64>) -> Result<VersionRecord> {
        // One read transaction: the latest pointer and the record agree.
        let txn = self.db.begin_read().map_err(|e| self.err(e))?;
        let latest = txn
            .open_table(DATASETS)
            .map_err(|e| self.err(e))?
            .get(dataset)
            .map_err(|e| self.err(e))?
            .map(|v| v.value())
            .ok_or_else(|| StorageError::UnknownDataset(dataset.to_owned()))?;
        let version = version.unwrap_or(latest);
        let table = txn.open_table(VERSIONS).map_err(|e| self.err(e))?;
        let bytes = table
            .get((dataset, version))
            .map_err(|e| self.err(e))?
            .ok_or_else(|| StorageError::UnknownVersion {
                dataset: dataset.to_owned(),
                version,
            })?;
        self.decode(bytes.value())
    }

    /// All versions of `dataset`, oldest first.
    pub fn versions(&self, dataset: &str) -> Result<Vec<VersionRecord>> {
        let txn = self.db.begin_read().map_err(|e| self.err(e))?;
        let table = txn.open_table(VERSIONS).map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for entry in table
            .range((dataset, 0)..=(dataset, u64::MAX))
            .map_err(|e| self.err(e))?
        {
            let (_, v) = entry.map_err(|e| self.err(e))?;
            out.push(self.decode(v.value())?);
        }
        Ok(out)
    }

    /// Every owned chunk run: of datasets, of checkpoints, and of the
    /// objects failed ingests kept for a re-run (to rebuild the allocator
    /// at open).
    pub fn chunk_runs(&self) -> Result<Vec<ChunkRun>> {
        let txn = self.db.begin_read().map_err(|e| self.err(e))?;
        let table = txn.open_table(CHUNKS).map_err(|e| self.err(e))?;
        let mut out = crate::checkpoint::tables::chunk_runs(&txn).map_err(|e| self.err(e))?;
        out.extend(crate::resume_tables::chunk_runs(&txn).map_err(|e| self.err(e))?);
        for entry in table.iter().map_err(|e| self.err(e))? {
            let (k, v) = entry.map_err(|e| self.err(e))?;
            let owner: ChunkOwner = self.decode(v.value())?;
            out.push(ChunkRun {
                start: k.value(),
                count: owner.count,
            });
        }
        Ok(out)
    }

    /// Every committed metadata file (to find orphans at open).
    pub fn metadata_files(&self) -> Result<Vec<PathBuf>> {
        let txn = self.db.begin_read().map_err(|e| self.err(e))?;
        let table = txn.open_table(VERSIONS).map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for entry in table.iter().map_err(|e| self.err(e))? {
            let (_, v) = entry.map_err(|e| self.err(e))?;
            let rec: VersionRecord = self.decode(v.value())?;
            out.push(rec.metadata_file);
        }
        Ok(out)
    }

    /// Makes a version visible: record, latest pointer and chunk map in one
    /// durable transaction, which also deletes what a failed ingest of the
    /// dataset kept for a re-run (`ingest::resume`). Returns the chunks of
    /// that record the version does not hold, for the caller to free.
    pub fn commit_version(&self, record: &VersionRecord) -> Result<Vec<ChunkRun>> {
        let txn = self.db.begin_write().map_err(|e| self.err(e))?;
        let freed = crate::resume_tables::take_in(&txn, &record.dataset, &record.runs)
            .map_err(|e| self.err(e))?;
        {
            let mut versions = txn.open_table(VERSIONS).map_err(|e| self.err(e))?;
            let bytes = serde_json::to_vec(record).map_err(|e| self.err(e))?;
            versions
                .insert((record.dataset.as_str(), record.version), bytes.as_slice())
                .map_err(|e| self.err(e))?;
            let mut datasets = txn.open_table(DATASETS).map_err(|e| self.err(e))?;
            datasets
                .insert(record.dataset.as_str(), record.version)
                .map_err(|e| self.err(e))?;
            let mut chunks = txn.open_table(CHUNKS).map_err(|e| self.err(e))?;
            for run in &record.runs {
                let owner = ChunkOwner {
                    count: run.count,
                    dataset: record.dataset.clone(),
                    version: record.version,
                };
                let bytes = serde_json::to_vec(&owner).map_err(|e| self.err(e))?;
                chunks
                    .insert(run.start, bytes.as_slice())
                    .map_err(|e| self.err(e))?;
            }
        }
        txn.commit().map_err(|e| self.err(e))?;
        Ok(freed)
    }
}

fn open_error(path: &Path, e: redb::DatabaseError) -> StorageError {
    match e {
        redb::DatabaseError::DatabaseAlreadyOpen => StorageError::DataDirLocked {
            path: path.parent().unwrap_or(path).to_owned(),
        },
        other => StorageError::Catalog {
            path: path.to_owned(),
            message: other.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(dataset: &str, version: u64, start: u64) -> VersionRecord {
        VersionRecord {
            dataset: dataset.into(),
            version,
            created_unix_ms: 1,
            samples: 10,
            bytes: 100,
            skipped: 0,
            metadata_file: format!("meta/{dataset}/v{version}.parquet").into(),
            runs: vec![ChunkRun { start, count: 2 }],
            source: "test".into(),
        }
    }

    #[test]
    fn commits_are_visible_and_versions_are_ordered() {
        let dir = tempfile::tempdir().unwrap();
        let cat = Catalog::create(&dir.path().join("c.redb")).unwrap();
        assert!(matches!(
            cat.version("a", None),
            Err(StorageError::UnknownDataset(_))
        ));
        cat.commit_version(&record("a", 1, 0)).unwrap();
        cat.commit_version(&record("a", 2, 2)).unwrap();
        cat.commit_version(&record("b", 1, 4)).unwrap();
        assert_eq!(cat.dataset_names().unwrap(), vec!["a", "b"]);
        assert_eq!(cat.version("a", None).unwrap().version, 2);
        assert_eq!(cat.versions("a").unwrap().len(), 2);
        assert!(matches!(
            cat.version("a", Some(7)),
            Err(StorageError::UnknownVersion { version: 7, .. })
        ));
        assert_eq!(cat.chunk_runs().unwrap().len(), 3);
        drop(cat);
        let cat = Catalog::open(&dir.path().join("c.redb")).unwrap();
        assert_eq!(cat.metadata_files().unwrap().len(), 3);
    }

    #[test]
    fn retired_versions_are_gone_and_their_numbers_never_come_back() {
        let dir = tempfile::tempdir().unwrap();
        let cat = Catalog::create(&dir.path().join("c.redb")).unwrap();
        cat.commit_version(&record("a", 1, 0)).unwrap();
        cat.commit_version(&record("a", 2, 2)).unwrap();
        cat.commit_version(&record("b", 1, 4)).unwrap();
        let gone = cat.retire("a", Some(1)).unwrap();
        assert_eq!(gone.iter().map(|v| v.version).collect::<Vec<_>>(), [1]);
        assert_eq!(cat.version("a", None).unwrap().version, 2);
        assert_eq!(cat.chunk_runs().unwrap().len(), 2);
        assert_eq!(cat.retire("a", None).unwrap().len(), 1);
        assert_eq!(cat.dataset_names().unwrap(), vec!["b"]);
        assert!(matches!(
            cat.version("a", None),
            Err(StorageError::UnknownDataset(_))
        ));
        assert_eq!(cat.next_version("a").unwrap(), 3, "numbers are not reused");
        assert_eq!(cat.next_version("b").unwrap(), 2);
        assert!(cat.retire("nope", None).unwrap().is_empty());
        drop(cat);
        let cat = Catalog::open(&dir.path().join("c.redb")).unwrap();
        assert_eq!(cat.next_version("a").unwrap(), 3);
    }

    #[test]
    fn a_second_open_is_refused_while_the_first_is_held() {
        let dir = tempfile::tempdir().unwrap();
        let _cat = Catalog::create(&dir.path().join("c.redb")).unwrap();
        let err = Catalog::open(&dir.path().join("c.redb")).unwrap_err();
        assert!(matches!(err, StorageError::DataDirLocked { .. }), "{err}");
    }
}
