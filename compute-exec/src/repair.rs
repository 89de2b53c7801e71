//! Scrub and repair over a cluster: every storage node reads back its
//! objects against their checksums (`sluice_flight::scrub`), and each
//! object found bad is rewritten from a good replica.
//!
//! For a bad object the other nodes holding its dataset are asked, one
//! after another, for the object's bytes (a scan of that key's `data`,
//! which their own read checks against their checksum); the first copy
//! whose crc32c is the one the bad node recorded at ingest — the same
//! object, byte for byte — is sent to the bad node, which writes it over
//! its extent and reads it back. A bad object with no good copy anywhere
//! is reported, unrepaired. Every repair is logged and returned.
//!
//! Scrubs run on every node at once (each reads its own device, at the
//! rate asked); repairs follow, one object at a time. A job whose read
//! met a corrupt replica scrubs that node's copy of the job's datasets at
//! once, in the background ([`on_corrupt`], the session's
//! [`RepairNode`]).

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::AsArray;
use arrow::datatypes::SchemaRef;
use base64::Engine;
use datafusion::logical_expr::{col, lit};
use futures::TryStreamExt;
use futures::future::join_all;
use serde::{Deserialize, Serialize};
use sluice_flight::StorageEndpoint;
use sluice_flight::scrub::{BadObject, RepairObject, ScrubReport, ScrubRequest};
use sluice_planner::fragment::DatasetScanExec;
use sluice_udfs::UdfEnv;

use crate::session::{ComputeSession, RepairNode};

/// What a node's scrub found and what was repaired.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct NodeScrub {
    /// The storage node.
    pub node: String,
    /// Its scrub's report (absent: it failed, see `error`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Object)]
    pub report: Option<ScrubReport>,
    /// Why its scrub failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What became of each bad object.
    pub repairs: Vec<RepairLog>,
    /// Its checkpoint pieces' scrub (on a cluster that keeps them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoints: Option<crate::checkpoints::scrub::CheckpointsScrubbed>,
}

/// One bad object's repair.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RepairLog {
    /// The dataset.
    pub dataset: String,
    /// The version on the bad node.
    pub version: u64,
    /// The object's key.
    pub key: String,
    /// The node whose copy was used, if a good one was found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// `repaired`, `good` (it read back good by then), or why not.
    pub outcome: String,
}

/// Scrubs every node of `nodes` and repairs what it finds (see the module
/// docs); `schemas` are the datasets' tables.
pub async fn scrub_and_repair(
    nodes: &[Arc<dyn StorageEndpoint>],
    schemas: &HashMap<String, SchemaRef>,
    req: &ScrubRequest,
) -> Vec<NodeScrub> {
    let reports = join_all(nodes.iter().map(|n| n.scrub(req))).await;
    let mut out = Vec::with_capacity(nodes.len());
    for (node, report) in nodes.iter().zip(reports) {
        out.push(repair_found(node, nodes, schemas, report).await);
    }
    out
}

/// The [`RepairNode`] the node processes install on their sessions: the
/// node found holding a corrupt replica is scrubbed alone for each of the
/// job's datasets, and what it holds bad is rewritten from the others.
pub fn on_corrupt() -> RepairNode {
    RepairNode(Arc::new(
        |session: Arc<ComputeSession>, node: String, datasets: Vec<String>| {
            Box::pin(async move {
                let nodes = session.endpoints();
                let Some(bad) = nodes.iter().find(|n| n.name() == node) else {
                    return;
                };
                let schemas = session.table_schemas().await;
                for dataset in datasets {
                    let req = ScrubRequest {
                        dataset: Some(dataset),
                        rate_bytes_per_s: None,
                    };
                    scrub_node_and_repair(bad, &nodes, &schemas, &req).await;
                }
            })
        },
    ))
}

/// Scrubs `node` alone and repairs what it finds from the other `nodes`
/// (a read met a corrupt replica there).
pub async fn scrub_node_and_repair(
    node: &Arc<dyn StorageEndpoint>,
    nodes: &[Arc<dyn StorageEndpoint>],
    schemas: &HashMap<String, SchemaRef>,
    req: &ScrubRequest,
) -> NodeScrub {
    let report = node.scrub(req).await;
    repair_found(node, nodes, schemas, report).await
}

