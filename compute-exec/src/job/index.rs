//! [`SampleIndex`]: a job's samples, resolved once, at submit, into row ids
//! of the dataset versions it pins.
//!
//! Each storage node holding the dataset is asked once for the rows of
//! its pinned version that pass the job's filters (a take of every row,
//! [`Take::index`], answering each row's key and row id). The rows of all
//! nodes are sorted by key — so the order of an epoch depends on the seed
//! and the epoch only, not on how the dataset is spread — and a key held by
//! more than one node is read once. Then the keys are dropped: the job
//! keeps, per sample, the node holding it (one byte) and its row id there
//! (four), i.e. 5 bytes per sample, and every window names its rows by id.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Schema, SchemaRef, UInt32Type};
use datafusion::logical_expr::Expr;
use futures::TryStreamExt;
use serde::{Deserialize, Serialize};
use sluice_flight::scan::slot_field;
use sluice_flight::{DatasetScanExec, StorageEndpoint, Take};
use sluice_udfs::UdfEnv;

use super::error::JobError;
use super::query::KEY;
use crate::remote::Takes;
use sluice_flight::endpoint::endpoint_id;

/// A dataset version a job reads on one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pin {
    /// The node's name (its URL, or the in-process node's name).
    pub node: String,
    /// The version.
    pub version: u64,
}

/// See the module docs.
#[derive(Debug)]
pub struct SampleIndex {
    pins: Vec<Pin>,
    endpoints: Vec<usize>,
    /// The part (of a mixture; 0 otherwise) each pin's rows belong to.
    pin_parts: Vec<u8>,
    /// Each part's first sample: a mixture's parts, one after another.
    bases: Vec<u64>,
    nodes: Vec<u8>,
    rows: Vec<u32>,
    duplicates: usize,
}

/// The most nodes a job's dataset may be spread over.
pub const MAX_NODES: usize = u8::MAX as usize + 1;

impl SampleIndex {
    /// Lists the rows of `table` (whose schema is `schema`) passing
    /// `filters` on each node of `pins`, at its pinned version.
    pub async fn build(
        table: &str,
        schema: &SchemaRef,
        filters: &[Expr],
        pins: &[(Arc<dyn StorageEndpoint>, u64)],
    ) -> Result<Self, JobError> {
        if pins.len() > MAX_NODES {
            return Err(JobError::InvalidOptions(format!(
                "dataset {table} is spread over {} nodes; a job reads at most {MAX_NODES}",
                pins.len()
            )));
        }
        let key = schema
            .index_of(KEY)
            .map_err(|_| JobError::NotAPipeline(format!("dataset {table} has no {KEY} column")))?;
        let out = Arc::new(Schema::new(vec![schema.field(key).clone(), slot_field()]));
        let mut listed: Vec<(u8, Vec<RecordBatch>)> = Vec::with_capacity(pins.len());
        for (n, (endpoint, version)) in pins.iter().enumerate() {
            let scan = DatasetScanExec::new(
                table.to_string(),
                Some(vec![key, schema.fields().len()]),
                filters.to_vec(),
                None,
                Arc::clone(&out),
            )
            .with_take(Some(Take::index(*version)));
            let udfs = UdfEnv::new(Default::default());
            let batches: Vec<RecordBatch> = endpoint
                .execute(Arc::new(scan), udfs)
                .await
                .map_err(JobError::link)?
                .try_collect()
                .await
                .map_err(|e| JobError::running(&e))?;
            listed.push((n as u8, batches));
        }
        let mut all: Vec<(&str, u8, u32)> = Vec::new();
        for (node, batches) in &listed {
            for b in batches {
                let keys = b.column(0);
                if keys.data_type() != &DataType::Utf8 {
                    return Err(JobError::Internal(format!(
                        "the keys of {table} are {}, not Utf8",
                        keys.data_type()
                    )));
                }
                let keys = keys.as_string::<i32>();
                let rows = b.column(1).as_primitive::<UInt32Type>();
                for i in 0..b.num_rows() {
                    all.push((keys.value(i), *node, rows.value(i)));
                }
            }
        }
        all.sort_unstable_by(|a, b| a.0.cmp(b.0).then(a.1.cmp(&b.1)));
        let before = all.len();
        all.dedup_by(|a, b| a.0 == b.0);
        Ok(Self {
            pins: pins
                .iter()
                .map(|(e, v)| Pin {
                    node: e.name().to_string(),
                    version: *v,
                })
                .collect(),
            endpoints: pins.iter().map(|(e, _)| endpoint_id(e)).collect(),
            pin_parts: vec![0; pins.len()],
            bases: vec![0],
            nodes: all.iter().map(|s| s.1).collect(),
            rows: all.iter().map(|s| s.2).collect(),
            duplicates: before - all.len(),
        })
    }

