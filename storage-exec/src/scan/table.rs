//! [`DatasetTable`]: one dataset version as a DataFusion table.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::DFSchema;
use datafusion::datasource::source::DataSourceExec;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::Result as DFResult;
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use sluice_planner::fragment::Take;
use sluice_planner::fragment::filter_pushdown;

use super::options::ScanOptions;
use super::source::{ExtentSource, ScanColumns};
use super::take::VersionIndex;
use super::version::DatasetVersion;

/// A dataset version exposed to SQL.
#[derive(Debug)]
pub struct DatasetTable {
    version: Arc<DatasetVersion>,
    options: ScanOptions,
}

impl DatasetTable {
    /// A table over `version`.
    pub fn new(version: Arc<DatasetVersion>, options: ScanOptions) -> Self {
        Self { version, options }
    }

    /// The version it reads.
    pub fn version(&self) -> &Arc<DatasetVersion> {
        &self.version
    }

    /// A job's scan of `take` over this version, whose metadata is
    /// `index`; `projection` may name the slot column (the index past the
    /// table's columns). `filters` still apply: they route rows between
    /// the groups of a plan that places groups of samples apart.
    pub fn take_scan(
        &self,
        state: &dyn Session,
        index: Arc<VersionIndex>,
        take: &Take,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let columns = self.columns(state, projection, filters)?;
        let source = ExtentSource::take(
            Arc::clone(&self.version),
            index,
            take,
            columns,
            state.config().target_partitions(),
            self.options.clone(),
        )?;
        Ok(DataSourceExec::from_data_source(source))
    }

    /// The table columns to produce, the metadata columns to read (the
    /// projected ones, those the filters use, and the extent columns when
    /// `data` is wanted), their schema and the filters over it.
    fn columns(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
    ) -> DFResult<ScanColumns> {
        let v = &self.version;
        let projection: Vec<usize> = match projection {
            Some(p) => p.clone(),
            None => (0..v.table_schema.fields().len()).collect(),
        };
        let wants_data = projection.contains(&v.data_index());
        let mut read: Vec<usize> = projection
            .iter()
            .copied()
            .filter(|&i| i < v.data_index())
            .collect();
        for f in filters {
            for c in f.column_refs() {
                if let Ok(i) = v.metadata_schema.index_of(&c.name) {
                    read.push(i);
                }
            }
        }
        if wants_data {
            read.extend(v.extent_columns());
        }
        read.sort_unstable();
        read.dedup();
        let read_schema = Arc::new(v.metadata_schema.project(&read)?);
        let filter = match conjunction(filters.iter().cloned()) {
            Some(expr) => {
                let df_schema = DFSchema::try_from(read_schema.as_ref().clone())?;
                Some(state.create_physical_expr(expr, &df_schema)?)
            }
            None => None,
        };
        Ok(ScanColumns {
            projection,
            read,
            read_schema,
            filter,
        })
    }
}

#[async_trait]
impl TableProvider for DatasetTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.version.table_schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DFResult<Vec<TableProviderFilterPushDown>> {
        // Filters on metadata columns are applied exactly, before any extent
        // is read; filters on `data` need the bytes and stay above the scan.
        Ok(filter_pushdown(filters))
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let columns = self.columns(state, projection, filters)?;
        let source = ExtentSource::try_new(
            Arc::clone(&self.version),
            columns,
            limit,
            state.config().target_partitions(),
            self.options.clone(),
        )?;
        Ok(DataSourceExec::from_data_source(source))
    }
}
