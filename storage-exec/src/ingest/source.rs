//! Where ingest finds samples: a directory, a manifest, or memory.
//!
//! - **Directory, ImageFolder layout**: every top-level entry is a
//!   directory; each is a class and becomes the `label` column; files are
//!   found recursively below it.
//! - **Directory, flat**: files found recursively, no label.
//! - **Manifest**: a CSV, JSON-lines or Parquet file with a `path` column
//!   (relative paths resolve against a base directory) and optionally a
//!   `key` column; every other column is carried into the metadata as is.
//!   The manifest is read with DataFusion, so types are inferred the same
//!   way `sluice sql` would infer them.
//! - **Shards**: WebDataset tars, TFRecord files or Parquet files with the
//!   images inside (`super::shard_files`), each sample read in place from
//!   its shard.
//! - **Memory**: (key, bytes) pairs, for programs and benchmarks.
//! - **Objects**: a prefix or a manifest in an object store
//!   (`super::objects`).
//!
//! Keys default to the path relative to the source, with `/` separators;
//! entries are sorted by key so re-ingesting the same tree is deterministic.

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{Array, StringArray};
use arrow::compute::{cast, concat_batches};
use arrow::datatypes::{DataType, Field};
use datafusion::datasource::file_format::options::JsonReadOptions;
use datafusion::prelude::{CsvReadOptions, ParquetReadOptions, SessionContext};
use futures::FutureExt;

use super::confine::Confinement;
use super::entries::{Entry, Enumerated, Origin, image_folder_labels, key_part};
use super::node_share::NodeShare;
use super::objects::{ObjectSource, ObjectUrl, UrlAllow};
use crate::error::{Result, StorageError};
use crate::metadata::{KEY, RESERVED};

/// A source of samples for [`ingest`](super::ingest).
#[derive(Debug, Clone)]
pub enum IngestSource {
    /// A directory: ImageFolder layout (class sub-directories) or flat.
    Directory(PathBuf),
    /// A manifest file with a `path` column; relative paths resolve against `base`.
    Manifest {
        /// The CSV (`.csv`), JSON-lines (`.json`, `.jsonl`, `.ndjson`) or Parquet file.
        manifest: PathBuf,
        /// Directory that relative paths are relative to.
        base: PathBuf,
    },
    /// NodeShare files: one, a directory of them, or a glob
    /// (`shards/train-*.tar`).
    Shards(PathBuf),
    /// Objects already in memory, as (key, bytes).
    Memory(Vec<(String, Vec<u8>)>),
    /// A prefix or a manifest in an object store (`super::objects`).
    Objects(Arc<ObjectSource>),
}

impl IngestSource {
    /// The source for a CLI argument: shards when `path` names them (a
    /// `.tar`, `.tfrecord` or object-holding `.parquet` file, a directory
    /// of them, a glob), a
    /// manifest file when `path` is another file or `manifest` is given,
    /// a directory otherwise.
    pub fn from_cli(path: &Path, manifest: Option<&Path>) -> Self {
        match manifest {
            None if super::shard_files::is_shards(path) => Self::Shards(path.to_owned()),
            Some(m) => Self::Manifest {
                manifest: m.to_owned(),
                base: path.to_owned(),
            },
            None if path.is_file() => Self::Manifest {
                manifest: path.to_owned(),
                base: path.parent().unwrap_or(Path::new(".")).to_owned(),
            },
            None => Self::Directory(path.to_owned()),
        }
    }

    /// The source a CLI or REST argument names: an object store's when
    /// `arg` is a URL (`s3://`, `gs://`, `az://`, `http(s)://`; with
    /// `manifest`, a key below it), else [`from_cli`](Self::from_cli)'s.
    /// With `allow` (a server's `--ingest-url-allow`), the URL, its
    /// manifest and every object a manifest names must lie beneath it.
    pub fn from_arg(arg: &str, manifest: Option<&str>, allow: Option<&UrlAllow>) -> Result<Self> {
        if ObjectUrl::is_url(arg) {
            let url = match allow {
                Some(allow) => allow.admit(arg)?,
                None => ObjectUrl::parse(arg)?,
            };
            let source = ObjectSource::open(url, manifest, allow.cloned())?;
            return Ok(Self::Objects(Arc::new(source)));
        }
        Ok(Self::from_cli(Path::new(arg), manifest.map(Path::new)))
    }

