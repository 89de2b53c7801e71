//! Ingest from object stores: S3 and the S3-compatible stores (MinIO,
//! Ceph's RADOS Gateway, the gateways of WekaIO and DAOS), Google Cloud
//! Storage, Azure Blob Storage, and plain HTTP(S) stores that list.
//!
//! The client is the `object_store` crate's, the arrow-rs project's and
//! the one DataFusion reads through (so a manifest in a bucket is read by
//! the same DataFusion as a local one, and no second HTTP stack is
//! built). The modules:
//!
//! - [`address`]: the source URL and the `--ingest-url-allow` list,
//!   checked before any request is sent;
//! - `connect`: the store's client, credentials by the standard means
//!   (with `profile`, the AWS profile files), bounded retries;
//! - [`tally`]: the requests and retries, counted where they leave;
//! - `listing`: what a source holds, as entries (ImageFolder, flat, or
//!   a manifest in the store);
//! - `list_split`: a large prefix listed by its directories, several at
//!   once;
//! - `shard_object`: `ShardObject`, a shard file a listing found;
//! - `shards`: WebDataset and TFRecord shards in the store, streamed;
//! - `parquet_file`: `ParquetObject`, a Parquet object as the parquet
//!   crate's async file;
//! - `parquet_shards`: Parquet shards in the store (images inside), read by
//!   column chunk;
//! - `parquet_ranges`: `FetchedRanges`, a row group's fetched column
//!   chunks as the parquet crate's synchronous file, decoded off the
//!   runtime;
//! - `faults`: a store's errors, named, and whose fault they are;
//! - `fetch`: the objects' bytes, many GETs at once, straight into the
//!   ingest's load groups.
//!
//! Nothing is staged on a local disk: each object goes from its GET to
//! the probe, the checksum and the device. The listing is paginated
//! (1,000 keys a request on S3) and kept as one compact entry per object,
//! which the version's metadata needs anyway; the raw listing is never
//! held whole. A store's failure (5xx after the retries, refused
//! connections, a wrong credential) fails the ingest, which then commits
//! nothing; an object's own fault (a manifest row naming a missing key, a
//! corrupt image) is that sample's, under the ingest's policy.

pub mod address;
mod connect;
mod faults;
mod fetch;
mod list_split;
mod listing;
mod parquet_file;
mod parquet_ranges;
mod parquet_shards;
mod profile;
mod shard_object;
mod shards;
pub mod tally;

use std::sync::Arc;

use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};

pub use self::address::{ObjectUrl, UrlAllow};
pub(crate) use self::fetch::fetch_group;
pub use self::tally::{Counts, Tally};
use crate::error::Result;

/// What a listing (or a HEAD) says of an object's version: its ETag,
/// when the store gives one in listings, and its last-modified time.
/// With the size, what tells a re-run that an object is the one an
/// earlier run fetched (`ingest::resume`); size and time are what
/// `aws s3 sync` compares.
pub(crate) fn stamp(meta: &object_store::ObjectMeta) -> Option<Arc<str>> {
    let tag = meta.e_tag.as_deref().unwrap_or("-");
    Some(format!("{tag} {}", meta.last_modified.to_rfc3339()).into())
}

/// A source in an object store: a prefix to list, or a manifest in it.
pub struct ObjectSource {
    url: ObjectUrl,
    manifest: Option<ObjectUrl>,
    store: Arc<dyn ObjectStore>,
    tally: Arc<Tally>,
    /// Where a manifest's rows may point (a server's allow list).
    allow: Option<UrlAllow>,
    /// The Parquet shards' row groups read last (`parquet_shards`).
    row_groups: parquet_shards::RowGroupObjects,
}

impl std::fmt::Debug for ObjectSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL only: the client's own Debug would show its credentials.
        f.debug_struct("ObjectSource")
            .field("url", &self.url.to_string())
            .field("manifest", &self.manifest.as_ref().map(ToString::to_string))
            .finish_non_exhaustive()
    }
}

impl ObjectSource {
    /// The source at `url` (an already admitted one, on a server); with
    /// `manifest`, the manifest at that key below it. A `url` that names
    /// a `.csv`, `.json`, `.jsonl`, `.ndjson` or `.parquet` object is a
    /// manifest itself, its rows relative to the prefix it sits in.
    /// With `allow`, the manifest and every object it names must lie
    /// beneath the allowed prefixes. Nothing is sent until it is
    /// enumerated.
    pub fn open(url: ObjectUrl, manifest: Option<&str>, allow: Option<UrlAllow>) -> Result<Self> {
        let tally = Arc::new(Tally::default());
        let store = connect::connect(&url, &tally)?;
        let (url, manifest) = match manifest {
            Some(m) => {
                let at = url.join(m)?;
                (url, Some(at))
            }
            None if listing::is_manifest(&url.prefix) && !listing::is_glob(&url.prefix) => {
                let base = match url.prefix.rsplit_once('/') {
                    Some((dir, _)) => ObjectUrl {
                        prefix: dir.to_owned(),
                        ..url.clone()
                    },
                    None => ObjectUrl {
                        prefix: String::new(),
                        ..url.clone()
                    },
                };
                (base, Some(url))
            }
            None => (url, None),
        };
        if let (Some(allow), Some(m)) = (&allow, &manifest) {
            allow.admit(&m.to_string())?;
        }
        Ok(Self {
            url,
            manifest,
            store,
            tally,
            allow,
            row_groups: parquet_shards::RowGroupObjects::default(),
        })
    }

    /// The prefix the objects are under.
    pub fn url(&self) -> &ObjectUrl {
        &self.url
    }

    /// A short description for the catalog (no credential is in it).
    pub fn describe(&self) -> String {
        match &self.manifest {
            Some(m) => format!("manifest {m}"),
            None => format!("objects {}", self.url),
        }
    }

    /// The requests and retries so far.
    pub fn counts(&self) -> Counts {
        self.tally.counts()
    }

    /// The size and stamp of the object at `location` now, by a HEAD;
    /// `None` when it cannot be had (the object gone, the store failing:
    /// its fetch will say which).
    pub(crate) async fn head_stamp(&self, location: &ObjectPath) -> Option<(u64, Arc<str>)> {
        let meta = self.store.head(location).await.ok()?;
        Some((meta.size, stamp(&meta)?))
    }
}
