//! [`Jobs`]: the jobs of a compute node — submit, list, look up, cancel.
//! Jobs live in memory; they do not survive a restart of the node (their
//! ids carry a per-process random part, so an old id is never mistaken for
//! a new job). Their CPU work — listing samples, running windows, encoding
//! batches — runs on a runtime of their own, so the runtime answering REST
//! and Flight requests never waits behind decoding.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::runtime::{Handle, Runtime};

use super::run::Job;
use super::spec::{JobError, JobSpec};
use super::status::JobState;
use crate::session::ComputeSession;

/// See the module docs.
#[derive(Debug)]
pub struct Jobs {
    session: Arc<ComputeSession>,
    jobs: Mutex<BTreeMap<u64, Arc<Job>>>,
    next: AtomicU64,
    instance: u32,
    runtime: Option<Runtime>,
    handle: Handle,
}

impl Drop for Jobs {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which is not allowed inside another
        // runtime's task; its work is tied to jobs that are gone anyway.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl Jobs {
    /// The jobs of `session`, with a runtime of one thread per core.
    pub fn new(session: Arc<ComputeSession>) -> std::io::Result<Self> {
        let instance = getrandom::u32().unwrap_or_else(|_| std::process::id());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(sluice_planner::resources::machine_cores())
            .thread_name("sluice-jobs")
            .enable_all()
            .build()?;
        Ok(Self {
            session,
            jobs: Mutex::new(BTreeMap::new()),
            next: AtomicU64::new(1),
            instance,
            handle: runtime.handle().clone(),
            runtime: Some(runtime),
        })
    }

    /// The session jobs run in.
    pub fn session(&self) -> &Arc<ComputeSession> {
        &self.session
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<Job>>> {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Plans `spec` and starts listing its samples; errors of the pipeline
    /// or the options come back at once.
    pub async fn submit(&self, spec: JobSpec) -> Result<Arc<Job>, JobError> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let id = format!("job-{n}-{:08x}", self.instance);
        let job =
            Arc::new(Job::plan(id, spec, Arc::clone(&self.session), self.handle.clone()).await?);
        self.lock().insert(n, Arc::clone(&job));
        let starting = Arc::clone(&job);
        self.handle.spawn(async move { starting.start().await });
        Ok(job)
    }

    /// The jobs, oldest first.
    pub fn list(&self) -> Vec<Arc<Job>> {
        self.lock().values().cloned().collect()
    }

    /// The job `id`.
    pub fn get(&self, id: &str) -> Result<Arc<Job>, JobError> {
        self.lock()
            .values()
            .find(|j| j.id() == id)
            .cloned()
            .ok_or_else(|| JobError::JobNotFound(format!("{id:?}")))
    }

    /// Cancels the job `id`.
    pub fn cancel(&self, id: &str) -> Result<Arc<Job>, JobError> {
        let job = self.get(id)?;
        job.cancel();
        Ok(job)
    }

    /// How many jobs are in each state.
    pub fn counts(&self) -> BTreeMap<&'static str, usize> {
        let mut counts = BTreeMap::from([
            ("pending", 0),
            ("running", 0),
            ("done", 0),
            ("failed", 0),
            ("cancelled", 0),
        ]);
        for j in self.list() {
            let key = match j.state() {
                JobState::Pending => "pending",
                JobState::Running => "running",
                JobState::Done => "done",
                JobState::Failed => "failed",
                JobState::Cancelled => "cancelled",
            };
            *counts.entry(key).or_default() += 1;
        }
        counts
    }
}
