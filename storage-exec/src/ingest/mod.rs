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
//! A crash before step 5 leaves no trace that matters: the chunks are owned
//! by nobody (free again at the next open) and the metadata file by no
//! version (an orphan that `sluice gc` removes; opening deletes nothing).
//! A crash after it leaves a complete version.
//!
//! Modules:
//! - `confine`: `Confinement`: ingest reads only beneath the roots it was
//!   given;
//! - `copy`: a storage node's side of moving replicas;
//! - `parts`: a storage node's side of an ingest spread over several nodes;
//! - `pending`: `PendingIngests`: a storage node's prepared ingest parts,
//!   waiting for their coordinator's word;
//! - `prepared`: `Prepared`: an ingest whose objects and metadata are written
//!   but whose version is not yet committed;
//! - `node_share`: `NodeShare`: one of N storage nodes' part of a source;
//! - `version`: the last step of every way a version is written;
//! - `writer`: `ExtentWriter`: packs objects tightly into chunks and writes
//!   them.

mod confine;
mod copy;
mod entries;
mod node_share;
pub mod objects;
mod parts;
mod pending;
mod prepared;
pub mod shard_files;
mod source;
mod version;
mod writer;

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{ArrayRef, RecordBatch, StringBuilder, UInt32Builder, UInt64Builder};
use arrow::compute::take;
use futures::StreamExt;

pub use confine::Confinement;
pub use node_share::NodeShare;
pub use pending::PendingIngests;
pub use prepared::Prepared;
pub use source::IngestSource;
pub use writer::{Extent, ExtentWriter};

use self::shard_files::{OpenShards, Readers};
use self::version::{Sealing, seal};
use crate::error::{Result, StorageError};
use crate::metadata::{ProbedColumns, metadata_schema};
use crate::store::Store;
use entries::{Entry, Origin};
use sluice_udfs::probe::{Probe, probe, probe_file};
use source::enumerate;

/// What to do with an object that cannot be ingested.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnError {
    /// Leave it out, count it and name it in the report.
    #[default]
    Skip,
    /// Abort the ingest; nothing is committed.
    Fail,
}

impl std::str::FromStr for OnError {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "skip" => Ok(Self::Skip),
            "fail" => Ok(Self::Fail),
            other => Err(format!(
                "unknown error policy '{other}' (expected skip or fail)"
            )),
        }
    }
}

impl std::fmt::Display for OnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Skip => "skip",
            Self::Fail => "fail",
        })
    }
}

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
#[derive(Default)]
pub struct IngestOptions {
    /// Policy for bad objects.
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

/// An object read and probed, waiting for the writer.
struct Loaded {
    body: Body,
    probed: Probe,
}

/// An object's bytes: in memory, or (a large file) still in the file,
/// streamed into the device a piece at a time.
enum Body {
    Memory { bytes: Vec<u8>, crc: u32 },
    File { file: std::fs::File, len: u64 },
}

/// The largest object sluice can read back: a sample is one value of an
/// Arrow `BinaryArray`, whose offsets are `i32`.
pub const MAX_OBJECT_BYTES: u64 = i32::MAX as u64;

/// Files larger than this are streamed into the device rather than read
/// whole, in pieces of [`PIECE_BYTES`].
const STREAM_ABOVE: u64 = 16 << 20;
const PIECE_BYTES: usize = 4 << 20;

/// Why an object of `len` bytes is refused.
pub(crate) fn too_large(len: u64) -> String {
    format!("{len} bytes, over the largest object sluice can read back ({MAX_OBJECT_BYTES} bytes)")
}

/// Opens a source file, refusing a symbolic link: a link inside an ingest
/// root may point anywhere on the host (`/etc/passwd`), and is never
/// followed.
fn open_no_follow(path: &Path) -> std::result::Result<std::fs::File, String> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => "a symbolic link (links are not followed)".to_string(),
            _ => format!("cannot read {}: {e}", path.display()),
        })
}

