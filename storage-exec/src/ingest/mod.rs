//! Ingest: put a dataset version on the device, atomically.
//!
//! 1. Enumerate the source ([`IngestSource`]; `source` for directories
//!    and manifests, [`shard_files`] for shards, [`objects`] for a prefix,
//!    a manifest or shards in an object store, all yielding `entries`;
//!    an object store's objects are fetched by their load group).
//! 2. Read each object (on the blocking pool, several at a time), probe its
//!    header (image, video or array: [`sluice_udfs::probe`]) and compute its
//!    crc32c; a bad object follows the [`OnError`] policy. Memory is
//!    bounded: objects wait for the writer within a byte budget, and a
//!    large file is probed through its handle and streamed into the device
//!    a piece at a time, never read whole.
//! 3. Pack the accepted objects into chunks ([`ExtentWriter`]), then wait
//!    for every write and flush the device.
//! 4. Write the version's metadata to `meta/<dataset>/v<N>.parquet` (temp
//!    file, fsync, rename, fsync of the directory).
//! 5. Commit the version, its chunk runs and the dataset's latest pointer in
//!    one catalog transaction.
//!
//! Steps 1 to 4 are [`prepare`]; step 5 is [`Prepared::commit`], so that a
//! dataset spread over several nodes commits on all of them or on none.
//!
//! An ingest from an object store that fails keeps the objects it wrote
//! for its re-run (`resume`), owned by a record in the catalog that no
//! version is; its re-run from the same source fetches only the rest.
//!
//! A crash before step 5 leaves no trace that matters: the chunks are owned
//! by nobody (free again at the next open) and the metadata file by no
//! version (an orphan that `sluice gc` removes; opening deletes nothing).
//! A crash after it leaves a complete version.
//!
//! Modules:
//! - `confine`: `Confinement`: ingest reads only beneath the roots it was
//!   given;
//! - `copy`: a storage node's side of moving replicas;
//! - `entries`: what a source enumerates: each object's key and where its
//!   bytes are;
//! - `groups`: the objects in load groups, read ahead of the writer within
//!   a byte budget;
//! - `load`: reading, probing and checksumming one object (a large file
//!   streamed into the device);
//! - `parts`: a storage node's side of an ingest spread over several nodes;
//! - `pending`: `PendingIngests`: a storage node's prepared ingest parts,
//!   waiting for their coordinator's word;
//! - `prepared`: `Prepared`: an ingest whose objects and metadata are written
//!   but whose version is not yet committed;
//! - `resume`: what a failed ingest from an object store keeps, so that
//!   its re-run fetches only the rest;
//! - `rows`: the version's metadata, a row per accepted object;
//! - `node_share`: `NodeShare`: one of N storage nodes' part of a source;
//! - `version`: the last step of every way a version is written;
//! - `writer`: `ExtentWriter`: packs objects tightly into chunks and writes
//!   them.

mod confine;
mod copy;
mod entries;
mod groups;
mod load;
mod node_share;
pub mod objects;
mod parts;
mod pending;
mod prepared;
pub(crate) mod resume;
mod rows;
pub mod shard_files;
mod source;
mod version;
mod writer;

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;

pub use confine::Confinement;
pub use node_share::NodeShare;
pub use pending::PendingIngests;
pub use prepared::Prepared;
pub use sluice_base::OnError;
pub use source::IngestSource;
pub use writer::{Extent, ExtentWriter};

use self::load::{Body, stream_file};
use self::resume::Resume;
use self::rows::Rows;
use self::shard_files::OpenShards;
use self::version::{Sealing, seal};
use crate::error::{Result, StorageError};
use crate::store::Store;
use source::enumerate;

/// Progress of a running ingest.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// Objects processed (accepted or skipped).
    pub done: u64,
    /// Objects in the source.
    pub total: u64,
    /// Bytes accepted so far.
    pub bytes: u64,
}

/// How to ingest.
pub struct IngestOptions {
    /// Policy for bad objects: skip (the default) or fail; `null` is a
    /// query's, and an ingest given it is refused before it reads.
    pub on_error: OnError,
    /// Called after each object.
    pub progress: Option<Box<dyn Fn(Progress) + Send + Sync>>,
    /// When set, every object is read beneath these roots or refused (a
    /// server ingesting for a client); the CLI reads what its user can.
    pub confine: Option<Arc<Confinement>>,
    /// When set, only this part of the source is ingested (one storage
    /// node's share of a dataset spread over several).
    pub shard: Option<NodeShare>,
}

impl Default for IngestOptions {
    fn default() -> Self {
        Self::with_policy(OnError::Skip)
    }
}

