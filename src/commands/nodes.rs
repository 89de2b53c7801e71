//! The node processes: `sluice storage-node`, `sluice compute-node` and
//! `sluice serve` (both sides in one process, with the REST API and the
//! trainers' Flight service). Each prints `listening on
//! ADDR` on stdout once it accepts connections, and stops cleanly on
//! Ctrl-C or SIGTERM.

use std::sync::Arc;

use axum::serve::ListenerExt;
use sluice_access::{Audit, Auth, Scope};
use sluice_base::Executor;
use sluice_compute::job::JobStore;
use sluice_compute::{ComputeSession, Jobs, QueryService, ResourceHints};
use sluice_flight::{CheckpointEndpoint, ClientCerts, StorageClient, StorageEndpoint, Tls};
use sluice_storage::StorageFlightService;
use sluice_storage::checkpoint::{CheckpointOptions, Checkpoints};
use tokio::net::TcpListener;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Server;
use tonic::transport::server::Router;
use tonic::transport::server::TcpIncoming;

use super::place;
use crate::cli::{Cli, NodeFlags, QueryLimitFlags, RateArg};

/// Resolves on Ctrl-C or SIGTERM.
/// How long `serve` waits for open streams to end once told to stop.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

async fn shutdown() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

/// A Flight server builder with HTTP/2 windows sized for bulk tensors
/// (h2's default 64 KiB stream window stalls a stream of multi-MiB
/// messages on every round trip).
fn flight_builder() -> Server {
    Server::builder()
        .initial_stream_window_size(Some(FLIGHT_WINDOW))
        .initial_connection_window_size(Some(2 * FLIGHT_WINDOW))
        .http2_adaptive_window(Some(true))
}

/// A listener's connections for tonic, with Nagle's algorithm off.
/// tonic applies `Server::tcp_nodelay` only to a listener it binds
/// itself, not to one handed to `serve_with_incoming`: without this, a
/// small answer written after another (an action's result after its
/// headers, a stream's trailers) waited for the peer's delayed ACK, up
/// to 40 ms on Linux, whenever two calls shared a connection's turn.
fn incoming(listener: TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener).with_nodelay(Some(true))
}

/// The HTTP/2 flow-control window of a Flight stream.
const FLIGHT_WINDOW: u32 = 8 << 20;

/// The tokens a server accepts: `given` (every scope) and the tokens
/// file's (`--tokens`), read again on SIGHUP; refusals go to the audit
/// log (`--audit-log`).
fn accepted_tokens(cli: &Cli, given: &[String]) -> anyhow::Result<Auth> {
    let audit = match &cli.audit_log {
        Some(path) => Audit::to(path).map_err(anyhow::Error::msg)?,
        None => Audit::default(),
    };
    let auth = Auth::new(given.iter().cloned(), cli.tokens.as_deref(), audit)
        .map_err(anyhow::Error::msg)?;
    if cli.tokens.is_some() {
        reload_on_sighup(auth.clone());
    }
    Ok(auth)
}

/// Reads the tokens file again at each SIGHUP, until the process ends.
fn reload_on_sighup(auth: Auth) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        eprintln!("warning: no SIGHUP: the tokens file is read only at start");
        return;
    };
    sluice_base::task::detach(async move {
        while hup.recv().await.is_some() {
            match auth.reload() {
                Ok(n) => eprintln!("tokens file read again: {n} token(s)"),
                Err(e) => eprintln!("error: {e}; the tokens in use are kept"),
            }
        }
    });
}

async fn bind(addr: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))
}

/// A listener for `what` on `addr`: plain text only on loopback, unless
/// this process serves TLS (`--tls-cert`) or is told `--insecure`.
async fn listen(
    cli: &Cli,
    tls: Option<&Tls>,
    addr: &str,
    what: &str,
) -> anyhow::Result<TcpListener> {
    let listener = bind(addr).await?;
    let at = listener.local_addr()?;
    if !at.ip().is_loopback() && !tls.is_some_and(Tls::serves) && !cli.insecure {
        anyhow::bail!(
            "refusing to serve {what} in plain text on {at}, which is not loopback: give \
             --tls-cert and --tls-key (`sluice certs` makes them), listen on 127.0.0.1, \
             or pass --insecure on a network you trust"
        );
    }
    Ok(listener)
}

