//! Calibration on the job's own data: the cost model's figures replaced by
//! what the pipeline's stages cost on a sample of the dataset, timed where
//! they would run.
//!
//! ```text
//!  for each pipeline and each cut k = 0..=depth:
//!      the storage fragment of cut k over a sample (md5(key) below a
//!      threshold: spread over the dataset, the same objects for every cut;
//!      at most `sample` objects) ─► each storage node holding the dataset runs
//!      it without sending a byte and answers its CPU time and rows
//!  (and the deepest over no object: the cost of a run, taken off each)
//!  S_k = storage CPU per sample through cut k (S_0: the read alone)
//!      = S_0 + the time inside level 1..k's UDF calls, per object, over
//!        every run that ran them (each UDF times its own calls), where
//!        the levels' UDFs are told apart by name; else S_k as measured
//!  level j's measured cost S_j − S_{j−1} replaces the model's, row by row in
//!  proportion to the model's estimate for that row (so per-sample splits
//!  still see big and small objects), and both sides pay it: a stage costs
//!  the same CPU whichever side runs it (the rig's hosts are one CPU type)
//! ```
//!
//! Why a stage's own time rather than the difference of two runs: each
//! cut's run is timed once over a few dozen objects, and a cheap stage
//! after an expensive one (normalize, 0.3 ms, after a decode of 4 ms whose
//! runs vary by ±10%) vanished in the difference: EXPLAIN called it free.
//!
//! What cannot be measured is said, never guessed: a sample of bad objects
//! only, or a node that fails while timing, leaves the profiles' figures in
//! place and [`Calibration::Fallback`] names why (EXPLAIN shows it).

use datafusion::common::{Column, Result, ScalarValue};
use datafusion::logical_expr::{Expr, LogicalPlan, TableScan, lit};
use serde::{Deserialize, Serialize};

use crate::cost::{LINK_NS_PER_BYTE, SampleCost};
use crate::pipeline::Pipeline;

/// How calibration samples and how long it may take.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CalibrationOptions {
    /// Objects timed per cut (all of them on a smaller dataset).
    pub sample: usize,
    /// Time each node may spend on one cut's fragment; past it, the rows
    /// done so far are what was measured.
    pub budget: std::time::Duration,
}

impl Default for CalibrationOptions {
    fn default() -> Self {
        Self {
            sample: 24,
            budget: std::time::Duration::from_millis(1500),
        }
    }
}

/// Levels (0: the read, then each stage) with the model's and the
/// measured storage CPU per sample: what EXPLAIN shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LevelCost {
    /// The cost model's estimate, ns.
    pub estimated_ns: f64,
    /// Measured on the dataset's own objects, ns.
    pub calibrated_ns: f64,
}

/// What calibration did for one pipeline, as EXPLAIN reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "kind")]
pub enum CalibrationReport {
    /// Planned with measured costs.
    Measured {
        /// Objects timed per cut.
        objects: u64,
        /// The nodes that timed them.
        nodes: Vec<String>,
        /// Per level, estimated and calibrated.
        levels: Vec<LevelCost>,
    },
    /// Planned with the profiles, and why.
    Fallback {
        /// Why.
        reason: String,
    },
}

/// What one cut's fragment cost on the nodes that timed it.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct CutTiming {
    /// Objects read (rows sent plus bad samples).
    pub objects: u64,
    /// Storage CPU, ns, over all of them.
    pub cpu_ns: f64,
}

impl CutTiming {
    /// CPU per object, ns (`None` when nothing was read).
    pub fn per_object(&self) -> Option<f64> {
        (self.objects > 0).then(|| self.cpu_ns / self.objects as f64)
    }
}

/// Calibration of one pipeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "kind")]
pub enum Calibration {
    /// Measured: storage CPU per object of each cut's fragment.
    Measured {
        /// Per cut, from 0.
        cuts: Vec<CutTiming>,
        /// The nodes that timed it.
        nodes: Vec<String>,
    },
    /// Not measured, and why: the profiles' figures stand.
    Fallback {
        /// Why.
        reason: String,
    },
}

