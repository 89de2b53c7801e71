//! A storage node's gRPC services on one port: its Flight service (with
//! the checkpoint protocol) and the distributed engine's worker, and the
//! same served on loopback for `serve --loopback`.

use std::sync::Arc;

use sluice_access::{Auth, PassGate};
use sluice_flight::{StorageClient, StorageEndpoint};
use sluice_storage::StorageFlightService;
use sluice_storage::checkpoint::Checkpoints;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Server;
use tonic::transport::server::Router;

use super::listen::{bind, incoming, shutdown};

/// A storage node's services on `server`: Flight (with the checkpoint
/// protocol over `checkpoints`, when given; behind `auth`, when given,
/// but for a put with an upload pass), and beside it, on the same port
/// and behind the same check, the distributed engine's worker, which runs the storage fragments of queries and job
/// streams planned on other nodes.
pub(super) fn storage_services(
    mut server: Server,
    storage: Arc<sluice_storage::StorageNode>,
    limits: sluice_udfs::Limits,
    auth: Option<Auth>,
    checkpoints: Option<Arc<Checkpoints>>,
) -> Router {
    let worker = sluice_storage::engine::worker(Arc::clone(&storage), limits);
    let mut flight = StorageFlightService::new(storage).with_limits(limits);
    if let Some(c) = checkpoints {
        flight = flight.with_checkpoints(c);
    }
    let flight = flight.server();
    match auth {
        // A trainer's put that carries an upload pass is let through to
        // the checkpoint store, which takes it for that upload only.
        Some(auth) => server
            .add_service(PassGate::new(flight, auth.clone()))
            .add_service(InterceptedService::new(worker.into_worker_server(), auth)),
        None => server
            .add_service(flight)
            .add_service(worker.into_worker_server()),
    }
}

/// `storage` served on a loopback Flight port of its own, and a client of
/// it (`serve --loopback`: both sides of a cut in one process, with the
/// wire between them).
pub(super) async fn over_loopback(
    storage: Arc<sluice_storage::StorageNode>,
    limits: sluice_udfs::Limits,
) -> anyhow::Result<Arc<dyn StorageEndpoint>> {
    let listener = bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let router = storage_services(Server::builder(), storage, limits, None, None);
    sluice_base::task::detach(async move {
        let served = router
            .serve_with_incoming_shutdown(incoming(listener), shutdown())
            .await;
        if let Err(e) = served {
            eprintln!("error: loopback storage service: {e}");
        }
    });
    eprintln!("storage side on loopback Flight at {addr}");
    Ok(Arc::new(StorageClient::new(&format!("http://{addr}"))?))
}
