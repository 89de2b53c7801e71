//! Per-stage statistics of a job: where its time goes, tier by tier, and
//! which stage holds it back.
//!
//! ```text
//!  every UDF call ─► the job's StageClock (per tier, node, UDF: rows, ns, histogram)
//!  every window   ─► samples made, link bytes, windows ready ahead of the reader
//!  every batch    ─► time blocked on the reader, batches queued in its channel
//!  status / explain / metrics ─► StageStats::view: the last RECENT seconds
//!     (the whole job once it is idle)
//!       stages: samples/s, ms per sample (mean, p90), share of their tier's cores
//!       tiers:  storage CPU, link, compute CPU, trainer — busy share, and the
//!               rate each could sustain (measured / busy) beside the plan's estimate
//!       queues: windows ready ahead of the reader, batches in the reader's channel
//!       bottleneck: the busiest tier (and its busiest stage), with the headroom
//!               it leaves: how much faster the job could go before the next
//!               tier limits it
//! ```
//!
//! Co-located sides (the embedded default, nodes on this host) are one
//! pool of cores: their stages compete for the same CPUs, so the pool is
//! one tier (`cpu`) and the bottleneck is the pool's busiest stage. Time
//! outside UDFs (device reads, reordering, encoding) is not a stage: it
//! shows as CPU the stages do not account for, never in a stage's figures.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_planner::choose::Rates;
use sluice_planner::resources::Resources;
use sluice_udfs::{StageClock, StageTiming, Tier};

use super::pipeline::options::{CHANNEL_BATCHES, WINDOWS_RUNNING, WINDOWS_WAITING};
pub use super::stage_view::{Bottleneck, JobStages, QueueView, StageView, TierView};

/// The span the statistics of a running job cover.
pub const RECENT: Duration = Duration::from_secs(5);
/// Snapshots are this far apart at least.
const SNAP_EVERY: Duration = Duration::from_secs(1);
/// Snapshots kept (enough to reach back [`RECENT`]).
const SNAPS: usize = 8;

/// Counters the job's streams add to.
#[derive(Debug, Clone, Default)]
struct Counters {
    made: u64,
    link: u64,
    waited: Duration,
    streamed: Duration,
    ready_sum: u64,
    ready_n: u64,
    queued_sum: u64,
    queued_n: u64,
    first: Option<Instant>,
    last: Option<Instant>,
}

#[derive(Debug)]
struct Snap {
    at: Instant,
    counters: Counters,
    stages: Vec<StageTiming>,
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct StageStats {
    clock: Arc<StageClock>,
    counters: Mutex<Counters>,
    snaps: Mutex<VecDeque<Snap>>,
}

impl StageStats {
    /// The clock the job's UDFs record in.
    pub fn clock(&self) -> Arc<StageClock> {
        Arc::clone(&self.clock)
    }

    fn counters(&self) -> std::sync::MutexGuard<'_, Counters> {
        self.counters.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A window of `samples` done, its nodes having sent `link` bytes,
    /// `ready` windows (itself included) made ahead of the reader, `ran`
    /// since its stream's last window.
    pub fn window(&self, samples: u64, link: u64, ready: u64, ran: Duration) {
        let now = Instant::now();
        let mut c = self.counters();
        c.made += samples;
        c.link += link;
        c.streamed += ran;
        c.ready_sum += ready;
        c.ready_n += 1;
        c.first.get_or_insert(now - ran);
        c.last = Some(now);
    }

    /// A batch handed to the reader's channel, which held `queued` batches
    /// before it; the stream waited `waited` for room.
    pub fn sent(&self, queued: u64, waited: Duration) {
        let mut c = self.counters();
        c.queued_sum += queued;
        c.queued_n += 1;
        c.waited += waited;
        c.streamed += waited;
    }