/// The key calibrations are kept under: the dataset and the stages of the
/// pipeline's full storage fragment, with their arguments. Plain columns
/// are left out, so a job's window plan (which also carries each row's
/// slot) finds what its SQL was calibrated with.
pub fn key(p: &Pipeline) -> String {
    let exprs: Vec<String> = p
        .cut(p.depth())
        .shipped
        .iter()
        .filter(|e| !matches!(e, Expr::Column(_)))
        .map(|e| e.to_string())
        .collect();
    format!("{}: {}", p.dataset(), exprs.join(", "))
}

/// The predicate choosing about `fraction` of a dataset's objects by the
/// hash of their key: spread over the dataset, the same ones every time.
pub fn sample_predicate(scan: &TableScan, fraction: f64) -> Option<Expr> {
    if fraction >= 1.0 {
        return None;
    }
    let threshold = (fraction.max(0.0) * 4_294_967_296.0) as u64;
    let key = Expr::Column(Column::new(
        Some(scan.table_name.clone()),
        crate::pipeline::KEY_COLUMN,
    ));
    let md5 = datafusion::functions::crypto::expr_fn::md5(key);
    Some(md5.lt(lit(ScalarValue::Utf8(Some(format!("{threshold:08x}"))))))
}

/// The probes of one pipeline: its storage fragment at every cut, over the
/// sample (`sample` objects of `samples`), and the deepest one over no
/// object at all, whose cost (binding, planning, opening the scan) is what
/// a run costs whatever its size and is taken off each cut's: a window of
/// a job pays it once for hundreds of samples, not once for a few dozen.
pub fn probes(
    p: &Pipeline,
    samples: u64,
    sample: usize,
    fragment: impl Fn(usize, Option<Expr>, Option<usize>) -> Result<LogicalPlan>,
) -> Result<(Vec<LogicalPlan>, LogicalPlan)> {
    // Twice the objects wanted, as the hash is not exactly even on a small
    // dataset; the scan stops at `sample`.
    let fraction = 2.0 * sample as f64 / samples.max(1) as f64;
    let pred = sample_predicate(&p.scan, fraction);
    let cuts = (0..=p.depth())
        .map(|k| fragment(k, pred.clone(), Some(sample)))
        .collect::<Result<_>>()?;
    let empty = fragment(p.depth(), pred, Some(0))?;
    Ok((cuts, empty))
}

/// `table` (per cut, per costed row) with the measured cost of each level
/// in place of the model's: see the module docs.
pub fn apply(table: &[Vec<SampleCost>], cuts: &[CutTiming]) -> Vec<Vec<SampleCost>> {
    let depth = table.len().saturating_sub(1);
    let rows = table.first().map_or(0, Vec::len);
    if cuts.len() != table.len() || rows == 0 {
        return table.to_vec();
    }
    // Storage work of each cut and row, without its encoding of the link.
    let work = |k: usize, r: usize| {
        let c = &table[k][r];
        (c.storage_ns - LINK_NS_PER_BYTE * c.link_bytes).max(0.0)
    };
    // Measured cumulative cost, made monotone (a later cut does all an
    // earlier one does; noise may say otherwise).
    let mut measured = Vec::with_capacity(cuts.len());
    let mut last = 0.0f64;
    for c in cuts {
        last = last.max(c.per_object().unwrap_or(last));
        measured.push(last);
    }
    // Per level: each row's modelled increment, scaled so their mean is the
    // measured one (or the measured one as is, where the model says free).
    let mut levels = vec![vec![0.0; rows]; depth + 1];
    for (j, level) in levels.iter_mut().enumerate() {
        let incs: Vec<f64> = (0..rows)
            .map(|r| {
                if j == 0 {
                    work(0, r)
                } else {
                    (work(j, r) - work(j - 1, r)).max(0.0)
                }
            })
            .collect();
        let target = if j == 0 {
            measured[0]
        } else {
            measured[j] - measured[j - 1]
        };
        let mean = incs.iter().sum::<f64>() / rows as f64;
        for (out, inc) in level.iter_mut().zip(&incs) {
            *out = if mean > 1.0 {
                inc * target / mean
            } else {
                target
            };
        }
    }
    (0..=depth)
        .map(|k| {
            (0..rows)
                .map(|r| {
                    let through: f64 = levels[..=k].iter().map(|l| l[r]).sum();
                    let rest: f64 = levels[k + 1..].iter().map(|l| l[r]).sum();
                    let link = LINK_NS_PER_BYTE * table[k][r].link_bytes;
                    SampleCost {
                        storage_ns: through + link,
                        link_bytes: table[k][r].link_bytes,
                        compute_ns: rest + link,
                        out_bytes: table[k][r].out_bytes,
                    }
                })
                .collect()
        })
        .collect()
}

