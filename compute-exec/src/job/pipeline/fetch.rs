//! The second stage: a window's rows, fetched. In this order:
//!
//! 1. **cache**: the rows the node's output cache holds (a deterministic
//!    job's, `crate::job::outputs`) come from memory;
//! 2. **budget**: room among all streams' windows is reserved
//!    (`crate::session::window_budget::WindowBudget`): the bytes the last window measured
//!    per sample, or a whole window's before any;
//! 3. **executor**: for the rest, the job's plan as it is now (a re-plan
//!    replaces it; windows in flight finish under the one they began)
//!    runs on the jobs' runtime (the stream's own) over those rows' ids, each storage node's
//!    share a message down the stream's feed on it;
//! 4. **failover**: a storage node that cannot be reached is marked lost
//!    and the window runs again at once, each sample from another holder
//!    of its replicas; a replica whose checksum does not match is read
//!    from another holder (`crate::job::failover`);
//! 5. **retry**: samples with no holder left are tried again ([`Retry`])
//!    until the job's `storage_wait_s` has passed, then fail naming the
//!    nodes;
//!
//! and what the plan made goes into the cache. A window's task is
//! aborted when its future is dropped (the reader left, the job was
//! cancelled, an earlier window failed).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use arrow::datatypes::SchemaRef;
use datafusion::common::runtime::SpawnedTask;
use datafusion::physical_plan::collect;
use sluice_flight::LinkError;
use sluice_planner::fragment::SLOT;
use tonic::Code;

use super::options::{RETRY_FIRST, RETRY_MAX, WINDOW_BYTES};
use super::windows::Sizing;
use crate::error::JobError;
use crate::job::mix_plan::with_part_takes;
use crate::job::order::{EpochShape, Worker};
use crate::job::placed::StreamPlan;
use crate::job::run::Ready;
use crate::job::window_rows::WindowRows;
use crate::replicas::holders::{Avoid, Unheld};
use crate::session::output_cache::OutputCache;
use crate::session::window_budget::{Reservation, WindowBudget};

/// A window, fetched: its rows by slot, and the room they hold.
#[derive(Debug)]
pub struct Fetched {
    /// Its first position.
    pub start: u64,
    /// The sample of each of its positions.
    pub samples: Vec<u64>,
    /// Its rows, by slot.
    pub rows: WindowRows,
    /// Its room in the node's window budget, given back when the last
    /// batch with a row of it is gone.
    pub room: Reservation,
    /// Wall time from its reservation to its rows.
    pub took: Duration,
}

/// What fetches a stream's windows (see the module docs).
#[derive(Debug, Clone)]
pub struct Fetch {
    pub(super) ready: Arc<Ready>,
    pub(super) order: Arc<Vec<u64>>,
    /// The epoch's layout (from where a resumed job begins, for its first).
    pub(super) layout: EpochShape,
    pub(super) worker: Worker,
    pub(super) rank: u64,
    pub(super) plan: Arc<StreamPlan>,
    pub(super) budget: WindowBudget,
    pub(super) outputs: Option<(Arc<OutputCache>, u64)>,
    pub(super) schema: SchemaRef,
    pub(super) storage_wait: Duration,
    pub(super) sizing: Sizing,
    /// Windows fetched and not yet taken by the stage after.
    pub(super) fetched: Arc<AtomicU64>,
}

