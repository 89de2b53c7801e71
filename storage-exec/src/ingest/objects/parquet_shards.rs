//! Parquet shards in an object store (the Hugging Face Hub's layout: an
//! image column of `{bytes, path}` beside labels and text), read as the
//! local ones are (`crate::ingest::shard_files::parquet_shard`, whose
//! helpers these are) through the `parquet` crate's async reader
//! (`super::parquet_file`):
//! the footer first, then only the column chunks asked for, in ranged
//! GETs it coalesces. A shard is never held whole:
//!
//! - **Enumeration** reads every column but the objects' bytes: a row's
//!   key (the struct's `path`, or `shard/row`) and its metadata values.
//!   Each sample is an [`Origin::ObjectCell`]: its row group and row.
//! - **Loading.** A load group's cells are fetched by row group
//!   ([`fetch_cells`], from `super::fetch`): the object column of one row
//!   group, its column chunks fetched in ranged GETs and decoded on the
//!   blocking pool (`super::parquet_ranges`), once for all of its rows,
//!   and kept for the
//!   next load groups ([`RowGroupObjects`], the last few row groups of a
//!   source: a row group's rows span many load groups). Load groups in
//!   flight that want the same row group wait for one read of it. A row
//!   group is what the writer put in one (the Hub's are tens of MB).
//!
//! Whose fault: a store that fails (after `object_store`'s retries, and
//! [`BODY_TRIES`] tries of the whole read) fails the ingest, which
//! commits nothing; a file that is not Parquet, or a row group that does
//! not decode, is its samples' fault, named, under the ingest's policy.
//! A `.parquet` URL with a top-level `path` column is a manifest, as a
//! local one is; with an object column and none, it is one shard.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow::array::ArrayRef;
use arrow::error::ArrowError;
use futures::TryStreamExt;
use object_store::ObjectStoreExt;
use object_store::path::Path as ObjectPath;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use parquet::arrow::async_reader::ParquetRecordBatchStreamBuilder;
use parquet::errors::ParquetError;

use super::ObjectSource;
use super::faults::{BODY_TRIES, store_error};
use super::parquet_file::ParquetObject;
use super::parquet_ranges::FetchedRanges;
use super::shard_object::ShardObject;
use crate::error::{Result, StorageError};
use crate::ingest::entries::{Entry, Origin};
use crate::ingest::shard_files::Sample;
use crate::ingest::shard_files::columns::SourceOf;
use crate::ingest::shard_files::parquet_shard::{
    Place, bytes_leaves, listing, object_bytes, object_column, row_object, rows,
};

/// Rows decoded at a time when a shard is enumerated.
const BATCH_ROWS: usize = 8192;

/// One row group's objects: their bytes, or why the file cannot give them.
type Objects = std::result::Result<ArrayRef, String>;

/// The object columns of a source's row groups read last, each read once
/// however many load groups want it (see the module docs).
#[derive(Debug, Default)]
pub(super) struct RowGroupObjects {
    kept: Mutex<VecDeque<RowGroupSlot>>,
    /// The footers of the files read last: a row group's read asks for
    /// its column chunks only, not the footer again.
    footers: Mutex<VecDeque<(ObjectPath, ArrowReaderMetadata)>>,
}

/// A row group's objects (of the object at the path), once read.
type RowGroupSlot = ((ObjectPath, usize), Arc<tokio::sync::OnceCell<Objects>>);

impl RowGroupObjects {
    /// Row groups kept: the few load groups in flight each span one or two.
    const KEEP: usize = 4;

    /// The slot of row group `group` of `location`, made if it has none.
    fn slot(&self, location: &ObjectPath, group: usize) -> Arc<tokio::sync::OnceCell<Objects>> {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, cell)) = kept.iter().find(|((l, g), _)| l == location && *g == group) {
            return Arc::clone(cell);
        }
        let cell = Arc::new(tokio::sync::OnceCell::new());
        kept.push_back(((location.clone(), group), Arc::clone(&cell)));
        while kept.len() > Self::KEEP {
            kept.pop_front();
        }
        cell
    }

    /// The footer of `location` read last, if kept.
    fn footer(&self, location: &ObjectPath) -> Option<ArrowReaderMetadata> {
        let footers = self.footers.lock().unwrap_or_else(|e| e.into_inner());
        footers
            .iter()
            .find(|(l, _)| l == location)
            .map(|(_, m)| m.clone())
    }

    /// Keeps the footer of `location`.
    fn keep_footer(&self, location: &ObjectPath, footer: &ArrowReaderMetadata) {
        let mut footers = self.footers.lock().unwrap_or_else(|e| e.into_inner());
        footers.retain(|(l, _)| l != location);
        footers.push_back((location.clone(), footer.clone()));
        while footers.len() > Self::KEEP {
            footers.pop_front();
        }
    }
}

/// Why a read of a Parquet object failed: the store (the ingest's fault)
/// or the file (its samples').
enum Failed {
    Store(String),
    File(String),
}

