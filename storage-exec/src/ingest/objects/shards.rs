//! NodeShare files in an object store: WebDataset tars and TFRecord files,
//! read as the local ones are (`crate::ingest::shard_files`), through a
//! stream instead of a file.
//!
//! Each shard is read once from start to end by one streamed GET
//! ([`StreamRead`]), on the blocking pool, a few shards at once: the
//! tar headers (or the TFRecord framing) and the small members that
//! become columns are parsed as the bytes pass, and each object member
//! is kept as its byte range in the shard, not its bytes. The objects are
//! then fetched by ranged GETs when their load group comes
//! (`super::fetch`), the ranges of one shard in one group coalesced into
//! few requests. So a shard is never held whole, in memory or on a disk,
//! at the cost of reading its object bytes twice from the store (once
//! passed over, once fetched); a store that stops mid-stream is resumed
//! from the byte it reached, up to `super::fetch::BODY_TRIES` times.
//!
//! With a storage node's part of N, and at least N shards, the node reads
//! the shards at positions ≡ I mod N of the name order only, as it does
//! locally. Parquet shards are read by column chunk instead
//! (`super::parquet_shards`). A gzipped tar has no ranges: its one stream
//! is inflated, as it arrives, into an unlinked file in the scratch
//! directory (the data dir), as a local `.tar.gz` is
//! (`shard_files::inflate`), and its objects are read out of that file:
//! its bytes come from the store once, and never wait whole in memory.

use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetRange};

use super::ObjectSource;
use super::faults::{BODY_TRIES, store_error};
use super::parquet_shards;
pub(super) use super::shard_object::ShardObject;
use crate::error::{Result, StorageError};
use crate::ingest::entries::{Enumerated, Origin};
use crate::ingest::node_share::NodeShare;
use crate::ingest::shard_files::{self, Sample, ShardKind, tfrecord, webdataset};

/// Shards streamed at once.
const SHARDS_AT_ONCE: usize = 4;

/// An inflated shard's file, pinned under the shard's URL.
type Inflated = (PathBuf, Arc<std::fs::File>);

impl ObjectSource {
    /// The samples of `shards` (sorted by name), or of this node's files
    /// among them (see the module docs); a gzipped tar is inflated into
    /// `scratch`.
    pub(super) async fn enumerate_shards(
        self: Arc<Self>,
        shards: Vec<ShardObject>,
        part: Option<NodeShare>,
        scratch: PathBuf,
    ) -> Result<Enumerated> {
        // A compressed tar of a kind sluice does not inflate (`.tar.zst`).
        if let Some(why) = shards
            .iter()
            .find_map(|s| ShardKind::of(&s.name).and_then(std::result::Result::err))
        {
            return Err(self.bad(why));
        }
        let (shards, part_only) = NodeShare::own_files(part, shards);
        let per_shard: Vec<(Vec<Sample>, Option<Inflated>)> = futures::stream::iter(shards)
            .map(|shard| {
                let source = Arc::clone(&self);
                let scratch = scratch.clone();
                async move {
                    match shard.kind {
                        ShardKind::Parquet => {
                            Ok((parquet_shards::samples(source, shard).await?, None))
                        }
                        ShardKind::TarGz => source.gzipped_samples(shard, scratch).await,
                        _ => Ok((source.shard_samples(shard).await?, None)),
                    }
                }
            })
            .buffered(SHARDS_AT_ONCE)
            .try_collect()
            .await?;
        let mut samples = Vec::new();
        let mut inflated = Vec::new();
        for (shard, file) in per_shard {
            samples.extend(shard);
            inflated.extend(file);
        }
        Ok(shard_files::gather(samples, part_only, inflated))
    }

    /// A gzipped tar's samples: its stream inflated into an unlinked file
    /// in `scratch` (resumed where the store broke it), its headers read
    /// from that file, its objects left as ranges of it (the file comes
    /// back pinned under the shard's URL). A stream that is no gzip, or a
    /// tar too large for the scratch disk, is that shard's refusal; the
    /// store failing is the ingest's.
    async fn gzipped_samples(
        self: Arc<Self>,
        shard: ShardObject,
        scratch: PathBuf,
    ) -> Result<(Vec<Sample>, Option<Inflated>)> {
        let name = shard.name.clone();
        self.read_streamed(&shard, move |reader, path| {
            let mut out = Vec::new();
            match shard_files::inflated_tar(reader, &scratch) {
                Ok((tar, pinned)) => {
                    webdataset::samples(&path, &name, tar, &mut out);
                    (out, Some((path, Arc::new(pinned))))
                }
                Err(reason) => (vec![Sample::whole_shard(&name, reason)], None),
            }
        })
        .await
    }

