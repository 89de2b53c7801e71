//! [`LostNodes`]: a storage node that does not answer for longer than the
//! cluster's lost time counts as lost, and the parts it held are copied
//! from their other holders to nodes that hold no copy, until each part
//! has its replicas again (`super::move_dataset` with [`Why::Lost`]).
//!
//! Until then the node is only down: jobs read its parts from the other
//! holders (`crate::job::failover`) and nothing is copied — a node back
//! within the time (a restart, a kernel update) costs no copy at all. A
//! node back after its parts moved away holds stale versions
//! ([`retire_stale`]): they are retired once no job reads them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_flight::StorageEndpoint;

use super::{MoveReport, Why, answering, move_dataset, retire_when_unread};
use crate::ingest::Ingests;
use crate::job::Jobs;

/// See the module docs.
#[derive(Debug)]
pub struct LostNodes {
    after: Duration,
    down_since: Mutex<HashMap<String, Instant>>,
    /// Whether it ran once (the first run checks every node that answers).
    ticked: std::sync::atomic::AtomicBool,
    /// Datasets whose re-replication failed: when to try again, and the
    /// wait after that (doubling, at most [`MOST_BACKOFF`]).
    retry: Mutex<HashMap<String, (Instant, Duration)>>,
}

/// The longest wait before a failed re-replication is tried again.
const MOST_BACKOFF: Duration = Duration::from_secs(600);

impl LostNodes {
    /// Nodes count as lost once down for `after`.
    pub fn new(after: Duration) -> Self {
        Self {
            after,
            down_since: Mutex::new(HashMap::new()),
            ticked: Default::default(),
            retry: Mutex::new(HashMap::new()),
        }
    }

    /// How often [`LostNodes::tick`] should run: often enough to see a
    /// node lost within a few seconds of its time.
    pub fn period(&self) -> Duration {
        (self.after / 4).clamp(Duration::from_secs(1), Duration::from_secs(30))
    }

    /// The nodes down past the lost time at the last tick.
    pub fn lost(&self) -> Vec<String> {
        self.down_since
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, since)| since.elapsed() >= self.after)
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Asks every storage node, and re-replicates the parts of those down
    /// past the lost time: one report per dataset moved.
    pub async fn tick(&self, jobs: &Arc<Jobs>, ingests: &Ingests) -> Vec<MoveReport> {
        let endpoints = jobs.session().endpoints();
        let up = answering(&endpoints).await;
        let (lost, back): (Vec<String>, Vec<String>) = {
            let mut down = self.down_since.lock().unwrap_or_else(|e| e.into_inner());
            let first = !self.ticked.swap(true, std::sync::atomic::Ordering::Relaxed);
            let back = up
                .iter()
                .filter(|n| first || down.contains_key(*n))
                .cloned()
                .collect();
            down.retain(|n, _| !up.contains(n) && endpoints.iter().any(|e| e.name() == n));
            let now = Instant::now();
            for e in endpoints.iter().filter(|e| !up.contains(e.name())) {
                down.entry(e.name().to_string()).or_insert(now);
            }
            let lost = down
                .iter()
                .filter(|(_, since)| since.elapsed() >= self.after)
                .map(|(n, _)| n.clone())
                .collect();
            (lost, back)
        };
        for node in endpoints
            .iter()
            .filter(|e| back.contains(&e.name().to_string()))
        {
            if let Ok(held) = node.datasets().await {
                let held: Vec<(String, u64)> =
                    held.into_iter().map(|d| (d.name, d.version)).collect();
                retire_stale(jobs, node, &held);
            }
        }
        if lost.is_empty() {
            return Vec::new();
        }
        let ledger = jobs.session().ledger();
        let mut out = Vec::new();
        for dataset in ledger.laid_out_datasets() {
            let Some(layout) = ledger.layout(&dataset) else {
                continue;
            };
            // Only parts that can still be copied: a part whose every
            // holder is lost stays as it is, and is not asked again.
            let named: Vec<String> = lost
                .iter()
                .filter(|n| {
                    layout
                        .holders
                        .iter()
                        .any(|h| h.contains(n) && h.iter().any(|o| up.contains(o)))
                })
                .cloned()
                .collect();
            let waiting = self
                .retry
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&dataset)
                .is_some_and(|(at, _)| Instant::now() < *at);
            if named.is_empty() || waiting {
                continue;
            }
            let _one = ingests.exclusive().await;
            let moved = move_dataset(jobs, &dataset, &Why::Lost(named)).await;
            let mut retry = self.retry.lock().unwrap_or_else(|e| e.into_inner());
            let mut later = |why: &dyn std::fmt::Display| {
                let wait = retry
                    .get(&dataset)
                    .map_or(self.period(), |(_, w)| (*w * 2).min(MOST_BACKOFF));
                retry.insert(dataset.clone(), (Instant::now() + wait, wait));
                tracing::warn!(
                    "re-replication of {dataset}: {why}; tried again in {} s",
                    wait.as_secs()
                );
            };
            match moved {
                // Nowhere to copy to (too few nodes): a node may join.
                Ok(r) if r.moves.is_empty() => later(&format!("{} parts short", r.short.len())),
                Ok(r) => {
                    retry.remove(&dataset);
                    out.push(r);
                }
                Err(e) => later(&e),
            }
        }
        out
    }
}

/// Has `node` retire every version of `held` (what it lists: dataset and
/// version) that the ledger knows as moved away from it, once no job
/// reads it (in the background).
pub fn retire_stale(jobs: &Arc<Jobs>, node: &Arc<dyn StorageEndpoint>, held: &[(String, u64)]) {
    let ledger = jobs.session().ledger();
    for (dataset, version) in held {
        if ledger.moved_away(dataset, node.name(), *version) {
            tracing::info!(
                "{} holds {dataset}@{version}, moved away from it: retiring it",
                node.name()
            );
            retire_when_unread(Arc::clone(jobs), Arc::clone(node), dataset, *version);
        }
    }
}
