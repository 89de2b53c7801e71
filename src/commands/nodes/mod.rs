//! The node processes: `sluice storage-node`, `sluice compute-node` and
//! `sluice serve` (both sides in one process, with the REST API and the
//! trainers' Flight service). Each prints `listening on
//! ADDR` on stdout once it accepts connections, and stops cleanly on
//! Ctrl-C or SIGTERM.
//!
//! Modules:
//! - `listen`: ports, TLS, the Flight and REST listeners, tokens, shutdown;
//! - `storage`: a storage node's gRPC services on one port.

use std::sync::Arc;

use sluice_access::Scope;
use sluice_base::Executor;
use sluice_compute::checkpoints::ClusterCheckpoints;
use sluice_compute::job::JobStore;
use sluice_compute::{ComputeSession, Jobs, QueryService, ResourceHints};
use sluice_flight::{CheckpointEndpoint, ClientCerts, StorageClient, StorageEndpoint};
use sluice_storage::checkpoint::{CheckpointOptions, Checkpoints};
use tonic::transport::Server;

use super::place;
use crate::cli::{Cli, NodeFlags, QueryLimitFlags, RateArg};

mod listen;
mod storage;

use listen::{
    SHUTDOWN_GRACE, accepted_tokens, flight_builder, incoming, listen, location, serve_rest,
    shutdown, with_tls,
};
use storage::{over_loopback, storage_services};

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
    // The stripes of the cluster's checkpoints, kept for its coordinator;
    // trainers write theirs here directly with upload passes, unless only
    // holders of the CA's certificates may call (trainers have none).
    let passes = !tls.as_deref().is_some_and(|t| t.trusts());
    let options = CheckpointOptions {
        passes,
        ..CheckpointOptions::default()
    };
    let checkpoints = Checkpoints::new(Arc::clone(storage.store()), options);
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
    .with_repair(sluice_compute::repair::on_corrupt())
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
    let (endpoints, store) = serve_storage(
        cli,
        addrs,
        remote,
        loopback,
        storage_cores,
        link_limit,
        &cpu,
    )
    .await?;
    sluice_udfs::stage_cache::StageCache::global().configure(addrs.limits.stage_cache());
    // The parts this cluster wrote: what a storage node that registers
    // may bring (sluice_compute::ledger).
    let ledger = Arc::new(sluice_compute::replicas::ledger::PartLedger::open(
        &cli.data_dir.join("cluster"),
    )?);
    let session = Arc::new(
        ComputeSession::new(endpoints, place::profiles(cli)?, hints)
            .with_ledger(ledger)
            .with_query_memory(addrs.limits.query_memory as usize)
            .with_stream_memory(addrs.limits.stream_memory())
            .with_output_cache(addrs.limits.output_cache())
            .with_repair(sluice_compute::repair::on_corrupt())
            .with_limits(addrs.limits.decode.limits())
            .with_calibration(place::calibration(addrs.limits.no_calibrate)),
    );
    if let Err(e) = session.refresh().await {
        eprintln!("warning: {e}");
    }
    let auth = accepted_tokens(cli, &cli.token)?;
    let jobs = serve_jobs(cli, cpu, &session, addrs.job_ttl).await?;
    let (checkpoints, cluster_checkpoints) =
        serve_checkpoints(cli, addrs, &session, store.as_ref())?;
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
    announce(&format!(
        "sluice serve listening on {flight_addr} ({} dataset(s); Flight: jobs and queries)\n\
         REST API on {rest_url} (OpenAPI at /openapi.json){}\n",
        session.datasets().await.len(),
        if auth.enabled() {
            "; bearer tokens required"
        } else {
            ""
        }
    ));
    let query = QueryService::new(Arc::clone(&jobs))
        .with_query_timeout(addrs.limits.timeout())
        .with_checkpoints(checkpoints);
    let flight_server = with_tls(flight_builder(), tls.as_deref(), ClientCerts::Optional)?
        .add_service(query.serve(auth))
        .serve_with_incoming_shutdown(incoming(flight), shutdown());
    let rest_server = serve_rest(rest, app, tls.as_deref());
    until_stopped(flight_server, rest_server).await?;
    // Progress delivered since the last periodic save is kept.
    jobs.save_all();
    eprintln!("sluice serve stopped");
    Ok(())
}