    /// A short description for the catalog.
    pub fn describe(&self) -> String {
        match self {
            Self::Directory(p) => format!("directory {}", p.display()),
            Self::Manifest { manifest, .. } => format!("manifest {}", manifest.display()),
            Self::Shards(p) => format!("shards {}", p.display()),
            Self::Memory(s) => format!("{} in-memory objects", s.len()),
            Self::Objects(o) => o.describe(),
        }
    }

    /// What an ingest of this source would list, without reading a
    /// sample: each sample's key and, for a file, its path (not yet
    /// confined to the ingest roots: that happens when it is opened). A
    /// manifest is parsed and checked as an ingest checks it.
    pub async fn list(self) -> Result<Vec<(String, Option<PathBuf>)>> {
        Ok(enumerate(self, None, None, None)
            .await?
            .entries
            .into_iter()
            .map(|e| match e.origin {
                Origin::Path(p) | Origin::Range { path: p, .. } | Origin::Cell { path: p, .. } => {
                    (e.key, Some(p))
                }
                Origin::Object {
                    source, location, ..
                }
                | Origin::ObjectCell {
                    source, location, ..
                } => {
                    let url = source.url().of_key(location.as_ref());
                    (e.key, Some(PathBuf::from(url)))
                }
                Origin::Inline(_)
                | Origin::Fetched { .. }
                | Origin::Refused(_)
                | Origin::Kept(_) => (e.key, None),
            })
            .collect())
    }
}

/// The samples of `source`; shards are opened beneath `confine`'s roots
/// when it is given (every object is, when it is read).
pub(crate) async fn enumerate(
    source: IngestSource,
    confine: Option<Arc<Confinement>>,
    part: Option<NodeShare>,
    scratch: Option<PathBuf>,
) -> Result<Enumerated> {
    match source {
        IngestSource::Shards(path) => tokio::task::spawn_blocking(move || {
            let scratch = scratch.unwrap_or_else(std::env::temp_dir);
            super::shard_files::enumerate(&path, confine.as_deref(), part, &scratch)
        })
        .await
        .map_err(|e| StorageError::io("list", ".", std::io::Error::other(e)))?,
        IngestSource::Directory(dir) => tokio::task::spawn_blocking(move || enumerate_dir(&dir))
            .await
            .map_err(|e| StorageError::io("list", ".", std::io::Error::other(e)))?,
        // The CSV, JSON and Parquet readers can panic on a malformed file
        // (a Parquet footer cut short did): that is the manifest's fault,
        // named as such, never a lost request (`read_manifest`).
        IngestSource::Manifest { manifest, base } => enumerate_manifest(&manifest, &base).await,
        IngestSource::Objects(source) => {
            let scratch = scratch.unwrap_or_else(std::env::temp_dir);
            source.enumerate(part, scratch).await
        }
        IngestSource::Memory(samples) => Ok(Enumerated {
            entries: samples
                .into_iter()
                .map(|(key, bytes)| Entry {
                    key,
                    origin: Origin::Inline(bytes),
                })
                .collect(),
            user_fields: vec![],
            user_columns: vec![],
            part_only: false,
            inflated: Vec::new(),
        }),
    }
}

fn bad_source(path: &Path, reason: impl Into<String>) -> StorageError {
    StorageError::BadSource {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

fn visible_entries(dir: &Path) -> Result<Vec<std::fs::DirEntry>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| StorageError::io("list", dir, e))? {
        let entry = entry.map_err(|e| StorageError::io("list", dir, e))?;
        if !entry.file_name().to_string_lossy().starts_with('.') {
            out.push(entry);
        }
    }
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in visible_entries(dir)? {
        let path = entry.path();
        let ft = entry
            .file_type()
            .map_err(|e| StorageError::io("stat", &path, e))?;
        if ft.is_dir() {
            walk(&path, out)?;
        } else {
            // Files and symlinks alike; an unreadable one is reported per sample.
            out.push(path);
        }
    }
    Ok(())
}

fn rel_key(root: &Path, path: &Path) -> String {
    let rel = path.strip_prefix(root).unwrap_or(path);
    rel.components()
        .map(|c| key_part(c.as_os_str()))
        .collect::<Vec<_>>()
        .join("/")
}