impl From<ParquetError> for Failed {
    fn from(e: ParquetError) -> Self {
        if let ParquetError::External(inner) = &e
            && let Some(s) = inner.downcast_ref::<object_store::Error>()
        {
            return Self::Store(store_error(s));
        }
        Self::File(e.to_string())
    }
}

impl From<ArrowError> for Failed {
    fn from(e: ArrowError) -> Self {
        Self::File(e.to_string())
    }
}

/// The footer of the Parquet object at `location`, `size` bytes long:
/// kept from the last read of it, or read now.
async fn footer(
    source: &ObjectSource,
    location: &ObjectPath,
    size: u64,
) -> std::result::Result<ArrowReaderMetadata, Failed> {
    if let Some(footer) = source.row_groups.footer(location) {
        return Ok(footer);
    }
    let mut reader = ParquetObject::new(Arc::clone(&source.store), location.clone(), size);
    let footer =
        ArrowReaderMetadata::load_async(&mut reader, ArrowReaderOptions::default()).await?;
    source.row_groups.keep_footer(location, &footer);
    Ok(footer)
}

/// The reader of the Parquet object at `location`, `size` bytes long,
/// over its footer.
async fn builder(
    source: &ObjectSource,
    location: &ObjectPath,
    size: u64,
) -> std::result::Result<ParquetRecordBatchStreamBuilder<ParquetObject>, Failed> {
    let footer = footer(source, location, size).await?;
    let reader = ParquetObject::new(Arc::clone(&source.store), location.clone(), size);
    Ok(ParquetRecordBatchStreamBuilder::new_with_metadata(
        reader, footer,
    ))
}

/// Runs `read` until the store answers, at most [`BODY_TRIES`] times;
/// a store that still fails is the ingest's error, naming `location`.
async fn tried<T, F>(
    source: &ObjectSource,
    location: &ObjectPath,
    mut read: impl FnMut() -> F,
) -> Result<std::result::Result<T, String>>
where
    F: Future<Output = std::result::Result<T, Failed>>,
{
    let mut tries = 0;
    loop {
        tries += 1;
        match read().await {
            Ok(v) => return Ok(Ok(v)),
            Err(Failed::File(why)) => return Ok(Err(why)),
            Err(Failed::Store(why)) if tries >= BODY_TRIES => {
                return Err(StorageError::BadSource {
                    path: source.url.of_key(location.as_ref()).into(),
                    reason: format!("its store failed: {why}"),
                });
            }
            Err(Failed::Store(why)) => {
                source.tally.body_failed();
                tracing::info!("{location}: {why}; reading it again");
                tokio::time::sleep(Duration::from_millis(200 << tries)).await;
            }
        }
    }
}

/// The size and stamp (`super::stamp`) of the `.parquet` object at `location` when it is a
/// shard of objects (an object column, no top-level `path`); `None` when it is a
/// manifest, or when it cannot be read (the manifest's reader names why).
pub(super) async fn shard_size(
    source: &ObjectSource,
    location: &ObjectPath,
) -> Result<Option<(u64, Option<Arc<str>>)>> {
    let Ok(meta) = source.store.head(location).await else {
        return Ok(None);
    };
    let size = meta.size;
    let schema = tried(source, location, || async move {
        Ok::<_, Failed>(Arc::clone(builder(source, location, size).await?.schema()))
    })
    .await?;
    let shard =
        schema.is_ok_and(|s| s.field_with_name("path").is_err() && object_column(&s).is_some());
    Ok(shard.then_some((size, super::stamp(&meta))))
}

/// The samples of the Parquet shard `shard`, each a cell of it.
pub(super) async fn samples(source: Arc<ObjectSource>, shard: ShardObject) -> Result<Vec<Sample>> {
    let url = source.url.of_key(shard.location.as_ref());
    let read = tried(&source, &shard.location, || cells_of(&source, &shard, &url)).await?;
    let mut samples = match read {
        Ok(samples) => samples,
        Err(why) => {
            return Ok(vec![Sample::refused(
                format!("{}@0", shard.name),
                why,
                SourceOf {
                    shard: shard.name.clone(),
                    index: 0,
                    offset: 0,
                },
            )]);
        }
    };
    for s in &mut samples {
        if let Origin::Cell { row_group, row, .. } = s.origin {
            s.origin = Origin::ObjectCell {
                source: Arc::clone(&source),
                location: shard.location.clone(),
                size: shard.size,
                row_group,
                row,
                stamp: shard.stamp.clone(),
            };
        }
    }
    Ok(samples)
}

