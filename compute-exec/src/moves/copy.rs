//! Carrying out a [`Plan`] for one dataset: every sample's part found,
//! each node affected given its new version (rows kept, rows dropped,
//! rows copied in from other holders), and the new versions committed on
//! every node or on none.
//!
//! A sample's part is found by where it is: the nodes whose versions
//! (those of the dataset's layout) list its key. Part `p`'s samples are
//! found on exactly `p`'s holders that answer. Parts held by the very
//! same nodes (after a drain to as many nodes as replicas, say) cannot be
//! told apart, and need not be: their samples are one pool, dealt out
//! among them by sample, and each part's holders are still those of every
//! sample dealt to it. Parts that only look alike because some holders do
//! not answer must be moved alike (the plan does so), or the move is
//! refused until they answer.
//!
//! Bytes go from the node a move reads to the coordinator (a take of the
//! part's rows, checked against their checksums there) and on to the
//! node that gets them (`sluice_flight::copy`), one batch at a time.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::error::DataFusionError;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::future::join_all;
use futures::{StreamExt, TryStreamExt};
use sluice_flight::copy::CopyIn;
use sluice_flight::{LinkError, StorageEndpoint};
use sluice_planner::fragment::{DatasetScanExec, Take};
use sluice_udfs::UdfEnv;

use super::MoveError;
use super::plan::Plan;
use crate::replicas::index::SampleIndex;
use crate::replicas::ledger::PartLayout;

/// What one node's new version holds.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct NodeVersion {
    /// The node.
    pub node: String,
    /// Its new version.
    pub version: u64,
    /// Samples in it.
    pub samples: u64,
    /// Bytes of its objects, all written anew (kept and copied in).
    pub bytes: u64,
    /// Samples copied in.
    pub copied: u64,
    /// Samples dropped from its last version.
    pub dropped: u64,
}

/// What one node writes.
#[derive(Debug, Default)]
struct Work {
    /// Row ids to read, by source node.
    incoming: BTreeMap<String, Vec<u32>>,
    /// Row ids of its own version left out.
    drop: Vec<u32>,
}

/// Carries out `plan` for `dataset` (whose table schema is `schema`, laid
/// out as `layout`) over `endpoints` (every node known), under `txn`.
pub async fn execute(
    dataset: &str,
    schema: &SchemaRef,
    layout: &PartLayout,
    plan: &Plan,
    endpoints: &[Arc<dyn StorageEndpoint>],
    txn: &str,
) -> Result<Vec<NodeVersion>, MoveError> {
    let node = |name: &str| {
        endpoints
            .iter()
            .find(|e| e.name() == name)
            .cloned()
            .ok_or_else(|| MoveError::UnknownNode(name.to_string()))
    };
    let mut pins = Vec::new();
    for (name, version) in &layout.versions {
        if let Ok(e) = node(name) {
            pins.push((e, *version));
        }
    }
    let index = SampleIndex::build(dataset, schema, &[], &pins, &|_| true)
        .await
        .map_err(|e| MoveError::Listing(e.to_string()))?;
    let work = assign(&index, layout, plan)?;
    let mut asked = Vec::new();
    for (name, w) in &work {
        let target = node(name)?;
        let holds = layout.holders.iter().any(|h| h.contains(name));
        let req = CopyIn {
            txn: txn.to_string(),
            dataset: dataset.to_string(),
            keep: holds.then(|| layout.versions.get(name).copied()).flatten(),
            drop: w.drop.clone(),
            from: describe(w),
        };
        let mut sources = Vec::new();
        for (from, rows) in &w.incoming {
            let version = *layout
                .versions
                .get(from)
                .ok_or_else(|| MoveError::UnknownNode(from.clone()))?;
            sources.push((node(from)?, version, rows.clone()));
        }
        let rows = read_rows(dataset, schema, sources);
        asked.push(async move {
            let copied = w.incoming.values().map(|r| r.len() as u64).sum::<u64>();
            let got = target.copy_in(&req, rows).await;
            (target, got, copied, w.drop.len() as u64)
        });
    }
    let prepared = join_all(asked).await;
    let failed = prepared
        .iter()
        .find_map(|(_, got, _, _)| got.as_ref().err().cloned());
    if let Some(e) = failed {
        for (target, _, _, _) in &prepared {
            let _ = target.finish_ingest(txn, false).await;
        }
        return Err(MoveError::Copy(e));
    }
    let mut out: Vec<NodeVersion> = Vec::with_capacity(prepared.len());
    for (i, (target, got, copied, dropped)) in prepared.iter().enumerate() {
        let committed = matches!(target.finish_ingest(txn, true).await, Ok(Some(_)));
        if !committed {
            for (rest, ..) in &prepared[i + 1..] {
                let _ = rest.finish_ingest(txn, false).await;
            }
            return Err(match out.is_empty() {
                true => MoveError::Copy(LinkError::Protocol(format!(
                    "{} could not commit its new version; nothing moved",
                    target.name()
                ))),
                false => MoveError::Partial {
                    committed: out.iter().map(|v| v.node.clone()).collect(),
                    failed: target.name().to_string(),
                },
            });
        }
        let got = got.as_ref().map_err(|e| MoveError::Copy(e.clone()))?;
        out.push(NodeVersion {
            node: target.name().to_string(),
            version: got.version,
            samples: got.samples,
            bytes: got.bytes,
            copied: *copied,
            dropped: *dropped,
        });
    }
    Ok(out)
}