/// Repairs every bad object `report` found on `node` from the other
/// `nodes`.
async fn repair_found(
    node: &Arc<dyn StorageEndpoint>,
    nodes: &[Arc<dyn StorageEndpoint>],
    schemas: &HashMap<String, SchemaRef>,
    report: Result<ScrubReport, sluice_flight::LinkError>,
) -> NodeScrub {
    let mut scrubbed = NodeScrub {
        node: node.name().to_string(),
        report: None,
        error: None,
        repairs: Vec::new(),
        checkpoints: None,
    };
    match report {
        Ok(report) => {
            let others: Vec<_> = nodes.iter().filter(|o| o.name() != node.name()).collect();
            for bad in &report.bad {
                let schema = schemas.get(&bad.dataset);
                scrubbed
                    .repairs
                    .push(repair_one(node, &others, schema, bad).await);
            }
            scrubbed.report = Some(report);
        }
        Err(e) => scrubbed.error = Some(e.to_string()),
    }
    scrubbed
}

/// Rewrites `bad` on `node` from the first good copy on `others`.
async fn repair_one(
    node: &Arc<dyn StorageEndpoint>,
    others: &[&Arc<dyn StorageEndpoint>],
    schema: Option<&SchemaRef>,
    bad: &BadObject,
) -> RepairLog {
    let mut log = RepairLog {
        dataset: bad.dataset.clone(),
        version: bad.version,
        key: bad.key.clone(),
        from: None,
        outcome: "no good copy on any other node".into(),
    };
    let Some(schema) = schema else {
        log.outcome = format!("dataset {} is not listed by any node", bad.dataset);
        return log;
    };
    for other in others {
        let bytes = match object(other, &bad.dataset, schema, &bad.key).await {
            Ok(Some(b)) if crc32c::crc32c(&b) == bad.expected_crc32c => b,
            // Not there, another object under that key, or unreadable.
            Ok(_) | Err(_) => continue,
        };
        let req = RepairObject {
            dataset: bad.dataset.clone(),
            version: bad.version,
            key: bad.key.clone(),
            data: base64::engine::general_purpose::STANDARD.encode(&bytes),
        };
        log.from = Some(other.name().to_string());
        log.outcome = match node.repair_object(&req).await {
            Ok(r) if r.rewritten => "repaired".into(),
            Ok(_) => "good".into(),
            Err(e) => e.to_string(),
        };
        tracing::warn!(
            "repair of {} key {} on {} from {}: {}",
            bad.dataset,
            bad.key,
            node.name(),
            other.name(),
            log.outcome
        );
        return log;
    }
    tracing::error!(
        "{} key {} on {} is corrupt and no other node has a good copy",
        bad.dataset,
        bad.key,
        node.name()
    );
    log
}

/// The bytes of `key` of `dataset` (latest version) on `node`.
async fn object(
    node: &Arc<dyn StorageEndpoint>,
    dataset: &str,
    schema: &SchemaRef,
    key: &str,
) -> Result<Option<Vec<u8>>, String> {
    let data = schema.fields().len() - 1;
    let out = Arc::new(schema.project(&[data]).map_err(|e| e.to_string())?);
    let scan = DatasetScanExec::new(
        dataset.to_string(),
        Some(vec![data]),
        vec![col(crate::job::query::KEY).eq(lit(key))],
        None,
        out,
    );
    let udfs = UdfEnv::new(Default::default());
    let batches: Vec<_> = crate::on_node::run_fragment(node, dataset, Arc::new(scan), udfs)
        .await
        .map_err(|e| e.to_string())?
        .try_collect()
        .await
        .map_err(|e| e.to_string())?;
    let first = batches.iter().find(|b| b.num_rows() > 0);
    Ok(first.map(|b| b.column(0).as_binary::<i32>().value(0).to_vec()))
}
