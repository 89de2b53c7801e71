//! A placed plan bound to another stream's [`UdfEnv`].
//!
//! A job is planned and placed once; each of its streams runs that plan
//! under an environment of its own: its epoch (random UDFs draw from
//! `seed, epoch, key`), its bad-sample log and its cancel. The rewrite
//! ([`crate::rewrite`]) completes every random call with the seed and
//! epoch as literals, and every call and panic guard holds the environment
//! it was planned under, so [`rebind_plan`] makes the stream's plan from
//! the job's:
//!
//! - each sluice UDF call is bound to the new environment, and its hidden
//!   seed and epoch literals become the new environment's;
//! - each panic guard ([`crate::panic_guard`]) reports to it;
//! - projections and filters, the nodes that hold such expressions, are
//!   rebuilt over them; every other node is kept as it is, and one that
//!   holds a sluice call anyway is refused, by name, rather than run under
//!   the epoch it was planned for.
//!
//! This is a walk of the plan: no SQL, no optimizer and no placement run
//! again, and the result computes exactly the bytes a plan made afresh
//! for that environment would.
//!
//! [`same_every_epoch`] tells when rebinding changes no value: a plan with
//! no random call (none takes the seed and epoch) and nothing volatile
//! computes the same row for a sample in every epoch, so its outputs may
//! be kept from one epoch for the next.

use std::sync::Arc;

use datafusion::common::ScalarValue;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{Expr, LogicalPlan, Volatility};
use datafusion::physical_expr::expressions::Literal;
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::filter::{FilterExec, FilterExecBuilder};
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};

use crate::env::UdfEnv;
use crate::panic_guard::GuardedExpr;
use crate::udf::{bound_to, spec};

/// `expr` with its sluice UDF calls and panic guards bound to `env` (see
/// the module).
pub fn rebind_expr(
    expr: Arc<dyn PhysicalExpr>,
    env: &Arc<UdfEnv>,
) -> Result<Arc<dyn PhysicalExpr>> {
    expr.transform_up(|e| {
        if let Some(guard) = e.downcast_ref::<GuardedExpr>() {
            return Ok(Transformed::yes(Arc::new(guard.under(env)) as _));
        }
        let Some(call) = e.downcast_ref::<ScalarFunctionExpr>() else {
            return Ok(Transformed::no(e));
        };
        let Some(udf) = bound_to(call.fun(), env) else {
            return Ok(Transformed::no(e));
        };
        let mut args = call.args().to_vec();
        if let Some(seed) = spec(udf.name()).and_then(|s| s.seed_index()) {
            let options = &env.options;
            for (i, value) in [(seed, options.seed), (seed + 1, options.epoch)] {
                let planned = args.get(i).and_then(|a| a.downcast_ref::<Literal>());
                match planned.map(|l| l.value().data_type()) {
                    Some(ty) => {
                        // The literal keeps the type it was coerced to.
                        let v = ScalarValue::Int64(Some(value as i64)).cast_to(&ty)?;
                        args[i] = Arc::new(Literal::new(v));
                    }
                    None => {
                        return Err(DataFusionError::Plan(format!(
                            "{} was planned without its hidden seed and epoch literals",
                            udf.name()
                        )));
                    }
                }
            }
        }
        let rebound = ScalarFunctionExpr::new(
            call.name(),
            Arc::new(udf),
            args,
            call.return_field(&arrow::datatypes::Schema::empty())?,
            Arc::new(call.config_options().clone()),
        )
        .with_nullable(call.nullable());
        Ok(Transformed::yes(Arc::new(rebound) as _))
    })
    .map(|t| t.data)
}

/// Whether `expr` holds a sluice UDF call or a panic guard.
fn holds_bound(expr: &Arc<dyn PhysicalExpr>) -> Result<bool> {
    let mut found = false;
    expr.apply(|e| {
        let guarded = e.downcast_ref::<GuardedExpr>().is_some();
        let call = e
            .downcast_ref::<ScalarFunctionExpr>()
            .is_some_and(|c| spec(c.fun().name()).is_some());
        found = guarded || call;
        Ok(if found {
            TreeNodeRecursion::Stop
        } else {
            TreeNodeRecursion::Continue
        })
    })?;
    Ok(found)
}

/// `node` itself (not its children) bound to `env`: a projection's or a
/// filter's expressions rebound, any other node as it is, unless it holds
/// a sluice call (an error naming it).
pub fn rebind_node(
    node: Arc<dyn ExecutionPlan>,
    env: &Arc<UdfEnv>,
) -> Result<Transformed<Arc<dyn ExecutionPlan>>> {
    if let Some(p) = node.downcast_ref::<ProjectionExec>() {
        let exprs = p
            .expr()
            .iter()
            .map(|e| {
                Ok(ProjectionExpr::new(
                    rebind_expr(Arc::clone(&e.expr), env)?,
                    e.alias.clone(),
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let rebuilt = ProjectionExec::try_new(exprs, Arc::clone(p.input()))?;
        return Ok(Transformed::yes(Arc::new(rebuilt)));
    }
    if let Some(f) = node.downcast_ref::<FilterExec>() {
        let predicate = rebind_expr(Arc::clone(f.predicate()), env)?;
        let rebuilt = FilterExecBuilder::from(f)
            .with_predicate(predicate)
            .build()?;
        return Ok(Transformed::yes(Arc::new(rebuilt)));
    }
    let mut holds = false;
    node.apply_expressions(&mut |e| {
        holds = holds_bound(e)?;
        Ok(if holds {
            TreeNodeRecursion::Stop
        } else {
            TreeNodeRecursion::Continue
        })
    })?;
    if holds {
        return Err(DataFusionError::Plan(format!(
            "{} holds sluice UDF calls, and a plan is rebound to a stream only through \
             projections and filters",
            node.name()
        )));
    }
    Ok(Transformed::no(node))
}

/// `plan` with every node bound to `env` (see the module).
pub fn rebind_plan(
    plan: Arc<dyn ExecutionPlan>,
    env: &Arc<UdfEnv>,
) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| rebind_node(node, env))
        .map(|t| t.data)
}

/// Whether `plan` computes the same value for a row in every epoch: it
/// calls no random UDF (one that draws from the seed and epoch) and
/// nothing volatile (`random()`, `now()` …). Bad samples are another
/// matter: the error policy decides what they become, every epoch.
pub fn same_every_epoch(plan: &LogicalPlan) -> bool {
    let mut same = true;
    let varies = |e: &Expr| match e {
        Expr::ScalarFunction(f) => {
            spec(f.func.name()).is_some_and(|s| s.seed_index().is_some())
                || f.func.signature().volatility == Volatility::Volatile
        }
        _ => false,
    };
    let walked = plan.apply_with_subqueries(|node| {
        node.apply_expressions(|e| {
            e.apply(|e| {
                if varies(e) {
                    same = false;
                    return Ok(TreeNodeRecursion::Stop);
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })
    });
    walked.is_ok() && same
}
