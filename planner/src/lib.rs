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
//! - [`Planner::place`]: the rewrite into fragments.
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
pub mod resources;
pub mod stats;

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::catalog::TableProvider;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, Result, ScalarValue, internal_datafusion_err, plan_err};
use datafusion::datasource::provider_as_source;
use datafusion::logical_expr::{
    Expr, LogicalPlan, LogicalPlanBuilder, Projection, TableProviderFilterPushDown, TableScan,
    cast, lit,
};
use sluice_udfs::cost::Profiles;

pub use calibrate::{Calibration, CalibrationOptions, CalibrationReport, CutTiming};
pub use choose::{Rates, Split};
pub use delivery::Delivery;
pub use explain::{Candidate, Choice, Explanation, PipelineExplanation};
pub use fragment::StorageFragment;
pub use offload::Offload;
pub use pipeline::Pipeline;
pub use resources::Resources;
pub use stats::DatasetStats;

use crate::choose::{Metric, best_split};
use crate::cost::{SampleCost, cost_table, mean};
use crate::pipeline::shipped_name;

/// Where the compute fragment reads a storage fragment from.
pub trait FragmentTables {
    /// A table whose scan yields `fragment`'s output, from wherever it runs.
    fn table(&self, fragment: &StorageFragment) -> Result<Arc<dyn TableProvider>>;
}

/// A plan divided between storage and compute.
#[derive(Debug, Clone)]
pub struct Placement {
    /// The compute fragment: the original plan with each dataset scan
    /// (and the stages placed on storage) replaced by a fragment table.
    pub compute: LogicalPlan,
    /// The storage fragments.
    pub fragments: Vec<StorageFragment>,
    /// Why.
    pub explanation: Explanation,
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

    /// Divides `plan` (optimized) per `offload`.
    pub fn place(
        &self,
        plan: LogicalPlan,
        offload: Offload,
        tables: &dyn FragmentTables,
    ) -> Result<Placement> {
        let mut fragments = Vec::new();
        let mut pipelines = Vec::new();
        let compute = plan
            .transform_down(|node| {
                if let Some(p) = Pipeline::find(&node)
                    && self.stats.contains_key(&p.dataset())
                {
                    let (sub, why) = self.place_pipeline(&p, offload, tables, &mut fragments)?;
                    pipelines.push(why);
                    return Ok(Transformed::new(sub, true, TreeNodeRecursion::Jump));
                }
                if let LogicalPlan::TableScan(scan) = &node
                    && self.stats.contains_key(scan.table_name.table())
                {
                    return Ok(Transformed::yes(self.read_only(
                        scan,
                        tables,
                        &mut fragments,
                    )?));
                }
                Ok(Transformed::no(node))
            })?
            .data;
        if pipelines.is_empty()
            && let Offload::Cut(k) = offload
            && k > 0
        {
            return plan_err!("offload cut {k} is out of range: the query has no pipeline stages");
        }
        let explanation = Explanation {
            resources: self.resources.clone(),
            pipelines,
            storage_fragments: fragments
                .iter()
                .map(|f| f.plan.display_indent().to_string())
                .collect(),
            compute_fragment: compute.display_indent().to_string(),
            at_delivery: Vec::new(),
            mixture: Vec::new(),
        };
        Ok(Placement {
            compute,
            fragments,
            explanation,
        })
    }