    /// The statistics of the last [`RECENT`] seconds, or of the whole job
    /// when it made nothing in them; `None` before its first window.
    /// `res` and `estimate` are its plan's resources and rates.
    pub fn view(&self, res: &Resources, estimate: Option<&Rates>) -> Option<JobStages> {
        let now = Instant::now();
        let counters = self.counters().clone();
        let stages = self.clock.snapshot();
        // Nothing to show before the first window.
        counters.first?;
        let mut snaps = self.snaps.lock().unwrap_or_else(|e| e.into_inner());
        let base = snaps
            .iter()
            .find(|s| now - s.at <= RECENT + SNAP_EVERY)
            .filter(|s| counters.made > s.counters.made && now - s.at >= SNAP_EVERY);
        let view = match base {
            Some(b) => {
                let seconds = (now - b.at).as_secs_f64();
                let d = since(&counters, &b.counters);
                compute(
                    "recent",
                    seconds,
                    &d,
                    &diff(&stages, &b.stages),
                    res,
                    estimate,
                )
            }
            None => whole(&counters, &stages, res, estimate)?,
        };
        if snaps.back().is_none_or(|s| now - s.at >= SNAP_EVERY) {
            snaps.push_back(Snap {
                at: now,
                counters,
                stages,
            });
            if snaps.len() > SNAPS {
                snaps.pop_front();
            }
        }
        Some(view)
    }

