//! [`Pipeline`]: the part of a logical plan that may run next to the data,
//! and how a cut divides it.
//!
//! A pipeline is a projection over a dataset scan (with, between them, any
//! filter the scan could not take): the stages are the nested sluice UDF
//! calls of the projection's expressions. A call's *height* is 1 for a call
//! on columns, 1 + the highest call among its arguments otherwise. Cut `k`
//! runs, on storage, every maximal sub-expression of height ≤ `k` that is
//! storage-capable — pure (no volatile function, no subquery) and resting
//! only on storage-side inputs — and ships its value as a column; compute
//! evaluates the rest over those columns. Cut 0 ships the columns the
//! projection reads; the deepest cut runs the whole projection on storage.

use std::collections::BTreeSet;

use datafusion::common::Column;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use std::sync::Arc;

use datafusion::logical_expr::utils::split_conjunction;
use datafusion::logical_expr::{Expr, Filter, LogicalPlan, Projection, TableScan};

/// The column of a dataset table holding the objects' bytes.
pub const DATA_COLUMN: &str = "data";

/// The column of a dataset table holding each object's key.
pub const KEY_COLUMN: &str = "key";

/// Prefix of the columns a storage fragment ships.
pub const SHIPPED: &str = "__sluice_";

/// A projection over a dataset scan.
#[derive(Debug, Clone)]
pub struct Pipeline {
    /// The projection.
    pub projection: Projection,
    /// A filter between the projection and the scan, if any.
    pub filter: Option<LogicalPlan>,
    /// The scan.
    pub scan: TableScan,
    /// The UDFs of each stage: `stages[k - 1]` holds those of height `k`.
    pub stages: Vec<Vec<String>>,
    /// Outputs (indices into the projection) whose rows are kept only when
    /// not NULL: the `skip` error policy's checks. DataFusion pushes them
    /// below the projection, where they would run every stage a second
    /// time; they are taken out of [`Pipeline::filter`] and applied to the
    /// outputs instead (see [`Pipeline::checks_filter`]).
    pub checks: Vec<usize>,
}

impl Pipeline {
    /// The pipeline rooted at `plan`, if `plan` is a projection over a
    /// (filtered) scan.
    pub fn find(plan: &LogicalPlan) -> Option<Self> {
        let LogicalPlan::Projection(p) = plan else {
            return None;
        };
        let (filter, scan) = match p.input.as_ref() {
            LogicalPlan::TableScan(s) => (None, s.clone()),
            f @ LogicalPlan::Filter(inner) => match inner.input.as_ref() {
                LogicalPlan::TableScan(s) if storage_capable(&inner.predicate) => {
                    (Some(f.clone()), s.clone())
                }
                _ => return None,
            },
            _ => return None,
        };
        let mut stages: Vec<BTreeSet<String>> = Vec::new();
        for e in &p.expr {
            collect_stages(e, &mut stages);
        }
        let (filter, checks) = match filter {
            Some(LogicalPlan::Filter(f)) => {
                let (rest, checks) = take_checks(&f.predicate, &p.expr);
                let filter = match rest {
                    Some(_) if checks.is_empty() => Some(LogicalPlan::Filter(f)),
                    Some(pred) => Some(LogicalPlan::Filter(
                        Filter::try_new(pred, Arc::clone(&f.input)).ok()?,
                    )),
                    None => None,
                };
                (filter, checks)
            }
            other => (other, Vec::new()),
        };
        Some(Self {
            projection: p.clone(),
            filter,
            scan,
            stages: stages
                .into_iter()
                .map(|s| s.into_iter().collect())
                .collect(),
            checks,
        })
    }

    /// The predicate of [`Pipeline::checks`] over the outputs, if any.
    pub fn checks_filter(&self) -> Option<Expr> {
        self.checks
            .iter()
            .map(|&i| {
                let (_, f) = self.projection.schema.qualified_field(i);
                Expr::Column(Column::new_unqualified(f.name())).is_not_null()
            })
            .reduce(Expr::and)
    }

    /// The dataset's name as the catalog knows it.
    pub fn dataset(&self) -> String {
        self.scan.table_name.table().to_string()
    }

    /// The deepest cut.
    pub fn depth(&self) -> usize {
        self.stages.len()
    }