/// Opens a source file (beneath the roots of `confine`, when set) and
/// returns it with its length, refusing one over [`MAX_OBJECT_BYTES`]
/// before reading a byte of it.
fn open_source(
    path: &Path,
    confine: Option<&Confinement>,
) -> std::result::Result<(std::fs::File, u64), String> {
    let f = match confine {
        Some(c) => c.open(path)?,
        None => open_no_follow(path)?,
    };
    let meta = f
        .metadata()
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    if meta.len() > MAX_OBJECT_BYTES {
        return Err(too_large(meta.len()));
    }
    Ok((f, meta.len()))
}

/// Why a file whose length was `len` when opened is refused after `got`
/// bytes (fewer: it shrank; more: it grew): an object is the file as it
/// was when opened, or nothing.
fn changed(len: u64, got: u64) -> String {
    let how = if got < len { "shrank" } else { "grew" };
    format!("the file {how} while it was read ({len} bytes when opened)")
}

/// Reads a whole (small) source file, `len` bytes as opened.
fn read_whole(f: std::fs::File, len: u64, path: &Path) -> std::result::Result<Vec<u8>, String> {
    use std::io::Read;
    let mut out = Vec::with_capacity(len as usize);
    f.take(len + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if out.len() as u64 != len {
        return Err(changed(len, out.len() as u64));
    }
    Ok(out)
}

fn load(
    entry: Entry,
    confine: Option<&Confinement>,
    shards: &Readers,
) -> (String, std::result::Result<Loaded, String>) {
    let bytes = match entry.origin {
        Origin::Inline(b) if b.len() as u64 > MAX_OBJECT_BYTES => {
            return (entry.key, Err(too_large(b.len() as u64)));
        }
        Origin::Inline(b) => b,
        Origin::Refused(reason) => return (entry.key, Err(reason)),
        // Fetched by its group before it is loaded (`objects::fetch_group`).
        Origin::Object { location, .. } => {
            return (entry.key, Err(format!("{location} was not fetched")));
        }
        Origin::Range { len, .. } if len > MAX_OBJECT_BYTES => {
            return (entry.key, Err(too_large(len)));
        }
        Origin::Range { path, offset, len } => {
            let open = || match confine {
                Some(c) => c.open(&path),
                None => open_no_follow(&path),
            };
            match shards.files.read(&path, offset, len, open) {
                Ok(bytes) => bytes,
                Err(reason) => return (entry.key, Err(reason)),
            }
        }
        Origin::Cell {
            path,
            row_group,
            row,
        } => match shards.row_groups.object(&path, row_group, row, confine) {
            Ok(bytes) => bytes,
            Err(reason) => return (entry.key, Err(reason)),
        },
        Origin::Path(p) => {
            let opened = open_source(&p, confine).and_then(|(f, len)| {
                if len <= STREAM_ABOVE {
                    return read_whole(f, len, &p).map(Ok);
                }
                let probed = f
                    .try_clone()
                    .map_err(|e| format!("cannot read {}: {e}", p.display()))
                    .and_then(probe_file)?;
                Ok(Err(Loaded {
                    body: Body::File { file: f, len },
                    probed,
                }))
            });
            match opened {
                Ok(Ok(bytes)) => bytes,
                Ok(Err(streamed)) => return (entry.key, Ok(streamed)),
                Err(reason) => return (entry.key, Err(reason)),
            }
        }
    };
    let result = probe(&bytes).map(|probed| Loaded {
        body: Body::Memory {
            crc: crc32c::crc32c(&bytes),
            bytes,
        },
        probed,
    });
    (entry.key, result)
}

/// Streams `len` bytes of `file` into the writer as one object and returns
/// its extent and crc32c. Memory holds one piece, read and checksummed on
/// the blocking pool. A file that fails to read, shrinks or grows
/// meanwhile is this object's error (the inner one): its extent is filled
/// with zeros and left to nobody, so the writer stays whole; a device
/// error is the ingest's (the outer one).
async fn stream_file(
    writer: &mut ExtentWriter,
    file: std::fs::File,
    len: u64,
) -> Result<(Extent, std::result::Result<u32, String>)> {
    let extent = writer.begin(len).await?;
    let mut piece = Piece {
        file,
        buf: Vec::with_capacity(PIECE_BYTES),
        crc: Ok(0),
        len,
    };
    let mut left = len;
    while left > 0 {
        let want = left.min(PIECE_BYTES as u64) as usize;
        piece = tokio::task::spawn_blocking(move || piece.next(want))
            .await
            .map_err(|e| StorageError::io("read", ".", std::io::Error::other(e)))?;
        writer.put(&piece.buf).await?;
        left -= want as u64;
    }
    let piece = tokio::task::spawn_blocking(move || piece.end())
        .await
        .map_err(|e| StorageError::io("read", ".", std::io::Error::other(e)))?;
    Ok((extent, piece.crc))
}

/// A file being streamed: its next piece, and its crc32c so far or why
/// it was refused.
struct Piece {
    file: std::fs::File,
    buf: Vec<u8>,
    crc: std::result::Result<u32, String>,
    /// The file's length when it was opened.
    len: u64,
}

impl Piece {
    /// Reads the next `want` bytes into the buffer (zeros once the file
    /// has failed) and folds them into the crc.
    fn next(mut self, want: usize) -> Self {
        use std::io::Read;
        self.buf.clear();
        self.buf.resize(want, 0);
        if let Ok(crc) = self.crc {
            self.crc = match self.file.read_exact(&mut self.buf) {
                Ok(()) => Ok(crc32c::crc32c_append(crc, &self.buf)),
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    Err(changed(self.len, 0))
                }
                Err(e) => Err(format!("cannot read: {e}")),
            };
            if self.crc.is_err() {
                self.buf.fill(0);
            }
        }
        self
    }

    /// Checks that the file ends where it ended when opened.
    fn end(mut self) -> Self {
        use std::io::Read;
        if self.crc.is_ok() && self.file.read(&mut [0u8; 1]).is_ok_and(|n| n > 0) {
            self.crc = Err(changed(self.len, self.len + 1));
        }
        self
    }
}

