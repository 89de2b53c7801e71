//! [`ComputeSchema`]: the datasets the storage nodes listed, as the tables
//! of a compute session. `dataset@N` (version N) is resolved on demand by
//! asking a node that holds the dataset for that version's schema. A
//! dataset no node listed is asked of every node before it is called
//! unknown: a node leaves out of its listing a dataset it cannot open (a
//! damaged metadata file), and the query naming it gets that node's error,
//! naming the file, while every other dataset stays usable. A dataset
//! that is nowhere is recorded ([`ComputeSchema::missing`]): a statement
//! that then fails to plan fails as `UnknownDataset` (`crate::error`), a typed error
//! found again inside DataFusion's (never by its message).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{SchemaProvider, TableProvider};
use datafusion::error::{DataFusionError, Result};
use sluice_flight::{LinkError, StorageEndpoint};

use crate::remote::RemoteDatasetTable;

/// See the module docs.
#[derive(Debug)]
pub struct ComputeSchema {
    latest: BTreeMap<String, SchemaRef>,
    holders: HashMap<String, Vec<Arc<dyn StorageEndpoint>>>,
    nodes: Vec<Arc<dyn StorageEndpoint>>,
    versions: Mutex<BTreeSet<String>>,
    missing: Mutex<Option<String>>,
}

impl ComputeSchema {
    /// The tables of `latest` (dataset → schema), held by `holders`, of
    /// the storage `nodes`.
    pub fn new(
        latest: BTreeMap<String, SchemaRef>,
        holders: HashMap<String, Vec<Arc<dyn StorageEndpoint>>>,
        nodes: Vec<Arc<dyn StorageEndpoint>>,
    ) -> Self {
        Self {
            latest,
            holders,
            nodes,
            versions: Mutex::new(BTreeSet::new()),
            missing: Mutex::new(None),
        }
    }
}

impl ComputeSchema {
    /// The first table a query named that no node holds, if one did.
    pub fn missing(&self) -> Option<String> {
        self.missing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The versioned tables (`dataset@N`) queries have named so far.
    pub fn versions(&self) -> Vec<String> {
        let v = self.versions.lock().unwrap_or_else(|e| e.into_inner());
        v.iter().cloned().collect()
    }
}

/// The dataset a table name reads: `pets` for `pets@2`.
pub fn base_name(table: &str) -> &str {
    table.rsplit_once('@').map_or(table, |(d, _)| d)
}

#[async_trait]
impl SchemaProvider for ComputeSchema {
    fn table_names(&self) -> Vec<String> {
        self.latest.keys().cloned().collect()
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        if let Some(schema) = self.latest.get(name) {
            return Ok(Some(Arc::new(RemoteDatasetTable::new(
                name.to_string(),
                Arc::clone(schema),
            ))));
        }
        let Some(node) = self.holders.get(base_name(name)).and_then(|h| h.first()) else {
            // Listed by no node: unknown, unless a node holds it and cannot
            // open it (its error names the damage).
            for node in &self.nodes {
                match node.table_schema(name).await {
                    Err(LinkError::DatasetNotFound { .. }) | Ok(_) => {}
                    Err(e) => return Err(DataFusionError::from(e)),
                }
            }
            self.missing
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert_with(|| name.to_string());
            return Ok(None);
        };
        let schema = node
            .table_schema(name)
            .await
            .map_err(DataFusionError::from)?;
        self.versions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string());
        Ok(Some(Arc::new(RemoteDatasetTable::new(
            name.to_string(),
            schema,
        ))))
    }

    fn table_exist(&self, name: &str) -> bool {
        self.latest.contains_key(name) || self.holders.contains_key(base_name(name))
    }
}
