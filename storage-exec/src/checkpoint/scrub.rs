//! Reading checkpoint versions back, and repairing an extent
//! (`sluice_flight::checkpoint::scrub`): what a cluster's scrub does with
//! the pieces a node keeps.
//!
//! **Scrub** reads every extent of every version under a prefix (the
//! blocks covering it, O_DIRECT) and compares its crc32c with the one
//! recorded when it was written, at most at the rate asked; what does not
//! match is named, nothing is changed.
//!
//! **Repair** writes given bytes over one extent, only when their length
//! and crc32c are the extent's own, so it can only restore: the blocks
//! covering it are read, patched and written whole, flushed, and read
//! again. An extent that reads back good already is left alone.

use std::time::Instant;

use sluice_flight::checkpoint::scrub::{BadExtent, CheckpointScrub, ScrubCheckpoints};

use super::Checkpoints;
use crate::device::DeviceExt;
use crate::error::{Result, StorageError};
use crate::scrub::{pace, patch};

impl Checkpoints {
    /// The crc32c of the `len` bytes at `at` on the device.
    async fn crc_at(&self, at: u64, len: u64) -> Result<u32> {
        let (buf, inner) = self.store.device().read_covering(at, len).await?;
        Ok(crc32c::crc32c(&buf.as_slice()[inner..inner + len as usize]))
    }

    /// Reads back every version under `req.prefix` (see the module docs).
    pub async fn scrub(&self, req: &ScrubCheckpoints) -> Result<CheckpointScrub> {
        let began = Instant::now();
        let mut report = CheckpointScrub::default();
        for info in self.list(&req.prefix)? {
            // A version deleted since the listing is no longer ours to read.
            let Ok(record) = self.get(&info.name, Some(info.version)) else {
                continue;
            };
            report.versions += 1;
            for e in &record.extents {
                let actual = self.crc_at(e.device, e.len).await?;
                report.extents += 1;
                report.bytes += e.len;
                if actual != e.crc {
                    tracing::error!(
                        "scrub: checkpoint '{}' version {} bytes {}..{}: stored crc32c {:08x}, \
                         read {actual:08x}",
                        record.name,
                        record.version,
                        e.offset,
                        e.end(),
                        e.crc
                    );
                    report.bad.push(BadExtent {
                        name: record.name.clone(),
                        version: record.version,
                        offset: e.offset,
                        len: e.len,
                        expected_crc32c: e.crc,
                        actual_crc32c: actual,
                    });
                }
                pace(began, report.bytes, req.rate_bytes_per_s).await;
            }
        }
        report.seconds = began.elapsed().as_secs_f64();
        Ok(report)
    }

    /// Writes `bytes` over the extent of `name` `version` at `offset`
    /// (see the module docs); whether it was rewritten.
    pub async fn repair(
        &self,
        name: &str,
        version: u64,
        offset: u64,
        bytes: &[u8],
    ) -> Result<bool> {
        let refuse = |reason: String| StorageError::BadCheckpointRepair {
            name: name.to_string(),
            version,
            offset,
            reason,
        };
        let record = self.get(name, Some(version))?;
        let e = record
            .extents
            .iter()
            .find(|e| e.offset == offset)
            .ok_or_else(|| refuse("no extent starts there".into()))?;
        let given = crc32c::crc32c(bytes);
        if bytes.len() as u64 != e.len || given != e.crc {
            return Err(refuse(format!(
                "the bytes given ({} bytes, crc32c {given:08x}) are not the extent's ({} bytes, \
                 crc32c {:08x})",
                bytes.len(),
                e.len,
                e.crc
            )));
        }
        if self.crc_at(e.device, e.len).await? == e.crc {
            return Ok(false);
        }
        let device = self.store.device();
        patch(device, e.device, bytes).await?;
        let (again, at) = device.read_covering(e.device, e.len).await?;
        record.check(e, &again.as_slice()[at..at + e.len as usize])?;
        tracing::warn!(
            "repaired checkpoint '{name}' version {version} bytes {}..{} from another holder",
            e.offset,
            e.end()
        );
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::checkpoint::CheckpointOptions;
    use crate::{Store, StoreOptions};

    #[tokio::test]
    async fn a_flipped_byte_is_found_and_only_the_extents_own_bytes_repair_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = StoreOptions::new(dir.path());
        opts.device_size = 16 << 20;
        opts.chunk_size = 1 << 20;
        opts.cache_memory = Some(0);
        let store = Arc::new(Store::open(&opts).unwrap());
        let ck = Checkpoints::new(Arc::clone(&store), CheckpointOptions::default());
        let data: Vec<u8> = (0..(2 << 20) + 100).map(|i| (i * 7 % 251) as u8).collect();
        let id = ck.begin("run/a").unwrap();
        let piece: Result<&[u8]> = Ok(&data[..]);
        ck.write(&id, 0, futures::stream::iter([piece]))
            .await
            .unwrap();
        ck.commit(&id, data.len() as u64).await.unwrap();
        let all = ScrubCheckpoints::default();
        assert!(ck.scrub(&all).await.unwrap().bad.is_empty());

        // A byte of the second extent flipped on the device.
        let record = ck.get("run/a", None).unwrap();
        let e = record.extents[1];
        let (mut buf, inner) = store.device().read_covering(e.device, e.len).await.unwrap();
        buf.as_mut_slice()[inner + 5] ^= 0xff;
        let bs = store.device().block_size() as u64;
        store
            .device()
            .write_at(e.device / bs * bs, buf)
            .await
            .unwrap();
        let found = ck.scrub(&all).await.unwrap();
        assert_eq!(found.extents, record.extents.len() as u64);
        assert_eq!(found.bad.len(), 1);
        assert_eq!((found.bad[0].offset, found.bad[0].len), (e.offset, e.len));

        // Other bytes are refused; the extent's own restore it.
        let own = &data[e.offset as usize..e.end() as usize];
        let mut wrong = own.to_vec();
        wrong[0] ^= 1;
        let err = ck.repair("run/a", 1, e.offset, &wrong).await.unwrap_err();
        assert!(err.to_string().contains("are not the extent's"), "{err}");
        assert!(ck.repair("run/a", 1, e.offset + 1, own).await.is_err());
        assert!(ck.repair("run/a", 1, e.offset, own).await.unwrap());
        assert!(!ck.repair("run/a", 1, e.offset, own).await.unwrap());
        assert!(ck.scrub(&all).await.unwrap().bad.is_empty());
        let back: Vec<u8> = futures::TryStreamExt::try_concat(futures::StreamExt::map(
            ck.read(Arc::new(record), 0, u64::MAX),
            |b| b.map(|b| b.to_vec()),
        ))
        .await
        .unwrap();
        assert_eq!(back, data);
    }
}