/// `builder` serving TLS when this process has a certificate, asking
/// callers for one of the cluster's as `client_certs` says.
fn with_tls(
    builder: Server,
    tls: Option<&Tls>,
    client_certs: ClientCerts,
) -> anyhow::Result<Server> {
    match tls.filter(|t| t.serves()) {
        Some(t) => {
            Ok(builder.tls_config(t.tonic_server(client_certs).map_err(anyhow::Error::msg)?)?)
        }
        None => Ok(builder),
    }
}

/// `scheme://addr`, the TLS scheme when this process serves TLS.
fn location(tls: Option<&Tls>, plain: &str, secure: &str, addr: std::net::SocketAddr) -> String {
    let scheme = if tls.is_some_and(Tls::serves) {
        secure
    } else {
        plain
    };
    format!("{scheme}://{addr}")
}

pub async fn storage_node(cli: &Cli, node: &NodeFlags) -> anyhow::Result<()> {
    let storage = place::local_node(cli, node.cores, node.link_limit)?;
    let stage_cache = node
        .stage_cache_memory
        .unwrap_or_else(sluice_udfs::stage_cache::StageCache::default_budget);
    sluice_udfs::stage_cache::StageCache::global().configure(stage_cache);
    if !node.ingest_root.is_empty() || !node.ingest_url_allow.is_empty() {
        storage.allow_ingest(&node.ingest_root, &node.ingest_url_allow)?;
    }
    let tls = place::tls(cli)?;
    let listener = listen(
        cli,
        tls.as_deref(),
        node.listen.as_deref().unwrap_or("127.0.0.1:50051"),
        "Flight",
    )
    .await?;
    let addr = listener.local_addr()?;
    let datasets = storage.list()?;
    println!(
        "storage node listening on {addr} ({} dataset(s), {} core(s))",
        datasets.len(),
        storage.info().cores
    );
    if let Some(url) = &node.coordinator {
        let coordinator = crate::coordinator::Coordinator::new(
            url,
            place::rest_client(cli, url, place::node_token(cli))?,
        );
        let location = node
            .advertise
            .clone()
            .unwrap_or_else(|| location(tls.as_deref(), "http", "https", addr));
        coordinator.keep_registered("storage", location.clone(), None);
        println!("registering with the coordinator at {url} as {location}");
    }
    // Only nodes of the cluster call a storage node: with a tokens file,
    // tokens of scope `node`; with the cluster's CA, callers holding a
    // certificate it issued.
    let auth = accepted_tokens(cli, &[])?.requiring(Scope::Node);
    let server = with_tls(Server::builder(), tls.as_deref(), ClientCerts::Required)?;
    // The stripes of the cluster's checkpoints, kept for its coordinator.
    let checkpoints = Checkpoints::new(Arc::clone(storage.store()), CheckpointOptions::default());
    Checkpoints::spawn_reaper(&checkpoints);
    storage_services(
        server,
        storage,
        node.decode.limits(),
        Some(auth),
        Some(checkpoints),
    )
    .serve_with_incoming_shutdown(incoming(listener), shutdown())
    .await?;
    eprintln!("storage node stopped");
    Ok(())
}

