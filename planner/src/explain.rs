//! [`Explanation`]: what the planner decided and why, as text or JSON.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::calibrate::CalibrationReport;
use crate::choose::{Metric, Rates, Split};
use crate::delivery::Delivery;
use crate::offload::Offload;
use crate::resources::Resources;

/// One candidate cut of a pipeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    /// The cut: how many stages run on storage.
    pub cut: usize,
    /// The UDFs storage runs under it.
    pub on_storage: Vec<String>,
    /// Its estimated rates.
    pub rates: Rates,
}

/// What was chosen for a pipeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "kind")]
pub enum Choice {
    /// One cut for every sample.
    Cut {
        /// The cut.
        cut: usize,
    },
    /// A per-sample split.
    Split(Split),
}

impl Choice {
    /// The choice in words: `cut 1`, or the split's threshold and cuts.
    pub fn describe(&self) -> String {
        match self {
            Choice::Cut { cut } => format!("cut {cut}"),
            Choice::Split(s) => {
                let metric = match s.metric {
                    Metric::Pixels => "width*height",
                    Metric::Bytes => "length",
                };
                format!(
                    "per-sample split: {metric} > {} ({:.0}% of samples) at cut {}, the rest at cut {}",
                    s.threshold,
                    s.share_above * 100.0,
                    s.above,
                    s.below
                )
            }
        }
    }
}

/// The planner's reasoning for one pipeline (a projection over a dataset).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PipelineExplanation {
    /// The dataset.
    pub dataset: String,
    /// Its samples, per the catalog.
    pub samples: u64,
    /// Objects whose statistics were costed.
    pub sampled: usize,
    /// The UDFs of each stage.
    pub stages: Vec<Vec<String>>,
    /// Every single-cut candidate.
    pub candidates: Vec<Candidate>,
    /// The offload mode asked for.
    pub offload: Offload,
    /// The choice.
    pub choice: Choice,
    /// Estimated rates of the choice.
    pub rates: Rates,
    /// Whether the costs were measured on the dataset's own objects
    /// (and what they were), or why not; `None`: not asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<CalibrationReport>,
    /// A job's last level, run at delivery: on the compute side at every
    /// cut, in every candidate's compute rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<Delivery>,
}

/// The whole placement: resources, pipelines, fragments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Explanation {
    /// The resources planned for.
    pub resources: Resources,
    /// One entry per pipeline.
    pub pipelines: Vec<PipelineExplanation>,
    /// Each storage fragment's plan, indented.
    pub storage_fragments: Vec<String>,
    /// The compute fragment's plan, indented.
    pub compute_fragment: String,
    /// A job's stages that run as its batches are written out (on the
    /// compute side, into the trainer's slot or message), one line each:
    /// not part of the fragments above.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub at_delivery: Vec<String>,
    /// A mixture's parts (a job's: weight, samples, realised share), one
    /// line each, its rule first; the pipelines above are its parts', in
    /// order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mixture: Vec<String>,
}

fn rate(r: f64) -> String {
    if r >= 1e6 {
        format!("{:.2}M", r / 1e6)
    } else if r >= 1e4 {
        format!("{:.1}k", r / 1e3)
    } else {
        format!("{r:.1}")
    }
}

fn bytes(b: f64) -> String {
    if b >= 1048576.0 {
        format!("{:.2} MiB", b / 1048576.0)
    } else if b >= 1024.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{b:.0} B")
    }
}

fn micros(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.1} ms", ns / 1e6)
    } else {
        format!("{:.0} µs", ns / 1e3)
    }
}

impl Explanation {
    /// The explanation as a JSON document.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }

