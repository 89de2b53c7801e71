//! Scrub and repair: a node reads back its objects against the checksums
//! recorded at ingest, and rewrites one whose copy here went bad with the
//! bytes of a good replica (`sluice_flight::scrub`).
//!
//! **Scrub** walks every committed version (or one dataset's), object by
//! object in row order, reading each extent (the blocks covering it, with
//! O_DIRECT like any read) and comparing its crc32c with the metadata's.
//! It reads at most `rate_bytes_per_s` (sleeping between objects), so a
//! scrub in the background leaves the device to the jobs. What does not
//! match is named; nothing is changed.
//!
//! **Repair** takes the bytes of one object from elsewhere (the
//! coordinator reads them from another holder) and writes them over the
//! object's extent — only when their length and crc32c are the ones
//! recorded at ingest, so a repair can only restore the object, never
//! change it. The blocks covering the extent are read, patched and
//! written back whole (neighbouring objects keep their bytes), then the
//! extent is read again and checked. An object that reads back good
//! already is left as it is.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{UInt32Type, UInt64Type};
use sluice_flight::scrub::{BadObject, Repaired, ScrubReport, ScrubRequest};

use crate::device::{Device, DeviceExt};
use crate::error::{Result, StorageError};
use crate::metadata::{CHUNK, CRC32C, KEY, LENGTH, OFFSET};
use crate::scan::{DatasetVersion, VersionIndex};
use crate::store::Store;

/// One object's place and checksum, from a version's metadata.
struct Extent {
    key: String,
    at: u64,
    len: u64,
    crc: u32,
}

/// The extents of `index`'s rows (device offsets).
fn extents(index: &VersionIndex, chunk_size: u64) -> Result<Vec<Extent>> {
    let m: &RecordBatch = &index.metadata;
    let col = |name: &str| {
        m.column_by_name(name).ok_or_else(|| {
            let why = format!("a version's metadata has no {name} column");
            StorageError::io("scrub", ".", std::io::Error::other(why))
        })
    };
    let keys = col(KEY)?.as_string::<i32>().clone();
    let chunks = col(CHUNK)?.as_primitive::<UInt64Type>().clone();
    let offsets = col(OFFSET)?.as_primitive::<UInt64Type>().clone();
    let lengths = col(LENGTH)?.as_primitive::<UInt64Type>().clone();
    let crcs = col(CRC32C)?.as_primitive::<UInt32Type>().clone();
    Ok((0..m.num_rows())
        .map(|r| Extent {
            key: keys.value(r).to_string(),
            at: chunks.value(r) * chunk_size + offsets.value(r),
            len: lengths.value(r),
            crc: crcs.value(r),
        })
        .collect())
}

async fn open(store: &Arc<Store>, dataset: &str, version: u64) -> Result<Vec<Extent>> {
    let store = Arc::clone(store);
    let dataset = dataset.to_string();
    tokio::task::spawn_blocking(move || {
        let v = DatasetVersion::open(Arc::clone(&store), &dataset, Some(version))?;
        let index = VersionIndex::load(&v)?;
        extents(&index, store.chunk_size())
    })
    .await
    .map_err(|e| StorageError::io("scrub", ".", std::io::Error::other(e)))?
}

/// The crc32c of the `len` bytes at `at` on `store`'s device.
async fn read_crc(store: &Store, at: u64, len: u64) -> Result<u32> {
    let (buf, inner) = store.device().read_covering(at, len).await?;
    Ok(crc32c::crc32c(&buf.as_slice()[inner..inner + len as usize]))
}

/// Sleeps until `bytes` read since `began` are within `rate` bytes a
/// second (none or 0: no limit): a scrub's pace.
pub(crate) async fn pace(began: Instant, bytes: u64, rate: Option<u64>) {
    if let Some(rate) = rate.filter(|r| *r > 0) {
        let due = Duration::from_secs_f64(bytes as f64 / rate as f64);
        if let Some(wait) = due.checked_sub(began.elapsed()) {
            tokio::time::sleep(wait).await;
        }
    }
}

/// Writes `bytes` over the device at `at`: the blocks covering them read,
/// patched and written whole (their other bytes kept), then flushed. A
/// repair's write.
pub(crate) async fn patch(device: &Arc<dyn Device>, at: u64, bytes: &[u8]) -> Result<()> {
    let (mut buf, inner) = device.read_covering(at, bytes.len() as u64).await?;
    buf.as_mut_slice()[inner..inner + bytes.len()].copy_from_slice(bytes);
    let bs = device.block_size() as u64;
    device.write_at(at / bs * bs, buf).await?;
    device.flush().await?;
    Ok(())
}

/// Reads back every object of `store` (see the module docs).
pub async fn scrub(store: &Arc<Store>, req: &ScrubRequest) -> Result<ScrubReport> {
    let began = Instant::now();
    let mut report = ScrubReport::default();
    let mut names = store.catalog().dataset_names()?;
    if let Some(d) = &req.dataset {
        // A name this node does not hold is said, not scrubbed as nothing.
        if !names.contains(d) {
            return Err(StorageError::UnknownDataset(d.clone()));
        }
        names = vec![d.clone()];
    }
    for name in names {
        for record in store.catalog().versions(&name)? {
            report.versions += 1;
            for e in open(store, &name, record.version).await? {
                let actual = read_crc(store, e.at, e.len).await?;
                report.objects += 1;
                report.bytes += e.len;
                if actual != e.crc {
                    tracing::error!(
                        "scrub: dataset {name} version {} key {}: stored crc32c {:08x}, read {actual:08x}",
                        record.version,
                        e.key,
                        e.crc
                    );
                    report.bad.push(BadObject {
                        dataset: name.clone(),
                        version: record.version,
                        key: e.key,
                        expected_crc32c: e.crc,
                        actual_crc32c: actual,
                    });
                }
                pace(began, report.bytes, req.rate_bytes_per_s).await;
            }
        }
    }
    report.seconds = began.elapsed().as_secs_f64();
    Ok(report)
}