    /// Candidates and choice for `p`, then the rewrite.
    fn place_pipeline(
        &self,
        p: &Pipeline,
        offload: Offload,
        tables: &dyn FragmentTables,
        fragments: &mut Vec<StorageFragment>,
    ) -> Result<(LogicalPlan, PipelineExplanation)> {
        let dataset = p.dataset();
        let stats = &self.stats[&dataset];
        let rows = stats.rows();
        let modelled = cost_table(p, &self.profiles, &rows);
        let (table, calibration) = match self.calibrations.get(&calibrate::key(p)) {
            Some(Calibration::Measured { cuts, nodes }) => {
                let table = calibrate::apply(&modelled, cuts);
                let report = CalibrationReport::Measured {
                    objects: cuts.iter().map(|c| c.objects).min().unwrap_or(0),
                    nodes: nodes.clone(),
                    levels: calibrate::levels(&modelled, &table),
                };
                (table, Some(report))
            }
            Some(Calibration::Fallback { reason }) => (
                modelled,
                Some(CalibrationReport::Fallback {
                    reason: reason.clone(),
                }),
            ),
            None => (modelled, None),
        };
        // A job's stage at delivery: compute work at every cut.
        let delivery = self.delivery.get(&calibrate::key(p)).cloned();
        let table = match &delivery {
            Some(d) => table
                .into_iter()
                .map(|cut| {
                    cut.into_iter()
                        .map(|c| SampleCost {
                            compute_ns: c.compute_ns + d.ns(),
                            ..c
                        })
                        .collect()
                })
                .collect(),
            None => table,
        };
        let candidates: Vec<Candidate> = table
            .iter()
            .enumerate()
            .map(|(k, costs)| Candidate {
                cut: k,
                on_storage: p.stages[..k].iter().flatten().cloned().collect(),
                rates: Rates::of(mean(costs.iter().copied()), &self.resources),
            })
            .collect();
        let fixed = |k: usize| -> Result<(Choice, Rates)> {
            match candidates.get(k) {
                Some(c) => Ok((Choice::Cut { cut: k }, c.rates)),
                None => plan_err!(
                    "offload cut {k} is out of range: the pipeline over {dataset} has cuts 0 to {}",
                    p.depth()
                ),
            }
        };
        // The predicates of a per-sample split's two groups.
        let mut groups = None;
        let (choice, rates) = match offload {
            Offload::Compute => fixed(0)?,
            Offload::Storage => fixed(p.depth())?,
            Offload::Cut(k) => fixed(k)?,
            Offload::Auto => {
                let mut best = &candidates[0];
                for c in &candidates[1..] {
                    if c.rates.beats(&best.rates) {
                        best = c;
                    }
                }
                let split = best_split(&table, &rows, &self.resources, &best.rates)
                    .and_then(|s| Some((split_predicate(&p.scan, &s).ok()?, s)));
                match split {
                    Some((predicates, s)) => {
                        groups = Some(predicates);
                        (Choice::Split(s.clone()), s.rates)
                    }
                    None => (Choice::Cut { cut: best.cut }, best.rates),
                }
            }
        };
        let plan = match &choice {
            Choice::Cut { cut } => self.fragment(p, *cut, None, tables, fragments)?,
            Choice::Split(s) => {
                let (above, below) = groups
                    .ok_or_else(|| internal_datafusion_err!("a split without its predicates"))?;
                let a = self.fragment(p, s.above, Some(above), tables, fragments)?;
                let b = self.fragment(p, s.below, Some(below), tables, fragments)?;
                // A union drops qualifiers; the dataset's name restores
                // them for the nodes above, which may name `dataset.column`.
                LogicalPlanBuilder::from(a)
                    .union(b)?
                    .alias(p.scan.table_name.clone())?
                    .build()?
            }
        };
        // The skip policy's checks, on the outputs, once.
        let plan = match p.checks_filter() {
            Some(pred) => LogicalPlanBuilder::from(plan).filter(pred)?.build()?,
            None => plan,
        };
        let why = PipelineExplanation {
            dataset,
            samples: stats.samples,
            sampled: stats.sample.len(),
            stages: p.stages.clone(),
            candidates,
            offload,
            choice,
            rates,
            calibration,
            delivery,
        };
        Ok((plan, why))
    }

    /// The storage fragment of `p` at `cut` (over the rows `group` selects),
    /// and the compute projection that reads it.
    fn fragment(
        &self,
        p: &Pipeline,
        cut: usize,
        group: Option<Expr>,
        tables: &dyn FragmentTables,
        fragments: &mut Vec<StorageFragment>,
    ) -> Result<LogicalPlan> {
        let divided = p.cut(cut);
        let plan = storage_plan(p, cut, group, None)?;
        let fragment = StorageFragment {
            id: fragments.len(),
            dataset: p.dataset(),
            plan,
        };
        let provider = tables.table(&fragment)?;
        let name = format!("__storage_{}", fragment.id);
        fragments.push(fragment);
        let source = LogicalPlanBuilder::scan(name, provider_as_source(provider), None)?.build()?;
        let exprs = divided
            .compute
            .into_iter()
            .zip(p.projection.schema.iter())
            .map(|(e, (q, f))| {
                let e = match e {
                    Expr::Alias(a) => *a.expr,
                    other => other,
                };
                e.alias_qualified(q.cloned(), f.name())
            })
            .collect();
        Ok(LogicalPlan::Projection(Projection::try_new(
            exprs,
            Arc::new(source),
        )?))
    }

