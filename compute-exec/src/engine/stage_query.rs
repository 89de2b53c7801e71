//! [`run_stage`]: a stage built by hand (a storage fragment's tasks under
//! their boundary) run as one engine query of its own, planned by a
//! coordinating session into the engine's plan around it.
//!
//! The stage is offered to the session as a table ([`StageTable`]) whose
//! scan is the stage itself; the engine then plans the query's top
//! (`DistributedExec`) over it and sends each task to the node it is
//! routed to.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::Result;
use datafusion::datasource::TableType;
use datafusion::execution::{SendableRecordBatchStream, SessionStateBuilder};
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::{SessionConfig, SessionContext};

use super::{NodeChannels, coordinating};

/// Runs `stage` as one engine query over `channels`: its output, in one
/// stream.
pub async fn run_stage(
    stage: Arc<dyn ExecutionPlan>,
    channels: NodeChannels,
) -> Result<SendableRecordBatchStream> {
    let builder = SessionStateBuilder::new()
        .with_config(SessionConfig::new().with_target_partitions(1))
        .with_default_features();
    let ctx = SessionContext::new_with_state(coordinating(builder, channels)?.build());
    ctx.read_table(Arc::new(StageTable(stage)))?
        .execute_stream()
        .await
}

/// A stage built by hand, as a table: planning a scan of it through a
/// coordinating session makes the engine's plan around it.
#[derive(Debug)]
struct StageTable(Arc<dyn ExecutionPlan>);

#[async_trait]
impl TableProvider for StageTable {
    fn schema(&self) -> SchemaRef {
        self.0.schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        _projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::clone(&self.0))
    }
}
