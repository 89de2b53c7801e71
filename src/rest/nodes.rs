//! `/v1/nodes`: the storage nodes this server reads (up or down, cores,
//! link; given at start or registered with `POST /v1/nodes/storage`), the
//! compute nodes registered with it (`POST /v1/nodes/compute`, see
//! `sluice_compute::job::cluster`) and, in embedded mode, its device
//! (capacity, free chunks, I/O counters) and object cache — what an
//! operator checks first when a job is slow, and what the dashboard
//! draws.

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use super::AppState;
use super::error::ApiError;

/// A storage node as the compute side sees it.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct NodeView {
    /// Its name (its address, or the in-process node).
    pub name: String,
    /// Whether it runs on this host (co-located with this compute side).
    pub on_this_host: bool,
    /// Whether it answered just now.
    pub up: bool,
    /// Why not, when it did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Threads it gives to fragments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores: Option<usize>,
    /// Bytes per second its link is limited to, if it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_limit: Option<f64>,
    /// CPU time its process has used, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_seconds: Option<f64>,
    /// Fragments it has run (a job's window costs one on each node holding
    /// some of its rows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fragments: Option<u64>,
    /// Fragment streams it has opened: a query's fragment, or a job
    /// stream's feed (which carries all of the stream's windows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streams: Option<u64>,
}

/// This server's device (embedded mode).
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DeviceView {
    /// The I/O backend (`uring`, `file`, `spdk`).
    pub backend: String,
    /// Bytes.
    pub capacity: u64,
    /// Chunk size, bytes.
    pub chunk_size: u64,
    /// Chunks in all.
    pub total_chunks: u64,
    /// Chunks no dataset, checkpoint or upload holds.
    pub free_chunks: u64,
    /// Reads completed since the server started.
    pub reads: u64,
    /// Bytes read since the server started (two readings over time give
    /// the read bandwidth).
    pub read_bytes: u64,
    /// The node-wide object cache: budget, bytes held, hits, misses.
    pub cache_budget: u64,
    /// Bytes the cache holds.
    pub cache_bytes: u64,
    /// Reads served from the cache.
    pub cache_hits: u64,
    /// Reads that went to the device.
    pub cache_misses: u64,
}

/// The storage side of this server.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Cluster {
    /// Seconds since the server started (to turn counters into rates).
    pub uptime_s: f64,
    /// Its device, in embedded mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceView>,
    /// The storage nodes it reads.
    pub nodes: Vec<NodeView>,
    /// The compute nodes registered with it (they serve trainer ranks).
    pub compute: Vec<ComputeView>,
}

/// A compute node registered with this coordinator.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ComputeView {
    /// Its Flight location, as trainers reach it.
    pub location: String,
    /// Seconds since it last registered.
    pub last_seen_s: f64,
}

/// A compute node's registration.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Register {
    /// Its Flight location (`grpc://host:port`).
    pub location: String,
}

/// A compute node says it is alive and where trainers reach it; it must
/// say so again within the time to live (`ttl_s`), or ranks stop going
/// to it. The answer lists the storage nodes the coordinator reads
/// (`storage`), which the compute node reads too.
#[utoipa::path(post, path = "/v1/nodes/compute", operation_id = "register_compute_node",
    tag = "ops", request_body = Register,
    responses((status = 200, body = ComputeView), (status = 400, body = ApiError),
        (status = 401, body = ApiError)),
    security(("bearer" = [])))]
pub async fn register(
    State(s): State<AppState>,
    body: Result<Json<Register>, JsonRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Json(r) = body?;
    well_formed(&r.location)?;
    let nodes = s.jobs.compute_nodes();
    nodes.register(&r.location);
    // The storage nodes this coordinator reads, by the names other
    // processes reach them at (not asked now: the answer is a heartbeat's).
    let storage: Vec<String> = s
        .jobs
        .session()
        .endpoints()
        .iter()
        .map(|e| e.name().to_string())
        .filter(|n| n.starts_with("http://") || n.starts_with("https://"))
        .collect();
    Ok(Json(serde_json::json!({
        "location": r.location,
        "ttl_s": nodes.ttl().as_secs_f64(),
        "storage": storage,
    })))
}