/// One read of `shard`'s rows (every column but the objects' bytes).
async fn cells_of(
    source: &ObjectSource,
    shard: &ShardObject,
    url: &str,
) -> std::result::Result<Vec<Sample>, Failed> {
    let builder = builder(source, &shard.location, shard.size).await?;
    let (object, mask, rows_per_group) = listing(&builder).map_err(Failed::File)?;
    let mut batches = builder
        .with_projection(mask)
        .with_batch_size(BATCH_ROWS)
        .build()?;
    let mut place = Place::new(rows_per_group);
    let mut out = Vec::new();
    let path = std::path::PathBuf::from(url);
    while let Some(batch) = batches.try_next().await? {
        rows(&path, &shard.name, &object, &batch, &mut place, &mut out);
    }
    Ok(out)
}

/// The objects' bytes of row group `group` of the Parquet object at
/// `location` (`size` bytes), one binary value a row, from the kept
/// ones or read once; the inner `Err` says why the file cannot give
/// them (its samples' fault). A store's failure is not kept: the next
/// load group tries again.
async fn row_group_objects(
    source: &ObjectSource,
    location: &ObjectPath,
    size: u64,
    group: usize,
) -> Result<Objects> {
    let slot = source.row_groups.slot(location, group);
    slot.get_or_try_init(|| read_row_group(source, location, size, group))
        .await
        .cloned()
}

/// One read of row group `group`'s objects (see `row_group_objects`):
/// its object column's chunks fetched at once, then decoded on the
/// blocking pool.
async fn read_row_group(
    source: &ObjectSource,
    location: &ObjectPath,
    size: u64,
    group: usize,
) -> Result<Objects> {
    let read = || async move {
        let footer = footer(source, location, size).await?;
        let object = object_column(footer.schema())
            .ok_or_else(|| Failed::File("no object column".into()))?;
        if group >= footer.metadata().num_row_groups() {
            return Err(Failed::File(format!("no row group {group}")));
        }
        let leaves = bytes_leaves(footer.parquet_schema(), &object);
        let chunks = footer.metadata().row_group(group);
        let ranges: Vec<Range<u64>> = leaves
            .iter()
            .map(|&leaf| {
                let (start, len) = chunks.column(leaf).byte_range();
                start..start.saturating_add(len)
            })
            .collect();
        let fetched = source
            .store
            .get_ranges(location, &ranges)
            .await
            .map_err(|e| Failed::Store(store_error(&e)))?;
        let fetched =
            FetchedRanges::new(ranges.iter().map(|r| r.start).zip(fetched).collect(), size);
        let mask = ProjectionMask::leaves(footer.parquet_schema(), leaves);
        let decode = move || -> std::result::Result<ArrayRef, Failed> {
            let batches = ParquetRecordBatchReaderBuilder::new_with_metadata(fetched, footer)
                .with_row_groups(vec![group])
                .with_projection(mask)
                .with_batch_size(1 << 16)
                .build()?
                .collect::<std::result::Result<Vec<_>, ArrowError>>()?;
            object_bytes(&batches).map_err(Failed::File)
        };
        tokio::task::spawn_blocking(decode)
            .await
            .map_err(|e| Failed::File(format!("its decode failed: {e}")))?
    };
    let got = tried(source, location, read).await?;
    Ok(got.map_err(|why| {
        format!(
            "{}: row group {group}: {why}",
            source.url.of_key(location.as_ref())
        )
    }))
}

/// Replaces each cell of `group` ([`Origin::ObjectCell`]) by its object's
/// bytes, or by why it has none; `Err` when a store failed. Each row group
/// the group's cells are in is read once (see the module docs).
pub(super) async fn fetch_cells(group: &mut [Entry]) -> Result<()> {
    /// A row group wanted: its source, object, size and index, and the
    /// (entry, row) of each of its cells.
    type Wanted = (Arc<ObjectSource>, ObjectPath, u64, usize, Vec<(usize, u64)>);
    let mut wanted: Vec<Wanted> = Vec::new();
    for (i, e) in group.iter().enumerate() {
        let Origin::ObjectCell {
            source,
            location,
            size,
            row_group,
            row,
            ..
        } = &e.origin
        else {
            continue;
        };
        let same =
            |w: &&mut Wanted| Arc::ptr_eq(&w.0, source) && &w.1 == location && w.3 == *row_group;
        match wanted.iter_mut().find(same) {
            Some(w) => w.4.push((i, *row)),
            None => wanted.push((
                Arc::clone(source),
                location.clone(),
                *size,
                *row_group,
                vec![(i, *row)],
            )),
        }
    }
    let columns = futures::future::try_join_all(
        wanted
            .iter()
            .map(|(source, location, size, g, _)| row_group_objects(source, location, *size, *g)),
    )
    .await?;
    for ((.., g, cells), column) in wanted.iter().zip(columns) {
        for &(i, row) in cells {
            let object = column
                .as_ref()
                .map_err(Clone::clone)
                .and_then(|c| row_object(c, *g, row));
            group[i].origin = match object {
                Ok(bytes) => Origin::Inline(bytes),
                Err(why) => Origin::Refused(why),
            };
        }
    }
    Ok(())
}