/// Each node's work: the rows it reads from others, and those it drops.
fn assign(
    index: &SampleIndex,
    layout: &PartLayout,
    plan: &Plan,
) -> Result<BTreeMap<String, Work>, MoveError> {
    // The nodes listed: those that answered (one that did not is pinned
    // all the same, and holds no sample of the index).
    let listed: Vec<&str> = index
        .pins()
        .iter()
        .zip(&index.listed())
        .filter(|(_, a)| **a)
        .map(|(p, _)| p.node.as_str())
        .collect();
    let Classes { parts, pooled } = classes(layout, plan, &listed)?;
    let mut work: BTreeMap<String, Work> = BTreeMap::new();
    let mut names: Vec<String> = Vec::new();
    for s in 0..index.len() as u64 {
        names.clear();
        let holders: Vec<(u8, u32)> = index.holders(s).collect();
        names.extend(
            holders
                .iter()
                .map(|(pin, _)| index.pins()[usize::from(*pin)].node.clone()),
        );
        names.sort();
        let Some(ps) = parts.get(&names) else {
            return Err(MoveError::Listing(format!(
                "a sample is on {names:?}, which is no part's holders"
            )));
        };
        let p = match pooled.contains(&names) {
            true => ps[s as usize % ps.len()],
            false => ps[0],
        };
        let row_on = |node: &str| {
            holders
                .iter()
                .find(|(pin, _)| index.pins()[usize::from(*pin)].node == node)
                .map(|(_, row)| *row)
        };
        for m in plan.moves.iter().filter(|m| m.part == p) {
            let row = row_on(&m.from).ok_or_else(|| {
                MoveError::Listing(format!("part {p} is not listed on {}", m.from))
            })?;
            let w = work.entry(m.to.clone()).or_default();
            w.incoming.entry(m.from.clone()).or_default().push(row);
        }
        for (_, n) in plan.drops.iter().filter(|d| d.0 == p) {
            if let Some(row) = row_on(n) {
                work.entry(n.clone()).or_default().drop.push(row);
            }
        }
    }
    for w in work.values_mut() {
        // Device order: neighbouring extents are read together.
        w.incoming.values_mut().for_each(|r| r.sort_unstable());
        w.drop.sort_unstable();
    }
    Ok(work)
}