impl Fetch {
    /// The window of positions `start..stop`, fetched.
    pub fn window(
        &self,
        start: u64,
        stop: u64,
    ) -> impl Future<Output = Result<Fetched, JobError>> + Send + 'static + use<> {
        let samples = self
            .layout
            .worker_samples(&self.order, self.rank, self.worker, start, stop);
        let this = self.clone();
        // Its plan and estimate are the stream's when it is cut.
        let plan = self.plan.plan();
        let per_sample = self.sizing.bytes_per_sample();
        async move {
            let plan = plan?;
            let (mut rows, keys) = this.cached(&samples);
            let need: Vec<usize> = (0..samples.len())
                .filter(|&i| rows.at[i].is_none())
                .collect();
            let bytes = match per_sample {
                0 => WINDOW_BYTES,
                b => b.saturating_mul(need.len() as u64),
            };
            let room = this.budget.reserve(bytes).await;
            let began = Instant::now();
            if !need.is_empty() {
                let run: Vec<u64> = need.iter().map(|&i| samples[i]).collect();
                let made = this.run(plan, &run).await?;
                if let Some((cache, id)) = &this.outputs {
                    // Each batch's bytes per row are measured once, by
                    // `rows`, before the cache's lock is taken.
                    let rows = made
                        .rows()
                        .map(|(slot, row, len)| (keys[need[slot]], row, len));
                    cache.insert(*id, rows);
                }
                rows.fill(&need, made);
            }
            this.fetched.fetch_add(1, Ordering::Relaxed);
            Ok(Fetched {
                start,
                samples,
                rows,
                room,
                took: began.elapsed(),
            })
        }
    }

    /// The rows of `samples` the output cache holds, and their keys.
    fn cached(&self, samples: &[u64]) -> (WindowRows, Vec<u64>) {
        match &self.outputs {
            Some((cache, id)) => {
                let keys = self.ready.index.keys(samples);
                (WindowRows::from_cache(cache.lookup(*id, &keys)), keys)
            }
            None => (
                WindowRows::from_cache(vec![None; samples.len()]),
                Vec::new(),
            ),
        }
    }

    /// `plan` run over the rows of `samples` on the jobs' runtime, failed
    /// over to other holders and retried while a storage node cannot be
    /// reached (see the module docs).
    async fn run(
        &self,
        plan: Arc<dyn datafusion::physical_plan::ExecutionPlan>,
        samples: &[u64],
    ) -> Result<WindowRows, JobError> {
        let (index, failover) = (&self.ready.index, &self.ready.failover);
        let mut retry = Retry::new(self.storage_wait);
        // Replicas this window found corrupt: avoided by it alone.
        let mut corrupt = Avoid::default();
        // The node this window waited for, if it did (counted once, when
        // the window has run again).
        let mut waited: Option<(String, String)> = None;
        let batches = loop {
            let mut avoid = failover.avoid(index);
            avoid.extend(&corrupt);
            // With no live holder for some sample, every holder is tried
            // (a lost node may be back); one still gone is waited for.
            let takes = match index.takes(samples, &avoid) {
                Ok(takes) => takes,
                Err(_) => index
                    .takes(samples, &corrupt)
                    .map_err(|u| unheld(&u, "corrupt"))?,
            };
            let (plan, task) = (Arc::clone(&plan), Arc::clone(self.plan.task()));
            // On the jobs' runtime, which the stream runs on; aborted when
            // dropped: the stream no longer wants it.
            let run = SpawnedTask::spawn(async move {
                let plan = with_part_takes(plan, &takes)?;
                collect(plan, task).await
            });
            let attempt = run
                .join()
                .await
                .map_err(|e| JobError::Internal(e.to_string()))?
                .map_err(|e| JobError::running(&e));
            let e = match attempt {
                Ok(batches) => {
                    if let Some((node, reason)) = &waited {
                        failover.waited(node, reason);
                    }
                    break batches;
                }
                Err(e) => e,
            };
            match failed_node(&e) {
                Some((node, Met::Lost)) if index.touches(samples, &index.pins_of(node)) => {
                    avoid.extend(&index.pins_of(node));
                    // Run again at once when every sample has another
                    // holder; otherwise wait for a holder to come back.
                    let elsewhere = index.takes(samples, &avoid);
                    failover.lost(node, &e.to_string(), elsewhere.is_ok());
                    if let Err(u) = elsewhere {
                        retry.after(unheld(&u, "lost")).await?;
                        waited.get_or_insert_with(|| (node.to_string(), e.to_string()));
                    }
                }
                Some((node, Met::Corrupt)) => {
                    let pins = index.pins_of(node);
                    corrupt.extend(&pins);
                    if index.takes(samples, &corrupt).is_err() {
                        return Err(e);
                    }
                    failover.corrupt(node, &e.to_string());
                }
                Some((node, Met::Lost)) => {
                    let met = (node.to_string(), e.to_string());
                    retry.after(e).await?;
                    waited.get_or_insert(met);
                }
                None => return Err(e),
            }
        };
        WindowRows::from_plan(&batches, &self.schema, SLOT, samples.len())
    }
}

/// What a window met on a storage node.
enum Met {
    /// It could not be reached.
    Lost,
    /// A replica's bytes did not match their checksum.
    Corrupt,
}

/// The storage node `e` is about, when another holder may serve instead.
fn failed_node(e: &JobError) -> Option<(&str, Met)> {
    match e {
        JobError::Unavailable { node, .. } => Some((node, Met::Lost)),
        JobError::Storage(LinkError::Execution {
            node, code, kind, ..
        }) if *code == Code::DataLoss && kind == "checksum_mismatch" => Some((node, Met::Corrupt)),
        _ => None,
    }
}

/// A window's samples with no holder left, as a job's error naming them.
fn unheld(u: &Unheld, what: &str) -> JobError {
    JobError::Unavailable {
        node: u.nodes.join(", "),
        reason: format!(
            "{} sample(s) of the window are held only there, and every holder is {what}",
            u.samples
        ),
    }
}

/// How a window waits for a storage node that cannot be reached: it runs
/// again after [`RETRY_FIRST`], then twice as long each time (at most
/// [`RETRY_MAX`]), until the job's `storage_wait_s` has passed since the
/// first failure.
#[derive(Debug)]
pub struct Retry {
    until: Option<Instant>,
    wait: Duration,
    pause: Duration,
}

impl Retry {
    /// Waiting at most `wait` in all.
    pub fn new(wait: Duration) -> Self {
        Self {
            until: None,
            wait,
            pause: RETRY_FIRST,
        }
    }

    /// Sleeps before the next attempt, or gives `e` back when the wait is
    /// over (or there is none).
    pub async fn after(&mut self, e: JobError) -> Result<(), JobError> {
        let now = Instant::now();
        let until = *self.until.get_or_insert(now + self.wait);
        if now + self.pause > until {
            return Err(e);
        }
        tracing::warn!("{e}; retrying the window in {:?}", self.pause);
        tokio::time::sleep(self.pause).await;
        self.pause = (self.pause * 2).min(RETRY_MAX);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lost() -> JobError {
        JobError::Unavailable {
            node: "http://10.0.0.9:1".into(),
            reason: "connection refused".into(),
        }
    }

    #[tokio::test]
    async fn a_lost_node_is_retried_with_growing_pauses_until_the_wait_is_over() {
        let began = Instant::now();
        let mut retry = Retry::new(Duration::from_millis(600));
        // The first pause (0.25 s) fits in 0.6 s; the next (0.5 s) would
        // not: the error is given back at once.
        retry.after(lost()).await.unwrap();
        assert!(began.elapsed() >= RETRY_FIRST);
        let e = retry.after(lost()).await.unwrap_err();
        assert!(began.elapsed() < RETRY_FIRST * 2, "{:?}", began.elapsed());
        assert!(matches!(e, JobError::Unavailable { .. }), "{e}");
        // No wait: the first failure is the error.
        assert!(Retry::new(Duration::ZERO).after(lost()).await.is_err());
    }
}