/// A node's location, if it is one: `grpc://`, `grpc+tcp://` or `http://`
/// and a host, at most 256 bytes, no whitespace.
fn well_formed(location: &str) -> Result<(), ApiError> {
    let ok = ["grpc://", "grpc+tcp://", "http://"]
        .iter()
        .any(|p| location.strip_prefix(p).is_some_and(|a| !a.is_empty()))
        && location.len() <= 256
        && !location.chars().any(char::is_whitespace);
    if ok {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::BAD_REQUEST,
        "invalid_location",
        format!(
            "location {:?}: expected grpc://HOST:PORT",
            location.chars().take(64).collect::<String>()
        ),
    ))
}

/// A storage node says where the coordinator reaches it (`sluice
/// storage-node --coordinator`). A node not known yet is added: the next
/// refresh lists its datasets and the next ingest spreads over it. A
/// storage node holds data, so one that stops registering stays listed
/// (a job that needs it fails naming it) rather than being forgotten.
#[utoipa::path(post, path = "/v1/nodes/storage", operation_id = "register_storage_node",
    tag = "ops", request_body = Register,
    responses((status = 200, body = Object), (status = 400, body = ApiError),
        (status = 401, body = ApiError)),
    security(("bearer" = [])))]
pub async fn register_storage(
    State(s): State<AppState>,
    body: Result<Json<Register>, JsonRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Json(r) = body?;
    well_formed(&r.location)?;
    // Flight over gRPC is HTTP/2: the client speaks `http://`.
    let url = match r.location.split_once("://") {
        Some(("grpc" | "grpc+tcp", rest)) => format!("http://{rest}"),
        _ => r.location.clone(),
    };
    let client = sluice_flight::StorageClient::new(&url)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_location", e.to_string()))?;
    let session = s.jobs.session();
    let new = session.add_endpoint(std::sync::Arc::new(client));
    if new {
        // Its datasets are known before the next request needs them.
        if let Err(e) = session.refresh().await {
            tracing::warn!("after {} registered: {e}", r.location);
        }
    }
    Ok(Json(serde_json::json!({ "location": url, "new": new })))
}

/// The storage nodes (each asked now, a second at most) and the device.
#[utoipa::path(get, path = "/v1/nodes", operation_id = "list_nodes", tag = "ops",
    responses((status = 200, body = Cluster), (status = 401, body = ApiError)),
    security(("bearer" = [])))]
pub async fn list(State(s): State<AppState>) -> Json<Cluster> {
    let endpoints = s.jobs.session().endpoints();
    let asked = endpoints.iter().map(|e| async move {
        let info = tokio::time::timeout(std::time::Duration::from_secs(1), e.node_info()).await;
        let (up, error, info) = match info {
            Ok(Ok(i)) => (true, None, Some(i)),
            Ok(Err(err)) => (false, Some(err.to_string()), None),
            Err(_) => (false, Some("no answer within a second".to_string()), None),
        };
        NodeView {
            name: e.name().to_string(),
            on_this_host: e.on_this_host(),
            up,
            error,
            cores: info.as_ref().map(|i| i.cores),
            link_limit: info.as_ref().and_then(|i| i.link_limit),
            cpu_seconds: info
                .as_ref()
                .filter(|i| i.cpu_ns > 0)
                .map(|i| i.cpu_ns as f64 / 1e9),
            fragments: info.as_ref().map(|i| i.fragments),
            streams: info.as_ref().map(|i| i.streams),
        }
    });
    let nodes = futures::future::join_all(asked).await;
    let device = s.ingest_store.as_ref().map(|store| {
        let d = store.device();
        let (info, io, space, cache) = (
            d.describe(),
            d.stats(),
            store.space(),
            store.cache().stats(),
        );
        DeviceView {
            backend: info.backend.to_string(),
            capacity: info.capacity,
            chunk_size: space.chunk_size,
            total_chunks: space.total_chunks,
            free_chunks: space.free_chunks,
            reads: io.reads,
            read_bytes: io.read_bytes,
            cache_budget: cache.budget,
            cache_bytes: cache.bytes,
            cache_hits: cache.hits,
            cache_misses: cache.misses,
        }
    });
    let compute = s
        .jobs
        .compute_nodes()
        .live()
        .into_iter()
        .map(|(location, last_seen_s)| ComputeView {
            location,
            last_seen_s,
        })
        .collect();
    Json(Cluster {
        uptime_s: s.started.elapsed().as_secs_f64(),
        device,
        nodes,
        compute,
    })
}
