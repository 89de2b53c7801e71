//! [`KeyOwners`]: a query over a dataset spread over several storage
//! nodes reads each key once.
//!
//! Every key of a replicated version is on `replicas` storage nodes
//! (`crate::ingest`), so a query that ran its fragment over every row of
//! every node would see each row `replicas` times. Before the first node
//! runs, the query lists each node's keys and row ids, as a job does at
//! submit (`SampleIndex::build`). When no key is on two nodes, every node
//! runs the whole fragment, as before; otherwise each key goes to one
//! holder (`SampleIndex::takes`) and every node reads, through a take,
//! the rows it was given and no other. The listing is a key and a row id
//! per row, metadata only, once per query. It is done for every dataset
//! held by more than one node, not only those the coordinator's ledger
//! knows as replicated: a compute node (whose ledger is empty) and a
//! dataset copied by hand give the same answer as one data dir, and the
//! same rows a job reads. A node that does not answer the listing is read
//! around — given nothing, its keys read from their other holders — when
//! the coordinator's ledger shows the nodes that answered hold every
//! part; otherwise the query fails naming it, as before.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::common::{DataFusionError, Result};
use sluice_flight::endpoint::endpoint_id;
use sluice_flight::{LinkError, StorageEndpoint};
use tokio::sync::OnceCell;

use super::holders::Avoid;
use super::index::SampleIndex;
use super::ledger::PartLayout;
use crate::error::JobError;
use crate::plan_feeds::Takes;
use crate::remote::{NodeReads, ReplicaReads};

/// See the module docs.
#[derive(Debug)]
pub struct KeyOwners {
    table: String,
    schema: SchemaRef,
    pins: Vec<(Arc<dyn StorageEndpoint>, u64)>,
    layout: Option<PartLayout>,
    takes: OnceCell<std::result::Result<Option<Takes>, LinkError>>,
}

impl KeyOwners {
    /// Reads of `table` (whose schema is `schema`) at `pins`: each node
    /// and the version it holds; `layout`, the cluster's ingest of it, if
    /// the coordinator's ledger has it.
    pub fn new(
        table: String,
        schema: SchemaRef,
        pins: Vec<(Arc<dyn StorageEndpoint>, u64)>,
        layout: Option<PartLayout>,
    ) -> Self {
        Self {
            table,
            schema,
            pins,
            layout,
            takes: OnceCell::new(),
        }
    }
}

#[async_trait]
impl ReplicaReads for KeyOwners {
    /// What `endpoint` reads.
    async fn take_for(&self, endpoint: &Arc<dyn StorageEndpoint>) -> Result<NodeReads> {
        let takes = self
            .takes
            .get_or_init(|| async {
                // A holder down is read around when the others hold every
                // part of the layout; it is then given nothing to read.
                let whole = |listed: &[&str]| {
                    self.layout
                        .as_ref()
                        .is_some_and(|l| l.covered_by(listed, &self.pins))
                };
                let index = SampleIndex::build(&self.table, &self.schema, &[], &self.pins, &whole)
                    .await
                    .map_err(as_link)?;
                if index.replicated() == 0 && index.listed().iter().all(|&l| l) {
                    return Ok(None);
                }
                let all: Vec<u64> = (0..index.len() as u64).collect();
                let mut parts = index.takes(&all, &Avoid::default()).map_err(|u| {
                    LinkError::Protocol(format!(
                        "{} rows of {} have no holder",
                        u.samples, self.table
                    ))
                })?;
                Ok(Some(parts.swap_remove(0)))
            })
            .await
            .as_ref()
            .map_err(|e| DataFusionError::from(e.clone()))?;
        Ok(match takes {
            None => NodeReads::Whole,
            Some(takes) => match takes.get(&endpoint_id(endpoint)) {
                Some(take) => NodeReads::Take(take.clone()),
                None => NodeReads::Nothing,
            },
        })
    }
}

/// A listing's error as the storage link's, so that a query names the
/// node and keeps the kind (`node_unavailable`) it would have met running
/// its fragment there.
fn as_link(e: JobError) -> LinkError {
    match e {
        JobError::Unavailable { node, reason } => LinkError::Unavailable { node, reason },
        JobError::Storage(link) => link,
        other => LinkError::Protocol(other.to_string()),
    }
}
