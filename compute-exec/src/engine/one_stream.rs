//! [`OneStream`]: a plan that crosses hosts on the engine ends in one
//! partition. The engine runs only partition 0 of a distributed plan's
//! top (`DistributedExec`); a query whose compute fragment ends in several
//! partitions (a projection over the nodes' streams, say), or a feed's
//! two tasks, are merged into one before the engine takes them.

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::common::tree_node::TreeNode;
use datafusion::config::ConfigOptions;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};

use datafusion_distributed::NetworkCoalesceExec;

/// See the module docs.
#[derive(Debug, Default)]
pub struct OneStream;

impl PhysicalOptimizerRule for OneStream {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let crosses = plan.exists(|p| Ok(p.is::<NetworkCoalesceExec>()))?;
        if crosses && plan.output_partitioning().partition_count() > 1 {
            return Ok(Arc::new(CoalescePartitionsExec::new(plan)));
        }
        Ok(plan)
    }

    fn name(&self) -> &str {
        "one_stream"
    }

    fn schema_check(&self) -> bool {
        true
    }
}
