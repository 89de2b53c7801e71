//! A job's record: what the job store keeps of it (spec, pins, state,
//! progress, bad samples, routes), made from its state and saved at each
//! change of state, as it progresses (at most once a second, off the
//! runtime serving requests), when a reader's stream ends and when the
//! server stops. Records are written in the order they were made: one
//! made earlier never overwrites a later one.

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use super::Job;
use super::Source;
use crate::job::status::JobState;
use crate::job::store::{JobRecord, JobStore};

impl Job {
    /// The record the job store keeps.
    pub fn record(&self) -> JobRecord {
        let inner = self.lock();
        let (skipped, bad_samples) = self.bad.snapshot();
        JobRecord {
            id: self.id.clone(),
            spec: self.spec.clone(),
            created: self
                .created
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            pins: self.sources[0].pin_record(),
            mix_pins: if self.is_mixture() {
                self.sources.iter().map(Source::pin_record).collect()
            } else {
                Vec::new()
            },
            layouts: match self.sources.iter().any(|s| s.layout.is_some()) {
                true => self.sources.iter().map(|s| s.layout.clone()).collect(),
                false => Vec::new(),
            },
            state: self.state(),
            error: inner.error.clone(),
            failure: inner.failure.clone(),
            progress: inner.progress.record(),
            skipped,
            bad_samples,
            routes: inner.routes.clone(),
        }
    }

    /// Saves its record (a failure to is logged: the job goes on). A
    /// cancelled job has none.
    pub fn save(&self) {
        if let Some((store, seq, record)) = self.to_save() {
            write_record(&store, &self.saved, seq, &record);
        }
    }

    /// [`Job::save`] on the jobs' blocking pool: progress saved while a
    /// reader's stream is polled, off the runtime serving requests.
    pub(super) fn save_in_background(self: &Arc<Self>) {
        if let Some((store, seq, record)) = self.to_save() {
            let job = Arc::clone(self);
            self.runtime
                .spawn_blocking(move || write_record(&store, &job.saved, seq, &record));
        }
    }

    /// The store, the record's sequence number and the record, unless
    /// there is nothing to save.
    fn to_save(&self) -> Option<(Arc<JobStore>, u64, JobRecord)> {
        if self.state() == JobState::Cancelled {
            return None;
        }
        let store = Arc::clone(self.store.as_ref()?);
        let seq = self
            .next_save
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some((store, seq, self.record()))
    }
}

/// Writes `record` (number `seq`) unless a newer one was written.
pub(super) fn write_record(store: &JobStore, saved: &Mutex<u64>, seq: u64, record: &JobRecord) {
    let mut newest = saved.lock().unwrap_or_else(|e| e.into_inner());
    if seq < *newest {
        return;
    }
    match store.save(record) {
        Ok(()) => *newest = seq,
        Err(e) => tracing::warn!("job {}: cannot save its record: {e}", record.id),
    }
}
