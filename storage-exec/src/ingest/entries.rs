//! What an enumeration of a source yields, whoever enumerates it (a
//! directory or a manifest, `super::source`; shard files,
//! `super::shard_files`): [`Entry`]s, each a key and the [`Origin`] of its
//! bytes, gathered with their user columns into [`Enumerated`]; and
//! [`key_part`], a file name as key text, for both. Its own
//! file, so that neither enumerator imports the other for it.

use std::path::PathBuf;
use std::sync::Arc;

use arrow::array::{ArrayRef, UInt32Array};
use arrow::compute::take;
use arrow::datatypes::Field;

use super::node_share::NodeShare;
use super::objects::ObjectSource;
use super::writer::Extent;
use crate::error::Result;

/// Where one sample's bytes are.
#[derive(Debug)]
pub(crate) enum Origin {
    Path(PathBuf),
    /// `len` bytes at `offset` of a shard file.
    Range {
        path: PathBuf,
        offset: u64,
        len: u64,
    },
    /// The object column's value in `row` of row group `row_group` of a
    /// Parquet file.
    Cell {
        path: PathBuf,
        row_group: usize,
        row: u64,
    },
    Inline(Vec<u8>),
    /// A manifest's row fetched from its store (`super::objects`), with
    /// the version stamp its GET answered, which no listing gave: what a
    /// resume record keeps of it (`super::resume`).
    Fetched {
        bytes: Vec<u8>,
        stamp: Arc<str>,
    },
    /// An object in a store (`super::objects`), with its size when the
    /// listing gave it, or (a shard's member) the range of it that holds
    /// the sample; fetched into `Inline` by its load group.
    Object {
        source: Arc<ObjectSource>,
        location: object_store::path::Path,
        size: Option<u64>,
        range: Option<std::ops::Range<u64>>,
        /// Its version as the listing gave it (a member's: its shard's;
        /// `objects::stamp`): with the size, what tells a re-run that the
        /// bytes an earlier, failed run kept are still the object's
        /// (`super::resume`). `None` for a manifest's row (never listed).
        stamp: Option<Arc<str>>,
    },
    /// The object column's value in `row` of row group `row_group` of a
    /// Parquet object in a store (`super::objects`), `size` bytes long;
    /// fetched into `Inline` by its load group, a row group at a time.
    ObjectCell {
        source: Arc<ObjectSource>,
        location: object_store::path::Path,
        size: u64,
        row_group: usize,
        row: u64,
        /// The Parquet object's version, as for `Object`.
        stamp: Option<Arc<str>>,
    },
    /// Refused before a byte is read, and why (a duplicate key).
    Refused(String),
    /// On the device already: written and verified by an earlier run of
    /// this ingest that failed, and kept for this one (`super::resume`).
    Kept(Box<KeptObject>),
}

/// One object a failed run of the ingest wrote and verified, on the
/// device already (`super::resume`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct KeptObject {
    pub key: String,
    /// What it was in the store (`super::resume::record::identity`).
    pub identity: String,
    pub extent: Extent,
    pub crc: u32,
    pub probe: sluice_udfs::probe::Probe,
}

/// One sample to ingest.
#[derive(Debug)]
pub(crate) struct Entry {
    pub key: String,
    pub origin: Origin,
}

/// The enumerated samples and their user columns (one row per entry).
#[derive(Debug)]
pub(crate) struct Enumerated {
    pub entries: Vec<Entry>,
    pub user_fields: Vec<Field>,
    pub user_columns: Vec<ArrayRef>,
    /// Only one storage node's part was enumerated (its shard files, see
    /// `shard_files::enumerate`); otherwise the whole source.
    pub part_only: bool,
    /// Inflated `.tar.gz` shards, each under the shard's path: their
    /// objects are read from these files.
    pub inflated: Vec<(PathBuf, Arc<std::fs::File>)>,
}

impl Enumerated {
    /// The whole source's `entries` and their user columns.
    pub(crate) fn whole(
        entries: Vec<Entry>,
        user_fields: Vec<Field>,
        user_columns: Vec<ArrayRef>,
    ) -> Self {
        Self {
            entries,
            user_fields,
            user_columns,
            part_only: false,
            inflated: Vec::new(),
        }
    }

    /// Only `part`'s entries (every N-th from the I-th) and the rows of
    /// their user columns.
    pub(crate) fn keep_part(self, part: NodeShare) -> Result<Self> {
        let kept: Vec<u32> = (0..self.entries.len())
            .filter(|&i| part.keeps(i))
            .map(|i| i as u32)
            .collect();
        let rows = UInt32Array::from(kept);
        let user_columns = self
            .user_columns
            .iter()
            .map(|c| take(c.as_ref(), &rows, None))
            .collect::<std::result::Result<Vec<ArrayRef>, _>>()?;
        let entries: Vec<Entry> = self
            .entries
            .into_iter()
            .enumerate()
            .filter(|(i, _)| part.keeps(*i))
            .map(|(_, entry)| entry)
            .collect();
        Ok(Self {
            entries,
            user_fields: self.user_fields,
            user_columns,
            part_only: true,
            inflated: self.inflated,
        })
    }
}

/// The user columns of an ImageFolder: `label`, each key's first
/// segment (its class), for `keys` in entry order; none for a flat
/// layout. Local directories and object-store prefixes alike.
pub(crate) fn image_folder_labels<'a>(
    image_folder: bool,
    keys: impl Iterator<Item = &'a str>,
) -> (Vec<Field>, Vec<ArrayRef>) {
    if !image_folder {
        return (vec![], vec![]);
    }
    let labels: arrow::array::StringArray = keys.map(|k| k.split('/').next()).collect();
    (
        vec![Field::new("label", arrow::datatypes::DataType::Utf8, true)],
        vec![Arc::new(labels) as ArrayRef],
    )
}

/// A file name as key text: UTF-8 as it is; each byte of an invalid
/// sequence as `%XX`, so that `a\xff.jpg` and `a\xfe.jpg` stay two keys
/// (a lossy conversion made both `a\u{fffd}.jpg`, and one was lost). A key
/// that still collides is refused at ingest, named.
pub(crate) fn key_part(name: &std::ffi::OsStr) -> String {
    use std::fmt::Write;
    use std::os::unix::ffi::OsStrExt;
    let mut out = String::with_capacity(name.len());
    for chunk in name.as_bytes().utf8_chunks() {
        out.push_str(chunk.valid());
        for b in chunk.invalid() {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}
