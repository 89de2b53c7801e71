//! # sluice-planner: where each stage of a pipeline runs, and why
//!
//! The planner takes an optimized DataFusion logical plan and divides it
//! between storage nodes (next to the data) and the compute node:
//!
//! ```text
//!   Projection(normalize(flip(decode_rrc(data))), label)      compute fragment
//!       TableScan pets            ──place──►   Projection(normalize(__sluice_0), __sluice_1)
//!                                                  TableScan __storage_0 ◄── Flight ──┐
//!                                                                                    │
//!                                              storage fragment 0                    │
//!                                              Projection(flip(decode_rrc(data)) AS __sluice_0,
//!                                                         label AS __sluice_1)
//!                                                  TableScan pets
//! ```
//!
//! - [`pipeline`]: finds each projection over a dataset scan and its stages
//!   (nested sluice UDF calls), and divides it at a cut;
//! - [`cost`]: per sample, storage CPU, compute CPU and link bytes of a cut,
//!   from the dataset's [`stats`] and the UDFs' cost profiles;
//! - [`calibrate`]: the same figures measured on the dataset's own objects,
//!   where the stages would run, replacing the profiles' when they exist;
//! - [`choose`]: candidate rates under the [`resources`], the pick, and the
//!   per-sample split;
//! - [`delivery`]: a job's last stage deferred to delivery, costed on the
//!   compute side;
//! - [`explain`]: the reasoning, as text or JSON;
//! - [`fragment`]: the storage fragment, defined once;
//! - [`offload`]: `Offload`: who decides where the stages run.
//! - [`place`]: [`Planner::place`], the rewrite into fragments.
//!
//! The planner only rewrites plans. Who runs a storage fragment — a storage
//! node over Flight, or the same process — is up to the caller's
//! [`FragmentTables`].

pub mod calibrate;
pub mod choose;
pub mod cost;
pub mod delivery;
pub mod explain;
pub mod fragment;
pub mod offload;
pub mod pipeline;
mod place;
pub mod resources;
pub mod stats;

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::catalog::TableProvider;
use datafusion::common::Result;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::logical_expr::LogicalPlan;
use sluice_udfs::cost::Profiles;

pub use calibrate::{Calibration, CalibrationOptions, CalibrationReport, CutTiming};
pub use choose::{Rates, Split};
pub use delivery::Delivery;
pub use explain::{Candidate, Choice, Explanation, PipelineExplanation};
pub use fragment::StorageFragment;
pub use offload::Offload;
pub use pipeline::Pipeline;
pub use place::Placement;
pub use resources::Resources;
pub use stats::DatasetStats;

use crate::cost::cost_table;
use crate::place::storage_plan;

/// Where the compute fragment reads a storage fragment from.
pub trait FragmentTables {
    /// A table whose scan yields `fragment`'s output, from wherever it runs.
    fn table(&self, fragment: &StorageFragment) -> Result<Arc<dyn TableProvider>>;
}

/// The first pipeline of `plan`, top-down.
fn first_pipeline(plan: &LogicalPlan) -> Option<Pipeline> {
    let mut found = None;
    let _ = plan.apply(|node| {
        found = Pipeline::find(node);
        Ok(if found.is_some() {
            TreeNodeRecursion::Stop
        } else {
            TreeNodeRecursion::Continue
        })
    });
    found
}

/// The offload-aware planner.
#[derive(Debug, Clone)]
pub struct Planner {
    /// UDF cost profiles.
    pub profiles: Profiles,
    /// Machines planned for.
    pub resources: Resources,
    /// Statistics of the datasets, by name.
    pub stats: HashMap<String, DatasetStats>,
    /// Calibrations of pipelines, by [`calibrate::key`].
    pub calibrations: HashMap<String, Calibration>,
    /// Stages run at delivery after a pipeline, by its [`calibrate::key`]
    /// ([`Planner::deferring`]).
    pub delivery: HashMap<String, Delivery>,
}

/// The fragments to time to calibrate one pipeline ([`Planner::probes`]).
#[derive(Debug, Clone)]
pub struct Probes {
    /// The pipeline's [`calibrate::key`].
    pub key: String,
    /// Its dataset.
    pub dataset: String,
    /// Its storage fragment at each cut, from 0, over the sample.
    pub fragments: Vec<LogicalPlan>,
    /// The deepest fragment over no object: what a run costs by itself.
    pub empty: LogicalPlan,
    /// The UDFs of each stage (`stages[k - 1]`: those of height `k`), by
    /// which each run's UDF times are told apart
    /// ([`calibrate::from_stages`]).
    pub stages: Vec<Vec<String>>,
}

impl Planner {
    /// The fragments that calibrate each pipeline of `plan` over a dataset
    /// with samples: its storage fragment at every cut, over about
    /// `sample` of the dataset's objects.
    pub fn probes(&self, plan: &LogicalPlan, sample: usize) -> Result<Vec<Probes>> {
        let mut out = Vec::new();
        plan.apply(|node| {
            if let Some(p) = Pipeline::find(node)
                && let Some(stats) = self.stats.get(&p.dataset())
                && stats.samples > 0
                && p.depth() > 0
            {
                let (fragments, empty) =
                    calibrate::probes(&p, stats.samples, sample, |k, group, fetch| {
                        storage_plan(&p, k, group, fetch)
                    })?;
                out.push(Probes {
                    key: calibrate::key(&p),
                    dataset: p.dataset(),
                    fragments,
                    empty,
                    stages: p.stages.clone(),
                });
                return Ok(TreeNodeRecursion::Jump);
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        Ok(out)
    }

    /// This planner for `window`, a job's window plan that computes the
    /// pipeline of `query` less its last level, which the job runs at
    /// delivery (see [`delivery`]): the window's pipeline takes the query's
    /// calibration of the levels it keeps, and every candidate's compute
    /// side pays the last level. Unchanged where `window`'s pipeline is not
    /// exactly that (the same plan, or a level partly deferred: then the
    /// window is planned as it is, with the profiles).
    pub fn deferring(mut self, query: &LogicalPlan, window: &LogicalPlan) -> Self {
        let (Some(q), Some(w)) = (first_pipeline(query), first_pipeline(window)) else {
            return self;
        };
        let d = q.depth();
        if d == 0 || w.depth() + 1 != d || w.stages[..] != q.stages[..d - 1] {
            return self;
        }
        let Some(stats) = self.stats.get(&q.dataset()) else {
            return self;
        };
        let modelled = cost_table(&q, &self.profiles, &stats.rows());
        let estimated_ns = calibrate::levels(&modelled, &modelled)[d].estimated_ns;
        let (key_q, key_w) = (calibrate::key(&q), calibrate::key(&w));
        let calibrated_ns = match self.calibrations.get(&key_q).cloned() {
            Some(Calibration::Measured { cuts, nodes }) if cuts.len() == d + 1 => {
                // The last level's measured cost (never below nothing).
                let per = |k: usize| cuts[k].per_object().unwrap_or(0.0);
                let ns = (per(d) - per(d - 1)).max(0.0);
                let kept = Calibration::Measured {
                    cuts: cuts[..d].to_vec(),
                    nodes,
                };
                self.calibrations.insert(key_w.clone(), kept);
                Some(ns)
            }
            Some(fallback @ Calibration::Fallback { .. }) => {
                self.calibrations.insert(key_w.clone(), fallback);
                None
            }
            _ => None,
        };
        self.delivery.insert(
            key_w,
            Delivery {
                stages: q.stages[d - 1].clone(),
                estimated_ns,
                calibrated_ns,
            },
        );
        self
    }
}
