//! What the integration tests of sharded datasets share: a source of
//! small `.npy` samples in three classes, and storage nodes served on
//! loopback as `sluice storage-node` serves them.

use std::path::Path;
use std::sync::Arc;

use sluice_flight::{StorageClient, StorageEndpoint};
use sluice_storage::flight_service::StorageFlightService;
use sluice_storage::scan::ScanOptions;
use sluice_storage::{StorageNode, Store, StoreOptions};
use sluice_udfs::kernels::npy::{self, DType};

/// Samples in the source.
pub const SAMPLES: usize = 37;

/// Writes the source under `dir`: `c{i % 3}/v{i}.npy`, each a float32
/// pair `[i, 0.5]`.
pub fn write_samples(dir: &Path) {
    for i in 0..SAMPLES {
        let p = dir.join(format!("c{}/v{i:03}.npy", i % 3));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        let data: Vec<u8> = [i as f32, 0.5]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        std::fs::write(p, npy::write(DType::F32, &[2], &data)).unwrap();
    }
}

/// A storage node on its own store (`root/name`, ingesting from under
/// `src_root`), serving Flight and the engine's worker on one loopback
/// port.
#[allow(dead_code)] // Not every test crate that shares this module serves nodes.
pub async fn served_node(
    root: &Path,
    name: &str,
    src_root: &Path,
) -> (Arc<Store>, Arc<dyn StorageEndpoint>) {
    let mut opts = StoreOptions::new(root.join(name));
    opts.device_size = 64 << 20;
    opts.chunk_size = 1 << 20;
    let store = Store::open(&opts).unwrap();
    let node = StorageNode::new(Arc::clone(&store), ScanOptions::default(), 1, None).unwrap();
    node.allow_ingest(&[src_root.to_path_buf()], &[]).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let worker = sluice_storage::engine::worker(Arc::clone(&node), Default::default());
    let serve = tonic::transport::Server::builder()
        .add_service(StorageFlightService::new(node).server())
        .add_service(worker.into_worker_server())
        .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener));
    sluice_base::task::detach(async move {
        let _ = serve.await;
    });
    let client = StorageClient::new(&format!("http://{addr}")).unwrap();
    (store, Arc::new(client))
}
