//! [`LostNodes`]: a storage node that does not answer for longer than the
//! cluster's lost time counts as lost, and the parts it held are copied
//! from their other holders to nodes that hold no copy, until each part
//! has its replicas again (`super::move_dataset` with [`Why::Lost`]).
//!
//! Until then the node is only down: jobs read its parts from the other
//! holders (`crate::job::failover`) and nothing is copied — a node back
//! within the time (a restart, a kernel update) costs no copy at all.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{MoveReport, Why, answering, move_dataset};
use crate::ingest::Ingests;
use crate::job::Jobs;

/// See the module docs.
#[derive(Debug)]
pub struct LostNodes {
    after: Duration,
    down_since: Mutex<HashMap<String, Instant>>,
}

impl LostNodes {
    /// Nodes count as lost once down for `after`.
    pub fn new(after: Duration) -> Self {
        Self {
            after,
            down_since: Mutex::new(HashMap::new()),
        }
    }

    /// How often [`LostNodes::tick`] should run: often enough to see a
    /// node lost within a few seconds of its time.
    pub fn period(&self) -> Duration {
        (self.after / 4).clamp(Duration::from_secs(1), Duration::from_secs(30))
    }

    /// Asks every storage node, and re-replicates the parts of those down
    /// past the lost time: one report per dataset moved.
    pub async fn tick(&self, jobs: &Arc<Jobs>, ingests: &Ingests) -> Vec<MoveReport> {
        let endpoints = jobs.session().endpoints();
        let up = answering(&endpoints).await;
        let lost: Vec<String> = {
            let mut down = self.down_since.lock().unwrap_or_else(|e| e.into_inner());
            down.retain(|n, _| !up.contains(n) && endpoints.iter().any(|e| e.name() == n));
            let now = Instant::now();
            for e in endpoints.iter().filter(|e| !up.contains(e.name())) {
                down.entry(e.name().to_string()).or_insert(now);
            }
            down.iter()
                .filter(|(_, since)| since.elapsed() >= self.after)
                .map(|(n, _)| n.clone())
                .collect()
        };
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
            if named.is_empty() {
                continue;
            }
            let _one = ingests.exclusive().await;
            match move_dataset(jobs, &dataset, &Why::Lost(named)).await {
                Ok(r) => out.push(r),
                Err(e) => tracing::error!("re-replication of {dataset}: {e}"),
            }
        }
        out
    }
}
