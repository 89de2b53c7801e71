//! What an object-store source holds, as the entries of an ingest.
//!
//! - **A prefix**, listed page by page: the objects beneath it, keyed by
//!   their key relative to the prefix. As with a local directory, the
//!   layout is ImageFolder when every object sits below a first-level
//!   "directory" (the first segment becomes `label`), flat otherwise;
//!   keys with a segment that starts with `.` are hidden and left out, and
//!   so are "directory" placeholders (keys ending in `/`). Keys are sorted
//!   in byte order, as a local ingest sorts them.
//! - **A manifest** in the store: read by DataFusion through the same
//!   client (`super::super::source::read_manifest`), each row's `path`
//!   a key relative to the manifest's prefix, or an absolute URL in the
//!   same bucket. A row that names a local file or another bucket is
//!   refused, named: a manifest in a store reads that store only; on a
//!   server, a row outside `--ingest-url-allow` is refused too.
//! - **NodeShare files**: a prefix whose objects are all WebDataset tars or
//!   TFRecord files, or a URL naming one, is read as shards
//!   (`super::shards`), and so is a prefix of Parquet files with the
//!   images inside (`super::parquet_shards`). A `.parquet` URL is a manifest
//!   when it has a top-level `path` column, and one shard when it has an
//!   object column instead, as a local file is.
//! - **A pattern**: a URL whose last part is a shell pattern
//!   (`s3://b/shards/train-*.tar`, `[0-4]`) names the shards beside each
//!   other whose names match it: one listing of the part before it.

use std::path::PathBuf;
use std::sync::Arc;

use datafusion::prelude::SessionContext;
use futures::StreamExt;
use object_store::ObjectStoreExt;
use object_store::path::Path as ObjectPath;

use super::address::ObjectUrl;
use super::faults::{head_error, store_error};
use super::list_split::list_under;
use super::parquet_shards;
use super::shard_object::ShardObject;
use super::{ObjectSource, stamp};
use crate::error::{Result, StorageError};
use crate::ingest::entries::{Entry, Enumerated, Origin, image_folder_labels};
use crate::ingest::node_share::NodeShare;
use crate::ingest::shard_files::ShardKind;
use crate::ingest::shard_files::glob::matches;
use crate::ingest::source::{ManifestAt, read_manifest};

/// Whether `key` names a manifest by its extension.
pub(super) fn is_manifest(key: &str) -> bool {
    let lower = key.to_ascii_lowercase();
    [".csv", ".json", ".jsonl", ".ndjson", ".parquet"]
        .iter()
        .any(|e| lower.ends_with(e))
}

/// Whether the last part of `prefix` is a shell pattern (`*`, `[a-z]`;
/// `?` would begin a URL's query, which a source URL never has).
pub(super) fn is_glob(prefix: &str) -> bool {
    prefix
        .rsplit('/')
        .next()
        .is_some_and(|n| n.contains(['*', '[']))
}

/// The kind of shard file `key` names.
fn shard_kind(key: &str) -> Option<ShardKind> {
    match ShardKind::of(key) {
        None => None,
        Some(Ok(kind)) => Some(kind),
        // A compressed tar sluice does not read (`.tar.zst`, ...):
        // `enumerate_shards` names it.
        Some(Err(_)) => Some(ShardKind::TarGz),
    }
}

/// A key as the store's client names it: as it is, never percent-encoded
/// (`Path::from` would encode `été.jpg`, another key than the one listed),
/// refused where the client cannot name it.
fn key_path(key: &str) -> std::result::Result<ObjectPath, String> {
    ObjectPath::parse(key).map_err(|e| format!("a key sluice cannot name in the store: {e}"))
}

/// Objects listed between two lines of the log.
const LOG_EVERY: usize = 100_000;