/// Each cut's timing rebuilt from its parts: the read (cut 0's run, per
/// object) plus, per level, the time inside that level's UDF calls per
/// object, summed over every run that made them (runs of cut `j` and
/// deeper). `udf_ns[k]` is cut `k`'s run's time per UDF name, `stages`
/// the UDF names of each level (see [`crate::Probes::stages`]).
///
/// `None`, and the runs' totals stand, where the levels cannot be told
/// apart: a UDF name at two levels, a stage that is not a timed UDF (no
/// time under its name in a run that ran it), or cuts and levels that do
/// not match.
pub fn from_stages(
    cuts: &[CutTiming],
    udf_ns: &[std::collections::BTreeMap<String, u64>],
    stages: &[Vec<String>],
) -> Option<Vec<CutTiming>> {
    if cuts.len() != stages.len() + 1 || udf_ns.len() != cuts.len() {
        return None;
    }
    let mut seen = std::collections::HashSet::new();
    for level in stages {
        let names: std::collections::HashSet<&String> = level.iter().collect();
        if names.iter().any(|n| !seen.insert(*n)) {
            return None;
        }
    }
    let read = cuts[0].per_object()?;
    let mut levels = Vec::with_capacity(stages.len());
    for (j, level) in stages.iter().enumerate().map(|(i, l)| (i + 1, l)) {
        let names: std::collections::BTreeSet<&String> = level.iter().collect();
        let (mut ns, mut objects) = (0.0, 0u64);
        for (cut, times) in cuts.iter().zip(udf_ns).skip(j) {
            for name in &names {
                ns += *times.get(*name)? as f64;
            }
            objects += cut.objects;
        }
        if objects == 0 {
            return None;
        }
        levels.push(ns / objects as f64);
    }
    let mut through = read;
    Some(
        cuts.iter()
            .enumerate()
            .map(|(k, c)| {
                if k > 0 {
                    through += levels[k - 1];
                }
                CutTiming {
                    objects: c.objects,
                    cpu_ns: through * c.objects as f64,
                }
            })
            .collect(),
    )
}