    /// A dataset scan outside any pipeline: storage only reads.
    fn read_only(
        &self,
        scan: &TableScan,
        tables: &dyn FragmentTables,
        fragments: &mut Vec<StorageFragment>,
    ) -> Result<LogicalPlan> {
        let fragment = StorageFragment {
            id: fragments.len(),
            dataset: scan.table_name.table().to_string(),
            plan: LogicalPlan::TableScan(scan.clone()),
        };
        let provider = tables.table(&fragment)?;
        fragments.push(fragment);
        LogicalPlanBuilder::scan(scan.table_name.clone(), provider_as_source(provider), None)?
            .build()
    }
}

/// The storage fragment of `p` at `cut`: the shipped expressions over the
/// scan (with `group` applied, stopping after `fetch` rows) and the
/// pipeline's filter.
fn storage_plan(
    p: &Pipeline,
    cut: usize,
    group: Option<Expr>,
    fetch: Option<usize>,
) -> Result<LogicalPlan> {
    let divided = p.cut(cut);
    let mut input = filtered_scan(&p.scan, group)?;
    if let Some(n) = fetch
        && let LogicalPlan::TableScan(s) = &mut input
    {
        s.fetch = Some(s.fetch.map_or(n, |f| f.min(n)));
    } else if let Some(n) = fetch {
        input = LogicalPlanBuilder::from(input).limit(0, Some(n))?.build()?;
    }
    if let Some(f) = &p.filter {
        input = f.with_new_exprs(f.expressions(), vec![input])?;
    }
    let shipped = divided
        .shipped
        .iter()
        .enumerate()
        .map(|(i, e)| e.clone().alias(shipped_name(i)))
        .collect();
    Ok(LogicalPlan::Projection(Projection::try_new(
        shipped,
        Arc::new(input),
    )?))
}

/// `scan` with `group` applied: inside the scan when it takes the filter
/// exactly (metadata filters are applied before any object is read),
/// otherwise as a filter above it.
fn filtered_scan(scan: &TableScan, group: Option<Expr>) -> Result<LogicalPlan> {
    let Some(pred) = group else {
        return Ok(LogicalPlan::TableScan(scan.clone()));
    };
    let exact = scan
        .source
        .supports_filters_pushdown(&[&pred])?
        .first()
        .is_some_and(|p| *p == TableProviderFilterPushDown::Exact);
    if exact {
        let mut s = scan.clone();
        s.filters.push(pred);
        Ok(LogicalPlan::TableScan(s))
    } else {
        LogicalPlanBuilder::from(LogicalPlan::TableScan(scan.clone()))
            .filter(pred)?
            .build()
    }
}

/// The predicates selecting the objects above a split's threshold and the
/// others; neither is ever NULL, and every row satisfies exactly one.
fn split_predicate(scan: &TableScan, s: &Split) -> Result<(Expr, Expr)> {
    let schema = scan.source.schema();
    let col = |name: &str| -> Result<Expr> {
        if schema.field_with_name(name).is_err() {
            return plan_err!(
                "cannot split {} per sample: it has no {name} column",
                scan.table_name
            );
        }
        Ok(Expr::Column(Column::new(
            Some(scan.table_name.clone()),
            name,
        )))
    };
    let t = || lit(ScalarValue::Int64(Some(s.threshold as i64)));
    let big = arrow::datatypes::DataType::Int64;
    Ok(match s.metric {
        Metric::Pixels => {
            let (w, h) = (col("width")?, col("height")?);
            let pixels = cast(w.clone(), big.clone()) * cast(h.clone(), big);
            let above = w
                .clone()
                .is_not_null()
                .and(h.clone().is_not_null())
                .and(pixels.clone().gt(t()));
            let below = w.is_null().or(h.is_null()).or(pixels.lt_eq(t()));
            (above, below)
        }
        Metric::Bytes => {
            let l = col("length")?;
            let bytes = cast(l.clone(), big);
            let above = l.clone().is_not_null().and(bytes.clone().gt(t()));
            let below = l.is_null().or(bytes.lt_eq(t()));
            (above, below)
        }
    })
}