/// Rewrites `key` of `dataset` `version` with `bytes` (see the module docs).
pub async fn repair(
    store: &Arc<Store>,
    dataset: &str,
    version: u64,
    key: &str,
    bytes: &[u8],
) -> Result<Repaired> {
    let refuse = |reason: String| StorageError::BadRepair {
        dataset: dataset.to_string(),
        version,
        key: key.to_string(),
        reason,
    };
    let extents = open(store, dataset, version).await?;
    let e = extents
        .iter()
        .find(|e| e.key == key)
        .ok_or_else(|| refuse("the version has no such key".into()))?;
    let given = crc32c::crc32c(bytes);
    if bytes.len() as u64 != e.len || given != e.crc {
        return Err(refuse(format!(
            "the bytes given ({} bytes, crc32c {given:08x}) are not the object's ({} bytes, \
             crc32c {:08x})",
            bytes.len(),
            e.len,
            e.crc
        )));
    }
    let done = |rewritten| Repaired {
        dataset: dataset.to_string(),
        version,
        key: key.to_string(),
        rewritten,
    };
    if read_crc(store, e.at, e.len).await? == e.crc {
        return Ok(done(false));
    }
    patch(store.device(), e.at, bytes).await?;
    let again = read_crc(store, e.at, e.len).await?;
    if again != e.crc {
        return Err(StorageError::ChecksumMismatch {
            dataset: dataset.to_string(),
            version,
            key: key.to_string(),
            expected: e.crc,
            actual: again,
        });
    }
    tracing::warn!("repaired dataset {dataset} version {version} key {key} from a good replica");
    Ok(done(true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{IngestOptions, IngestSource, OnError, StoreOptions};

    /// A 3000-byte object: an npy array of 2,872 `u8` of its own pattern.
    fn object(i: u8) -> Vec<u8> {
        let n = 3000 - 128;
        let mut header = format!("{{'descr': '|u1', 'fortran_order': False, 'shape': ({n},), }}");
        while (10 + header.len() + 1) % 128 != 0 {
            header.push(' ');
        }
        header.push('\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
        out.extend_from_slice(header.as_bytes());
        out.extend((0..n as u32).map(|j| (j as u8).wrapping_mul(i) ^ i));
        assert_eq!(out.len(), 3000);
        out
    }

    #[tokio::test]
    async fn a_flipped_byte_is_found_and_only_the_objects_own_bytes_repair_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = StoreOptions::new(dir.path());
        opts.device_size = 16 << 20;
        opts.chunk_size = 1 << 20;
        opts.cache_memory = Some(0);
        let store = Store::open(&opts).unwrap();
        let objects: Vec<(String, Vec<u8>)> =
            (1..=5u8).map(|i| (format!("o{i}"), object(i))).collect();
        crate::ingest(
            &store,
            "ds",
            IngestSource::Memory(objects),
            IngestOptions::with_policy(OnError::Fail),
        )
        .await
        .unwrap();
        let clean = scrub(&store, &ScrubRequest::default()).await.unwrap();
        assert_eq!((clean.versions, clean.objects, clean.bad.len()), (1, 5, 0));
        assert_eq!(clean.bytes, 5 * 3000);

        // One byte of o3, on the device.
        let path = dir.path().join("device.img");
        let mut device = std::fs::read(&path).unwrap();
        let at = device.windows(3000).position(|w| w == object(3)).unwrap();
        device[at + 1234] ^= 0x40;
        std::fs::write(&path, &device).unwrap();

        let found = scrub(&store, &ScrubRequest::default()).await.unwrap();
        assert_eq!(found.bad.len(), 1, "{:?}", found.bad);
        let bad = &found.bad[0];
        assert_eq!(
            (bad.dataset.as_str(), bad.version, bad.key.as_str()),
            ("ds", 1, "o3")
        );
        assert_ne!(bad.expected_crc32c, bad.actual_crc32c);

        // Another object's bytes, or the object's own cut short: refused.
        for wrong in [object(4), object(3)[..2999].to_vec()] {
            let e = repair(&store, "ds", 1, "o3", &wrong).await.unwrap_err();
            assert!(matches!(e, StorageError::BadRepair { .. }), "{e}");
        }
        let e = repair(&store, "ds", 1, "nope", &object(3))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("no such key"), "{e}");

        let fixed = repair(&store, "ds", 1, "o3", &object(3)).await.unwrap();
        assert!(fixed.rewritten);
        let after = scrub(&store, &ScrubRequest::default()).await.unwrap();
        assert!(after.bad.is_empty(), "{:?}", after.bad);
        // The neighbours kept their bytes; a second repair has nothing to do.
        let device = std::fs::read(&path).unwrap();
        for i in 1..=5 {
            assert!(device.windows(3000).any(|w| w == object(i)), "o{i}");
        }
        assert!(
            !repair(&store, "ds", 1, "o3", &object(3))
                .await
                .unwrap()
                .rewritten
        );

        // At a bounded rate the scrub takes its time: 15 kB at 30 kB/s.
        let slow = ScrubRequest {
            dataset: Some("ds".into()),
            rate_bytes_per_s: Some(30_000),
        };
        let began = Instant::now();
        scrub(&store, &slow).await.unwrap();
        assert!(
            began.elapsed() >= Duration::from_millis(400),
            "{:?}",
            began.elapsed()
        );
    }
}
