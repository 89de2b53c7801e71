//! The bytes of an ingest's objects, fetched from their store.
//!
//! A load group's objects are fetched all at once (a Parquet shard's cells
//! by row group, `super::parquet_shards`) (the ingest keeps a few
//! groups in flight, so some hundred GETs are open), each into memory,
//! and handed to the loader as bytes, which probes and checksums them as
//! it does a local file's. An object over [`RANGE_BYTES`] is fetched in
//! ranged GETs of that size, [`RANGES_AT_ONCE`] at a time.
//!
//! Whose fault a failure is decides what it costs:
//! - the object's own (`NoSuchKey`: a manifest row naming a key that is
//!   not there; `AccessDenied` on that key; an object too large to read
//!   back; one whose length changed between listing and reading): that
//!   sample's, under the ingest's policy, as an unreadable local file is;
//! - the store's (5xx or a dropped connection after the retries, a wrong
//!   or expired credential, a missing bucket): the ingest's, which fails
//!   and commits nothing. A store that is down must never leave a version
//!   with samples silently missing.
//!
//! Above `object_store`'s own retries of each request, a fetch that still
//! failed is tried again whole, up to [`BODY_TRIES`] times, and counted as
//! a retry: a body cut off after good headers, or a connection reset
//! mid-answer, is not retried below (a store restarting drops both).

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStoreExt;
use object_store::path::Path as ObjectPath;

use super::ObjectSource;
use super::faults::{BODY_TRIES, objects_fault, store_error};
use crate::error::{Result, StorageError};
use crate::ingest::entries::{Entry, Origin};
use crate::ingest::{MAX_OBJECT_BYTES, too_large};

/// An object's bytes, and the version stamp its GET answered.
type Fetched = (Vec<u8>, Option<Arc<str>>);

/// Objects larger than this are fetched in ranges of it.
pub const RANGE_BYTES: u64 = 8 << 20;
/// Ranges of one object in flight.
pub const RANGES_AT_ONCE: usize = 4;

/// `group` with each object's origin replaced by its bytes, or by why the
/// object is refused; `Err` when the store failed (see the module docs).
/// The members of one shard in the group are fetched together, their
/// ranges coalesced by `object_store` into few requests.
pub(crate) async fn fetch_group(mut group: Vec<Entry>) -> Result<Vec<Entry>> {
    super::parquet_shards::fetch_cells(&mut group).await?;
    let mut shards: Vec<Members> = Vec::new();
    for (i, e) in group.iter_mut().enumerate() {
        let Origin::Object {
            source,
            location,
            range: Some(range),
            ..
        } = &e.origin
        else {
            continue;
        };
        if range.end - range.start > MAX_OBJECT_BYTES {
            let len = range.end - range.start;
            e.origin = Origin::Refused(too_large(len));
            continue;
        }
        let range = range.clone();
        match shards
            .iter_mut()
            .find(|m| Arc::ptr_eq(&m.source, source) && &m.location == location)
        {
            Some(m) => m.wanted.push((i, range)),
            None => shards.push(Members {
                source: Arc::clone(source),
                location: location.clone(),
                wanted: vec![(i, range)],
            }),
        }
    }
    let fetched = futures::future::try_join_all(shards.iter().map(Members::fetch)).await?;
    for (members, bytes) in shards.iter().zip(fetched) {
        for ((i, _), b) in members.wanted.iter().zip(bytes) {
            group[*i].origin = Origin::Inline(Vec::from(b));
        }
    }
    futures::stream::iter(group)
        .map(|entry| async move {
            let Origin::Object {
                source,
                location,
                size,
                range: None,
                stamp,
            } = entry.origin
            else {
                return Ok(entry);
            };
            let origin = match source.fetch(&location, size).await? {
                // No listing stamped it (a manifest's row): its GET's stamp.
                Ok((bytes, Some(got))) if stamp.is_none() => Origin::Fetched { bytes, stamp: got },
                Ok((bytes, _)) => Origin::Inline(bytes),
                Err(reason) => Origin::Refused(reason),
            };
            Ok(Entry {
                key: entry.key,
                origin,
            })
        })
        .buffered(crate::ingest::LOAD_GROUP)
        .try_collect()
        .await
}

/// The members of one shard a load group wants: (entry, range) each.
struct Members {
    source: Arc<ObjectSource>,
    location: ObjectPath,
    wanted: Vec<(usize, Range<u64>)>,
}