/// Objects loaded per blocking task, and tasks in flight.
pub(crate) const LOAD_GROUP: usize = 32;
const LOAD_TASKS: usize = 4;
/// Bytes of loaded objects held at once, waiting for the writer: a group
/// takes its size in permits (at most all of them) before it is read and
/// gives them back once written, so memory stays near this bound whatever
/// the files' sizes (a file over [`STREAM_ABOVE`] is streamed, and counts
/// as that much).
const LOAD_BUDGET: u64 = 256 << 20;
/// Bytes of a store's objects one load group fetches, at most (its last
/// object may bring it past: a group ends after it). With the budget,
/// memory holds the budget's bytes or, at most, one group whose large
/// object takes the whole budget (an object of a store over 16 MiB is
/// fetched whole, not streamed into the device as a local file is).
const GROUP_FETCH_BYTES: u64 = 64 << 20;

/// Marks every entry whose key an earlier entry already has: keys are
/// unique within a version by construction, and a duplicate is refused,
/// named, never silently merged.
fn refuse_duplicate_keys(entries: &mut [Entry]) {
    let mut seen: std::collections::HashMap<String, usize> =
        std::collections::HashMap::with_capacity(entries.len());
    for (i, e) in entries.iter_mut().enumerate() {
        match seen.get(&e.key) {
            Some(first) => {
                e.origin = Origin::Refused(format!(
                    "duplicate key: row {} of the source has the same key (keys are unique \
                     within a version; give one a 'key' in the manifest, or rename it)",
                    first + 1
                ));
            }
            None => {
                seen.insert(e.key.clone(), i);
            }
        }
    }
}

/// Bytes a group will hold once loaded, from the files' sizes (not
/// following links; a file that cannot be stat'ed counts as empty and is
/// refused by the loader).
fn group_bytes(group: &[Entry]) -> u64 {
    group
        .iter()
        .map(|e| match &e.origin {
            Origin::Inline(b) => b.len() as u64,
            Origin::Path(p) => std::fs::symlink_metadata(p)
                .map(|m| m.len().min(STREAM_ABOVE))
                .unwrap_or(0),
            Origin::Range { len, .. } => (*len).min(LOAD_BUDGET),
            // Held whole once fetched (see `GROUP_FETCH_BYTES`).
            Origin::Object {
                size: Some(size), ..
            } => *size,
            // Unknown until fetched (a manifest's row): as small objects
            // are, bounded by the group's count.
            Origin::Object { size: None, .. } => 0,
            // Unknown until its row group is decoded; those decoded are
            // bounded by the row groups `Readers` keeps.
            Origin::Cell { .. } | Origin::Refused(_) => 0,
        })
        .sum()
}