fn enumerate_dir(dir: &Path) -> Result<Enumerated> {
    let meta = std::fs::metadata(dir).map_err(|e| StorageError::io("open", dir, e))?;
    if !meta.is_dir() {
        return Err(bad_source(dir, "not a directory"));
    }
    let top = visible_entries(dir)?;
    let image_folder =
        !top.is_empty() && top.iter().all(|e| e.file_type().is_ok_and(|t| t.is_dir()));
    let mut files = Vec::new();
    walk(dir, &mut files)?;
    let mut rows: Vec<(String, PathBuf)> =
        files.into_iter().map(|p| (rel_key(dir, &p), p)).collect();
    rows.sort();
    let (user_fields, user_columns) =
        image_folder_labels(image_folder, rows.iter().map(|(key, _)| key.as_str()));
    Ok(Enumerated {
        entries: rows
            .into_iter()
            .map(|(key, path)| Entry {
                key,
                origin: Origin::Path(path),
            })
            .collect(),
        user_fields,
        user_columns,
        part_only: false,
        inflated: Vec::new(),
    })
}

async fn enumerate_manifest(manifest: &Path, base: &Path) -> Result<Enumerated> {
    if !manifest.is_file() {
        return Err(bad_source(manifest, "manifest file not found"));
    }
    let at = ManifestAt {
        read: manifest.to_string_lossy().to_string(),
        shown: manifest.to_owned(),
        ctx: SessionContext::new(),
    };
    read_manifest(at, |rel| {
        let rel = PathBuf::from(rel);
        Origin::Path(if rel.is_absolute() {
            rel
        } else {
            base.join(rel)
        })
    })
    .await
}

/// A manifest to read: what DataFusion reads (a path, or a URL of a store
/// registered with `ctx`), and the name errors give it.
pub(crate) struct ManifestAt {
    pub read: String,
    pub shown: PathBuf,
    pub ctx: SessionContext,
}

/// The entries of a manifest, each row's `path` resolved by `resolve`;
/// a reader's panic on a malformed file is the manifest's error, named.
pub(crate) async fn read_manifest(
    at: ManifestAt,
    resolve: impl Fn(&str) -> Origin,
) -> Result<Enumerated> {
    let shown = at.shown.clone();
    AssertUnwindSafe(read_rows(at, resolve))
        .catch_unwind()
        .await
        .unwrap_or_else(|panic| {
            Err(bad_source(
                &shown,
                format!(
                    "cannot read manifest: its reader failed on it ({})",
                    sluice_udfs::udf::panic_message(&panic)
                ),
            ))
        })
        .map_err(|e| match e {
            e @ StorageError::BadSource { .. } => e,
            // Arrow's errors (a column that does not cast) name no file.
            e => bad_source(&shown, format!("cannot read manifest: {e}")),
        })
}

