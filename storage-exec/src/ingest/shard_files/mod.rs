//! Datasets as they already are: samples read out of shard files (WebDataset
//! tars, TFRecord) in place, never unpacked. (Not to be confused with
//! `super::shard`, one storage node's part of a source.)
//!
//! - [`webdataset`]: `.tar` shards, members grouped into samples by key;
//! - [`tfrecord`]: `.tfrecord` files of `tf.train.Example`;
//! - [`parquet_shard`]: Parquet files with the image bytes inside (the Hugging
//!   Face Hub's layout), each object decoded with its row group;
//! - [`columns`]: the metadata columns their small members and features
//!   become, and the columns that trace a sample to its shard
//!   (`source_shard`, `source_index`, `source_offset`);
//! - `glob`: `matches`, a name against a shell pattern (`*`, `?`,
//!   `[a-z]`), here and in an object store's listing;
//! - `open_shards`: `OpenShards`: the shard files an ingest reads objects
//!   from, kept open between objects.
//!
//! A source is one shard file, a directory of them (every visible file a
//! shard, TFRecord `.index` companions ignored) or a glob in the last
//! part of a path (`shards/train-*.tar`). Shards are read in name order,
//! one at a time: a tar's headers are read and its objects skipped over,
//! a TFRecord's records read one by one. What the enumeration keeps is
//! each sample's place in its shard (the object is read from there when
//! it is written, under the ingest's load budget) and its small values:
//! memory grows with the number of samples, never with a shard's size.
//! Every shard is opened beneath the ingest roots when the ingest has
//! them, as each object later is.
//!
//! Compressed shards (`.tar.gz`, `.tgz`) are inflated once into an unlinked
//! temporary file and read from there as a tar ([`inflate`]).

pub mod columns;
pub(crate) mod glob;
mod inflate;
mod open_shards;
pub mod parquet_shard;
pub mod tfrecord;
pub mod webdataset;

pub(crate) use open_shards::OpenShards;

use std::path::{Path, PathBuf};

use self::columns::{Columns, SourceOf, Value};
use super::confine::Confinement;
use super::entries::{Entry, Enumerated, Origin};
use super::node_share::NodeShare;
use crate::error::{Result, StorageError};

/// The layout of a shard file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardKind {
    /// A WebDataset tar.
    Tar,
    /// A gzipped WebDataset tar.
    TarGz,
    /// A TFRecord file.
    TfRecord,
    /// A Parquet file of objects (one with a `path` column is a manifest).
    Parquet,
}

impl ShardKind {
    /// The kind of the file `name`, by its extension; `Err` for a shard
    /// sluice cannot read, saying what to do.
    pub fn of(name: &str) -> Option<std::result::Result<Self, String>> {
        let lower = name.to_ascii_lowercase();
        if lower.ends_with(".tar") {
            Some(Ok(Self::Tar))
        } else if lower.ends_with(".tar.gz") || lower.ends_with(".tgz") {
            Some(Ok(Self::TarGz))
        } else if [".tfrecord", ".tfrecords", ".tfrec"]
            .iter()
            .any(|e| lower.ends_with(e))
        {
            Some(Ok(Self::TfRecord))
        } else if lower.ends_with(".parquet") {
            Some(Ok(Self::Parquet))
        } else if [".tar.zst", ".tar.xz", ".tar.bz2", ".tar.lz4"]
            .iter()
            .any(|e| lower.ends_with(e))
        {
            Some(Err(format!(
                "{name}: of compressed shards, sluice reads .tar.gz; decompress this one \
                 to a .tar first"
            )))
        } else {
            None
        }
    }
}

/// What an ingest keeps while it reads objects out of shards: the shard
/// files open, and the Parquet row groups decoded.
#[derive(Debug, Default)]
pub(crate) struct Readers {
    pub files: open_shards::OpenShards,
    pub row_groups: parquet_shard::RowGroups,
}

/// One sample of a shard.
#[derive(Debug)]
pub(crate) struct Sample {
    pub key: String,
    pub origin: Origin,
    pub values: Vec<(String, Value)>,
    pub source: SourceOf,
}

impl Sample {
    /// A sample refused before a byte of its object is read.
    pub(crate) fn refused(key: String, reason: String, source: SourceOf) -> Self {
        Self {
            key,
            origin: Origin::Refused(reason),
            values: Vec::new(),
            source,
        }
    }

    /// The refusal of a whole shard that could not be read at all.
    pub(crate) fn whole_shard(name: &str, reason: String) -> Self {
        let source = SourceOf {
            shard: name.to_owned(),
            index: 0,
            offset: 0,
        };
        Self::refused(format!("{name}@0"), reason, source)
    }
}

/// A `.tar.gz` inflated, twice: one handle for the pass over its
/// headers, one kept to read its objects from.
pub(crate) fn inflated_tar(
    gz: impl std::io::Read,
    scratch: &Path,
) -> std::result::Result<(std::fs::File, std::fs::File), String> {
    let tar = inflate::inflate(gz, scratch)?;
    let pinned = tar
        .try_clone()
        .map_err(|e| format!("cannot keep the inflated shard open: {e}"))?;
    Ok((tar, pinned))
}

/// Whether `path` (a file, a directory, or a glob) names shards: a shard
/// file, a directory whose visible files are all shards, or a pattern.
pub fn is_shards(path: &Path) -> bool {
    if has_glob(path) {
        return true;
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    if path.is_file() {
        return is_shard_file(path, &name);
    }
    let Ok(dir) = std::fs::read_dir(path) else {
        return false;
    };
    let mut any = false;
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name.ends_with(".index") {
            continue;
        }
        if !entry.file_type().is_ok_and(|t| t.is_file()) || !is_shard_file(&entry.path(), &name) {
            return false;
        }
        any = true;
    }
    any
}