/// `serve`'s jobs, on `cpu`: those an earlier run saved beside the data
/// brought back, and expired after `ttl` idle.
async fn serve_jobs(
    cli: &Cli,
    cpu: Arc<Executor>,
    session: &Arc<ComputeSession>,
    ttl: std::time::Duration,
) -> anyhow::Result<Arc<Jobs>> {
    // Jobs survive a restart: their records live beside the data.
    let job_store = JobStore::open(cli.data_dir.join("jobs"))?;
    let jobs = Arc::new(Jobs::on(cpu, Arc::clone(session), Some(job_store)));
    match jobs.restore().await {
        Ok(0) => {}
        Ok(n) => eprintln!("{n} job(s) restored"),
        Err(e) => eprintln!("warning: jobs of an earlier run: {e}"),
    }
    spawn_job_expiry(Arc::clone(&jobs), ttl);
    Ok(jobs)
}

/// The storage nodes `serve` reads: remote ones (`--storage`, or none
/// yet with `--remote-storage`), or its own data dir as an in-process node
/// (on `cpu` unless `--storage-cores` gives it cores of its own; over a
/// loopback Flight port with `--loopback`) with its store.
async fn serve_storage(
    cli: &Cli,
    addrs: &ServeAddrs<'_>,
    remote: bool,
    loopback: bool,
    storage_cores: Option<usize>,
    link_limit: Option<RateArg>,
    cpu: &Arc<Executor>,
) -> anyhow::Result<(
    Vec<Arc<dyn StorageEndpoint>>,
    Option<Arc<sluice_storage::Store>>,
)> {
    if remote {
        return Ok((place::remote_nodes(cli, addrs.storage)?, None));
    }
    let storage = match storage_cores {
        None => place::local_node_on(cli, Arc::clone(cpu), link_limit)?,
        Some(cores) => place::local_node(cli, Some(cores), link_limit)?,
    };
    let store = Arc::clone(storage.store());
    let endpoint: Arc<dyn StorageEndpoint> = if loopback {
        over_loopback(storage, addrs.limits.decode.limits()).await?
    } else {
        storage
    };
    Ok((vec![endpoint], Some(store)))
}

/// The checkpoints `serve` answers for, and the cluster's (for REST) when
/// they are striped over its storage nodes.
type ServeCheckpoints = (Arc<dyn CheckpointEndpoint>, Option<Arc<ClusterCheckpoints>>);

/// Where `serve`'s checkpoints live: in its own data dir (`store`), or
/// striped over the cluster's storage nodes (the second value, for REST).
fn serve_checkpoints(
    cli: &Cli,
    addrs: &ServeAddrs<'_>,
    session: &Arc<ComputeSession>,
    store: Option<&Arc<sluice_storage::Store>>,
) -> anyhow::Result<ServeCheckpoints> {
    if let Some(s) = store {
        let c = Checkpoints::new(Arc::clone(s), addrs.checkpoints.clone());
        Checkpoints::spawn_reaper(&c);
        return Ok((c, None));
    }
    let keeping = sluice_compute::checkpoints::Keeping {
        keep: addrs.checkpoints.keep,
        idle_timeout: addrs.checkpoints.idle_timeout,
        replicas: addrs.cluster_checkpoints.0,
        sweep_every: addrs.cluster_checkpoints.1,
    };
    let c = ClusterCheckpoints::open(
        Arc::clone(session),
        &cli.data_dir.join("cluster"),
        keeping,
        place::node_credential(cli)?,
    )?;
    ClusterCheckpoints::spawn_upkeep(&c);
    Ok((Arc::clone(&c) as Arc<dyn CheckpointEndpoint>, Some(c)))
}

/// Prints `text` on stdout in one write, without a panic if whoever
/// started us stopped reading.
fn announce(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}

/// Runs both servers until the process is told to stop. A client that
/// keeps a stream open (a trainer that stopped reading) must not keep the
/// server from stopping: after a grace period the connections left are
/// closed.
async fn until_stopped(
    flight: impl std::future::Future<Output = Result<(), tonic::transport::Error>>,
    rest: impl std::future::Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    let servers = async {
        let (f, r) = tokio::join!(flight, rest);
        f?;
        r?;
        anyhow::Ok(())
    };
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
