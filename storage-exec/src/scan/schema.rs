//! [`DatasetSchema`]: the catalog's datasets as DataFusion tables.
//!
//! `FROM imagenet` reads the latest version; `FROM "imagenet@2"` reads
//! version 2. Tables are resolved when a query names them, so a dataset
//! committed by an ingest is visible to the next query.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::SchemaProvider;
use datafusion::datasource::TableProvider;
use datafusion::error::{DataFusionError, Result as DFResult};

use super::options::ScanOptions;
use super::table::DatasetTable;
use super::version::DatasetVersion;
use crate::error::StorageError;
use crate::store::Store;

/// The datasets of one store, as a schema.
#[derive(Debug)]
pub struct DatasetSchema {
    store: Arc<Store>,
    options: ScanOptions,
}

impl DatasetSchema {
    /// A schema over `store`'s datasets.
    pub fn new(store: Arc<Store>, options: ScanOptions) -> Self {
        Self { store, options }
    }
}

/// Splits `name@version`.
fn parse_name(name: &str) -> (&str, Option<&str>) {
    match name.rsplit_once('@') {
        Some((ds, v)) => (ds, Some(v)),
        None => (name, None),
    }
}

/// The dataset and version (latest when `None`) a table name reads.
pub fn parse_table(name: &str) -> Result<(&str, Option<u64>), String> {
    let (dataset, version) = parse_name(name);
    match version {
        Some(v) => v
            .parse::<u64>()
            .map(|v| (dataset, Some(v)))
            .map_err(|_| format!("bad version '{v}' in table name '{name}' (expected dataset@N)")),
        None => Ok((dataset, None)),
    }
}

#[async_trait]
impl SchemaProvider for DatasetSchema {
    fn table_names(&self) -> Vec<String> {
        self.store.catalog().dataset_names().unwrap_or_default()
    }

    async fn table(&self, name: &str) -> DFResult<Option<Arc<dyn TableProvider>>> {
        let (dataset, version) = parse_table(name).map_err(DataFusionError::Plan)?;
        // Catalog lookup and the Parquet footer read are blocking file I/O.
        let (store, name) = (Arc::clone(&self.store), dataset.to_owned());
        let opened =
            tokio::task::spawn_blocking(move || DatasetVersion::open(store, &name, version))
                .await
                .map_err(|e| DataFusionError::External(Box::new(e)))?;
        match opened {
            Ok(v) => Ok(Some(Arc::new(DatasetTable::new(v, self.options.clone())))),
            // Unknown datasets are "not found" so DataFusion names the table.
            Err(StorageError::UnknownDataset(_)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    fn table_exist(&self, name: &str) -> bool {
        let (dataset, _) = parse_name(name);
        matches!(self.store.catalog().latest_version(dataset), Ok(Some(_)))
    }
}
