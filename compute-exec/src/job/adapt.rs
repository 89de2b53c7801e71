//! Re-planning under load: a running job measures its tiers and moves its
//! cut when what it sees contradicts the plan.
//!
//! ```text
//!  every window done ─► Meter: samples, link bytes, time waiting on the reader
//!  every REVIEW_EVERY ─► Observed: samples/s, link bytes/s, storage CPU busy
//!     (the nodes' process CPU, from node_info, over their cores), compute CPU
//!     busy (this process), the reader's share ─► the bottleneck
//!  link-bound, carrying far less than the plan assumes (a throttled link),
//!  or CPU-bound with the link carrying far more ─► plan again under the
//!  observed link ─► a choice that promises GAIN × the observed rate
//!  replaces the window plan at the next window: rows are the same whichever
//!  cut makes them (placement transparency), so no delivered byte changes
//! ```
//!
//! Only `auto` jobs move, and only where the sides are separate machines:
//! co-located sides are one pool of cores, and no cut changes how many work.
//! Each move is kept with the measurements that caused it (job status and
//! `GET /v1/jobs/{id}/explain`); the new placement becomes the job's plan,
//! which every stream of the job runs from its next window, and every
//! later stream (see `placed`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sluice_flight::StorageEndpoint;
use sluice_planner::{Explanation, Offload};

/// How often a stream reviews its plan.
pub const REVIEW_EVERY: Duration = Duration::from_secs(2);
/// Windows a review needs to have seen.
pub const MIN_WINDOWS: u64 = 2;
/// A side whose CPU is busy this share of the time may be the bottleneck.
pub const BUSY: f64 = 0.6;
/// Waiting on the reader this share of the time: the trainer is the bottleneck.
pub const TRAINER_BOUND: f64 = 0.5;
/// How far the link may fall short of (or beat) the plan's before it counts.
pub const LINK_OFF: f64 = 0.7;
/// What a new plan must promise over the observed rate to be taken.
pub const GAIN: f64 = 1.2;
/// No move this soon after another: let the new plan show what it does.
pub const SETTLE: Duration = Duration::from_secs(4);

/// What a running job measured over one review interval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Observed {
    /// The interval, seconds.
    pub seconds: f64,
    /// Samples its windows made per second.
    pub samples_per_s: f64,
    /// Bytes per second the storage nodes sent it.
    pub link_bytes_per_s: f64,
    /// Share of the storage nodes' cores their processes kept busy (`None`:
    /// a node did not say).
    pub storage_busy: Option<f64>,
    /// Share of this node's compute cores its process kept busy.
    pub compute_busy: f64,
    /// Share of the interval its streams waited on their readers.
    pub trainer_wait: f64,
    /// Which tier limited it: `link`, `storage`, `compute` or `trainer`.
    pub bottleneck: String,
}

/// One move of a running job's cut.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Replan {
    /// Seconds after the job was submitted.
    pub at_s: f64,
    /// Samples its streams had made by then.
    pub after_samples: u64,
    /// The choice it left.
    pub from: String,
    /// The choice it took.
    pub to: String,
    /// The link the new plan assumes, bytes per second.
    pub link_bytes_per_s: f64,
    /// The new plan's estimate, samples per second.
    pub estimated_per_s: f64,
    /// What caused it.
    pub measured: Observed,
}

/// The bottleneck of `o`: the reader when streams wait on it; else the
/// busiest side if it is busy; else the link.
pub fn bottleneck(o: &Observed) -> &'static str {
    let storage = o.storage_busy.unwrap_or(0.0);
    if o.trainer_wait >= TRAINER_BOUND {
        "trainer"
    } else if o.compute_busy >= BUSY && o.compute_busy >= storage {
        "compute"
    } else if storage >= BUSY {
        "storage"
    } else {
        "link"
    }
}

