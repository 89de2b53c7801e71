//! Records kept while an ingest from a store goes on, so that a process
//! killed mid-ingest loses only its last seconds (see `super`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Resume;
use super::record::{Addition, save};
use crate::alloc::{ChunkRun, subtract};
use crate::error::Result;
use crate::ingest::entries::KeptObject;
use crate::ingest::writer::ExtentWriter;

/// The least time between two records kept while an ingest runs (see the
/// module docs).
pub(super) const KEEP_EVERY: Duration = Duration::from_secs(2);

/// A record kept costs the ingest at most one part in this many of its
/// time: the next waits this many times as long as the last save took.
const KEEP_SHARE: u32 = 20;

impl Resume {
    /// Saves a record of what is durable so far, when it is time (see the
    /// module docs); the ingest goes on after. A device that fails its
    /// flush fails the ingest; a record that cannot be saved only logs
    /// (the ingest's chunks stay its own).
    pub(crate) async fn keep_so_far(&mut self, writer: &mut ExtentWriter) -> Result<()> {
        let Some(store) = self.store.clone() else {
            return Ok(());
        };
        // Nothing accepted since the last save, or not yet time.
        if self.kept.len() == self.saved || self.kept_at.elapsed() < self.every {
            return Ok(());
        }
        let started = Instant::now();
        let synced = writer.sync().await?;
        let mut runs = self.prior_runs();
        runs.extend_from_slice(&synced.runs);
        // What is durable of those not saved yet, in order: up to the
        // first in the chunk still being filled (those after it are in
        // it too, or kept from the run before and saved next time).
        let upto = self.saved
            + self.kept[self.saved..]
                .iter()
                .take_while(|k| synced.holds(&k.extent))
                .count();
        let objects: Vec<KeptObject> = self.kept[self.saved..upto].to_vec();
        // The record's chunks are ceded first: whatever stops this run
        // while it is saved, no chunk it may name goes back to the free
        // space.
        let newly = subtract(&synced.runs, &self.ceded);
        writer.cede(&newly);
        self.ceded.extend_from_slice(&newly);
        let add = Addition {
            source: self.source.clone(),
            fresh: self.fresh,
            objects,
            runs,
        };
        let dataset = self.dataset.clone();
        let on_pool = Arc::clone(&store);
        let saved = tokio::task::spawn_blocking(move || save(on_pool.catalog(), &dataset, &add))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()));
        match saved {
            Ok((freed, held)) => {
                store.space_map().release(&freed);
                let took = started.elapsed();
                tracing::info!(
                    "dataset '{}': {held} objects verified so far are kept for a re-run \
                     ({} ms)",
                    self.dataset,
                    took.as_millis()
                );
                self.saved = upto;
                self.fresh = false;
                self.every = KEEP_EVERY.max(took * KEEP_SHARE);
            }
            Err(why) => self.take_back(writer, &newly, &why),
        }
        self.kept_at = Instant::now();
        Ok(())
    }

    /// A record was not saved: the chunks ceded for it are the run's
    /// again.
    fn take_back(&mut self, writer: &mut ExtentWriter, newly: &[ChunkRun], why: &str) {
        writer.adopt(newly);
        self.ceded = subtract(&self.ceded, newly);
        tracing::warn!(
            "dataset '{}': no record kept for a re-run this time: {why}",
            self.dataset
        );
    }
}