/// Whether the file `name` at `path` is a shard: by its extension, and a
/// Parquet file only if it holds objects (else it is a manifest).
fn is_shard_file(path: &Path, name: &str) -> bool {
    match ShardKind::of(name) {
        Some(Ok(ShardKind::Parquet)) => parquet_shard::is_object_file(path),
        Some(_) => true,
        None => false,
    }
}

fn has_glob(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|n| n.to_string_lossy().contains(['*', '?', '[']))
}

/// The shard files `path` names, in name order, each with its name under
/// the source (relative to the directory they are in).
pub fn list(path: &Path) -> Result<Vec<(PathBuf, String)>> {
    let bad = |reason: String| StorageError::BadSource {
        path: path.to_owned(),
        reason,
    };
    let (dir, pattern): (PathBuf, Option<Vec<char>>) = if has_glob(path) {
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
        let pattern = path
            .file_name()
            .map(|n| n.to_string_lossy().chars().collect());
        (parent.unwrap_or(Path::new(".")).to_owned(), pattern)
    } else if path.is_file() {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        return Ok(vec![(path.to_owned(), name.unwrap_or_default())]);
    } else {
        (path.to_owned(), None)
    };
    let mut out = Vec::new();
    let entries = std::fs::read_dir(&dir).map_err(|e| StorageError::io("list", &dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| StorageError::io("list", &dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name.ends_with(".index") {
            continue;
        }
        if let Some(p) = &pattern
            && !glob::matches(p, &name.chars().collect::<Vec<_>>())
        {
            continue;
        }
        match ShardKind::of(&name) {
            Some(Ok(_)) => out.push((entry.path(), name)),
            Some(Err(why)) => return Err(bad(why)),
            None if pattern.is_some() => {
                return Err(bad(format!(
                    "{name} matches but is not a shard (.tar, .tfrecord or .parquet)"
                )));
            }
            None => {}
        }
    }
    if out.is_empty() {
        return Err(bad("no shards (.tar, .tfrecord, .parquet) there".into()));
    }
    out.sort_by(|a, b| a.1.cmp(&b.1));
    Ok(out)
}

/// Every sample of the shards `path` names, and their columns; with
/// `part` (one storage node's of N) and at least N shard files, only the
/// files at positions ≡ I mod N of the name order: each node reads its
/// own files and no other's (with fewer files than nodes every node reads
/// them all and keeps every N-th sample, `super::shard`).
pub(crate) fn enumerate(
    path: &Path,
    confine: Option<&Confinement>,
    part: Option<NodeShare>,
    scratch: &Path,
) -> Result<Enumerated> {
    let (files, part_only) = NodeShare::own_files(part, list(path)?);
    let mut samples = Vec::new();
    let mut inflated = Vec::new();
    for (file, name) in files {
        let kind = match ShardKind::of(&name) {
            Some(Ok(kind)) => kind,
            _ => continue,
        };
        let opened = match confine {
            Some(c) => c.open(&file),
            None => std::fs::File::open(&file)
                .map_err(|e| format!("cannot open {}: {e}", file.display())),
        };
        let handle = match opened {
            Ok(f) => f,
            Err(reason) => {
                samples.push(Sample::whole_shard(&name, reason));
                continue;
            }
        };
        match kind {
            ShardKind::Tar => webdataset::samples(&file, &name, handle, &mut samples),
            ShardKind::TarGz => match inflated_tar(handle, scratch) {
                Ok((tar, pinned)) => {
                    webdataset::samples(&file, &name, tar, &mut samples);
                    inflated.push((file.clone(), std::sync::Arc::new(pinned)));
                }
                Err(reason) => samples.push(Sample::whole_shard(&name, reason)),
            },
            ShardKind::TfRecord => tfrecord::samples(&file, &name, handle, &mut samples),
            ShardKind::Parquet => parquet_shard::samples(&file, &name, handle, &mut samples),
        }
    }
    Ok(gather(samples, part_only, inflated))
}

/// The entries and columns of shards' `samples` (`part_only`: of one
/// storage node's files only).
pub(crate) fn gather(
    samples: Vec<Sample>,
    part_only: bool,
    inflated: Vec<(PathBuf, std::sync::Arc<std::fs::File>)>,
) -> Enumerated {
    let mut columns = Columns::default();
    let mut entries = Vec::with_capacity(samples.len());
    for s in samples {
        columns.push(s.values, s.source);
        entries.push(Entry {
            key: s.key,
            origin: s.origin,
        });
    }
    let (user_fields, user_columns) = columns.finish();
    Enumerated {
        entries,
        user_fields,
        user_columns,
        part_only,
        inflated,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_by_extension_and_compressed_shards_say_what_to_do() {
        assert_eq!(ShardKind::of("a.TAR"), Some(Ok(ShardKind::Tar)));
        assert_eq!(ShardKind::of("a.tfrecords"), Some(Ok(ShardKind::TfRecord)));
        assert_eq!(ShardKind::of("a.tgz"), Some(Ok(ShardKind::TarGz)));
        assert!(
            ShardKind::of("a.tar.zst")
                .unwrap()
                .unwrap_err()
                .contains("decompress this one")
        );
        assert_eq!(ShardKind::of("a.jpg"), None);
    }
}
