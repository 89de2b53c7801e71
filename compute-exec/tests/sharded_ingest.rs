//! Sharded ingest over real in-process storage nodes (real stores on
//! files): a version is spread over every node and committed on all of
//! them or on none, each error keeps its code and kind, and a node that
//! refused leaves no lock held on the others.

use std::path::Path;
use std::sync::Arc;

use sluice_base::Fault;
use sluice_compute::ingest::{IngestError, IngestRequest, Ingests};
use sluice_flight::StorageEndpoint;
use sluice_storage::scan::ScanOptions;
use sluice_storage::{StorageNode, Store, StoreOptions};
use tonic::Code;

use crate::common::{SAMPLES, write_samples};

fn node(root: &Path, name: &str) -> (Arc<Store>, Arc<StorageNode>) {
    let mut opts = StoreOptions::new(root.join(name));
    opts.device_size = 64 << 20;
    opts.chunk_size = 1 << 20;
    let store = Store::open(&opts).unwrap();
    let node = StorageNode::new(Arc::clone(&store), ScanOptions::default(), 1, None).unwrap();
    (store, node)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_ingest_commits_on_every_node_or_none() {
    let root = tempfile::tempdir().unwrap();
    let src_root = root.path().join("src");
    let src = src_root.join("vecs");
    write_samples(&src);
    let (a_store, a) = node(root.path(), "a");
    let (b_store, b) = node(root.path(), "b");
    a.allow_ingest(std::slice::from_ref(&src_root), &[])
        .unwrap();
    let nodes: Vec<Arc<dyn StorageEndpoint>> = vec![a.clone(), b.clone()];
    let req = IngestRequest {
        dataset: "vecs".into(),
        path: src.display().to_string(),
        manifest: None,
        on_error: "fail".into(),
        replicas: Some(1),
    };
    let ingests = Ingests::default();

    // Node b takes no ingest: a prepares its part, and drops it.
    let err = ingests.run(&nodes, &req).await.unwrap_err();
    assert!(matches!(err, IngestError::Part { .. }), "{err}");
    assert_eq!(
        (err.code(), err.kind()),
        (Code::PermissionDenied, "forbidden_path")
    );
    assert!(
        err.to_string().contains("no version was committed"),
        "{err}"
    );
    for store in [&a_store, &b_store] {
        assert_eq!(store.catalog().latest_version("vecs").unwrap(), None);
    }
    assert!(!root.path().join("a/meta/vecs/v1.parquet").exists());

    // Allowed on both: one part each, every sample once, version 1 on both
    // (node a's lock was freed with its dropped part).
    b.allow_ingest(&[src_root], &[]).unwrap();
    let report = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        ingests.run(&nodes, &req),
    )
    .await
    .expect("node a's ingest lock is still held")
    .unwrap();
    assert_eq!(report.samples, SAMPLES as u64);
    let counts: Vec<u64> = report.parts.iter().map(|p| p.samples).collect();
    assert_eq!(counts, [19, 18]);
    assert!(report.parts.iter().all(|p| p.version == 1));
    for (store, n) in [(&a_store, 19), (&b_store, 18)] {
        let v = store.catalog().version("vecs", None).unwrap();
        assert_eq!((v.version, v.samples), (1, n));
    }

    // A source outside the roots is refused on every node; nothing new.
    let outside = IngestRequest {
        path: root.path().join("a").display().to_string(),
        ..req.clone()
    };
    let err = ingests.run(&nodes, &outside).await.unwrap_err();
    assert_eq!(err.kind(), "forbidden_path", "{err}");
    assert_eq!(a_store.catalog().latest_version("vecs").unwrap(), Some(1));

    // No node: said so.
    let err = ingests.run(&[], &req).await.unwrap_err();
    assert_eq!(
        (err.code(), err.kind()),
        (Code::FailedPrecondition, "no_storage_nodes")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committing_a_part_the_node_does_not_hold_is_a_named_error() {
    let root = tempfile::tempdir().unwrap();
    let (_store, a) = node(root.path(), "a");
    let err = a.finish_ingest("nope", true).await.unwrap_err();
    assert_eq!(
        (err.code(), err.kind()),
        (Code::FailedPrecondition, "ingest_not_prepared")
    );
    assert!(err.to_string().contains("nope"), "{err}");
    // Dropping one it does not hold is no error (its prepare may have failed).
    assert_eq!(a.finish_ingest("nope", false).await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_replicas_every_part_is_on_two_distinct_nodes() {
    let root = tempfile::tempdir().unwrap();
    let src_root = root.path().join("src");
    let src = src_root.join("vecs");
    write_samples(&src);
    let mut stores = Vec::new();
    let mut nodes: Vec<Arc<dyn StorageEndpoint>> = Vec::new();
    for name in ["a", "b", "c"] {
        let (store, node) = node(root.path(), name);
        node.allow_ingest(std::slice::from_ref(&src_root), &[])
            .unwrap();
        stores.push(store);
        nodes.push(node);
    }
    let req = IngestRequest {
        dataset: "vecs".into(),
        path: src.display().to_string(),
        manifest: None,
        on_error: "fail".into(),
        // Two, the default with at least two nodes.
        replicas: None,
    };
    let ingests = Ingests::default();
    let report = ingests.run(&nodes, &req).await.unwrap();
    assert_eq!(report.replicas, 2);
    // 37 samples: parts of 13, 12, 12; node i holds parts i and i-1.
    assert_eq!(report.samples, SAMPLES as u64);
    let counts: Vec<u64> = report.parts.iter().map(|p| p.samples).collect();
    assert_eq!(counts, [13 + 12, 12 + 13, 12 + 12]);
    assert_eq!(report.stored_bytes, 2 * report.bytes);
    let names: Vec<&str> = nodes.iter().map(|n| n.name()).collect();
    assert_eq!(
        report.holders,
        [
            vec![names[0], names[1]],
            vec![names[1], names[2]],
            vec![names[2], names[0]]
        ]
    );
    for (store, n) in stores.iter().zip(counts) {
        let v = store.catalog().version("vecs", None).unwrap();
        assert_eq!((v.version, v.samples), (1, n));
    }

    // More replicas than nodes: refused before anything is written.
    let err = ingests
        .run(
            &nodes[..2],
            &IngestRequest {
                replicas: Some(3),
                ..req.clone()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), err.kind()),
        (Code::InvalidArgument, "bad_replicas")
    );
    assert!(err.to_string().contains("replicas 3"), "{err}");
    assert_eq!(stores[0].catalog().latest_version("vecs").unwrap(), Some(1));
}
