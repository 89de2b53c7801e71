//! [`Source`]: what a job reads for one of its pipelines — the job's
//! one, or a part of its mixture: the dataset, the filters its samples
//! pass, and the versions pinned on the nodes holding it. The job's
//! samples are listed from its [`Sources`] once, at start
//! ([`Sources::index`]).

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::logical_expr::Expr;
use sluice_flight::StorageEndpoint;

use crate::error::JobError;
use crate::replicas::index::{Pin, SampleIndex};
use crate::replicas::ledger::PartLayout;

/// See the module docs.
#[derive(Debug)]
pub struct Source {
    /// Its name in a mixture's `source` column (empty: not a mixture).
    pub name: String,
    /// Its weight in a mixture.
    pub weight: f64,
    /// The dataset (as the SQL names it: `name` or `name@version`).
    pub table: String,
    /// The dataset's columns.
    pub table_schema: SchemaRef,
    /// What its samples pass.
    pub filters: Vec<Expr>,
    /// The nodes it is read on, each at the version pinned.
    pub pins: Vec<(Arc<dyn StorageEndpoint>, u64)>,
    /// How the cluster's ingest laid out the version (at submit, from the
    /// coordinator's ledger; on a compute node, from the job's record).
    pub layout: Option<PartLayout>,
}

impl Source {
    /// The versions pinned, as the job's record keeps them.
    pub fn pin_record(&self) -> Vec<Pin> {
        self.pins
            .iter()
            .map(|(e, v)| Pin {
                node: e.name().to_string(),
                version: *v,
            })
            .collect()
    }

    /// Its samples, listed on every node pinned; a node lost meanwhile is
    /// left out when its layout (the cluster's ingest of the version) says
    /// the others hold every part.
    async fn index(&self) -> Result<SampleIndex, JobError> {
        let whole = |listed: &[&str]| {
            self.layout
                .as_ref()
                .is_some_and(|l| l.covered_by(listed, &self.pins))
        };
        SampleIndex::build(
            &self.table,
            &self.table_schema,
            &self.filters,
            &self.pins,
            &whole,
        )
        .await
    }
}

/// What a job reads: its one source, or its mixture's parts in order.
#[derive(Debug)]
pub struct Sources(Vec<Source>);

impl Sources {
    /// `parts` in order (at least one).
    pub fn new(parts: Vec<Source>) -> Self {
        Self(parts)
    }

    /// Its samples: its source's, or its mixture's parts' one after
    /// another.
    pub(super) async fn index(&self) -> Result<SampleIndex, JobError> {
        if let [one] = self.0.as_slice() {
            return one.index().await;
        }
        let mut parts = Vec::with_capacity(self.0.len());
        for s in &self.0 {
            parts.push(s.index().await?);
        }
        SampleIndex::concat(parts)
    }

    /// The storage nodes they are read on, each once.
    pub fn nodes(&self) -> Vec<Arc<dyn StorageEndpoint>> {
        let mut out: Vec<Arc<dyn StorageEndpoint>> = Vec::new();
        for (e, _) in self.0.iter().flat_map(|s| &s.pins) {
            if !out.iter().any(|o| o.name() == e.name()) {
                out.push(Arc::clone(e));
            }
        }
        out
    }

    /// Whether one reads a version of `dataset` up to `through` on `node`.
    pub fn reads_through(&self, dataset: &str, node: &str, through: u64) -> bool {
        self.0.iter().any(|s| {
            s.table.split('@').next() == Some(dataset)
                && s.pins
                    .iter()
                    .any(|(e, v)| e.name() == node && *v <= through)
        })
    }

    /// The datasets read (as the SQL names them).
    pub fn datasets(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|s| s.table.as_str())
    }
}

impl std::ops::Deref for Sources {
    type Target = [Source];

    fn deref(&self) -> &[Source] {
        &self.0
    }
}

impl std::ops::DerefMut for Sources {
    fn deref_mut(&mut self) -> &mut [Source] {
        &mut self.0
    }
}
