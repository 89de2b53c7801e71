//! [`YieldAfterJoins`]: the compute plan's joins hand control back to the
//! runtime between batches, so a timeout or a client that leaves stops a
//! query within a batch.
//!
//! A query stops when its stream is dropped, and a task is aborted only
//! where it yields. DataFusion makes its leaves cooperative (a batch read
//! spends the task's Tokio budget), but a join makes many rows out of few
//! without reading more: a sort over a cross join of four 60-row tables
//! drains 13 million rows from memory in a single poll, minutes during
//! which neither the query's deadline nor a closed channel is seen, and
//! the work goes on after the client left. Each join's output (and
//! `UNNEST`'s, which grows rows the same way) is wrapped in DataFusion's
//! [`CooperativeExec`]: every batch it passes spends budget, and when the
//! budget is spent the task yields. Results are unchanged; the cost is a
//! budget check per batch.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::joins::{
    CrossJoinExec, HashJoinExec, NestedLoopJoinExec, PiecewiseMergeJoinExec, SortMergeJoinExec,
    SymmetricHashJoinExec,
};
use datafusion::physical_plan::unnest::UnnestExec;

/// See the module docs.
#[derive(Debug, Default)]
pub struct YieldAfterJoins;

/// Whether `plan` can make more rows than it reads.
fn multiplies_rows(plan: &Arc<dyn ExecutionPlan>) -> bool {
    plan.downcast_ref::<CrossJoinExec>().is_some()
        || plan.downcast_ref::<NestedLoopJoinExec>().is_some()
        || plan.downcast_ref::<HashJoinExec>().is_some()
        || plan.downcast_ref::<SortMergeJoinExec>().is_some()
        || plan.downcast_ref::<SymmetricHashJoinExec>().is_some()
        || plan.downcast_ref::<PiecewiseMergeJoinExec>().is_some()
        || plan.downcast_ref::<UnnestExec>().is_some()
}

impl PhysicalOptimizerRule for YieldAfterJoins {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            Ok(if multiplies_rows(&node) {
                Transformed::yes(Arc::new(CooperativeExec::new(node)) as Arc<dyn ExecutionPlan>)
            } else {
                Transformed::no(node)
            })
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "yield_after_joins"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use datafusion::physical_plan::displayable;
    use datafusion::prelude::SessionContext;

    use super::*;

    #[tokio::test]
    async fn joins_are_wrapped_and_results_unchanged() {
        let plain = SessionContext::new();
        let state = datafusion::execution::SessionStateBuilder::new_from_existing(plain.state())
            .with_physical_optimizer_rule(Arc::new(YieldAfterJoins))
            .build();
        let yielding = SessionContext::new_with_state(state);
        let sql = "SELECT a.x * 100 + b.x AS v FROM (VALUES (1), (2), (3)) a(x), \
                   (VALUES (4), (5)) b(x) ORDER BY v";
        let df = yielding.sql(sql).await.unwrap();
        let plan = df.clone().create_physical_plan().await.unwrap();
        let shown = displayable(plan.as_ref()).indent(false).to_string();
        assert!(shown.contains("CooperativeExec"), "{shown}");
        let got =
            datafusion::arrow::util::pretty::pretty_format_batches(&df.collect().await.unwrap())
                .unwrap()
                .to_string();
        let want = plain.sql(sql).await.unwrap().collect().await.unwrap();
        let want = datafusion::arrow::util::pretty::pretty_format_batches(&want)
            .unwrap()
            .to_string();
        assert_eq!(got, want);
    }
}