    /// One shard's samples, their objects as ranges of it.
    async fn shard_samples(self: Arc<Self>, shard: ShardObject) -> Result<Vec<Sample>> {
        let (name, kind, size) = (shard.name.clone(), shard.kind, shard.size);
        let mut samples = self
            .read_streamed(&shard, move |reader, path| {
                let mut out = Vec::new();
                match kind {
                    ShardKind::TfRecord => tfrecord::samples_from(&path, &name, reader, &mut out),
                    _ => webdataset::samples_from(&path, &name, reader, size, &mut out),
                }
                out
            })
            .await?;
        for s in &mut samples {
            if let Origin::Range { offset, len, .. } = s.origin {
                s.origin = Origin::Object {
                    source: Arc::clone(&self),
                    location: shard.location.clone(),
                    size: Some(len),
                    range: Some(offset..offset + len),
                    stamp: shard.stamp.clone(),
                };
            }
        }
        Ok(samples)
    }

    /// Runs `read` over `shard`'s one stream ([`StreamRead`]) on the
    /// blocking pool, with the shard's URL as its path; the store failing
    /// mid-stream (past the resumptions) is the ingest's error, naming
    /// the shard.
    async fn read_streamed<T: Send + 'static>(
        self: &Arc<Self>,
        shard: &ShardObject,
        read: impl FnOnce(&mut StreamRead<'_>, PathBuf) -> T + Send + 'static,
    ) -> Result<T> {
        let url = self.url.of_key(shard.location.as_ref());
        let handle = tokio::runtime::Handle::current();
        let source = Arc::clone(self);
        let (location, size) = (shard.location.clone(), shard.size);
        let (out, failure) = tokio::task::spawn_blocking(move || {
            let mut reader = StreamRead::new(handle, &source, &location, size);
            let out = read(&mut reader, PathBuf::from(&url));
            (out, reader.failure)
        })
        .await
        .map_err(|e| StorageError::io("list", ".", std::io::Error::other(e)))?;
        match failure {
            Some(why) => Err(StorageError::BadSource {
                path: self.url.of_key(shard.location.as_ref()).into(),
                reason: format!("its store failed while the shard was read: {why}"),
            }),
            None => Ok(out),
        }
    }
}

/// A shard read as one stream, resumed where it broke (see the module
/// docs); `failure` says why it ended early, when the store failed.
struct StreamRead<'a> {
    handle: tokio::runtime::Handle,
    source: &'a ObjectSource,
    location: &'a ObjectPath,
    stream: Option<BoxStream<'static, object_store::Result<Bytes>>>,
    buf: Bytes,
    at: u64,
    size: u64,
    tries: u32,
    failure: Option<String>,
}

impl<'a> StreamRead<'a> {
    /// A reader of the `size` bytes at `location`, from the start.
    fn new(
        handle: tokio::runtime::Handle,
        source: &'a ObjectSource,
        location: &'a ObjectPath,
        size: u64,
    ) -> Self {
        Self {
            handle,
            source,
            location,
            stream: None,
            buf: Bytes::new(),
            at: 0,
            size,
            tries: 0,
            failure: None,
        }
    }

    /// The stream from byte `at` on: the whole object at first (a plain
    /// HTTP server need not answer ranges), a range only to resume.
    fn open(&mut self) -> std::result::Result<(), String> {
        let options = GetOptions {
            range: (self.at > 0).then_some(GetRange::Offset(self.at)),
            ..Default::default()
        };
        let got = self
            .handle
            .block_on(self.source.store.get_opts(self.location, options))
            .map_err(|e| store_error(&e))?;
        self.stream = Some(got.into_stream());
        Ok(())
    }

    /// Counts a failed stream and waits before the next try; `Err` once
    /// the tries are spent.
    fn broke(&mut self, why: String) -> std::io::Result<()> {
        self.stream = None;
        self.tries += 1;
        if self.tries >= BODY_TRIES {
            self.failure = Some(why.clone());
            return Err(std::io::Error::other(why));
        }
        self.source.tally.body_failed();
        tracing::info!(
            "{}: the stream broke at byte {} ({why}); resuming there",
            self.location,
            self.at
        );
        std::thread::sleep(Duration::from_millis(200 << self.tries));
        Ok(())
    }
}

impl Read for StreamRead<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        loop {
            if !self.buf.is_empty() {
                let n = out.len().min(self.buf.len());
                out[..n].copy_from_slice(&self.buf[..n]);
                self.buf.advance(n);
                self.at += n as u64;
                return Ok(n);
            }
            if self.at >= self.size || out.is_empty() {
                return Ok(0);
            }
            if self.stream.is_none()
                && let Err(why) = self.open()
            {
                self.broke(why)?;
                continue;
            }
            let next = match self.stream.as_mut() {
                Some(stream) => self.handle.block_on(stream.next()),
                None => continue,
            };
            match next {
                Some(Ok(bytes)) => self.buf = bytes,
                Some(Err(e)) => self.broke(store_error(&e))?,
                None => {
                    let why = format!("the stream ended at byte {} of {}", self.at, self.size);
                    self.broke(why)?;
                }
            }
        }
    }
}