    /// Divides the projection at `cut`.
    pub fn cut(&self, cut: usize) -> Cut {
        let mut shipped = Vec::new();
        let compute = self
            .projection
            .expr
            .iter()
            .map(|e| split(e, cut, &mut shipped))
            .collect();
        Cut { shipped, compute }
    }
}

/// Splits `predicate` into the conjuncts that are `e IS NOT NULL` for a
/// stage-bearing output `e` of `outputs` (their indices) and the rest.
fn take_checks(predicate: &Expr, outputs: &[Expr]) -> (Option<Expr>, Vec<usize>) {
    let mut checks = Vec::new();
    let mut rest = Vec::new();
    for c in split_conjunction(predicate) {
        let found = match c {
            Expr::IsNotNull(inner) => outputs.iter().position(|o| {
                let o = match o {
                    Expr::Alias(a) => a.expr.as_ref(),
                    other => other,
                };
                o == inner.as_ref() && height(o) > 0
            }),
            _ => None,
        };
        match found {
            Some(i) if !checks.contains(&i) => checks.push(i),
            Some(_) => {}
            None => rest.push(c.clone()),
        }
    }
    checks.sort_unstable();
    (rest.into_iter().reduce(Expr::and), checks)
}

/// A projection divided at a cut.
#[derive(Debug, Clone, PartialEq)]
pub struct Cut {
    /// What storage computes and ships, in order: column `i` of the
    /// fragment is `shipped[i]`, named [`shipped_name`]`(i)`.
    pub shipped: Vec<Expr>,
    /// The projection's expressions over the shipped columns (unqualified
    /// references to [`shipped_name`]s), in the projection's order.
    pub compute: Vec<Expr>,
}

/// The name of shipped column `i`.
pub fn shipped_name(i: usize) -> String {
    format!("{SHIPPED}{i}")
}

/// Whether `name` is a sluice UDF (one with a cost model).
pub fn is_stage(name: &str) -> bool {
    sluice_udfs::udf::spec(name).is_some()
}

/// The height of `e`: how many nested sluice UDF calls its deepest path has.
pub fn height(e: &Expr) -> usize {
    let mut below = 0;
    let _ = e.apply_children(|c| {
        below = below.max(height(c));
        Ok(TreeNodeRecursion::Continue)
    });
    match e {
        Expr::ScalarFunction(f) if is_stage(f.func.name()) => below + 1,
        _ => below,
    }
}

/// Whether `e` can run on storage: pure, and free of subqueries and
/// outer references.
pub fn storage_capable(e: &Expr) -> bool {
    if e.is_volatile() {
        return false;
    }
    let mut ok = true;
    let _ = e.apply(|n| {
        if matches!(
            n,
            Expr::ScalarSubquery(_)
                | Expr::InSubquery(_)
                | Expr::Exists(_)
                | Expr::OuterReferenceColumn(..)
                | Expr::Placeholder(_)
                | Expr::AggregateFunction(_)
                | Expr::WindowFunction(_)
        ) {
            ok = false;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    ok
}

fn collect_stages(e: &Expr, stages: &mut Vec<BTreeSet<String>>) {
    let _ = e.apply(|n| {
        if let Expr::ScalarFunction(f) = n
            && is_stage(f.func.name())
        {
            let h = height(n);
            if stages.len() < h {
                stages.resize_with(h, BTreeSet::new);
            }
            stages[h - 1].insert(f.func.name().to_string());
        }
        Ok(TreeNodeRecursion::Continue)
    });
}

fn split(e: &Expr, cut: usize, shipped: &mut Vec<Expr>) -> Expr {
    let reads_columns = !e.column_refs().is_empty();
    let inner = match e {
        Expr::Alias(a) => a.expr.as_ref(),
        other => other,
    };
    if reads_columns && height(inner) <= cut && storage_capable(inner) {
        let i = match shipped.iter().position(|s| s == inner) {
            Some(i) => i,
            None => {
                shipped.push(inner.clone());
                shipped.len() - 1
            }
        };
        let col = Expr::Column(Column::from_name(shipped_name(i)));
        return match e {
            Expr::Alias(a) => col.alias_qualified(a.relation.clone(), a.name.clone()),
            _ => col,
        };
    }
    e.clone()
        .map_children(|c| Ok(Transformed::yes(split(&c, cut, shipped))))
        .map(|t| t.data)
        .unwrap_or_else(|_| e.clone())
}