impl Members {
    /// Their bytes, in order; `Err` when the store failed (tried
    /// [`BODY_TRIES`] times: a shard's bytes are no sample's fault).
    async fn fetch(&self) -> Result<Vec<bytes::Bytes>> {
        let ranges: Vec<Range<u64>> = self.wanted.iter().map(|(_, r)| r.clone()).collect();
        let mut tries = 0;
        loop {
            tries += 1;
            let why = match self.source.store.get_ranges(&self.location, &ranges).await {
                Ok(got)
                    if got
                        .iter()
                        .zip(&ranges)
                        .all(|(b, r)| b.len() as u64 == r.end - r.start) =>
                {
                    return Ok(got);
                }
                Ok(_) => "the shard is shorter than when it was read".to_owned(),
                Err(e) => store_error(&e),
            };
            let url = self.source.url.of_key(self.location.as_ref());
            if tries >= BODY_TRIES {
                return Err(StorageError::BadSource {
                    path: url.into(),
                    reason: format!("its store failed: {why}"),
                });
            }
            self.source.tally.body_failed();
            tracing::info!("{url}: {why}; fetching its members again");
            tokio::time::sleep(Duration::from_millis(200 << tries)).await;
        }
    }
}

impl ObjectSource {
    /// The bytes of the object at `location` (`size` as listed, when it
    /// was), with the version stamp a whole GET answered (`None` for one
    /// fetched in ranges): `Ok(Err(reason))` for the object's fault, `Err`
    /// for the store's.
    async fn fetch(
        &self,
        location: &ObjectPath,
        size: Option<u64>,
    ) -> Result<std::result::Result<Fetched, String>> {
        let url = self.url.of_key(location.as_ref());
        if let Some(len) = size.filter(|&l| l > MAX_OBJECT_BYTES) {
            return Ok(Err(too_large(len)));
        }
        let mut tries = 0;
        loop {
            tries += 1;
            let got = match size {
                Some(len) if len > RANGE_BYTES => self.fetch_ranges(location, len).await,
                _ => self.fetch_whole(location, size).await,
            };
            match got {
                Ok(bytes) => return Ok(bytes),
                Err(Failure::Object(reason)) => return Ok(Err(format!("{url}: {reason}"))),
                Err(Failure::Body(e) | Failure::Store(e)) if tries < BODY_TRIES => {
                    self.tally.body_failed();
                    tracing::info!("{url}: {e}; fetching it again");
                    tokio::time::sleep(Duration::from_millis(200 << tries)).await;
                }
                Err(Failure::Body(e)) | Err(Failure::Store(e)) => {
                    return Err(StorageError::BadSource {
                        path: url.into(),
                        reason: format!("its store failed: {e}"),
                    });
                }
            }
        }
    }

    async fn fetch_whole(
        &self,
        location: &ObjectPath,
        size: Option<u64>,
    ) -> std::result::Result<std::result::Result<Fetched, String>, Failure> {
        let got = self.store.get(location).await.map_err(classify)?;
        let len = got.meta.size;
        if len > MAX_OBJECT_BYTES {
            return Ok(Err(too_large(len)));
        }
        let stamp = super::stamp(&got.meta);
        let bytes = got
            .bytes()
            .await
            .map_err(|e| Failure::Body(store_error(&e)))?;
        if let Some(listed) = size
            && listed != bytes.len() as u64
        {
            return Ok(Err(changed(listed, bytes.len() as u64)));
        }
        Ok(Ok((Vec::from(bytes), stamp)))
    }

    async fn fetch_ranges(
        &self,
        location: &ObjectPath,
        len: u64,
    ) -> std::result::Result<std::result::Result<Fetched, String>, Failure> {
        let ranges = (0..len.div_ceil(RANGE_BYTES))
            .map(|i| i * RANGE_BYTES..((i + 1) * RANGE_BYTES).min(len));
        let pieces: Vec<bytes::Bytes> = futures::stream::iter(ranges)
            .map(|r| async move {
                let want = r.end - r.start;
                let got = self.store.get_range(location, r).await.map_err(classify)?;
                if got.len() as u64 != want {
                    return Err(Failure::Object(changed(len, got.len() as u64)));
                }
                Ok(got)
            })
            .buffered(RANGES_AT_ONCE)
            .try_collect()
            .await?;
        let mut out = Vec::with_capacity(len as usize);
        for p in pieces {
            out.extend_from_slice(&p);
        }
        Ok(Ok((out, None)))
    }
}

/// Why one fetch failed.
enum Failure {
    /// The object's fault (see the module docs).
    Object(String),
    /// The body was cut off after a good answer.
    Body(String),
    /// The store's fault: the ingest's error once the tries are spent.
    Store(String),
}

fn classify(e: object_store::Error) -> Failure {
    let text = store_error(&e);
    if objects_fault(&e) {
        Failure::Object(text)
    } else {
        Failure::Store(text)
    }
}

fn changed(listed: u64, got: u64) -> String {
    format!("the object changed while it was read ({listed} bytes listed, {got} read)")
}