impl ObjectSource {
    /// The entries of this source (see the module docs); of `part`'s
    /// shard files only, for shards and a storage node's part. A gzipped
    /// tar is inflated into an unlinked file in `scratch`.
    pub(crate) async fn enumerate(
        self: Arc<Self>,
        part: Option<NodeShare>,
        scratch: PathBuf,
    ) -> Result<Enumerated> {
        match self.manifest.clone() {
            Some(manifest) if manifest.prefix.to_ascii_lowercase().ends_with(".parquet") => {
                let location = key_path(&manifest.prefix).map_err(|e| self.bad(e))?;
                let Some((size, stamp)) = parquet_shards::shard_size(&self, &location).await?
                else {
                    return self.enumerate_manifest(manifest).await;
                };
                let name = manifest.prefix.rsplit('/').next().unwrap_or_default();
                let shard = ShardObject {
                    name: name.to_owned(),
                    kind: ShardKind::Parquet,
                    location,
                    size,
                    stamp,
                };
                self.enumerate_shards(vec![shard], part, scratch).await
            }
            Some(manifest) => self.enumerate_manifest(manifest).await,
            None if is_glob(&self.url.prefix) => self.enumerate_glob(part, scratch).await,
            None if shard_kind(&self.url.prefix).is_some() => {
                // One shard file, named.
                let location = key_path(&self.url.prefix).map_err(|e| self.bad(e))?;
                let meta = match self.store.head(&location).await {
                    Ok(meta) => meta,
                    Err(e) => {
                        let said = head_error(self.store.as_ref(), &location, &e).await;
                        return Err(self.bad(format!("cannot read the shard: {said}")));
                    }
                };
                let name = self.url.prefix.rsplit('/').next().unwrap_or_default();
                let shard = ShardObject {
                    name: name.to_owned(),
                    kind: shard_kind(name).unwrap_or(ShardKind::Tar),
                    location,
                    size: meta.size,
                    stamp: stamp(&meta),
                };
                self.enumerate_shards(vec![shard], part, scratch).await
            }
            None => self.enumerate_prefix(part, scratch).await,
        }
    }

    async fn enumerate_prefix(
        self: Arc<Self>,
        part: Option<NodeShare>,
        scratch: PathBuf,
    ) -> Result<Enumerated> {
        let prefix = key_path(&self.url.prefix).map_err(|e| self.bad(e))?;
        let mut listed = list_under(Arc::clone(&self.store), prefix);
        let mut rows: Vec<(String, ObjectPath, u64, Option<Arc<str>>)> = Vec::new();
        let (mut shards, mut companions) = (0usize, 0usize);
        while let Some(meta) = listed.next().await {
            let meta =
                meta.map_err(|e| self.bad(format!("cannot list it: {}", store_error(&e))))?;
            let location = meta.location.as_ref();
            let rel = match self.url.prefix.as_str() {
                "" => location,
                p => location
                    .strip_prefix(p)
                    .and_then(|r| r.strip_prefix('/'))
                    .unwrap_or(location),
            };
            if rel.is_empty() || rel.ends_with('/') || rel.split('/').any(|s| s.starts_with('.')) {
                continue;
            }
            if shard_kind(rel).is_some() {
                shards += 1;
            } else if rel.ends_with(".index") {
                // A TFRecord index, beside its shard: passed over, as locally.
                companions += 1;
            }
            let version = stamp(&meta);
            rows.push((rel.to_owned(), meta.location, meta.size, version));
            if rows.len().is_multiple_of(LOG_EVERY) {
                tracing::info!("listed {} objects under {}", rows.len(), self.url);
            }
        }
        if rows.is_empty() {
            return Err(self.bad("no objects under this prefix".into()));
        }
        rows.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        if shards > 0 && shards + companions == rows.len() {
            let shards = rows
                .into_iter()
                .filter(|(name, ..)| !name.ends_with(".index"))
                .map(|(name, location, size, stamp)| ShardObject {
                    kind: shard_kind(&name).unwrap_or(ShardKind::Tar),
                    name,
                    location,
                    size,
                    stamp,
                })
                .collect();
            return self.enumerate_shards(shards, part, scratch).await;
        }
        let image_folder = rows.iter().all(|(rel, ..)| rel.contains('/'));
        let (user_fields, user_columns) =
            image_folder_labels(image_folder, rows.iter().map(|(rel, ..)| rel.as_str()));
        let entries = rows
            .into_iter()
            .map(|(key, location, size, stamp)| Entry {
                key,
                origin: Origin::Object {
                    source: Arc::clone(&self),
                    location,
                    size: Some(size),
                    range: None,
                    stamp,
                },
            })
            .collect();
        Ok(Enumerated::whole(entries, user_fields, user_columns))
    }

