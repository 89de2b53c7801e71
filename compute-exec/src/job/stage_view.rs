//! What a job's per-stage statistics say ([`JobStages`]), as status,
//! `EXPLAIN ANALYZE` and the dashboard show them: each stage's rate and
//! time per sample, each tier's busy share and the rate it could sustain
//! beside the plan's estimate, the queues, and the bottleneck. Made by
//! `super::stages`.

use serde::{Deserialize, Serialize};

/// One stage at one site, over the view's span.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StageView {
    /// `storage` or `compute`.
    pub tier: String,
    /// The storage node it ran on (absent on the compute side).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node: String,
    /// The UDF.
    pub udf: String,
    /// Samples it evaluated per second.
    pub samples_per_s: f64,
    /// Mean wall time per sample, milliseconds.
    pub mean_ms: f64,
    /// The 90th percentile of the time per sample of its calls (a call is a
    /// batch), milliseconds, within 19%.
    pub p90_ms: f64,
    /// Share of its tier's cores it kept busy.
    pub busy: f64,
    /// Whether it is the job's bottleneck.
    pub bottleneck: bool,
}

/// One tier, over the view's span.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TierView {
    /// `storage`, `link`, `compute`, `trainer`, or `cpu` (co-located sides
    /// as one pool).
    pub tier: String,
    /// Share of its capacity in use: cores kept busy by its stages, the
    /// link's bytes over its bandwidth, the share of time the streams
    /// waited on their readers (`None`: not known, e.g. an unlimited link).
    pub busy: Option<f64>,
    /// Samples per second it could sustain at full use (the job's rate over
    /// `busy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_per_s: Option<f64>,
    /// What the plan estimated it sustains.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_per_s: Option<f64>,
    /// Bytes per second (the link).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_s: Option<f64>,
}

/// The occupancy of a buffer between stages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct QueueView {
    /// `windows` (made ahead of the reader) or `reader` (batches in the
    /// reader's channel).
    pub queue: String,
    /// Mean occupancy.
    pub mean: f64,
    /// Capacity.
    pub capacity: u64,
}

/// What holds the job back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Bottleneck {
    /// The tier.
    pub tier: String,
    /// Its busiest stage, for a CPU tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    /// Its busy share.
    pub busy: f64,
    /// How many times faster the job could go before the next busiest
    /// tier limits it (`None`: no other tier does any work).
    pub headroom: Option<f64>,
}

/// A job's per-stage statistics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobStages {
    /// What the figures cover: `recent` (the last few seconds) or `job`
    /// (from the first window to the last).
    pub over: String,
    /// Its length, seconds.
    pub seconds: f64,
    /// Samples the job's windows made per second.
    pub samples_per_s: f64,
    /// Each stage at each site.
    pub stages: Vec<StageView>,
    /// Each tier.
    pub tiers: Vec<TierView>,
    /// The buffers between stages.
    pub queues: Vec<QueueView>,
    /// The tier (and stage) that holds the job back, once any did work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bottleneck: Option<Bottleneck>,
}

impl JobStages {
    /// The statistics as text, EXPLAIN ANALYZE style: a line per tier, per
    /// stage and per queue, and the bottleneck.
    pub fn to_text(&self) -> String {
        let pct = |b: Option<f64>| b.map_or("-".into(), |b| format!("{:.0}%", b * 100.0));
        let per_s = |r: Option<f64>| r.map_or("-".into(), |r| format!("{r:.0}/s"));
        let mut out = format!(
            "measured over {} ({:.1} s): {:.0} samples/s\n",
            if self.over == "recent" {
                "the last seconds"
            } else {
                "the job"
            },
            self.seconds,
            self.samples_per_s
        );
        out.push_str("  tier      busy   could sustain   estimated\n");
        for t in &self.tiers {
            out.push_str(&format!(
                "  {:<8} {:>5}   {:>13}   {:>9}{}\n",
                t.tier,
                pct(t.busy),
                per_s(t.capacity_per_s),
                per_s(t.estimated_per_s),
                t.bytes_per_s.map_or(String::new(), |b| format!(
                    "   ({:.1} Mbit/s)",
                    b * 8.0 / 1e6
                )),
            ));
        }
        out.push_str(
            "  stage                                        samples/s   mean ms   p90 ms   busy\n",
        );
        for s in &self.stages {
            let at = if s.node.is_empty() {
                s.tier.clone()
            } else {
                format!("{} {}", s.tier, s.node)
            };
            out.push_str(&format!(
                "  {:<44} {:>9.0} {:>9.2} {:>8.2} {:>5.0}%{}\n",
                format!("{} ({at})", s.udf),
                s.samples_per_s,
                s.mean_ms,
                s.p90_ms,
                s.busy * 100.0,
                if s.bottleneck { "  <- bottleneck" } else { "" }
            ));
        }
        for q in &self.queues {
            out.push_str(&format!(
                "  queue {:<8} {:.1} of {} on average\n",
                q.queue, q.mean, q.capacity
            ));
        }
        match &self.bottleneck {
            Some(b) => out.push_str(&format!(
                "bottleneck: {}{} at {:.0}% busy; {}\n",
                b.tier,
                b.stage
                    .as_ref()
                    .map_or(String::new(), |s| format!(" ({s})")),
                b.busy * 100.0,
                b.headroom
                    .map_or("nothing else is busy".into(), |h| format!(
                        "the next tier limits the job at {h:.1}x this rate"
                    ))
            )),
            None => out.push_str("bottleneck: none measured yet\n"),
        }
        out
    }
}