    /// The explanation as text.
    pub fn to_text(&self) -> String {
        let r = &self.resources;
        let mut out = String::new();
        match &r.colocated {
            Some(why) => {
                let _ = writeln!(
                    out,
                    "resources: co-located ({why}): one pool of {} core(s) runs both sides, \
                     the link is memory; a cut moves work between thread pools, not machines, \
                     so the cut with the least CPU per sample wins (ties: fewer bytes handed over)",
                    r.compute_cores
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "resources: {} storage node(s) x {} core(s), compute {} core(s), link {} ({})",
                    r.storage_nodes,
                    r.storage_cores,
                    r.compute_cores,
                    r.link_text(),
                    r.link_source
                );
            }
        }
        if let Some((rule, parts)) = self.mixture.split_first() {
            let _ = writeln!(out, "mixture: {rule}");
            for line in parts {
                let _ = writeln!(out, "  {line}");
            }
        }
        for p in &self.pipelines {
            p.write_text(&mut out);
        }
        for (i, f) in self.storage_fragments.iter().enumerate() {
            let _ = writeln!(out, "\nstorage fragment {i}:");
            for line in f.lines() {
                let _ = writeln!(out, "  {line}");
            }
        }
        let _ = writeln!(out, "\ncompute fragment:");
        for line in self.compute_fragment.lines() {
            let _ = writeln!(out, "  {line}");
        }
        if !self.at_delivery.is_empty() {
            let _ = writeln!(
                out,
                "\nat delivery (each batch's column written where the trainer reads it):"
            );
            for line in &self.at_delivery {
                let _ = writeln!(out, "  {line}");
            }
        }
        out
    }
}

impl PipelineExplanation {
    fn write_text(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "\npipeline over {} ({} samples, {} costed)",
            self.dataset, self.samples, self.sampled
        );
        let levels = match &self.calibration {
            Some(CalibrationReport::Measured { levels, .. }) => Some(levels),
            _ => None,
        };
        let cost = |i: usize| match levels.and_then(|l| l.get(i)) {
            Some(l) => format!(
                "  (storage CPU/sample: estimated {}, calibrated {})",
                micros(l.estimated_ns),
                micros(l.calibrated_ns)
            ),
            None => String::new(),
        };
        if levels.is_some() {
            let _ = writeln!(out, "  read{}", cost(0));
        }
        for (i, s) in self.stages.iter().enumerate() {
            let _ = writeln!(out, "  stage {}: {}{}", i + 1, s.join(", "), cost(i + 1));
        }
        if let Some(d) = &self.delivery {
            let measured = d
                .calibrated_ns
                .map_or(String::new(), |ns| format!(", calibrated {}", micros(ns)));
            let _ = writeln!(
                out,
                "  at delivery: {}  (compute CPU/sample: estimated {}{measured}; every cut's compute side pays it)",
                d.stages.join(", "),
                micros(d.estimated_ns)
            );
        }
        match &self.calibration {
            Some(CalibrationReport::Measured { objects, nodes, .. }) => {
                let _ = writeln!(
                    out,
                    "  calibrated on {objects} of the dataset's objects per cut, timed on {}",
                    nodes.join(", ")
                );
            }
            Some(CalibrationReport::Fallback { reason }) => {
                let _ = writeln!(
                    out,
                    "  not calibrated ({reason}): planned with the UDF profiles"
                );
            }
            None => {}
        }
        let _ = writeln!(
            out,
            "  {:>4}  {:>10}  {:>10}  {:>10}  {:>10}  {:>12}  {:<9}  on storage",
            "cut", "storage/s", "link/s", "compute/s", "est/s", "bytes/sample", "limit"
        );
        let chosen = match &self.choice {
            Choice::Cut { cut } => Some(*cut),
            Choice::Split(_) => None,
        };
        for c in &self.candidates {
            let mark = if chosen == Some(c.cut) { "*" } else { " " };
            let on = if c.on_storage.is_empty() {
                "(read only)".to_string()
            } else {
                c.on_storage.join(", ")
            };
            let _ = writeln!(
                out,
                "{mark} {:>4}  {:>10}  {:>10}  {:>10}  {:>10}  {:>12}  {:<9}  {on}",
                c.cut,
                rate(c.rates.storage_per_s),
                c.rates.link_per_s.map_or("-".into(), rate),
                rate(c.rates.compute_per_s),
                rate(c.rates.per_s),
                bytes(c.rates.bytes_per_sample),
                c.rates.bottleneck(),
            );
        }
        let what = self.choice.describe();
        let _ = writeln!(
            out,
            "  offload {}: {what}, est {}/s ({} per sample over the link, limited by {})",
            self.offload,
            rate(self.rates.per_s),
            bytes(self.rates.bytes_per_sample),
            self.rates.bottleneck()
        );
    }
}