    /// The shards whose names match the pattern in the last part of the
    /// URL, beside each other under the part before it (as a local glob:
    /// every match must be a shard).
    async fn enumerate_glob(
        self: Arc<Self>,
        part: Option<NodeShare>,
        scratch: PathBuf,
    ) -> Result<Enumerated> {
        let (dir, pattern) = self
            .url
            .prefix
            .rsplit_once('/')
            .unwrap_or(("", self.url.prefix.as_str()));
        let pattern: Vec<char> = pattern.chars().collect();
        let under = match dir {
            "" => None,
            d => Some(key_path(d).map_err(|e| self.bad(e))?),
        };
        let mut listed = self.store.list(under.as_ref());
        let mut shards = Vec::new();
        while let Some(meta) = listed.next().await {
            let meta =
                meta.map_err(|e| self.bad(format!("cannot list it: {}", store_error(&e))))?;
            let location = meta.location.as_ref();
            let name = match dir {
                "" => location,
                d => location
                    .strip_prefix(d)
                    .and_then(|r| r.strip_prefix('/'))
                    .unwrap_or(location),
            };
            if name.contains('/')
                || name.starts_with('.')
                || name.ends_with(".index")
                || !matches(&pattern, &name.chars().collect::<Vec<_>>())
            {
                continue;
            }
            let Some(kind) = shard_kind(name) else {
                return Err(self.bad(format!(
                    "{name} matches but is not a shard (.tar, .tfrecord or .parquet)"
                )));
            };
            let version = stamp(&meta);
            shards.push(ShardObject {
                name: name.to_owned(),
                location: meta.location,
                size: meta.size,
                stamp: version,
                kind,
            });
        }
        if shards.is_empty() {
            return Err(self.bad("no shards (.tar, .tfrecord, .parquet) match it".into()));
        }
        shards.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        self.enumerate_shards(shards, part, scratch).await
    }

    async fn enumerate_manifest(self: Arc<Self>, manifest: ObjectUrl) -> Result<Enumerated> {
        let ctx = SessionContext::new();
        let root = url::Url::parse(&manifest.root())
            .map_err(|e| self.bad(format!("cannot register its store: {e}")))?;
        ctx.register_object_store(&root, Arc::clone(&self.store));
        let at = ManifestAt {
            read: manifest.to_string(),
            shown: manifest.to_string().into(),
            ctx,
        };
        let source = Arc::clone(&self);
        read_manifest(at, move |path| source.resolve_row(path)).await
    }

    /// A manifest row's `path` as an object of this store, or refused.
    fn resolve_row(self: &Arc<Self>, path: &str) -> Origin {
        let url = if ObjectUrl::is_url(path) {
            ObjectUrl::parse(path)
        } else if path.starts_with('/') {
            return Origin::Refused(format!(
                "the manifest names the local file {path}: a manifest in an object store \
                 names objects of its own bucket only"
            ));
        } else {
            self.url.join(path)
        };
        let url = url.and_then(|u| match &self.allow {
            Some(allow) => allow.admit(&u.to_string()),
            None => Ok(u),
        });
        match url {
            Ok(u) if u.kind == self.url.kind && u.bucket == self.url.bucket => {
                match key_path(&u.prefix) {
                    Ok(location) => Origin::Object {
                        source: Arc::clone(self),
                        location,
                        size: None,
                        range: None,
                        stamp: None,
                    },
                    Err(why) => Origin::Refused(format!("{u}: {why}")),
                }
            }
            Ok(u) => Origin::Refused(format!(
                "{u} is in another bucket: a manifest in an object store names objects of \
                 its own bucket ({}) only",
                self.url.root()
            )),
            Err(e) => Origin::Refused(e.to_string()),
        }
    }

    pub(super) fn bad(&self, reason: String) -> StorageError {
        StorageError::BadSource {
            path: self.url.to_string().into(),
            reason,
        }
    }
}
