//! [`PartialOnStorage`]: a query's partial aggregate runs in the storage
//! fragments, on the nodes, so that what crosses to the coordinating node
//! is one partial row per group and node rather than every row read.
//!
//! DataFusion splits an aggregate into a partial and a final step; the
//! partial step may run on any split of its input, the final step merges
//! what the partial steps made. When the partial step's input is the rows
//! of a storage fragment's stage (a [`ReportedExec`], perhaps under
//! projections and a round-robin repartition), the step (and the
//! projections) move into every task's fragment; the stage's output is
//! then the partial rows, and the final step reads them as before. An
//! aggregate whose partial step needs its input in an order stays where
//! it is (a node's rows arrive in no order the plan knows).

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::config::ConfigOptions;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{
    ChildrenPropertiesMode, ExecutionPlan, Partitioning, ReplaceChildrenOptions,
};

use crate::reported::ReportedExec;

/// See the module docs.
#[derive(Debug, Default)]
pub struct PartialOnStorage;

impl PhysicalOptimizerRule for PartialOnStorage {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(push_partial).map(|t| t.data)
    }

    fn name(&self) -> &str {
        "partial_on_storage"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

fn recompute() -> ReplaceChildrenOptions {
    ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute)
}

fn push_partial(plan: Arc<dyn ExecutionPlan>) -> Result<Transformed<Arc<dyn ExecutionPlan>>> {
    let Some(agg) = plan.downcast_ref::<AggregateExec>() else {
        return Ok(Transformed::no(plan));
    };
    if *agg.mode() != AggregateMode::Partial
        || plan.required_input_ordering().iter().any(Option::is_some)
    {
        return Ok(Transformed::no(plan));
    }
    // Down from the partial step: projections move with it, a round-robin
    // repartition stays above the stage, anything else stops the move.
    let mut moved: Vec<Arc<dyn ExecutionPlan>> = vec![Arc::clone(&plan)];
    let mut spread: Option<Arc<dyn ExecutionPlan>> = None;
    let mut below = Arc::clone(agg.input());
    let reported = loop {
        if let Some(r) = below.downcast_ref::<ReportedExec>() {
            break r;
        }
        let next = match below.children().as_slice() {
            [only] => Arc::clone(only),
            _ => return Ok(Transformed::no(plan)),
        };
        if below.is::<ProjectionExec>() {
            moved.push(Arc::clone(&below));
        } else if let Some(r) = below.downcast_ref::<RepartitionExec>()
            && matches!(r.partitioning(), Partitioning::RoundRobinBatch(_))
            && spread.is_none()
        {
            spread = Some(Arc::clone(&below));
        } else {
            return Ok(Transformed::no(plan));
        }
        below = next;
    };
    let on_top = |fragment: Arc<dyn ExecutionPlan>| {
        moved.iter().rev().try_fold(fragment, |input, node| {
            Arc::clone(node).replace_children(vec![input], recompute())
        })
    };
    let Some(stage) = super::restage(reported, on_top)? else {
        return Ok(Transformed::no(plan));
    };
    let top = match spread {
        Some(r) => r.replace_children(vec![stage], recompute())?,
        None => stage,
    };
    Ok(Transformed::yes(top))
}
