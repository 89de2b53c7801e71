//! [`Jobs`]: the jobs of a compute node — submit, list, look up, cancel.
//! With a [`JobStore`], jobs survive a restart: their records are loaded
//! and each is planned again over the versions it pinned (ids carry a
//! random part, so an old id is never mistaken for a new job); a
//! cancelled job's record is removed. Finished jobs, and jobs nobody has
//! read, expire after the registry's time to live ([`Jobs::expire`]),
//! records and all. Their CPU work — listing samples, running windows, encoding
//! batches — runs on an [`Executor`] (their own, or the one the process's
//! in-process storage node runs its fragments on), so the runtime
//! answering REST and Flight requests never waits behind decoding.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sluice_base::Executor;
use tokio::runtime::Handle;

use super::cluster::{ComputeNodes, JobSource};
use super::run::Job;
use super::spec::JobSpec;
use super::status::JobState;
use super::store::{JobRecord, JobStore};
use crate::error::JobError;
use crate::session::ComputeSession;

/// Finished jobs (done, failed, cancelled) kept, newest first: older ones
/// are forgotten, with their records, as new jobs arrive.
pub const FINISHED_KEPT: usize = 256;

/// See the module docs.
#[derive(Debug)]
pub struct Jobs {
    session: Arc<ComputeSession>,
    store: Option<Arc<JobStore>>,
    jobs: Mutex<BTreeMap<u64, Arc<Job>>>,
    next: AtomicU64,
    instance: u32,
    finished_kept: usize,
    executor: Arc<Executor>,
    source: Option<Arc<dyn JobSource>>,
    adopting: tokio::sync::Mutex<()>,
    nodes: Arc<ComputeNodes>,
}

impl Jobs {
    /// The jobs of `session`, on an executor of their own of one thread
    /// per core, kept in memory only.
    pub fn new(session: Arc<ComputeSession>) -> std::io::Result<Self> {
        Self::with_store(session, None)
    }

    /// The jobs of `session`, saved in `store` if given, on an executor
    /// of their own of one thread per core; call [`Jobs::restore`] to
    /// bring back those an earlier run saved.
    pub fn with_store(
        session: Arc<ComputeSession>,
        store: Option<JobStore>,
    ) -> std::io::Result<Self> {
        let executor = Executor::new("sluice-jobs", sluice_planner::resources::machine_cores())?;
        Ok(Self::on(executor, session, store))
    }

    /// The jobs of `session`, saved in `store` if given, computing on
    /// `executor` (shared with the other roles of this process).
    pub fn on(
        executor: Arc<Executor>,
        session: Arc<ComputeSession>,
        store: Option<JobStore>,
    ) -> Self {
        let instance = getrandom::u32().unwrap_or_else(|_| std::process::id());
        Self {
            session,
            store: store.map(Arc::new),
            jobs: Mutex::new(BTreeMap::new()),
            next: AtomicU64::new(1),
            instance,
            finished_kept: FINISHED_KEPT,
            executor,
            source: None,
            adopting: tokio::sync::Mutex::new(()),
            nodes: Arc::default(),
        }
    }

    /// A compute node's jobs: one this node does not hold is looked up in
    /// `source` (the coordinator) and planned here ([`Jobs::find`]).
    pub fn with_source(mut self, source: Arc<dyn JobSource>) -> Self {
        self.source = Some(source);
        self
    }

    /// The compute nodes registered with this node (a coordinator).
    pub fn compute_nodes(&self) -> &Arc<ComputeNodes> {
        &self.nodes
    }

    /// The session jobs run in.
    pub fn session(&self) -> &Arc<ComputeSession> {
        &self.session
    }

