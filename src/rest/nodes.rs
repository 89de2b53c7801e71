//! `/v1/nodes`: the storage nodes this server reads (up or down, cores,
//! link; given at start or registered with `POST /v1/nodes/storage`), the
//! compute nodes registered with it (`POST /v1/nodes/compute`, see
//! `sluice_compute::job::cluster`) and, in embedded mode, its device
//! (capacity, free chunks, I/O counters) and object cache — what an
//! operator checks first when a job is slow, and what the dashboard
//! draws.
//!
//! Joining is the cluster's decision, not the caller's:
//! - a registration needs a token of scope `node`; a node's own token
//!   (from a tokens file) is bound to the location it registers
//!   (`sluice_compute::job::cluster`);
//! - a location must be a `grpc://`, `grpc+tls://`, `http://` or
//!   `https://` address: a host, a port in 1..=65535, no user or
//!   password, no path, and not a link-local or unspecified address;
//! - on a cluster with a CA (`--tls-ca`), a location must be a TLS one,
//!   and the node there must present a certificate the CA issued for the
//!   location's host: checked when a node joins (or rejoins after its
//!   time to live), and on every connection made to it since, which
//!   dials with the CA;
//! - a storage node must answer before it is listed, and it joins only if
//!   every dataset version it holds is one the cluster wrote there
//!   (`sluice_compute::ledger`); otherwise it is quarantined: listed under
//!   `quarantined` with what it holds, read by nothing;
//! - `DELETE /v1/nodes/{kind}/{id}` (admin; `sluice nodes remove`) takes a
//!   node out: queries and new jobs no longer wait for it.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::SystemTime;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use sluice_access::Principal;
use sluice_compute::admission::{Admitted, NotAdmitted, admit_storage};
use sluice_compute::job::cluster::Refused;
use sluice_compute::replicas::ledger::Unknown;

use super::AppState;
use super::error::{ApiError, Kind};
use super::location::well_formed;

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
    /// Storage nodes that registered holding datasets the cluster did not
    /// write there: read by nothing.
    pub quarantined: Vec<QuarantineView>,
}

/// A storage node kept out of the cluster.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct QuarantineView {
    /// Its location.
    pub location: String,
    /// The token it registered with.
    pub by: String,
    /// When it last registered, seconds since the Unix epoch.
    pub at: f64,
    /// What it holds that the cluster did not write there.
    #[schema(value_type = Vec<Object>)]
    pub unknown: Vec<serde_json::Value>,
}

/// The storage nodes in quarantine, by location.
#[derive(Debug, Default)]
pub struct Quarantine(Mutex<BTreeMap<String, QuarantineView>>);

impl Quarantine {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, QuarantineView>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn hold(&self, location: &str, by: &str, unknown: &[Unknown]) {
        let at = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let unknown = unknown
            .iter()
            .filter_map(|u| serde_json::to_value(u).ok())
            .collect();
        let mut q = self.lock();
        // A flood of registrations holds a bounded list.
        if q.len() >= MAX_QUARANTINED && !q.contains_key(location) {
            return;
        }
        q.insert(
            location.to_string(),
            QuarantineView {
                location: location.to_string(),
                by: by.to_string(),
                at,
                unknown,
            },
        );
    }

    fn release(&self, location: &str) -> bool {
        self.lock().remove(location).is_some()
    }

    fn list(&self) -> Vec<QuarantineView> {
        self.lock().values().cloned().collect()
    }
}

/// Most storage nodes listed in quarantine at once.
const MAX_QUARANTINED: usize = 256;
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
    Extension(who): Extension<Principal>,
    body: Result<Json<Register>, JsonRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Json(r) = body?;
    well_formed(&r.location)?;
    let nodes = s.jobs.compute_nodes();
    // A heartbeat of a live node is not checked again (its trainers'
    // connections are, each with the CA).
    if !nodes.is_live(&r.location) {
        identified(&s, &who, "POST /v1/nodes/compute", &r.location).await?;
    }
    let owner = (!who.shared()).then(|| who.name());
    nodes.register(owner, &r.location).map_err(|e| match e {
        Refused::Taken { .. } => {
            super::access::refuse(&s, &who, "POST /v1/nodes/compute", e.to_string())
        }
        Refused::Busy(why) => ApiError::new(Kind::TooManyNodes, why),
    })?;
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

/// On a cluster with a CA, whether the node at `location` holds a
/// certificate the CA issued for its host (a TLS handshake that checks
/// it); a plain location is refused there. Refusals are audited.
async fn identified(
    s: &AppState,
    who: &Principal,
    call: &str,
    location: &str,
) -> Result<(), ApiError> {
    let Some(tls) = s.node_credential.tls().filter(|t| t.trusts()) else {
        return Ok(());
    };
    let refuse = |kind: Kind, why: String| {
        s.auth.audit().refused(who.name(), None, call, &why);
        Err(ApiError::new(kind, why))
    };
    if !sluice_flight::tls::is_tls(location) {
        return refuse(
            Kind::TlsRequired,
            format!(
                "this cluster speaks TLS: register a grpc+tls:// location, served with a \
                 certificate of the cluster's CA (not {location})"
            ),
        );
    }
    let authority = location
        .split_once("://")
        .map_or(location, |(_, a)| a.trim_end_matches('/'));
    match tls.connect(authority).await {
        Ok(_) => Ok(()),
        Err(e) => refuse(
            Kind::NodeIdentity,
            format!(
                "the node at {location} holds no certificate of this cluster for its host: {e}"
            ),
        ),
    }
}