/// `entries` in load groups: a group ends at [`LOAD_GROUP`] entries, or
/// after the object of a store that brings its fetched bytes to
/// [`GROUP_FETCH_BYTES`]. A store's object is held whole once fetched,
/// so a large one rides in a small group, whose bytes (over the budget)
/// then hold every permit until written.
fn load_groups(mut entries: impl Iterator<Item = Entry>) -> impl Iterator<Item = Vec<Entry>> {
    std::iter::from_fn(move || {
        let mut group = Vec::with_capacity(LOAD_GROUP);
        let mut fetched = 0u64;
        while group.len() < LOAD_GROUP && fetched < GROUP_FETCH_BYTES {
            let Some(entry) = entries.next() else { break };
            if let Origin::Object { size, range, .. } = &entry.origin {
                fetched += range
                    .as_ref()
                    .map_or(size.unwrap_or(0), |r| r.end - r.start);
            }
            group.push(entry);
        }
        (!group.is_empty()).then_some(group)
    })
}

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
    refuse_duplicate_keys(&mut enumerated.entries);
    if let Some(s) = opts.shard.filter(|_| !enumerated.part_only) {
        enumerated = enumerated.keep_part(s)?;
    }
    let total = enumerated.entries.len() as u64;
    let version = store.catalog().next_version(dataset)?;

    let mut writer = ExtentWriter::new(
        Arc::clone(store.device()),
        store.space_map().reserve(),
        store.chunk_size(),
        dataset,
    );
    let mut keys = StringBuilder::new();
    let mut probed = ProbedColumns::default();
    let (mut chunks, mut offsets, mut lengths) = (
        UInt64Builder::new(),
        UInt64Builder::new(),
        UInt64Builder::new(),
    );
    let mut crcs = UInt32Builder::new();
    let mut accepted: Vec<u64> = Vec::with_capacity(enumerated.entries.len());
    let mut skipped = Vec::new();
    let mut bytes_total = 0u64;
    let mut done = 0u64;

    // Objects are loaded in groups on the blocking pool, a few groups ahead
    // of the writer, and appended in source order. Each group first takes
    // its bytes from the load budget, in order (`then` is sequential), and
    // gives them back when the writer has taken the group: a later group
    // never holds permits an earlier one waits for.
    let budget = Arc::new(tokio::sync::Semaphore::new(LOAD_BUDGET as usize));
    let shards = Arc::new(Readers {
        files: OpenShards::pinned(enumerated.inflated),
        row_groups: Default::default(),
    });
    let groups = load_groups(enumerated.entries.into_iter());
    let confine = opts.confine.clone();
    let loaded = futures::stream::iter(groups)
        .then(|group| {
            let budget = Arc::clone(&budget);
            async move {
                let (group, bytes) = tokio::task::spawn_blocking(move || {
                    let bytes = group_bytes(&group);
                    (group, bytes)
                })
                .await
                .map_err(|e| StorageError::io("load", ".", std::io::Error::other(e)))?;
                let permits = bytes.clamp(1, LOAD_BUDGET) as u32;
                let permit = budget
                    .acquire_many_owned(permits)
                    .await
                    .map_err(|e| StorageError::io("load", ".", std::io::Error::other(e)))?;
                Ok::<_, StorageError>((group, permit))
            }
        })
        .map(|ready| {
            let confine = confine.clone();
            let shards = Arc::clone(&shards);
            async move {
                let (group, permit) = ready?;
                let group = objects::fetch_group(group).await?;
                let results = tokio::task::spawn_blocking(move || {
                    group
                        .into_iter()
                        .map(|e| load(e, confine.as_deref(), &shards))
                        .collect::<Vec<_>>()
                })
                .await
                .map_err(|e| StorageError::io("load", ".", std::io::Error::other(e)))?;
                Ok::<_, StorageError>((results, permit))
            }
        })
        .buffered(LOAD_TASKS);
    let mut loaded = std::pin::pin!(loaded);

    // A bad object is skipped (named) or ends the ingest, by policy.
    let mut refuse = |key: String, reason: String| match opts.on_error {
        OnError::Skip => {
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
    while let Some(group) = loaded.next().await {
        let (group, _permit) = group?;
        for (key, result) in group {
            let row = done;
            done += 1;
            match result {
                Ok(obj) => {
                    let (extent, crc) = match obj.body {
                        Body::Memory { bytes, crc } => (writer.append(&bytes).await?, Ok(crc)),
                        Body::File { file, len } => stream_file(&mut writer, file, len).await?,
                    };
                    match crc {
                        Ok(crc) => {
                            keys.append_value(&key);
                            probed.append(&obj.probed);
                            chunks.append_value(extent.chunk);
                            offsets.append_value(extent.offset);
                            lengths.append_value(extent.length);
                            crcs.append_value(crc);
                            accepted.push(row);
                            bytes_total += extent.length;
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
                    bytes: bytes_total,
                });
            }
        }
    }
    if accepted.is_empty() {
        return Err(StorageError::EmptyIngest(dataset.to_owned()));
    }
    let (runs, reservation) = writer.finish().await?;

    // Metadata: key, user columns (rows of accepted objects), system columns.
    let schema = metadata_schema(&enumerated.user_fields);
    let column_names: Vec<String> = enumerated
        .user_fields
        .iter()
        .map(|f| f.name().clone())
        .collect();
    let indices = arrow::array::UInt64Array::from(accepted);
    let mut columns: Vec<ArrayRef> = vec![Arc::new(keys.finish())];
    for col in &enumerated.user_columns {
        columns.push(take(col.as_ref(), &indices, None)?);
    }
    columns.extend(probed.finish());
    columns.push(Arc::new(chunks.finish()));
    columns.push(Arc::new(offsets.finish()));
    columns.push(Arc::new(lengths.finish()));
    columns.push(Arc::new(crcs.finish()));
    let batch = RecordBatch::try_new(Arc::clone(&schema), columns)?;
    seal(Sealing {
        store: Arc::clone(store),
        guard,
        dataset: dataset.to_owned(),
        version,
        schema,
        batches: vec![batch],
        runs,
        reservation,
        source: source_desc,
        bytes: bytes_total,
        skipped,
        columns: column_names,
        started,
        requests: remote.map(|o| o.counts()),
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::ChunkAllocator;
    use crate::device::{DeviceOptions, create_device_file, file::FileDevice};
    use crate::space::Space;

    /// A file that shrinks or grows between its open and its last piece is
    /// that object's error, and the writer goes on whole.
    #[tokio::test]
    async fn a_file_that_changes_while_streamed_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let dev_path = dir.path().join("d.img");
        create_device_file(&dev_path, 64 << 20).unwrap();
        let dev: Arc<dyn crate::device::Device> =
            Arc::new(FileDevice::open(&dev_path, &DeviceOptions::default()).unwrap());
        let space = Space::new(ChunkAllocator::new(64)).reserve();
        let mut w = ExtentWriter::new(dev, space, 1 << 20, "t");
        let len = (PIECE_BYTES * 2 + 100) as u64;
        let path = dir.path().join("f");
        for (cut, want) in [(PIECE_BYTES as u64 + 7, "shrank"), (len + 3, "grew")] {
            std::fs::write(&path, vec![1u8; len as usize]).unwrap();
            let f = std::fs::File::open(&path).unwrap();
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .unwrap()
                .set_len(cut)
                .unwrap();
            let (extent, crc) = stream_file(&mut w, f, len).await.unwrap();
            assert_eq!(extent.length, len);
            let err = crc.unwrap_err();
            assert!(err.contains(want), "{err}");
            assert!(err.contains(&format!("{len} bytes when opened")), "{err}");
        }
        std::fs::write(&path, vec![2u8; len as usize]).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        let (_, crc) = stream_file(&mut w, f, len).await.unwrap();
        assert_eq!(crc.unwrap(), crc32c::crc32c(&vec![2u8; len as usize]));
        w.finish().await.unwrap();
    }
}