/// Parts by the nodes their samples are found on.
struct Classes {
    /// The nodes (sorted) → the parts whose samples are found there.
    parts: HashMap<Vec<String>, Vec<usize>>,
    /// The groups whose parts are held by the very same nodes: one pool.
    pooled: HashSet<Vec<String>>,
}

/// The [`Classes`] of `layout`'s parts over the nodes `listed` (see the
/// module docs); parts that look alike and would move differently are
/// an error.
fn classes(layout: &PartLayout, plan: &Plan, listed: &[&str]) -> Result<Classes, MoveError> {
    let seen = |holders: &[String]| -> Vec<String> {
        let mut h: Vec<String> = holders
            .iter()
            .filter(|n| listed.contains(&n.as_str()))
            .cloned()
            .collect();
        h.sort();
        h
    };
    // Parts by the nodes their samples are found on.
    let mut parts: HashMap<Vec<String>, Vec<usize>> = HashMap::new();
    for (p, h) in layout.holders.iter().enumerate() {
        parts.entry(seen(h)).or_default().push(p);
    }
    let moved = |p: usize| {
        let mut to: Vec<(&str, &str)> = plan
            .moves
            .iter()
            .filter(|m| m.part == p)
            .map(|m| ("to", m.to.as_str()))
            .chain(
                plan.drops
                    .iter()
                    .filter(|d| d.0 == p)
                    .map(|d| ("drop", d.1.as_str())),
            )
            .collect();
        to.sort();
        to
    };
    // Parts on the very same nodes are one pool of samples, split among
    // them by sample; parts that only look alike (some holders silent)
    // must move alike.
    let mut pooled: HashSet<Vec<String>> = HashSet::new();
    for (found, ps) in &parts {
        let all = |p: usize| {
            let mut h = layout.holders[p].clone();
            h.sort();
            h
        };
        if ps.iter().all(|&p| all(p) == all(ps[0])) {
            pooled.insert(found.clone());
        } else if ps.iter().any(|&p| moved(p) != moved(ps[0])) {
            return Err(MoveError::Ambiguous {
                parts: ps.clone(),
                nodes: found.clone(),
            });
        }
    }
    Ok(Classes { parts, pooled })
}

/// The rows of each of `sources` (a node, its version, row ids), one
/// source after another, every table column.
fn read_rows(
    dataset: &str,
    schema: &SchemaRef,
    sources: Vec<(Arc<dyn StorageEndpoint>, u64, Vec<u32>)>,
) -> SendableRecordBatchStream {
    let (dataset, out) = (dataset.to_string(), Arc::clone(schema));
    let batches = futures::stream::iter(sources)
        .then(move |(node, version, rows)| {
            let (dataset, out) = (dataset.clone(), Arc::clone(&out));
            async move {
                let udfs = UdfEnv::new(Default::default());
                let rows: Arc<[u32]> = rows.into();
                let scan = DatasetScanExec::new(
                    dataset.clone(),
                    Some((0..out.fields().len()).collect()),
                    Vec::new(),
                    None,
                    out,
                )
                .with_take(Some(Take {
                    version,
                    slots: Arc::clone(&rows),
                    rows: Some(rows),
                }));
                crate::on_node::run_fragment(&node, &dataset, Arc::new(scan), udfs)
                    .await
                    .map_err(|e| DataFusionError::External(Box::new(e)))
            }
        })
        .try_flatten();
    Box::pin(RecordBatchStreamAdapter::new(Arc::clone(schema), batches))
}

/// Where a node's copied rows come from, for its version's record.
fn describe(w: &Work) -> String {
    let from: Vec<String> = w
        .incoming
        .iter()
        .map(|(n, r)| format!("{} rows of {n}", r.len()))
        .collect();
    match from.is_empty() {
        true => "no rows from other nodes".into(),
        false => format!("a copy of {}", from.join(", ")),
    }
}