impl IngestOptions {
    /// Options with `on_error`, no progress callback and no confinement.
    pub fn with_policy(on_error: OnError) -> Self {
        Self {
            on_error,
            progress: None,
            confine: None,
            shard: None,
        }
    }
}

impl std::fmt::Debug for IngestOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IngestOptions")
            .field("on_error", &self.on_error)
            .field("shard", &self.shard)
            .finish()
    }
}

/// An object left out of a version, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Skipped {
    /// The key it would have had.
    pub key: String,
    /// Why it was refused.
    pub reason: String,
}

/// What an ingest committed.
#[derive(Debug, Clone, serde::Serialize)]
pub struct IngestReport {
    /// Dataset name.
    pub dataset: String,
    /// The new version.
    pub version: u64,
    /// Samples committed.
    pub samples: u64,
    /// Object bytes committed.
    pub bytes: u64,
    /// Chunks used.
    pub chunks: u64,
    /// Objects left out.
    pub skipped: Vec<Skipped>,
    /// The metadata columns the source gave (a manifest's, an
    /// ImageFolder's `label`, a shard's members and features).
    pub columns: Vec<String>,
    /// Wall time in seconds.
    pub seconds: f64,
    /// For a source in an object store: the requests sent and the
    /// attempts retried.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests: Option<objects::Counts>,
}

/// Checks that a dataset name is usable as a table name and a directory
/// name. Capitals are refused: SQL folds unquoted names to lowercase, so
/// `Pets` could be ingested and never queried as written.
pub fn validate_dataset_name(name: &str) -> Result<()> {
    let ok = name.len() <= 128
        && name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    if ok {
        Ok(())
    } else {
        // The name is echoed, but never more than a line of it.
        let shown: String = name.chars().take(64).collect();
        let more = if name.chars().count() > 64 { "…" } else { "" };
        Err(StorageError::InvalidDatasetName(format!("{shown}{more}")))
    }
}

/// The largest object sluice can read back: a sample is one value of an
/// Arrow `BinaryArray`, whose offsets are `i32`.
pub const MAX_OBJECT_BYTES: u64 = i32::MAX as u64;

/// Why an object of `len` bytes is refused.
pub(crate) fn too_large(len: u64) -> String {
    format!("{len} bytes, over the largest object sluice can read back ({MAX_OBJECT_BYTES} bytes)")
}

/// Objects loaded per blocking task.
pub(crate) const LOAD_GROUP: usize = 32;

/// Ingests `source` as a new version of `dataset`: [`prepare`], then
/// [`Prepared::commit`].
pub async fn ingest(
    store: &Arc<Store>,
    dataset: &str,
    source: IngestSource,
    opts: IngestOptions,
) -> Result<IngestReport> {
    prepare(store, dataset, source, opts).await?.commit()
}

/// Steps 1 to 4 of an ingest: every object is on the device and the
/// version's metadata is written, but nothing is visible until
/// [`Prepared::commit`]; dropping the result instead leaves no trace (its
/// chunks are free again, its metadata file removed). The store takes no
/// other ingest meanwhile. A dataset spread over several storage nodes is
/// ingested so: every node prepares its part, and the parts are committed
/// only when all are prepared.
pub async fn prepare(
    store: &Arc<Store>,
    dataset: &str,
    source: IngestSource,
    opts: IngestOptions,
) -> Result<Prepared> {
    validate_dataset_name(dataset)?;
    opts.on_error
        .for_ingest()
        .map_err(|reason| StorageError::BadSource {
            path: source.describe().into(),
            reason,
        })?;
    let started = Instant::now();
    let guard = store.lock_ingest_owned().await;
    let source_desc = match opts.shard {
        Some(s) => format!("{} (shard {s})", source.describe()),
        None => source.describe(),
    };
    let scratch = Some(store.data_dir().to_owned());
    let remote = match &source {
        IngestSource::Objects(o) => Some(Arc::clone(o)),
        _ => None,
    };
    let mut enumerated = enumerate(source, opts.confine.clone(), opts.shard, scratch).await?;
    // Keys are checked over what this node enumerated: the whole source
    // when the part is every N-th sample, its own files when shard files
    // are split by file (a key repeated in two nodes' files is not seen).
    groups::refuse_duplicate_keys(&mut enumerated.entries);
    if let Some(s) = opts.shard.filter(|_| !enumerated.part_only) {
        enumerated = enumerated.keep_part(s)?;
    }
    let version = store.catalog().next_version(dataset)?;
    let mut writer = ExtentWriter::new(
        Arc::clone(store.device()),
        store.space_map().reserve(),
        store.chunk_size(),
        dataset,
    );
    let entries = std::mem::take(&mut enumerated.entries);
    let (entries, mut resume) =
        Resume::start(store, dataset, &source_desc, remote.as_ref(), entries).await?;
    let total = entries.len() as u64;
    let shards = OpenShards::pinned(std::mem::take(&mut enumerated.inflated));
    let loaded = groups::loaded(entries, shards, opts.confine.clone());
    let written = write_loaded(dataset, &opts, &mut writer, loaded, total, &mut resume).await;
    let (rows, skipped) = match written {
        Ok(written) => written,
        Err(e) => return Err(resume.keep_failed(store, dataset, writer, e).await),
    };
    if rows.is_empty() {
        return Err(StorageError::EmptyIngest(dataset.to_owned()));
    }
    let (mut runs, reservation) = writer.finish().await?;
    // The objects taken from a failed run's record are in its chunks.
    runs.splice(0..0, resume.prior_runs());
    let (resumed, resumed_bytes) = resume.resumed();
    let kept = resume.into_kept(runs.clone());
    let bytes = rows.bytes;
    let meta = rows.finish(&enumerated.user_fields, &enumerated.user_columns)?;
    seal(Sealing {
        store: Arc::clone(store),
        guard,
        dataset: dataset.to_owned(),
        version,
        schema: meta.schema,
        batches: vec![meta.batch],
        runs,
        reservation,
        source: source_desc,
        bytes,
        skipped,
        columns: meta.columns,
        started,
        requests: remote.map(|o| objects::Counts {
            resumed,
            resumed_bytes,
            ..o.counts()
        }),
        kept,
    })
    .await
}

