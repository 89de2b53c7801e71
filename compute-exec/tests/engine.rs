//! Queries over storage nodes served on loopback, on the distributed
//! engine: each storage fragment runs as a task on the node that holds its
//! rows (a dataset on one node as two tasks there), the answer equals the
//! embedded default's, a replicated dataset reads each key once, and
//! EXPLAIN shows the stages, the tasks and the node each runs on.

use std::path::Path;
use std::sync::Arc;

use arrow::util::pretty::pretty_format_batches;
use futures::TryStreamExt;
use sluice_compute::ingest::{IngestRequest, Ingests};
use sluice_compute::replicas::ledger::{PartLayout, PartLedger};
use sluice_compute::{ComputeSession, ResourceHints};
use sluice_flight::StorageEndpoint;
use sluice_planner::Offload;
use sluice_storage::scan::ScanOptions;
use sluice_storage::{StorageNode, Store, StoreOptions};
use sluice_udfs::UdfEnv;

use crate::common::{SAMPLES, served_node, write_samples};

const GROUP_BY: &str = "SELECT label, count(*) AS n, count(DISTINCT key) AS keys, \
    min(key) AS first, max(key) AS last FROM vecs GROUP BY label ORDER BY label";

/// Ingests `src` as `vecs` over `nodes` with `replicas` copies, recorded
/// in a ledger under `dir`; a session over the nodes that knows it.
async fn sharded(
    dir: &Path,
    nodes: &[Arc<dyn StorageEndpoint>],
    src: &Path,
    replicas: u32,
) -> ComputeSession {
    let req = IngestRequest {
        dataset: "vecs".into(),
        path: src.display().to_string(),
        manifest: None,
        on_error: "fail".into(),
        replicas: Some(replicas),
    };
    let report = Ingests::default().run(nodes, &req).await.unwrap();
    let ledger = Arc::new(PartLedger::open(dir).unwrap());
    let parts: Vec<(String, u64)> = report
        .parts
        .iter()
        .map(|p| (p.node.clone(), p.version))
        .collect();
    ledger.committed("vecs", &parts).unwrap();
    let layout = PartLayout {
        replicas,
        holders: report.holders.clone(),
        versions: parts.iter().cloned().collect(),
    };
    ledger.laid_out("vecs", layout).unwrap();
    ComputeSession::new(
        nodes.to_vec(),
        sluice_udfs::cost::default_profiles(),
        ResourceHints::default(),
    )
    .with_ledger(ledger)
}

async fn answer(session: &ComputeSession, sql: &str) -> String {
    let udfs = UdfEnv::new(Default::default());
    let batches: Vec<_> = session
        .execute(sql, Offload::Auto, &udfs)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    pretty_format_batches(&batches).unwrap().to_string()
}

async fn explained(session: &ComputeSession, sql: &str) -> String {
    answer(session, &format!("EXPLAIN {sql}")).await
}

/// The answer of the embedded default: one node in this process holding
/// the whole source.
async fn embedded(dir: &Path, src_root: &Path, src: &Path, sql: &str) -> String {
    let mut opts = StoreOptions::new(dir.to_path_buf());
    opts.device_size = 64 << 20;
    opts.chunk_size = 1 << 20;
    let store = Store::open(&opts).unwrap();
    let node = StorageNode::new(store, ScanOptions::default(), 1, None).unwrap();
    node.allow_ingest(&[src_root.to_path_buf()], &[]).unwrap();
    let nodes: Vec<Arc<dyn StorageEndpoint>> = vec![node];
    let session = sharded(&dir.join("ledger"), &nodes, src, 1).await;
    answer(&session, sql).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_over_storage_nodes_run_their_fragments_on_the_engine() {
    let root = tempfile::tempdir().unwrap();
    let src_root = root.path().join("src");
    let src = src_root.join("vecs");
    write_samples(&src);
    let want = embedded(&root.path().join("embedded"), &src_root, &src, GROUP_BY).await;
    assert!(
        want.contains(&format!("| {} ", SAMPLES.div_ceil(3))),
        "{want}"
    );

    // Sharded over three nodes, one copy each.
    let mut nodes: Vec<Arc<dyn StorageEndpoint>> = Vec::new();
    for name in ["a", "b", "c"] {
        nodes.push(served_node(root.path(), name, &src_root).await.1);
    }
    let session = sharded(&root.path().join("ledger1"), &nodes, &src, 1).await;
    assert_eq!(answer(&session, GROUP_BY).await, want, "sharded, one copy");
    // A plan whose compute side ends in several partitions (the nodes'
    // streams, projected) is merged into one for the engine.
    let keys = answer(&session, "SELECT upper(key) AS k FROM vecs").await;
    assert_eq!(
        keys.lines().filter(|l| l.contains("/V")).count(),
        SAMPLES,
        "{keys}"
    );
    let plan = explained(&session, GROUP_BY).await;
    assert!(plan.contains("NetworkCoalesceExec"), "{plan}");
    for (i, n) in nodes.iter().enumerate() {
        let task = format!(
            "t{i}: StorageFragmentExec: dataset=vecs, node={}, reads=all its rows, \
             fragment=AggregateExec: mode=Partial",
            n.name()
        );
        assert!(plan.contains(&task), "{task} not in {plan}");
    }

    // Two copies of every part: each key is read once, by one holder.
    let mut nodes2: Vec<Arc<dyn StorageEndpoint>> = Vec::new();
    for name in ["d", "e", "f"] {
        nodes2.push(served_node(root.path(), name, &src_root).await.1);
    }
    let session = sharded(&root.path().join("ledger2"), &nodes2, &src, 2).await;
    assert_eq!(answer(&session, GROUP_BY).await, want, "two copies");

    // A dataset on one node: two tasks, both on it, the second reading
    // nothing — the fragment still runs where the data is.
    let one = vec![served_node(root.path(), "g", &src_root).await.1];
    let session = sharded(&root.path().join("ledger3"), &one, &src, 1).await;
    assert_eq!(answer(&session, GROUP_BY).await, want, "one node");
    let plan = explained(&session, GROUP_BY).await;
    let node = one[0].name();
    for (i, reads) in ["all its rows", "nothing"].iter().enumerate() {
        let task = format!("t{i}: StorageFragmentExec: dataset=vecs, node={node}, reads={reads}");
        assert!(plan.contains(&task), "{task} not in {plan}");
    }
}