async fn read_rows(at: ManifestAt, resolve: impl Fn(&str) -> Origin) -> Result<Enumerated> {
    let ManifestAt {
        read: name,
        shown: manifest,
        ctx,
    } = at;
    let manifest = manifest.as_path();
    let ext = name
        .rsplit('/')
        .next()
        .and_then(|file| file.rsplit_once('.'))
        .map(|(_, e)| e.to_lowercase())
        .unwrap_or_default();
    let df = match ext.as_str() {
        "csv" => ctx.read_csv(&name, CsvReadOptions::new().file_extension(".csv")).await,
        "json" | "jsonl" | "ndjson" => {
            let dot_ext = format!(".{ext}");
            ctx.read_json(&name, JsonReadOptions::default().file_extension(&dot_ext))
                .await
        }
        "parquet" => ctx.read_parquet(&name, ParquetReadOptions::default()).await,
        other => {
            return Err(bad_source(
                manifest,
                format!("unknown manifest type '.{other}' (expected .csv, .json, .jsonl, .ndjson or .parquet)"),
            ));
        }
    }
    .map_err(|e| bad_source(manifest, format!("cannot read manifest: {e}")))?;
    let schema = Arc::new(df.schema().as_arrow().clone());
    let batches = df
        .collect()
        .await
        .map_err(|e| bad_source(manifest, format!("cannot read manifest: {e}")))?;
    let batch = concat_batches(&schema, &batches)?;

    let string_col = |name: &str| -> Result<Option<StringArray>> {
        let Some(col) = batch.column_by_name(name) else {
            return Ok(None);
        };
        let col = cast(col, &DataType::Utf8)?;
        Ok(col.as_any().downcast_ref::<StringArray>().cloned())
    };
    let paths =
        string_col("path")?.ok_or_else(|| bad_source(manifest, "manifest has no 'path' column"))?;
    let keys = string_col(KEY)?;

    let mut entries = Vec::with_capacity(batch.num_rows());
    for i in 0..batch.num_rows() {
        if paths.is_null(i) {
            return Err(bad_source(
                manifest,
                format!("row {}: 'path' is empty", i + 1),
            ));
        }
        let key = match &keys {
            Some(k) if !k.is_null(i) => k.value(i).to_owned(),
            Some(_) => {
                return Err(bad_source(
                    manifest,
                    format!("row {}: 'key' is empty", i + 1),
                ));
            }
            None => paths.value(i).to_owned(),
        };
        entries.push(Entry {
            key,
            origin: resolve(paths.value(i)),
        });
    }

    let mut user_fields = Vec::new();
    let mut user_columns = Vec::new();
    for (field, col) in schema.fields().iter().zip(batch.columns()) {
        let name = field.name().as_str();
        if name == "path" || name == KEY {
            continue;
        }
        if RESERVED.contains(&name) {
            return Err(bad_source(
                manifest,
                format!("column '{name}' is reserved by sluice; rename it in the manifest"),
            ));
        }
        // View types are an in-memory optimisation; store plain strings/bytes.
        let (dt, col) = match field.data_type() {
            DataType::Utf8View | DataType::LargeUtf8 => {
                (DataType::Utf8, cast(col, &DataType::Utf8)?)
            }
            DataType::BinaryView | DataType::LargeBinary => {
                (DataType::Binary, cast(col, &DataType::Binary)?)
            }
            dt => (dt.clone(), Arc::clone(col)),
        };
        user_fields.push(Field::new(name, dt, true));
        user_columns.push(col);
    }
    Ok(Enumerated::whole(entries, user_fields, user_columns))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_manifest_whose_reader_panics_is_named() {
        // The fuzz target's finding: a Parquet file cut short panicked the
        // reader (its first byte picks the format there).
        let found =
            include_bytes!("../../../tests/fuzz/corpus/manifest/regression-parquet-cut-footer");
        let dir = tempfile::tempdir().unwrap();
        let manifest = dir.path().join("cut.parquet");
        std::fs::write(&manifest, &found[1..]).unwrap();
        let e = IngestSource::Manifest {
            manifest: manifest.clone(),
            base: dir.path().to_owned(),
        }
        .list()
        .await
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("cut.parquet") && e.contains("cannot read manifest"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn image_folder_layout_gives_labels_and_sorted_keys() {
        let dir = tempfile::tempdir().unwrap();
        for (class, file) in [("dog", "b.jpg"), ("cat", "a.jpg"), ("dog", "sub/a.jpg")] {
            let p = dir.path().join(class).join(file);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, b"x").unwrap();
        }
        let e = enumerate(IngestSource::Directory(dir.path().into()), None, None, None)
            .await
            .unwrap();
        let keys: Vec<_> = e.entries.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, ["cat/a.jpg", "dog/b.jpg", "dog/sub/a.jpg"]);
        assert_eq!(e.user_fields[0].name(), "label");
        let labels = e.user_columns[0]
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        assert_eq!(labels.value(2), "dog");
    }

    #[tokio::test]
    async fn flat_directory_has_no_label() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.png"), b"x").unwrap();
        std::fs::create_dir(dir.path().join("more")).unwrap();
        std::fs::write(dir.path().join("more/b.png"), b"x").unwrap();
        let e = enumerate(IngestSource::Directory(dir.path().into()), None, None, None)
            .await
            .unwrap();
        assert!(e.user_fields.is_empty());
        assert_eq!(e.entries.len(), 2);
    }

    #[tokio::test]
    async fn manifest_columns_are_carried_and_reserved_names_refused() {
        let dir = tempfile::tempdir().unwrap();
        let m = dir.path().join("m.csv");
        std::fs::write(&m, "path,label,split\nx/a.png,3,train\nb.png,4,val\n").unwrap();
        let e = enumerate(
            IngestSource::Manifest {
                manifest: m.clone(),
                base: dir.path().into(),
            },
            None,
            None,
            None,
        )
        .await
        .unwrap();
        assert_eq!(e.entries[0].key, "x/a.png");
        let names: Vec<_> = e.user_fields.iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["label", "split"]);
        assert_eq!(e.user_fields[0].data_type(), &DataType::Int64);

        std::fs::write(&m, "path,width\na.png,3\n").unwrap();
        let err = enumerate(
            IngestSource::Manifest {
                manifest: m.clone(),
                base: dir.path().into(),
            },
            None,
            None,
            None,
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("'width' is reserved"), "{err}");

        std::fs::write(&m, "file,label\na.png,3\n").unwrap();
        let err = enumerate(
            IngestSource::Manifest {
                manifest: m,
                base: dir.path().into(),
            },
            None,
            None,
            None,
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("no 'path' column"), "{err}");
    }
}