/// The link a new plan should assume, if what was observed contradicts the
/// plan's `assumed` link: a link-bound job carrying well under it, or a
/// CPU-bound one carrying well over it.
pub fn observed_link(o: &Observed, assumed: Option<f64>) -> Option<f64> {
    if o.link_bytes_per_s <= 0.0 {
        return None;
    }
    match o.bottleneck.as_str() {
        "link" => match assumed {
            Some(a) if o.link_bytes_per_s >= LINK_OFF * a => None,
            _ => Some(o.link_bytes_per_s),
        },
        "storage" | "compute" => match assumed {
            Some(a) if o.link_bytes_per_s * LINK_OFF > a => Some(o.link_bytes_per_s),
            _ => None,
        },
        _ => None,
    }
}

/// A job's placement as it runs: the current explanation and the moves
/// so far.
#[derive(Debug)]
pub struct Adaptive {
    state: Mutex<State>,
    started: Instant,
}

#[derive(Debug)]
struct State {
    explanation: Explanation,
    history: Vec<Replan>,
    last: Option<Observed>,
    moved: Option<Instant>,
}

impl Adaptive {
    /// The placement of a job planned as `explanation`.
    pub fn new(explanation: Explanation) -> Self {
        Self {
            state: Mutex::new(State {
                explanation,
                history: Vec::new(),
                last: None,
                moved: None,
            }),
            started: Instant::now(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a job placed under `offload` as explained may move.
    pub fn may_move(&self, offload: Offload) -> bool {
        matches!(offload, Offload::Auto) && self.lock().explanation.resources.colocated.is_none()
    }

    /// The placement now.
    pub fn explanation(&self) -> Explanation {
        self.lock().explanation.clone()
    }

    /// The moves so far.
    pub fn history(&self) -> Vec<Replan> {
        self.lock().history.clone()
    }

    /// The last review's measurements.
    pub fn last(&self) -> Option<Observed> {
        self.lock().last.clone()
    }

    /// Keeps `o` as the last measurements; whether a move may follow now.
    pub fn observed(&self, o: &Observed) -> bool {
        let mut s = self.lock();
        s.last = Some(o.clone());
        s.moved.is_none_or(|t| t.elapsed() >= SETTLE)
    }

    /// The link the current plan assumes.
    pub fn assumed_link(&self) -> Option<f64> {
        self.lock().explanation.resources.link_bytes_per_s
    }

    /// Records a move to `explanation`, caused by `measured`.
    pub fn moved(&self, explanation: Explanation, measured: Observed, after_samples: u64) {
        let mut s = self.lock();
        let from = choice_of(&s.explanation);
        let to = choice_of(&explanation);
        let link = explanation.resources.link_bytes_per_s.unwrap_or(0.0);
        let estimated = explanation.pipelines.first().map_or(0.0, |p| p.rates.per_s);
        s.history.push(Replan {
            at_s: self.started.elapsed().as_secs_f64(),
            after_samples,
            from,
            to,
            link_bytes_per_s: link,
            estimated_per_s: estimated,
            measured,
        });
        s.explanation = explanation;
        s.moved = Some(Instant::now());
    }
}

/// The choice of an explanation's pipelines, as text.
pub fn choice_of(e: &Explanation) -> String {
    let parts: Vec<String> = e.pipelines.iter().map(|p| p.choice.describe()).collect();
    if parts.is_empty() {
        "no pipeline".into()
    } else {
        parts.join("; ")
    }
}

/// One stream's measurements since its last review.
#[derive(Debug)]
pub struct Meter {
    since: Instant,
    windows: u64,
    samples: u64,
    link_bytes: u64,
    waited: Duration,
    compute_cpu: u64,
    storage_cpu: Option<u64>,
}

impl Meter {
    /// A meter starting now, with the storage nodes' CPU readings.
    pub async fn start(nodes: &[Arc<dyn StorageEndpoint>]) -> Self {
        Self {
            since: Instant::now(),
            windows: 0,
            samples: 0,
            link_bytes: 0,
            waited: Duration::ZERO,
            compute_cpu: sluice_base::process_cpu_ns(),
            storage_cpu: storage_cpu(nodes).await.map(|(ns, _)| ns),
        }
    }

    /// A window of `samples` done, its storage nodes having sent `link_bytes`.
    pub fn window(&mut self, samples: u64, link_bytes: u64) {
        self.windows += 1;
        self.samples += samples;
        self.link_bytes += link_bytes;
    }

    /// Time spent waiting on the reader.
    pub fn waited(&mut self, d: Duration) {
        self.waited += d;
    }

    /// Whether a review is due.
    pub fn due(&self) -> bool {
        self.windows >= MIN_WINDOWS && self.since.elapsed() >= REVIEW_EVERY
    }

    /// The interval's measurements (`compute_cores` of this node), and a
    /// fresh meter for the next.
    pub async fn review(
        &mut self,
        nodes: &[Arc<dyn StorageEndpoint>],
        compute_cores: f64,
    ) -> Observed {
        let seconds = self.since.elapsed().as_secs_f64().max(1e-3);
        let compute = sluice_base::process_cpu_ns().saturating_sub(self.compute_cpu);
        let storage = storage_cpu(nodes).await;
        let storage_busy = match (self.storage_cpu, storage) {
            (Some(before), Some((now, cores))) if cores > 0 => {
                Some(now.saturating_sub(before) as f64 / 1e9 / (seconds * cores as f64))
            }
            _ => None,
        };
        let mut o = Observed {
            seconds,
            samples_per_s: self.samples as f64 / seconds,
            link_bytes_per_s: self.link_bytes as f64 / seconds,
            storage_busy,
            compute_busy: compute as f64 / 1e9 / (seconds * compute_cores.max(1.0)),
            trainer_wait: self.waited.as_secs_f64() / seconds,
            bottleneck: String::new(),
        };
        o.bottleneck = bottleneck(&o).into();
        *self = Self {
            since: Instant::now(),
            windows: 0,
            samples: 0,
            link_bytes: 0,
            waited: Duration::ZERO,
            compute_cpu: sluice_base::process_cpu_ns(),
            storage_cpu: storage.map(|(ns, _)| ns),
        };
        o
    }
}

/// The nodes' CPU time so far and cores, summed (`None` if one is silent).
async fn storage_cpu(nodes: &[Arc<dyn StorageEndpoint>]) -> Option<(u64, usize)> {
    let mut total = (0u64, 0usize);
    for n in nodes {
        let info = n.node_info().await.ok()?;
        if info.cpu_ns == 0 {
            return None;
        }
        total.0 += info.cpu_ns;
        total.1 += info.cores;
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(link: f64, storage: Option<f64>, compute: f64, wait: f64) -> Observed {
        let mut o = Observed {
            seconds: 2.0,
            samples_per_s: 100.0,
            link_bytes_per_s: link,
            storage_busy: storage,
            compute_busy: compute,
            trainer_wait: wait,
            bottleneck: String::new(),
        };
        o.bottleneck = bottleneck(&o).into();
        o
    }

    #[test]
    fn the_bottleneck_is_the_reader_then_the_busiest_side_then_the_link() {
        assert_eq!(obs(1e6, Some(0.9), 0.9, 0.7).bottleneck, "trainer");
        assert_eq!(obs(1e6, Some(0.5), 0.9, 0.0).bottleneck, "compute");
        assert_eq!(obs(1e6, Some(0.95), 0.7, 0.0).bottleneck, "storage");
        assert_eq!(obs(1e6, Some(0.2), 0.3, 0.1).bottleneck, "link");
        assert_eq!(obs(1e6, None, 0.3, 0.1).bottleneck, "link");
    }

    #[test]
    fn a_throttled_link_is_taken_and_a_fine_one_is_left_alone() {
        // Link-bound at 1.25 MB/s where the plan assumed 125 MB/s.
        assert_eq!(
            observed_link(&obs(1.25e6, Some(0.2), 0.1, 0.0), Some(1.25e8)),
            Some(1.25e6)
        );
        // Link-bound near what was assumed: nothing to learn.
        assert_eq!(
            observed_link(&obs(1.0e8, Some(0.2), 0.1, 0.0), Some(1.25e8)),
            None
        );
        // CPU-bound while the link carried far more than assumed.
        assert_eq!(
            observed_link(&obs(5e8, Some(0.9), 0.2, 0.0), Some(1.25e8)),
            Some(5e8)
        );
        // The trainer is the bottleneck: no cut helps.
        assert_eq!(
            observed_link(&obs(1e6, Some(0.1), 0.1, 0.9), Some(1.25e8)),
            None
        );
    }
}