/// A storage node says where the coordinator reaches it (`sluice
/// storage-node --coordinator`). A node not read yet must answer within
/// two seconds, and is read only if every dataset version it holds is
/// one the cluster wrote there; otherwise it is quarantined (400, kind
/// `quarantined`, and listed by `GET /v1/nodes`). A node already read
/// answers nothing new: its registration is a heartbeat.
#[utoipa::path(post, path = "/v1/nodes/storage", operation_id = "register_storage_node",
    tag = "ops", request_body = Register,
    responses((status = 200, body = Object), (status = 400, body = ApiError),
        (status = 401, body = ApiError), (status = 403, body = ApiError)),
    security(("bearer" = [])))]
pub async fn register_storage(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    body: Result<Json<Register>, JsonRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Json(r) = body?;
    well_formed(&r.location)?;
    // Flight over gRPC is HTTP/2: the client speaks `http://` (`https://`).
    let url = sluice_flight::tls::dial_url(&r.location);
    if !s.jobs.session().endpoints().iter().any(|e| e.name() == url) {
        identified(&s, &who, "POST /v1/nodes/storage", &r.location).await?;
    }
    match admit_storage(&s.jobs, &url, s.node_credential.clone()).await {
        Ok(admitted) => {
            s.quarantine.release(&url);
            let new = admitted == Admitted::Joined;
            if new {
                tracing::info!("storage node {url} joined (registered by {})", who.name());
            }
            Ok(Json(serde_json::json!({ "location": url, "new": new })))
        }
        Err(e) => {
            let kind = match &e {
                NotAdmitted::Location(_) => Kind::InvalidLocation,
                NotAdmitted::Unreachable { .. } => Kind::NodeUnreachable,
                NotAdmitted::Foreign { unknown, .. } => {
                    s.quarantine.hold(&url, who.name(), unknown);
                    s.auth.audit().refused(
                        who.name(),
                        None,
                        "POST /v1/nodes/storage",
                        &e.to_string(),
                    );
                    Kind::Quarantined
                }
            };
            Err(ApiError::new(kind, e.to_string()))
        }
    }
}

/// Takes node `id` (its location, or its `host:port`) of `kind`
/// (`storage` or `compute`) out of the cluster: a storage node is no
/// longer read (queries and new jobs stop waiting for it; it may
/// register again), a compute node is given no more ranks. A quarantined
/// storage node is forgotten.
#[utoipa::path(delete, path = "/v1/nodes/{kind}/{id}", operation_id = "remove_node", tag = "ops",
    params(("kind" = String, Path, description = "storage or compute"),
        ("id" = String, Path, description = "The node's location or host:port")),
    responses((status = 200, body = Object), (status = 404, body = ApiError),
        (status = 401, body = ApiError), (status = 403, body = ApiError)),
    security(("bearer" = [])))]
pub async fn remove(
    State(s): State<AppState>,
    Path((kind, id)): Path<(String, String)>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let is = |location: &str| {
        location == id
            || location
                .split_once("://")
                .is_some_and(|(_, a)| a.trim_end_matches('/') == id)
    };
    let removed: Vec<String> = match kind.as_str() {
        "storage" => {
            let session = s.jobs.session();
            let mut gone: Vec<String> = session
                .endpoints()
                .iter()
                .map(|e| e.name().to_string())
                .filter(|n| is(n))
                .filter(|n| session.remove_endpoint(n))
                .collect();
            let held: Vec<String> = s
                .quarantine
                .list()
                .into_iter()
                .map(|q| q.location)
                .filter(|l| is(l))
                .collect();
            for l in held {
                s.quarantine.release(&l);
                gone.push(l);
            }
            gone
        }
        "compute" => {
            let nodes = s.jobs.compute_nodes();
            nodes
                .live()
                .into_iter()
                .map(|(l, _)| l)
                .filter(|l| is(l))
                .filter(|l| nodes.remove(l))
                .collect()
        }
        other => {
            return Err(ApiError::new(
                Kind::NoSuchNodeType,
                format!("kind {other:?}: storage or compute"),
            ));
        }
    };
    if removed.is_empty() {
        return Err(ApiError::new(
            Kind::NodeNotFound,
            format!("no {kind} node {id:?}"),
        ));
    }
    tracing::info!("{kind} node(s) removed: {}", removed.join(", "));
    Ok(Json(serde_json::json!({ "removed": removed })))
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
        quarantined: s.quarantine.list(),
    })
}