pub async fn compute_node(
    cli: &Cli,
    listen: &str,
    storage: &[String],
    cluster: Cluster<'_>,
    hints: ResourceHints,
    limits: QueryLimitFlags,
) -> anyhow::Result<()> {
    sluice_udfs::stage_cache::StageCache::global().configure(limits.stage_cache());
    let session = ComputeSession::new(
        place::remote_nodes(cli, storage)?,
        place::profiles(cli)?,
        hints,
    )
    .with_query_memory(limits.query_memory as usize)
    .with_stream_memory(limits.stream_memory())
    .with_output_cache(limits.output_cache())
    .with_limits(limits.decode.limits())
    .with_calibration(place::calibration(limits.no_calibrate));
    let session = Arc::new(session);
    let tls = place::tls(cli)?;
    let listener = self::listen(cli, tls.as_deref(), listen, "Flight").await?;
    let addr = listener.local_addr()?;
    let mut jobs = Jobs::new(Arc::clone(&session))?;
    let mut reporter = None;
    if let Some(url) = cluster.coordinator {
        let coordinator = crate::coordinator::Coordinator::new(
            url,
            place::rest_client(cli, url, place::node_token(cli))?,
        );
        let location = cluster.advertise.map_or_else(
            || location(tls.as_deref(), "grpc", "grpc+tls", addr),
            str::to_string,
        );
        // The storage nodes the coordinator reads are this node's too.
        let learner = Arc::clone(&session);
        let credential = place::node_credential(cli)?;
        let learn = move |reply: &serde_json::Value| {
            for url in crate::coordinator::storage_urls(reply) {
                match StorageClient::with_credential(&url, credential.clone()) {
                    Ok(c) => {
                        learner.add_endpoint(Arc::new(c));
                    }
                    Err(e) => eprintln!("warning: storage node {url}: {e}"),
                }
            }
        };
        // Registered once before it listens, so that its first query
        // already sees the coordinator's storage nodes; a coordinator not
        // up yet is retried in the background.
        let first = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            coordinator.register_once("compute", &location),
        )
        .await;
        match first {
            Ok(Ok(reply)) => learn(&reply),
            Ok(Err(e)) => eprintln!("warning: cannot register with the coordinator at {url}: {e}"),
            Err(_) => eprintln!("warning: the coordinator at {url} did not answer within 5 s"),
        }
        coordinator.keep_registered("compute", location.clone(), Some(Box::new(learn)));
        println!("serving the jobs of the coordinator at {url} as {location}");
        reporter = Some((coordinator.clone(), location));
        jobs = jobs.with_source(Arc::new(coordinator));
    }
    if let Err(e) = session.refresh().await {
        eprintln!("warning: {e}");
    }
    println!(
        "compute node listening on {addr} ({} dataset(s) over {} storage node(s))",
        session.datasets().await.len(),
        session.endpoints().len()
    );
    let jobs = Arc::new(jobs);
    if let Some((coordinator, location)) = reporter {
        crate::coordinator::report_progress(coordinator, Arc::clone(&jobs), location);
    }
    with_tls(flight_builder(), tls.as_deref(), ClientCerts::Optional)?
        .add_service(
            QueryService::new(jobs)
                .with_query_timeout(limits.timeout())
                // Its own --token is what it sends; it accepts the
                // tokens file's.
                .serve(accepted_tokens(cli, &[])?),
        )
        .serve_with_incoming_shutdown(incoming(listener), shutdown())
        .await?;
    eprintln!("compute node stopped");
    Ok(())
}

/// A compute node's place in a cluster.
#[derive(Debug, Clone, Copy)]
pub struct Cluster<'a> {
    /// The coordinator's REST URL, if the node has one.
    pub coordinator: Option<&'a str>,
    /// The Flight location trainers reach the node at.
    pub advertise: Option<&'a str>,
}

/// Where `sluice serve` listens and what REST may ingest.
#[derive(Debug)]
pub struct ServeAddrs<'a> {
    /// Arrow Flight (job streams, queries).
    pub flight: &'a str,
    /// The REST API.
    pub rest: &'a str,
    /// Directories REST ingest may read.
    pub ingest_roots: &'a [std::path::PathBuf],
    /// Object-store prefixes REST ingest may read.
    pub ingest_url_allow: sluice_storage::ingest::objects::UrlAllow,
    /// Remote storage nodes instead of the data dir.
    pub storage: &'a [String],
    /// No storage of its own even with no `storage`: nodes register.
    pub remote_storage: bool,
    /// How checkpoints in the data dir are kept.
    pub checkpoints: CheckpointOptions,
    /// On a cluster: copies of each checkpoint stripe (`None`: the
    /// default), and the period of the sweep of stray pieces.
    pub cluster_checkpoints: (Option<u32>, std::time::Duration),
    /// How long a finished or unread job is kept.
    pub job_ttl: std::time::Duration,
    /// A background scrub's period and request (`serve --scrub-every`).
    pub scrub: Option<(std::time::Duration, sluice_flight::scrub::ScrubRequest)>,
    /// Seconds after which a storage node that does not answer is lost
    /// and its parts re-replicated (`serve --lost-after`; 0: never).
    pub lost_after: f64,
    /// Limits on each SQL query.
    pub limits: QueryLimitFlags,
}

