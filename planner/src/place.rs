//! [`Planner::place`]: a plan divided into its compute fragment and the
//! storage fragments it reads, each pipeline at the cut (or per-sample
//! split) its costs choose, with the reasons ([`PipelineExplanation`]).
//!
//! A pipeline's costs per cut are modelled from the UDFs' profiles,
//! replaced by what calibration measured where it ran, and charged a
//! stage deferred to delivery on the compute side ([`Planner::costs`]);
//! `offload` picks among them ([`Planner::choose`]); each chosen cut
//! becomes a storage fragment (shipped expressions over the scan) and the
//! compute projection that reads it ([`Planner::fragment`]).

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, Result, ScalarValue, internal_datafusion_err, plan_err};
use datafusion::datasource::provider_as_source;
use datafusion::logical_expr::{
    Expr, LogicalPlan, LogicalPlanBuilder, Projection, TableProviderFilterPushDown, TableScan,
    cast, lit,
};
use sluice_udfs::cost::SampleStats;

use crate::choose::{Metric, best_split};
use crate::cost::{SampleCost, cost_table, mean};
use crate::pipeline::shipped_name;
use crate::{
    Calibration, CalibrationReport, Candidate, Choice, Delivery, Explanation, FragmentTables,
    Offload, Pipeline, PipelineExplanation, Planner, Rates, Split, StorageFragment, calibrate,
};

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

/// A cut or split chosen, its rates, and a split's two predicates (the
/// rows above its threshold, the others).
type Chosen = (Choice, Rates, Option<(Expr, Expr)>);

impl Planner {
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
        let (table, calibration, delivery) = self.costs(p, &rows);
        let candidates: Vec<Candidate> = table
            .iter()
            .enumerate()
            .map(|(k, costs)| Candidate {
                cut: k,
                on_storage: p.stages[..k].iter().flatten().cloned().collect(),
                rates: Rates::of(mean(costs.iter().copied()), &self.resources),
            })
            .collect();
        let (choice, rates, groups) = self.choose(p, offload, &table, &rows, &candidates)?;
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

    /// The cost of each of `p`'s cuts for each sampled row (`rows`):
    /// modelled from the profiles, measured where `p` was calibrated,
    /// with the compute side paying a stage deferred to delivery.
    fn costs(
        &self,
        p: &Pipeline,
        rows: &[SampleStats],
    ) -> (
        Vec<Vec<SampleCost>>,
        Option<CalibrationReport>,
        Option<Delivery>,
    ) {
        let modelled = cost_table(p, &self.profiles, rows);
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
        (table, calibration, delivery)
    }

    /// The cut (or per-sample split) `offload` asks for among
    /// `candidates`, its rates, and a split's two predicates (above and
    /// below its threshold).
    fn choose(
        &self,
        p: &Pipeline,
        offload: Offload,
        table: &[Vec<SampleCost>],
        rows: &[SampleStats],
        candidates: &[Candidate],
    ) -> Result<Chosen> {
        let fixed = |k: usize| -> Result<Chosen> {
            match candidates.get(k) {
                Some(c) => Ok((Choice::Cut { cut: k }, c.rates, None)),
                None => plan_err!(
                    "offload cut {k} is out of range: the pipeline over {} has cuts 0 to {}",
                    p.dataset(),
                    p.depth()
                ),
            }
        };
        match offload {
            Offload::Compute => fixed(0),
            Offload::Storage => fixed(p.depth()),
            Offload::Cut(k) => fixed(k),
            Offload::Auto => {
                let mut best = &candidates[0];
                for c in &candidates[1..] {
                    if c.rates.beats(&best.rates) {
                        best = c;
                    }
                }
                let split = best_split(table, rows, &self.resources, &best.rates)
                    .and_then(|s| Some((split_predicate(&p.scan, &s).ok()?, s)));
                Ok(match split {
                    Some((predicates, s)) => {
                        let rates = s.rates;
                        (Choice::Split(s), rates, Some(predicates))
                    }
                    None => (Choice::Cut { cut: best.cut }, best.rates, None),
                })
            }
        }
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
pub(crate) fn storage_plan(
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
