//! Moving replicated parts between real storage nodes served over Flight
//! (real stores on files): a drain copies every part the node holds to
//! the others and leaves each part on its replicas, a rebalance spreads
//! them back, a lost node's parts get their copies back from the holders
//! left, and every job in between reads the same rows, byte for byte.

use std::sync::Arc;

use arrow::array::{Array, AsArray, RecordBatch};
use futures::{StreamExt, TryStreamExt};
use sluice_compute::ingest::{IngestRequest, Ingests};
use sluice_compute::moves::{Why, move_dataset};
use sluice_compute::replicas::ledger::{PartLayout, PartLedger};
use sluice_compute::{ComputeSession, JobSpec, Jobs, ResourceHints};
use sluice_flight::StorageEndpoint;
use sluice_storage::Store;

use crate::common::{SAMPLES, served_node, write_samples};

/// Every sample's key and tensor bytes, by key, as a job reads them.
async fn read_all(jobs: &Jobs) -> Vec<(String, String)> {
    jobs.session().refresh().await.unwrap();
    let mut spec = JobSpec::sql("SELECT key, npy(data) AS x FROM vecs");
    spec.batch_size = 5;
    let job = jobs.submit(spec).await.unwrap();
    let batches: Vec<RecordBatch> = job
        .deliver(0, 0, 0, None)
        .await
        .unwrap()
        .map(|d| d.and_then(|d| d.batch()))
        .try_collect()
        .await
        .unwrap();
    let mut out = Vec::new();
    for b in &batches {
        let keys = b.column(0).as_string::<i32>();
        for i in 0..b.num_rows() {
            let x = format!("{:?}", b.column(1).slice(i, 1));
            out.push((keys.value(i).to_string(), x));
        }
    }
    out.sort();
    out
}

/// Each node's sample count of `vecs`, at its latest version.
fn counts(stores: &[Arc<Store>]) -> Vec<u64> {
    stores
        .iter()
        .map(|s| s.catalog().version("vecs", None).map_or(0, |v| v.samples))
        .collect()
}

fn held(layout: &PartLayout, node: &str) -> usize {
    layout
        .holders
        .iter()
        .filter(|h| h.iter().any(|n| n == node))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_rebalance_and_loss_move_parts_and_lose_no_sample() {
    let root = tempfile::tempdir().unwrap();
    let src_root = root.path().join("src");
    let src = src_root.join("vecs");
    write_samples(&src);
    let mut stores = Vec::new();
    let mut nodes: Vec<Arc<dyn StorageEndpoint>> = Vec::new();
    for name in ["a", "b", "c"] {
        let (store, n) = served_node(root.path(), name, &src_root).await;
        stores.push(store);
        nodes.push(n);
    }
    let names: Vec<String> = nodes.iter().map(|n| n.name().to_string()).collect();
    let req = IngestRequest {
        dataset: "vecs".into(),
        path: src.display().to_string(),
        manifest: None,
        on_error: "fail".into(),
        replicas: Some(2),
    };
    let report = Ingests::default().run(&nodes, &req).await.unwrap();
    let ledger = Arc::new(PartLedger::open(&root.path().join("ledger")).unwrap());
    let parts: Vec<(String, u64)> = report
        .parts
        .iter()
        .map(|p| (p.node.clone(), p.version))
        .collect();
    ledger.committed("vecs", &parts).unwrap();
    let layout = PartLayout {
        replicas: 2,
        holders: report.holders.clone(),
        versions: parts.iter().cloned().collect(),
    };
    ledger.laid_out("vecs", layout).unwrap();
    let session = Arc::new(
        ComputeSession::new(
            nodes.clone(),
            sluice_udfs::cost::default_profiles(),
            ResourceHints::default(),
        )
        .with_ledger(Arc::clone(&ledger)),
    );
    let jobs = Arc::new(Jobs::new(session).unwrap());
    let want = read_all(&jobs).await;
    assert_eq!(want.len(), SAMPLES);
    assert_eq!(counts(&stores), [25, 25, 24]);

    // Drain b: its parts (0 and 1) get their second copy on the node
    // without one; b's version is retired (no job reads it).
    let drained = move_dataset(&jobs, "vecs", &Why::Drain(names[1].clone()))
        .await
        .unwrap();
    assert_eq!(drained.moves.len(), 2, "{drained:?}");
    assert!(drained.short.is_empty(), "{drained:?}");
    let layout = ledger.layout("vecs").unwrap();
    assert!(
        layout
            .holders
            .iter()
            .all(|h| h.len() == 2 && !h.contains(&names[1]))
    );
    assert_eq!(ledger.version("vecs", &names[1]), None);
    // a and c hold every sample now; b retires once nothing reads it.
    for _ in 0..100 {
        if counts(&stores)[1] == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(counts(&stores), [37, 0, 37]);
    assert_eq!(read_all(&jobs).await, want, "after the drain");

    // Rebalance: b takes parts back, evenly.
    let spread = move_dataset(&jobs, "vecs", &Why::Rebalance).await.unwrap();
    assert!(!spread.moves.is_empty() && spread.moves.len() == spread.drops.len());
    let layout = ledger.layout("vecs").unwrap();
    let loads: Vec<usize> = names.iter().map(|n| held(&layout, n)).collect();
    assert_eq!(loads.iter().sum::<usize>(), 6);
    assert!(loads.iter().all(|&l| l == 2), "{loads:?}");
    assert_eq!(read_all(&jobs).await, want, "after the rebalance");

    // c lost: its parts are copied from the holders left.
    let lost = move_dataset(&jobs, "vecs", &Why::Lost(vec![names[2].clone()]))
        .await
        .unwrap();
    assert_eq!(lost.moves.len(), 2, "{lost:?}");
    assert!(lost.short.is_empty(), "{lost:?}");
    let layout = ledger.layout("vecs").unwrap();
    assert!(
        layout
            .holders
            .iter()
            .all(|h| h.len() == 2 && !h.contains(&names[2]))
    );
    assert_eq!(read_all(&jobs).await, want, "without c");
}
