//! A failed (or still running) ingest's resume record in the catalog
//! (tables `resumes`, `resume_objects` and `resume_chunks`,
//! `crate::resume_tables`): read back, added to by each save, and what
//! identifies each kept object in its store (see `super`).
use object_store::path::Path as ObjectPath;
use redb::{ReadableDatabase, ReadableTable};

use crate::alloc::{ChunkRun, subtract};
use crate::catalog::Catalog;
use crate::error::Result;
use crate::ingest::entries::{KeptObject, Origin};
use crate::resume_tables::{
    RESUME_CHUNKS, RESUME_OBJECTS, RESUMES, objects_end, remove_objects, remove_runs,
};
use crate::space::Reservation;
use crate::store::Store;

/// A dataset's record as read back (see the module docs): its source,
/// its objects, and the chunks they are in.
pub(super) struct Record {
    /// The source, as the version's record would name it.
    pub source: String,
    pub objects: Vec<KeptObject>,
    pub runs: Vec<ChunkRun>,
}

/// What the `resumes` table holds of a record; its objects are rows of
/// their own (`resume_objects`), its runs too (`resume_chunks`).
#[derive(serde::Serialize, serde::Deserialize)]
struct Head {
    source: String,
}

/// What one save adds to a dataset's record: the objects made durable
/// since the last save, and every run the record holds now.
pub(super) struct Addition {
    pub source: String,
    /// The dataset's record before is another source's: its objects go.
    pub fresh: bool,
    pub objects: Vec<KeptObject>,
    pub runs: Vec<ChunkRun>,
}

/// `dataset`'s record, if a run left one.
pub(super) fn record(catalog: &Catalog, dataset: &str) -> Result<Option<Record>> {
    let txn = catalog.db().begin_read().map_err(|e| catalog.err(e))?;
    let table = txn.open_table(RESUMES).map_err(|e| catalog.err(e))?;
    let Some(value) = table.get(dataset).map_err(|e| catalog.err(e))? else {
        return Ok(None);
    };
    let head: Head = catalog.decode(value.value())?;
    let mut objects = Vec::new();
    let rows = txn.open_table(RESUME_OBJECTS).map_err(|e| catalog.err(e))?;
    let end = objects_end(dataset);
    for entry in rows
        .range((dataset, "")..(end.as_str(), ""))
        .map_err(|e| catalog.err(e))?
    {
        let (_, v) = entry.map_err(|e| catalog.err(e))?;
        objects.push(catalog.decode(v.value())?);
    }
    let mut runs = Vec::new();
    let chunks = txn.open_table(RESUME_CHUNKS).map_err(|e| catalog.err(e))?;
    for entry in chunks
        .range((dataset, 0)..=(dataset, u64::MAX))
        .map_err(|e| catalog.err(e))?
    {
        let (k, v) = entry.map_err(|e| catalog.err(e))?;
        runs.push(ChunkRun {
            start: k.value().1,
            count: v.value(),
        });
    }
    Ok(Some(Record {
        source: head.source,
        objects,
        runs,
    }))
}

/// Adds `add` to `dataset`'s record, durably, in one transaction: its
/// objects (replacing those of the same keys), its runs in place of the
/// record's. Returns the runs of the record before that it no longer
/// holds, and how many objects the record holds now.
pub(super) fn save(
    catalog: &Catalog,
    dataset: &str,
    add: &Addition,
) -> Result<(Vec<ChunkRun>, u64)> {
    let head = serde_json::to_vec(&Head {
        source: add.source.clone(),
    })
    .map_err(|e| catalog.err(e))?;
    let txn = catalog.db().begin_write().map_err(|e| catalog.err(e))?;
    let (before, held) = {
        let mut table = txn.open_table(RESUMES).map_err(|e| catalog.err(e))?;
        table
            .insert(dataset, head.as_slice())
            .map_err(|e| catalog.err(e))?;
        let mut rows = txn.open_table(RESUME_OBJECTS).map_err(|e| catalog.err(e))?;
        if add.fresh {
            remove_objects(&mut rows, dataset).map_err(|e| catalog.err(e))?;
        }
        for object in &add.objects {
            let bytes = serde_json::to_vec(object).map_err(|e| catalog.err(e))?;
            rows.insert((dataset, object.key.as_str()), bytes.as_slice())
                .map_err(|e| catalog.err(e))?;
        }
        let end = objects_end(dataset);
        let held = rows
            .range((dataset, "")..(end.as_str(), ""))
            .map_err(|e| catalog.err(e))?
            .count() as u64;
        let mut chunks = txn.open_table(RESUME_CHUNKS).map_err(|e| catalog.err(e))?;
        let before = remove_runs(&mut chunks, dataset).map_err(|e| catalog.err(e))?;
        for run in &add.runs {
            chunks
                .insert((dataset, run.start), run.count)
                .map_err(|e| catalog.err(e))?;
        }
        (before, held)
    };
    txn.commit().map_err(|e| catalog.err(e))?;
    Ok((subtract(&before, &add.runs), held))
}

/// What an object of a store is, as far as a re-run can tell without
/// asking the store: its location, size, range and version stamp. `None`
/// for everything else (a local file needs no download; a manifest's row
/// was not listed: its identity is its GET's, [`unlisted_identity`]).
pub(super) fn identity(origin: &Origin) -> Option<String> {
    match origin {
        Origin::Object {
            location,
            size,
            range,
            stamp: Some(tag),
            ..
        } => Some(format!("{location} {size:?} {range:?} {tag}")),
        Origin::ObjectCell {
            location,
            size,
            row_group,
            row,
            stamp: Some(tag),
            ..
        } => Some(format!("{location} {size} {row_group}/{row} {tag}")),
        _ => None,
    }
}

/// What a manifest's row was in the store, as its GET (or a HEAD)
/// answered: its location, size and version stamp.
pub(super) fn unlisted_identity(location: &ObjectPath, size: u64, stamp: &str) -> String {
    format!("{location} unlisted {size} {stamp}")
}

/// A run's objects, to keep for the next run if its version is not
/// committed: after its failure, or when its prepared version is dropped
/// (a peer's part failed on a cluster).
pub(crate) struct Kept(pub(super) Addition);

impl Kept {
    /// Adds the run's objects to the dataset's record and keeps
    /// `reservation`'s chunks (now the record's); frees the runs of the
    /// record before that this one does not hold. Whatever fails, the
    /// ingest's own error stands: this only logs.
    pub(crate) fn save(self, store: &Store, dataset: &str, reservation: Reservation, why: &str) {
        match save(store.catalog(), dataset, &self.0) {
            Ok((freed, held)) => {
                reservation.keep();
                store.space_map().release(&freed);
                tracing::warn!(
                    "dataset '{dataset}': {why}; {held} objects it verified are kept for a \
                     re-run from the same source"
                );
            }
            Err(e) => tracing::warn!("dataset '{dataset}': nothing kept for a re-run: {e}"),
        }
    }
}
