//! [`Prepared`]: an ingest whose objects and metadata are written but
//! whose version is not yet committed — the first phase of a commit that
//! spans several storage nodes.
//!
//! A prepared ingest holds the chunks it wrote (a [`Reservation`]), the
//! metadata file it wrote, and the store's ingest lock. Committing makes
//! the version visible in one catalog transaction; dropping it for any
//! reason (an abort, a failed peer, a coordinator that never came back)
//! frees the chunks at once and removes the metadata file, so an aborted
//! part leaves nothing behind but device blocks no version names; a part
//! read from an object store keeps its objects for a re-run instead
//! (`super::resume`), so that a peer's failure costs it no download. A
//! process that dies while holding one leaves what a crashed ingest
//! leaves: free chunks at the next open and an orphan metadata file for
//! `sluice gc`.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::OwnedMutexGuard;

use super::IngestReport;
use super::resume::Kept;
use crate::catalog::VersionRecord;
use crate::error::Result;
use crate::space::Reservation;
use crate::store::Store;

/// See the module docs.
pub struct Prepared {
    store: Arc<Store>,
    record: VersionRecord,
    reservation: Reservation,
    /// What to keep for a re-run if this is dropped (`super::resume`).
    kept: Option<Kept>,
    metadata: PathBuf,
    report: IngestReport,
    committed: bool,
    _lock: OwnedMutexGuard<()>,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("dataset", &self.record.dataset)
            .field("version", &self.record.version)
            .field("samples", &self.record.samples)
            .finish_non_exhaustive()
    }
}

impl Prepared {
    pub(super) fn new(
        store: Arc<Store>,
        record: VersionRecord,
        (reservation, kept): (Reservation, Option<Kept>),
        metadata: PathBuf,
        report: IngestReport,
        lock: OwnedMutexGuard<()>,
    ) -> Self {
        Self {
            store,
            record,
            reservation,
            kept,
            metadata,
            report,
            committed: false,
            _lock: lock,
        }
    }

    /// What the version will hold once committed (its number, samples,
    /// bytes, skipped objects).
    pub fn report(&self) -> &IngestReport {
        &self.report
    }

    /// What a node answers its coordinator once it holds this version.
    pub fn part(&self) -> sluice_flight::ingest::PreparedPart {
        sluice_flight::ingest::PreparedPart {
            version: self.report.version,
            samples: self.report.samples,
            bytes: self.report.bytes,
        }
    }

    /// Makes the version visible: its record, chunk runs and the
    /// dataset's latest pointer in one catalog transaction.
    pub fn commit(mut self) -> Result<IngestReport> {
        // An empty reservation takes its place: dropping it frees nothing.
        let empty = self.store.space_map().reserve();
        let reservation = std::mem::replace(&mut self.reservation, empty);
        self.store.commit(&self.record, reservation)?;
        self.committed = true;
        Ok(self.report.clone())
    }
}

impl Drop for Prepared {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        // From an object store, its objects are kept for a re-run (their
        // chunks, the record's now); otherwise the reservation's own drop
        // frees the chunks. The metadata file is this part's only other
        // trace.
        if let Some(kept) = self.kept.take() {
            let empty = self.store.space_map().reserve();
            let reservation = std::mem::replace(&mut self.reservation, empty);
            let why = format!("version {} was not committed", self.record.version);
            kept.save(&self.store, &self.record.dataset, reservation, &why);
        }
        match std::fs::remove_file(&self.metadata) {
            Ok(()) => tracing::info!(
                "dataset '{}': version {} not committed; its part was dropped",
                self.record.dataset,
                self.record.version
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(
                "dataset '{}': cannot remove the metadata of uncommitted version {} ({}): {e}; \
                 `sluice gc` removes it",
                self.record.dataset,
                self.record.version,
                self.metadata.display()
            ),
        }
    }
}
