//! A job's record: what the job store keeps of it (spec, pins, state,
//! progress, bad samples, routes), made from its state ([`record_of`])
//! and saved ([`Saves`]) at each change of state, as it progresses (at
//! most once a second, off the runtime serving requests), when a
//! reader's stream ends and when the server stops. Records are written
//! in the order they were made: one made earlier never overwrites a
//! later one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use tokio::runtime::Handle;

use super::{Inner, Job, Source};
use crate::job::store::{JobRecord, JobStore};

/// The record the job store keeps of `job`, whose state is `inner`.
pub(super) fn record_of(job: &Job, inner: &Inner) -> JobRecord {
    let (skipped, bad_samples) = job.bad.snapshot();
    let sources = &job.sources;
    JobRecord {
        id: job.id.clone(),
        spec: job.spec.clone(),
        created: job
            .created
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64()),
        pins: sources[0].pin_record(),
        mix_pins: if job.is_mixture() {
            sources.iter().map(Source::pin_record).collect()
        } else {
            Vec::new()
        },
        layouts: match sources.iter().any(|s| s.layout.is_some()) {
            true => sources.iter().map(|s| s.layout.clone()).collect(),
            false => Vec::new(),
        },
        state: job.state(),
        error: inner.error.clone(),
        failure: inner.failure.clone(),
        progress: inner.progress.record(),
        skipped,
        bad_samples,
        routes: inner.routes.clone(),
    }
}

/// Where a job's records go, numbered as made.
#[derive(Debug)]
pub(super) struct Saves {
    store: Option<Arc<JobStore>>,
    next: AtomicU64,
    /// The number of the newest record written.
    saved: Arc<Mutex<u64>>,
}

impl Saves {
    /// Records to `store` (none: nothing is saved).
    pub(super) fn new(store: Option<Arc<JobStore>>) -> Self {
        Self {
            store,
            next: AtomicU64::new(0),
            saved: Arc::new(Mutex::new(0)),
        }
    }

    /// Writes the record `make` makes now (a failure to is logged: the
    /// job goes on); on `runtime`'s blocking pool where given, off the
    /// runtime serving requests.
    pub(super) fn save(&self, make: impl FnOnce() -> JobRecord, runtime: Option<&Handle>) {
        let Some(store) = self.store.clone() else {
            return;
        };
        // Numbered before it is made: a record made later has a larger
        // number, whichever is written first.
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        let record = make();
        match runtime {
            None => write_record(&store, &self.saved, seq, &record),
            Some(rt) => {
                let saved = Arc::clone(&self.saved);
                rt.spawn_blocking(move || write_record(&store, &saved, seq, &record));
            }
        }
    }

    /// Removes job `id`'s record.
    pub(super) fn remove(&self, id: &str) {
        if let Some(Err(e)) = self.store.as_ref().map(|s| s.remove(id)) {
            tracing::warn!("job {id}: cannot remove its record: {e}");
        }
    }
}

/// Writes `record` (number `seq`) unless a newer one was written.
fn write_record(store: &JobStore, saved: &Mutex<u64>, seq: u64, record: &JobRecord) {
    let mut newest = saved.lock().unwrap_or_else(|e| e.into_inner());
    if seq < *newest {
        return;
    }
    match store.save(record) {
        Ok(()) => *newest = seq,
        Err(e) => tracing::warn!("job {}: cannot save its record: {e}", record.id),
    }
}