/// Writes each loaded object, in source order, through `writer` (one
/// kept from a failed run is on the device already); returns the rows of
/// those accepted and those skipped, and tells `resume` of each accepted
/// (which keeps a record of them from time to time).
/// A bad object is skipped (named) or ends the ingest, by
/// `opts.on_error`; `opts.progress` hears after each of the `total`.
async fn write_loaded(
    dataset: &str,
    opts: &IngestOptions,
    writer: &mut ExtentWriter,
    loaded: impl futures::Stream<Item = Result<groups::Group>>,
    total: u64,
    resume: &mut Resume,
) -> Result<(Rows, Vec<Skipped>)> {
    let mut rows = Rows::default();
    let mut skipped = Vec::new();
    let mut refuse = |key: String, reason: String| match opts.on_error {
        // (`null` was refused before the ingest began.)
        OnError::Skip | OnError::Null => {
            tracing::info!("dataset '{dataset}': skipping '{key}': {reason}");
            skipped.push(Skipped { key, reason });
            Ok(())
        }
        OnError::Fail => Err(StorageError::BadSample {
            dataset: dataset.to_owned(),
            key,
            reason,
        }),
    };
    let mut loaded = std::pin::pin!(loaded);
    let mut done = 0u64;
    while let Some(group) = loaded.next().await {
        let (group, _permit) = group?;
        for (key, result) in group {
            let row = done;
            done += 1;
            match result {
                Ok(obj) => {
                    let (extent, crc) = match obj.body {
                        Body::Memory { bytes, crc } => (writer.append(&bytes).await?, Ok(crc)),
                        Body::File { file, len } => stream_file(writer, file, len).await?,
                        Body::Kept { extent, crc } => (extent, Ok(crc)),
                    };
                    match crc {
                        Ok(crc) => {
                            let stamp = obj.stamp.as_deref();
                            resume.accepted(row, &key, &obj.probed, &extent, crc, stamp);
                            rows.push(row, &key, &obj.probed, &extent, crc);
                        }
                        Err(reason) => refuse(key, reason)?,
                    }
                }
                Err(reason) => refuse(key, reason)?,
            }
            if let Some(p) = &opts.progress {
                p(Progress {
                    done,
                    total,
                    bytes: rows.bytes,
                });
            }
        }
        // From a store, what is durable so far survives this process.
        resume.keep_so_far(writer).await?;
    }
    Ok((rows, skipped))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Backend;
    use crate::store::StoreOptions;

    /// `null` is a query's policy: an ingest given it is refused before
    /// it reads an object, naming the policy, and commits nothing.
    #[tokio::test]
    async fn an_ingest_refuses_the_null_policy_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&StoreOptions {
            backend: Backend::File,
            device_size: 16 << 20,
            ..StoreOptions::new(dir.path())
        })
        .unwrap();
        let source = IngestSource::Memory(vec![("a".into(), b"x".to_vec())]);
        let err = ingest(
            &store,
            "d",
            source,
            IngestOptions::with_policy(OnError::Null),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("'null'"), "{err}");
        assert_eq!(store.catalog().next_version("d").unwrap(), 1);
    }
}