    /// The statistics of the whole job (EXPLAIN ANALYZE).
    pub fn total(&self, res: &Resources, estimate: Option<&Rates>) -> Option<JobStages> {
        whole(
            &self.counters().clone(),
            &self.clock.snapshot(),
            res,
            estimate,
        )
    }
}

/// The view of the whole job: from its first window to its last.
fn whole(
    c: &Counters,
    stages: &[StageTiming],
    res: &Resources,
    estimate: Option<&Rates>,
) -> Option<JobStages> {
    let seconds = (c.last? - c.first?).as_secs_f64().max(1e-3);
    Some(compute("job", seconds, c, stages, res, estimate))
}

fn since(now: &Counters, before: &Counters) -> Counters {
    Counters {
        made: now.made - before.made,
        link: now.link - before.link,
        waited: now.waited.saturating_sub(before.waited),
        streamed: now.streamed.saturating_sub(before.streamed),
        ready_sum: now.ready_sum - before.ready_sum,
        ready_n: now.ready_n - before.ready_n,
        queued_sum: now.queued_sum - before.queued_sum,
        queued_n: now.queued_n - before.queued_n,
        first: now.first,
        last: now.last,
    }
}

fn diff(now: &[StageTiming], before: &[StageTiming]) -> Vec<StageTiming> {
    now.iter()
        .map(|s| {
            let had = before.iter().find(|b| b.site == s.site && b.udf == s.udf);
            StageTiming {
                site: s.site.clone(),
                udf: s.udf.clone(),
                tally: had.map_or_else(|| s.tally.clone(), |b| s.tally.since(&b.tally)),
            }
        })
        .filter(|s| s.tally.rows > 0)
        .collect()
}

/// The view of `c` and `stages` over `seconds`.
fn compute(
    over: &str,
    seconds: f64,
    c: &Counters,
    stages: &[StageTiming],
    res: &Resources,
    estimate: Option<&Rates>,
) -> JobStages {
    let seconds = seconds.max(1e-3);
    let rate = c.made as f64 / seconds;
    let tiers = tier_views(seconds, c, stages, res, estimate);
    let bottleneck = bottleneck(&tiers, stages);
    let flagged = bottleneck
        .as_ref()
        .and_then(|b| busiest_stage(stages, &b.tier))
        .map(|s| (s.site.clone(), s.udf.clone()));
    let colocated = res.colocated.is_some();
    let compute_cores = res.compute_cores.max(1.0);
    let cores = |tier: Tier| match tier {
        _ if colocated => compute_cores,
        Tier::Storage => res.storage_cores.max(1.0),
        Tier::Compute => compute_cores,
    };
    let stages = stages
        .iter()
        .filter(|s| s.tally.rows > 0)
        .map(|s| StageView {
            tier: s.site.tier.as_str().into(),
            node: s.site.node.clone(),
            udf: s.udf.clone(),
            samples_per_s: s.tally.rows as f64 / seconds,
            mean_ms: s.tally.mean_ns() / 1e6,
            p90_ms: s.tally.quantile_ns(0.9) / 1e6,
            busy: s.tally.nanos as f64 / 1e9 / (seconds * cores(s.site.tier)),
            bottleneck: flagged
                .as_ref()
                .is_some_and(|(site, udf)| *site == s.site && *udf == s.udf),
        })
        .collect();
    let mean = |sum: u64, n: u64| if n == 0 { 0.0 } else { sum as f64 / n as f64 };
    JobStages {
        over: over.into(),
        seconds,
        samples_per_s: rate,
        stages,
        tiers,
        queues: vec![
            QueueView {
                queue: "windows".into(),
                mean: mean(c.ready_sum, c.ready_n),
                capacity: (WINDOWS_RUNNING + WINDOWS_WAITING) as u64,
            },
            QueueView {
                queue: "reader".into(),
                mean: mean(c.queued_sum, c.queued_n),
                capacity: CHANNEL_BATCHES as u64,
            },
        ],
        bottleneck,
    }
}

/// How busy each tier was over `seconds`, and what it could carry at
/// that: one `cpu` tier where the sides share a machine, else storage,
/// link and compute; and the trainer (the share of the stream's time it
/// kept the windows waiting).
fn tier_views(
    seconds: f64,
    c: &Counters,
    stages: &[StageTiming],
    res: &Resources,
    estimate: Option<&Rates>,
) -> Vec<TierView> {
    let storage_cores = (res.storage_cores * res.storage_nodes.max(1) as f64).max(1.0);
    let compute_cores = res.compute_cores.max(1.0);
    let busy_ns = |tier: Option<Tier>| -> f64 {
        stages
            .iter()
            .filter(|s| tier.is_none_or(|t| s.site.tier == t))
            .map(|s| s.tally.nanos as f64)
            .sum()
    };
    let rate = c.made as f64 / seconds;
    let capacity = |busy: f64| (busy > 0.0).then(|| rate / busy);
    let view = |tier: &str, busy: Option<f64>, estimated_per_s, bytes_per_s| TierView {
        tier: tier.into(),
        busy,
        capacity_per_s: busy.and_then(capacity),
        estimated_per_s,
        bytes_per_s,
    };
    let mut tiers = Vec::new();
    if res.colocated.is_some() {
        let busy = busy_ns(None) / 1e9 / (seconds * compute_cores);
        let estimated = estimate.map(|e| e.compute_per_s.min(e.storage_per_s));
        tiers.push(view("cpu", Some(busy), estimated, None));
    } else {
        let storage = busy_ns(Some(Tier::Storage)) / 1e9 / (seconds * storage_cores);
        tiers.push(view(
            "storage",
            Some(storage),
            estimate.map(|e| e.storage_per_s),
            None,
        ));
        let link_bps = c.link as f64 / seconds;
        let link = res.link_bytes_per_s.map(|l| link_bps / l.max(1.0));
        let estimated = estimate.and_then(|e| e.link_per_s);
        tiers.push(view("link", link, estimated, Some(link_bps)));
        let compute = busy_ns(Some(Tier::Compute)) / 1e9 / (seconds * compute_cores);
        tiers.push(view(
            "compute",
            Some(compute),
            estimate.map(|e| e.compute_per_s),
            None,
        ));
    }
    let trainer =
        (c.streamed > Duration::ZERO).then(|| c.waited.as_secs_f64() / c.streamed.as_secs_f64());
    tiers.push(TierView {
        tier: "trainer".into(),
        busy: trainer,
        capacity_per_s: None,
        estimated_per_s: None,
        bytes_per_s: None,
    });
    tiers
}

/// The busiest tier, its busiest stage, and its headroom over the next.
fn bottleneck(tiers: &[TierView], stages: &[StageTiming]) -> Option<Bottleneck> {
    let mut ranked: Vec<(&TierView, f64)> = tiers
        .iter()
        .filter_map(|t| t.busy.map(|b| (t, b)))
        .filter(|(_, b)| *b > 0.0)
        .collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    ranked.first().map(|(t, busy)| Bottleneck {
        tier: t.tier.clone(),
        stage: busiest_stage(stages, &t.tier).map(|s| s.udf.clone()),
        busy: *busy,
        headroom: ranked.get(1).map(|(_, next)| busy / next),
    })
}

/// The stage of `tier` (every stage for `cpu`) that took the most time.
fn busiest_stage<'a>(stages: &'a [StageTiming], tier: &str) -> Option<&'a StageTiming> {
    stages
        .iter()
        .filter(|s| tier == "cpu" || s.site.tier.as_str() == tier)
        .max_by_key(|s| s.tally.nanos)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_udfs::Site;

    fn apart() -> Resources {
        Resources {
            storage_nodes: 1,
            storage_cores: 1.0,
            compute_cores: 1.0,
            link_bytes_per_s: Some(1e6),
            link_source: "configured".into(),
            colocated: None,
        }
    }

    #[test]
    fn a_slow_compute_stage_is_named_with_the_headroom_it_leaves() {
        let stats = StageStats::default();
        let clock = stats.clock();
        // Over one second: storage decodes for 0.2 s, compute resizes for
        // 0.8 s, the link carries 0.1 MB of its 1 MB/s.
        clock.record(&Site::storage("a"), "decode_image", 100, 200_000_000);
        clock.record(&Site::default(), "resize", 100, 800_000_000);
        stats.window(100, 100_000, 1, Duration::from_secs(1));
        let v = stats.total(&apart(), None).unwrap();
        let b = v.bottleneck.clone().unwrap();
        assert_eq!(b.tier, "compute");
        assert_eq!(b.stage.as_deref(), Some("resize"));
        assert!((b.busy - 0.8).abs() < 0.01, "{b:?}");
        assert!((b.headroom.unwrap() - 4.0).abs() < 0.05, "{b:?}");
        let resize = v.stages.iter().find(|s| s.udf == "resize").unwrap();
        assert!(resize.bottleneck);
        assert!((resize.mean_ms - 8.0).abs() < 0.01);
        assert!(
            !v.stages
                .iter()
                .find(|s| s.udf == "decode_image")
                .unwrap()
                .bottleneck
        );
        let link = v.tiers.iter().find(|t| t.tier == "link").unwrap();
        assert!((link.busy.unwrap() - 0.1).abs() < 0.01);
        let text = v.to_text();
        assert!(
            text.contains("resize (compute)") && text.contains("<- bottleneck"),
            "{text}"
        );
        assert!(
            text.contains("bottleneck: compute (resize) at 80% busy"),
            "{text}"
        );
    }

    #[test]
    fn a_reader_that_does_not_read_is_the_bottleneck() {
        let stats = StageStats::default();
        stats
            .clock()
            .record(&Site::default(), "normalize", 10, 10_000_000);
        stats.window(10, 0, 3, Duration::from_millis(100));
        stats.sent(2, Duration::from_millis(900));
        let v = stats.total(&apart(), None).unwrap();
        assert_eq!(v.bottleneck.unwrap().tier, "trainer");
        let windows = v.queues.iter().find(|q| q.queue == "windows").unwrap();
        assert_eq!(windows.mean, 3.0);
    }

    #[test]
    fn co_located_sides_are_one_pool() {
        let stats = StageStats::default();
        let clock = stats.clock();
        clock.record(
            &Site::storage("in-process"),
            "decode_image",
            50,
            600_000_000,
        );
        clock.record(&Site::default(), "normalize", 50, 300_000_000);
        stats.window(50, 0, 1, Duration::from_millis(500));
        let res = Resources {
            compute_cores: 2.0,
            ..Resources::default()
        };
        let v = stats.total(&res, None).unwrap();
        let b = v.bottleneck.unwrap();
        assert_eq!(
            (b.tier.as_str(), b.stage.as_deref()),
            ("cpu", Some("decode_image"))
        );
        assert!((b.busy - 0.9).abs() < 0.01, "{b:?}");
        assert!(v.tiers.iter().all(|t| t.tier != "link"));
    }

    #[test]
    fn nothing_to_show_before_the_first_window() {
        assert!(StageStats::default().view(&apart(), None).is_none());
    }
}