    /// The query runtime, the executor's: jobs' windows and SQL queries
    /// are planned and computed here, never on the runtime that answers
    /// REST, Flight control calls and `/healthz` ([`crate::offthread`]).
    pub fn handle(&self) -> &Handle {
        self.executor.handle()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<Job>>> {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Plans `spec` and starts listing its samples; errors of the pipeline
    /// or the options come back at once.
    pub async fn submit(&self, spec: JobSpec) -> Result<Arc<Job>, JobError> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let id = format!("job-{n}-{:08x}", self.instance);
        // Planned on the query runtime, like the queries of its windows.
        let planned = Job::plan(
            id,
            spec,
            Arc::clone(&self.session),
            self.handle().clone(),
            self.store.clone(),
        );
        let job = Arc::new(
            crate::offthread::plan_on(self.handle(), planned)
                .await
                .map_err(JobError::Internal)??,
        );
        job.save();
        self.lock().insert(n, Arc::clone(&job));
        let starting = Arc::clone(&job);
        sluice_base::task::detach_on(self.handle(), async move { starting.start().await });
        self.forget_old();
        Ok(job)
    }

    /// The same registry keeping at most `n` finished jobs.
    pub fn with_finished_kept(mut self, n: usize) -> Self {
        self.finished_kept = n;
        self
    }

    /// Forgets the oldest finished jobs past the number kept: jobs are
    /// not a log that grows forever.
    fn forget_old(&self) {
        let gone: Vec<Arc<Job>> = {
            let mut jobs = self.lock();
            let finished: Vec<u64> = jobs
                .iter()
                .filter(|(_, j)| matches!(j.state(), JobState::Done) || j.state().is_final())
                .map(|(n, _)| *n)
                .collect();
            let extra = finished.len().saturating_sub(self.finished_kept);
            finished[..extra]
                .iter()
                .filter_map(|n| jobs.remove(n))
                .collect()
        };
        for job in gone {
            if let Some(Err(e)) = self.store.as_ref().map(|s| s.remove(job.id())) {
                tracing::warn!("job {}: cannot remove its record: {e}", job.id());
            }
        }
    }

    /// Saves every job's record (at shutdown: progress delivered since
    /// the last save is not lost).
    pub fn save_all(&self) {
        for job in self.list() {
            job.save();
        }
    }

    /// Forgets, with their records, jobs idle longer than `ttl`: finished
    /// ones (done, failed, cancelled) and running ones nobody reads.
    /// Returns their ids.
    pub fn expire(&self, ttl: std::time::Duration) -> Vec<String> {
        let gone: Vec<Arc<Job>> = {
            let mut jobs = self.lock();
            let old: Vec<u64> = jobs
                .iter()
                .filter(|(_, j)| j.state() != JobState::Pending && j.idle_for() > ttl)
                .map(|(n, _)| *n)
                .collect();
            old.iter().filter_map(|n| jobs.remove(n)).collect()
        };
        for job in &gone {
            tracing::info!(
                "job {} expired ({:?}, idle for {:.0} s)",
                job.id(),
                job.state(),
                job.idle_for().as_secs_f64()
            );
            if let Some(Err(e)) = self.store.as_ref().map(|s| s.remove(job.id())) {
                tracing::warn!("job {}: cannot remove its record: {e}", job.id());
            }
        }
        gone.iter().map(|j| j.id().to_owned()).collect()
    }

    /// Brings back the jobs saved by an earlier run: each is planned again
    /// over the versions it pinned and indexed anew, on the jobs' runtime
    /// (the stack and limits a submission has). A job that cannot be (its
    /// dataset version or node gone, a pipeline over today's limits) is
    /// logged and left in the store: no record stops the server from
    /// starting. Returns how many came back.
    pub async fn restore(&self) -> std::io::Result<usize> {
        let Some(store) = &self.store else {
            return Ok(0);
        };
        let mut restored = 0;
        for record in store.load()? {
            let id = record.id.clone();
            match self.replan(record, self.store.clone()).await {
                Ok(job) => self.admit(&job),
                Err(e) => {
                    tracing::warn!("job {id} cannot be restored: {e}");
                    continue;
                }
            }
            restored += 1;
        }
        Ok(restored)
    }

    /// The jobs, oldest first.
    pub fn list(&self) -> Vec<Arc<Job>> {
        self.lock().values().cloned().collect()
    }

    /// The jobs still to deliver (pending or running) that read a version
    /// of `dataset` up to `through` on `node`: while any does, those
    /// versions stay.
    pub fn pinning(&self, dataset: &str, node: &str, through: u64) -> Vec<String> {
        self.list()
            .into_iter()
            .filter(|j| matches!(j.state(), JobState::Pending | JobState::Running))
            .filter(|j| j.sources().reads_through(dataset, node, through))
            .map(|j| j.id().to_string())
            .collect()
    }

    /// The job `id`.
    pub fn get(&self, id: &str) -> Result<Arc<Job>, JobError> {
        self.lock()
            .values()
            .find(|j| j.id() == id)
            .cloned()
            .ok_or_else(|| JobError::JobNotFound { job: quoted(id) })
    }

    /// The job `id`, held here or, on a compute node with a source, found
    /// there and planned here over the versions its record pins. A
    /// compute node asks its source at every new stream: a job cancelled
    /// or forgotten there is cancelled here (streams already running end
    /// when their trainers leave); a source that cannot be reached leaves
    /// a job held here readable.
    pub async fn find(&self, id: &str) -> Result<Arc<Job>, JobError> {
        let held = self.get(id);
        let Some(source) = &self.source else {
            return held;
        };
        let asked = source.record(id).await;
        match (held, asked) {
            (Ok(job), Ok(Some(r))) if r.state == JobState::Cancelled => {
                job.cancel();
                Ok(job)
            }
            (Ok(job), Ok(None)) => {
                job.cancel();
                Err(JobError::JobNotFound { job: quoted(id) })
            }
            (Ok(job), _) => Ok(job),
            (Err(e), Ok(None)) => Err(e),
            (Err(_), Err(reason)) => Err(JobError::Unavailable {
                node: source.name().to_string(),
                reason: format!("cannot ask it for job {}: {reason}", quoted(id)),
            }),
            (Err(_), Ok(Some(record))) => self.adopt(source.name(), record).await,
        }
    }

    /// Plans the job of `record` (from `source`) here, once: two ranks
    /// asking at once adopt it once.
    async fn adopt(&self, source: &str, mut record: JobRecord) -> Result<Arc<Job>, JobError> {
        let _one = self.adopting.lock().await;
        if let Ok(job) = self.get(&record.id) {
            return Ok(job);
        }
        // Done there is readable here: later epochs, re-reads.
        if record.state == JobState::Done {
            record.state = JobState::Running;
        }
        // What this node delivers, it reports to the coordinator
        // (`super::report`): it starts from nothing of its own.
        record.progress = Default::default();
        record.skipped = 0;
        record.bad_samples.clear();
        let job = self.replan(record, None).await?;
        tracing::info!("job {} adopted from {source}", job.id());
        self.admit(&job);
        Ok(job)
    }

    /// Plans the job of `record` anew over the versions it pinned, on the
    /// jobs' runtime (the stack and limits a submission has), saving its
    /// progress to `store`.
    async fn replan(
        &self,
        record: JobRecord,
        store: Option<Arc<JobStore>>,
    ) -> Result<Arc<Job>, JobError> {
        let planned = Job::restore(
            record,
            Arc::clone(&self.session),
            self.handle().clone(),
            store,
        );
        Ok(Arc::new(
            crate::offthread::plan_on(self.handle(), planned)
                .await
                .map_err(JobError::Internal)??,
        ))
    }

    /// Lists `job` (restored or adopted) and starts it unless it ended.
    fn admit(&self, job: &Arc<Job>) {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(n, Arc::clone(job));
        if !job.state().is_final() {
            let starting = Arc::clone(job);
            sluice_base::task::detach_on(self.handle(), async move { starting.start().await });
        }
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

/// `id` quoted for a message, cut after 64 characters: an id comes from
/// the request, and an error must not echo megabytes of it (a gRPC status
/// travels in a header).
fn quoted(id: &str) -> String {
    const MAX: usize = 64;
    match id.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{:?}… ({} bytes)", &id[..cut], id.len()),
        None => format!("{id:?}"),
    }
}