pub async fn serve(
    cli: &Cli,
    addrs: &ServeAddrs<'_>,
    loopback: bool,
    storage_cores: Option<usize>,
    link_limit: Option<RateArg>,
    hints: ResourceHints,
) -> anyhow::Result<()> {
    let remote = addrs.remote_storage || !addrs.storage.is_empty();
    // One executor for the process's CPU work: its jobs', and its
    // in-process storage node's fragments (unless `--storage-cores`
    // models a storage machine of its own), on the same cores.
    let cpu = Executor::new("sluice-cpu", sluice_planner::resources::machine_cores())?;
    let (endpoints, store): (Vec<Arc<dyn StorageEndpoint>>, _) = if remote {
        (place::remote_nodes(cli, addrs.storage)?, None)
    } else {
        let storage = match storage_cores {
            None => place::local_node_on(cli, Arc::clone(&cpu), link_limit)?,
            Some(cores) => place::local_node(cli, Some(cores), link_limit)?,
        };
        let store = Arc::clone(storage.store());
        let endpoint: Arc<dyn StorageEndpoint> = if loopback {
            over_loopback(storage, addrs.limits.decode.limits()).await?
        } else {
            storage
        };
        (vec![endpoint], Some(store))
    };
    sluice_udfs::stage_cache::StageCache::global().configure(addrs.limits.stage_cache());
    // The parts this cluster wrote: what a storage node that registers
    // may bring (sluice_compute::ledger).
    let ledger = Arc::new(sluice_compute::ledger::PartLedger::open(
        &cli.data_dir.join("cluster"),
    )?);
    let session = Arc::new(
        ComputeSession::new(endpoints, place::profiles(cli)?, hints)
            .with_ledger(ledger)
            .with_query_memory(addrs.limits.query_memory as usize)
            .with_stream_memory(addrs.limits.stream_memory())
            .with_output_cache(addrs.limits.output_cache())
            .with_limits(addrs.limits.decode.limits())
            .with_calibration(place::calibration(addrs.limits.no_calibrate)),
    );
    if let Err(e) = session.refresh().await {
        eprintln!("warning: {e}");
    }
    let auth = accepted_tokens(cli, &cli.token)?;
    // Jobs survive a restart: their records live beside the data.
    let job_store = JobStore::open(cli.data_dir.join("jobs"))?;
    let jobs = Arc::new(Jobs::on(cpu, Arc::clone(&session), Some(job_store)));
    match jobs.restore().await {
        Ok(0) => {}
        Ok(n) => eprintln!("{n} job(s) restored"),
        Err(e) => eprintln!("warning: jobs of an earlier run: {e}"),
    }
    spawn_job_expiry(Arc::clone(&jobs), addrs.job_ttl);
    // Checkpoints live beside the datasets: in serve's own data dir, or
    // striped over the cluster's storage nodes.
    let mut cluster_checkpoints = None;
    let checkpoints: Arc<dyn CheckpointEndpoint> = match store.as_ref() {
        Some(s) => {
            let c = Checkpoints::new(Arc::clone(s), addrs.checkpoints.clone());
            Checkpoints::spawn_reaper(&c);
            c
        }
        None => {
            let keeping = sluice_compute::checkpoints::Keeping {
                keep: addrs.checkpoints.keep,
                idle_timeout: addrs.checkpoints.idle_timeout,
                replicas: addrs.cluster_checkpoints.0,
                sweep_every: addrs.cluster_checkpoints.1,
            };
            let c = sluice_compute::checkpoints::ClusterCheckpoints::open(
                Arc::clone(&session),
                &cli.data_dir.join("cluster"),
                keeping,
                place::node_credential(cli)?,
            )?;
            sluice_compute::checkpoints::ClusterCheckpoints::spawn_upkeep(&c);
            cluster_checkpoints = Some(Arc::clone(&c));
            c
        }
    };
    let tls = place::tls(cli)?;
    let flight = listen(cli, tls.as_deref(), addrs.flight, "Flight").await?;
    let flight_addr = flight.local_addr()?;
    let rest = listen(cli, tls.as_deref(), addrs.rest, "the REST API").await?;
    let rest_addr = rest.local_addr()?;
    let rest_url = location(tls.as_deref(), "http", "https", rest_addr);
    let state = crate::rest::AppState {
        jobs: Arc::clone(&jobs),
        auth: auth.clone(),
        ingest_store: store,
        checkpoints: Some(Arc::clone(&checkpoints)),
        cluster_checkpoints,
        ingest_roots: addrs.ingest_roots.to_vec(),
        ingest_url_allow: addrs.ingest_url_allow.clone(),
        started: std::time::Instant::now(),
        flight: location(tls.as_deref(), "grpc", "grpc+tls", flight_addr),
        ingests: Arc::default(),
        quarantine: Arc::default(),
        node_credential: place::node_credential(cli)?,
    };
    if let Some((every, req)) = addrs.scrub.clone() {
        crate::rest::scrub::every(state.clone(), every, req);
    }
    if remote {
        crate::rest::moves::watch_lost(state.clone(), addrs.lost_after);
    }
    let app = crate::rest::app(state);
    // One write, and no panic if whoever started us stopped reading.
    let announce = format!(
        "sluice serve listening on {flight_addr} ({} dataset(s); Flight: jobs and queries)\n\
         REST API on {rest_url} (OpenAPI at /openapi.json){}\n",
        session.datasets().await.len(),
        if auth.enabled() {
            "; bearer tokens required"
        } else {
            ""
        }
    );
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = out
            .write_all(announce.as_bytes())
            .and_then(|()| out.flush());
    }
    let query = QueryService::new(Arc::clone(&jobs))
        .with_query_timeout(addrs.limits.timeout())
        .with_checkpoints(checkpoints);
    let flight_server = with_tls(flight_builder(), tls.as_deref(), ClientCerts::Optional)?
        .add_service(query.serve(auth))
        .serve_with_incoming_shutdown(incoming(flight), shutdown());
    let rest_server = serve_rest(rest, app, tls.as_deref());
    let servers = async {
        let (f, r) = tokio::join!(flight_server, rest_server);
        f?;
        r?;
        anyhow::Ok(())
    };
    // A client that keeps a stream open (a trainer that stopped reading)
    // must not keep the server from stopping: after a grace period the
    // connections left are closed.
    tokio::select! {
        r = servers => r?,
        () = async {
            shutdown().await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } => eprintln!(
            "sluice serve: connections still open {} s after the signal; closing them",
            SHUTDOWN_GRACE.as_secs()
        ),
    }
    // Progress delivered since the last periodic save is kept.
    jobs.save_all();
    eprintln!("sluice serve stopped");
    Ok(())
}