    /// A mixture's index: `parts`' samples one after another (part `j`'s
    /// sample `s` is `bases()[j] + s`), each part's rows taken at its own
    /// pins.
    pub fn concat(parts: Vec<SampleIndex>) -> Result<Self, JobError> {
        let pins: usize = parts.iter().map(|p| p.pins.len()).sum();
        if pins > MAX_NODES {
            return Err(JobError::InvalidOptions(format!(
                "a mixture's parts are spread over {pins} (part, node) pairs; a job reads at \
                 most {MAX_NODES}"
            )));
        }
        let mut out = Self {
            pins: Vec::new(),
            endpoints: Vec::new(),
            pin_parts: Vec::new(),
            bases: Vec::new(),
            nodes: Vec::new(),
            rows: Vec::new(),
            duplicates: 0,
        };
        for (j, p) in parts.into_iter().enumerate() {
            let first = out.pins.len() as u8;
            out.bases.push(out.rows.len() as u64);
            out.pin_parts
                .extend(std::iter::repeat_n(j as u8, p.pins.len()));
            out.pins.extend(p.pins);
            out.endpoints.extend(p.endpoints);
            out.nodes.extend(p.nodes.iter().map(|n| n + first));
            out.rows.extend(p.rows);
            out.duplicates += p.duplicates;
        }
        Ok(out)
    }

    /// Each part's first sample (one part, at 0, unless a mixture).
    pub fn bases(&self) -> &[u64] {
        &self.bases
    }

    /// Samples of each part.
    pub fn part_sizes(&self) -> Vec<u64> {
        let mut ends: Vec<u64> = self.bases[1..].to_vec();
        ends.push(self.rows.len() as u64);
        self.bases.iter().zip(ends).map(|(b, e)| e - b).collect()
    }

    /// Samples in the job's dataset.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether it has none.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The versions pinned.
    pub fn pins(&self) -> &[Pin] {
        &self.pins
    }

    /// Keys held by more than one node (each is read from the first).
    pub fn duplicates(&self) -> usize {
        self.duplicates
    }

    /// Bytes it holds per sample.
    pub const BYTES_PER_SAMPLE: usize = size_of::<u8>() + size_of::<u32>();

    /// Where sample `s` is: its node's name, version and row id.
    pub fn locate(&self, s: u64) -> Option<(&str, u64, u32)> {
        let i = usize::try_from(s).ok()?;
        let pin = &self.pins[*self.nodes.get(i)? as usize];
        Some((&pin.node, pin.version, self.rows[i]))
    }

    /// Each of `samples`' place, as one number: its node (of the pins) and
    /// its row id there (the key of its row in the output cache).
    pub fn keys(&self, samples: &[u64]) -> Vec<u64> {
        samples
            .iter()
            .map(|&s| (u64::from(self.nodes[s as usize]) << 32) | u64::from(self.rows[s as usize]))
            .collect()
    }

    /// The rows each node reads for `samples` (indices into the sorted
    /// samples), slot `i` being `samples[i]`'s: of each part, in order.
    pub fn takes(&self, samples: &[u64]) -> Vec<Takes> {
        let mut per: HashMap<u8, (Vec<u32>, Vec<u32>)> = HashMap::new();
        for (slot, &s) in samples.iter().enumerate() {
            let node = self.nodes[s as usize];
            let e = per.entry(node).or_default();
            e.0.push(self.rows[s as usize]);
            e.1.push(slot as u32);
        }
        let mut parts: Vec<HashMap<usize, Take>> = vec![HashMap::new(); self.bases.len()];
        for (node, (rows, slots)) in per {
            let pin = &self.pins[node as usize];
            let take = Take {
                version: pin.version,
                rows: Some(Arc::from(rows)),
                slots: Arc::from(slots),
            };
            parts[usize::from(self.pin_parts[node as usize])]
                .insert(self.endpoints[node as usize], take);
        }
        parts.into_iter().map(Arc::new).collect()
    }
}