/// Per level (0: the read, then each stage), the model's and the measured
/// storage CPU per sample, ns: what EXPLAIN shows.
pub fn levels(table: &[Vec<SampleCost>], calibrated: &[Vec<SampleCost>]) -> Vec<LevelCost> {
    let mean_work = |t: &[Vec<SampleCost>], k: usize| {
        let rows = &t[k];
        rows.iter()
            .map(|c| (c.storage_ns - LINK_NS_PER_BYTE * c.link_bytes).max(0.0))
            .sum::<f64>()
            / rows.len().max(1) as f64
    };
    (0..table.len())
        .map(|k| {
            let (m, c) = (mean_work(table, k), mean_work(calibrated, k));
            if k == 0 {
                LevelCost {
                    estimated_ns: m,
                    calibrated_ns: c,
                }
            } else {
                LevelCost {
                    estimated_ns: (m - mean_work(table, k - 1)).max(0.0),
                    calibrated_ns: (c - mean_work(calibrated, k - 1)).max(0.0),
                }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost(storage_ns: f64, link_bytes: f64, compute_ns: f64) -> SampleCost {
        SampleCost {
            storage_ns: storage_ns + LINK_NS_PER_BYTE * link_bytes,
            link_bytes,
            compute_ns: compute_ns + LINK_NS_PER_BYTE * link_bytes,
            out_bytes: 0.0,
        }
    }

    #[test]
    fn measured_levels_replace_the_model_and_keep_its_spread() {
        // Two rows; the model: read 1 µs, the stage 10 µs (row 0) and 30 µs
        // (row 1). Measured: the read 2 µs, the stage 200 µs on average.
        let table = vec![
            vec![cost(1e3, 1000.0, 10e3), cost(1e3, 1000.0, 30e3)],
            vec![cost(11e3, 10.0, 0.0), cost(31e3, 10.0, 0.0)],
        ];
        let cuts = [
            CutTiming {
                objects: 10,
                cpu_ns: 20e3,
            },
            CutTiming {
                objects: 10,
                cpu_ns: 2020e3,
            },
        ];
        let t = apply(&table, &cuts);
        let work = |c: &SampleCost| c.storage_ns - LINK_NS_PER_BYTE * c.link_bytes;
        assert!((work(&t[0][0]) - 2e3).abs() < 1e-6);
        // The stage's 200 µs mean, split 1:3 as the model had it.
        assert!((work(&t[1][0]) - (2e3 + 100e3)).abs() < 1e-6);
        assert!((work(&t[1][1]) - (2e3 + 300e3)).abs() < 1e-6);
        // Cut 0: compute pays the stage.
        let cw = |c: &SampleCost| c.compute_ns - LINK_NS_PER_BYTE * c.link_bytes;
        assert!((cw(&t[0][1]) - 300e3).abs() < 1e-6);
        assert_eq!(t[0][0].link_bytes, 1000.0);
        let l = levels(&table, &t);
        assert!((l[1].calibrated_ns - 200e3).abs() < 1e-6);
        assert!((l[1].estimated_ns - 20e3).abs() < 1e-6);
    }

    #[test]
    fn each_level_is_its_udfs_own_time_over_the_runs_that_made_it() {
        let times = |pairs: &[(&str, u64)]| -> std::collections::BTreeMap<String, u64> {
            pairs.iter().map(|(n, t)| (n.to_string(), *t)).collect()
        };
        // The read: 50 µs per object. decode: 4 ms per object in both runs
        // that made it; normalize: 0.3 ms. The totals say normalize is
        // free (cut 2 ran cheaper than cut 1): the difference lost it.
        let cuts = [
            CutTiming {
                objects: 10,
                cpu_ns: 500e3,
            },
            CutTiming {
                objects: 10,
                cpu_ns: 44_000e3,
            },
            CutTiming {
                objects: 10,
                cpu_ns: 43_000e3,
            },
        ];
        let udf_ns = [
            times(&[]),
            times(&[("decode", 41_000_000)]),
            times(&[("decode", 39_000_000), ("normalize", 3_000_000)]),
        ];
        let stages = vec![vec!["decode".to_string()], vec!["normalize".to_string()]];
        let got = from_stages(&cuts, &udf_ns, &stages).unwrap();
        let per = |c: &CutTiming| c.per_object().unwrap();
        assert!((per(&got[0]) - 50e3).abs() < 1e-6);
        assert!((per(&got[1]) - (50e3 + 4e6)).abs() < 1e-6);
        assert!((per(&got[2]) - (50e3 + 4e6 + 0.3e6)).abs() < 1e-6);
        // Not told apart: the same UDF at two levels, or a stage no run timed.
        let twice = vec![vec!["resize".to_string()], vec!["resize".to_string()]];
        assert!(from_stages(&cuts, &udf_ns, &twice).is_none());
        let untimed = vec![vec!["decode".to_string()], vec!["abs".to_string()]];
        assert!(from_stages(&cuts, &udf_ns, &untimed).is_none());
        assert!(from_stages(&cuts[..2], &udf_ns[..2], &stages).is_none());
    }

    #[test]
    fn noise_never_makes_a_deeper_cut_cheaper() {
        let table = vec![vec![cost(1e3, 100.0, 5e3)], vec![cost(6e3, 10.0, 0.0)]];
        let cuts = [
            CutTiming {
                objects: 4,
                cpu_ns: 40e3,
            },
            CutTiming {
                objects: 4,
                cpu_ns: 36e3,
            },
        ];
        let t = apply(&table, &cuts);
        assert!(t[1][0].storage_ns >= t[0][0].storage_ns - LINK_NS_PER_BYTE * 90.0);
        assert!(t[0][0].compute_ns >= LINK_NS_PER_BYTE * 100.0);
    }
}