/// A storage node's services on `server`: Flight (with the checkpoint
/// protocol over `checkpoints`, when given), and beside it, on the same
/// port and behind the same check (`auth`, when given), the distributed
/// engine's worker, which runs the storage fragments of queries and job
/// streams planned on other nodes.
fn storage_services(
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
        Some(auth) => server
            .add_service(InterceptedService::new(flight, auth.clone()))
            .add_service(InterceptedService::new(worker.into_worker_server(), auth)),
        None => server
            .add_service(flight)
            .add_service(worker.into_worker_server()),
    }
}

/// `storage` served on a loopback Flight port of its own, and a client of
/// it (`serve --loopback`: both sides of a cut in one process, with the
/// wire between them).
async fn over_loopback(
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

/// Serves the REST API `app` on `rest` (over TLS when this process has a
/// certificate) until the process is told to stop.
async fn serve_rest(rest: TcpListener, app: axum::Router, tls: Option<&Tls>) -> anyhow::Result<()> {
    // With connect info: a trainer's ranks go to a compute node beside it.
    let app = app.into_make_service_with_connect_info::<std::net::SocketAddr>();
    match tls.filter(|t| t.serves()) {
        Some(t) => {
            let config = t.rustls_server().map_err(anyhow::Error::msg)?;
            // `tap_io`: the listener axum knows the peer address of.
            let tls_rest = crate::rest::tls::TlsListener::new(rest, config)?.tap_io(|_| {});
            axum::serve(tls_rest, app)
                .with_graceful_shutdown(shutdown())
                .await?;
        }
        None => {
            // Nagle's algorithm off, as on the TLS listener and Flight's.
            let rest = rest.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            axum::serve(rest, app)
                .with_graceful_shutdown(shutdown())
                .await?;
        }
    }
    Ok(())
}

/// Forgets expired jobs, checking a tenth of `ttl` apart (at most a minute).
fn spawn_job_expiry(jobs: Arc<Jobs>, ttl: std::time::Duration) {
    let every = (ttl / 10).clamp(
        std::time::Duration::from_millis(100),
        std::time::Duration::from_secs(60),
    );
    let weak = Arc::downgrade(&jobs);
    drop(jobs);
    sluice_base::task::detach(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            let Some(jobs) = weak.upgrade() else { return };
            jobs.expire(ttl);
        }
    });
}
