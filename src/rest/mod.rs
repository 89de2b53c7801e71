//! The REST API (axum), documented by the OpenAPI document it serves at
//! `/openapi.json`, generated from the handlers themselves (utoipa), so the
//! document and the routes cannot drift apart.
//!
//! ```text
//!  POST   /v1/jobs               submit {sql | plan, batch_size, epochs, shuffle, world_size, drop_last, on_error, offload}
//!  GET    /v1/jobs               list
//!  GET    /v1/jobs/{id}          state, progress, samples/s, bytes per tier, skipped samples
//!  DELETE /v1/jobs/{id}          cancel
//!  GET    /v1/jobs/{id}/explain  placement
//!  GET    /v1/datasets[/{name}]  datasets
//!  POST   /v1/datasets           ingest a directory under an --ingest-root, or an
//!                                 object store URL under an --ingest-url-allow
//!  GET    /v1/checkpoints        checkpoint versions (?prefix=)
//!  DELETE /v1/checkpoints        delete one (?name=, &version=)
//!  GET    /v1/info               version, the Flight address
//!  GET    /v1/nodes              storage nodes (up/down, cores, link), the device, the cache
//!  POST   /v1/scrub              every storage node checks its objects; bad ones repaired from replicas (admin)
//!  POST   /v1/nodes/storage/{id}/drain  a node's parts copied elsewhere, then retired there (admin)
//!  POST   /v1/rebalance          parts spread evenly over the storage nodes (admin)
//!  GET    /healthz  /metrics  /openapi.json
//!  GET    /                      the dashboard (static files reading the routes above)
//! ```
//!
//! With bearer tokens configured, every route but `/healthz` and the
//! dashboard's static files needs `authorization: Bearer TOKEN` (401
//! otherwise).
//!
//! Modules:
//! - `access`: who may call which route: `authorize`, the middleware, and
//!   `need`, the scope each route needs;
//! - `caller`: `Caller`: the address a REST request came from, where the
//!   server knows it;
//! - [`checkpoints`]: `/v1/checkpoints`: the checkpoints trainers wrote over
//!   Flight, listed and deleted;
//! - [`dashboard`]: the dashboard: three static files compiled into the
//!   binary and served at `/`;
//! - [`datasets`]: `/v1/datasets`: the datasets the storage side holds;
//! - [`error`]: `ApiError`: every REST error is JSON with a stable code and
//!   a message naming the thing at fault;
//! - `error_kind`: `Kind`, the API's own error kinds, each with its status
//!   and code;
//! - [`jobs`]: `/v1/jobs`: submit, list, look at, explain and cancel jobs;
//! - `location`: `well_formed`: a node's location, checked before it is
//!   dialled;
//! - [`metrics`]: `/metrics`: the server's readings in the Prometheus text
//!   format 0.0.4, written by `prometheus-client`;
//! - [`moves`]: moving replicated parts between storage nodes;
//! - [`nodes`]: `/v1/nodes`: the storage nodes this server reads, their
//!   admission and their state;
//! - [`ops`]: operations endpoints: `/healthz` and `/metrics`;
//! - [`scrub`]: `POST /v1/scrub`: every storage node reads back its objects
//!   against their checksums;
//! - [`tls`]: the REST API over TLS: `TlsListener`.

mod access;
mod caller;
pub mod checkpoints;
pub mod dashboard;
pub mod datasets;
pub mod error;
mod error_kind;
pub mod jobs;
mod location;
pub mod metrics;
pub mod moves;
pub mod nodes;
pub mod ops;
pub mod scrub;
pub mod tls;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::Request;
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use sluice_access::Auth;
use sluice_compute::Jobs;
use sluice_storage::Store;
use utoipa::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use error::{ApiError, Kind};

/// What the handlers share.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The jobs (and, through them, the compute session).
    pub jobs: Arc<Jobs>,
    /// Accepted tokens, and the audit log.
    pub auth: Auth,
    /// The store REST ingest writes to (embedded mode).
    pub ingest_store: Option<Arc<Store>>,
    /// The checkpoints: the data dir's (embedded mode), or the
    /// cluster's (striped over its storage nodes).
    pub checkpoints: Option<Arc<dyn sluice_flight::CheckpointEndpoint>>,
    /// The same, on a cluster: what moves stripes off lost and drained
    /// nodes.
    pub cluster_checkpoints: Option<Arc<sluice_compute::checkpoints::ClusterCheckpoints>>,
    /// Directories REST ingest may read.
    pub ingest_roots: Vec<PathBuf>,
    /// Object-store prefixes REST ingest may read (`--ingest-url-allow`).
    pub ingest_url_allow: sluice_storage::ingest::objects::UrlAllow,
    /// When the server started.
    pub started: Instant,
    /// The Flight location trainers are sent to (`grpc://` or, serving
    /// TLS, `grpc+tls://`).
    pub flight: String,
    /// Sharded ingests over remote storage nodes, one at a time.
    pub ingests: Arc<sluice_compute::ingest::Ingests>,
    /// Storage nodes that registered holding what the cluster did not
    /// write there.
    pub quarantine: Arc<nodes::Quarantine>,
    /// What this coordinator presents to the storage nodes it calls.
    pub node_credential: sluice_flight::Credential,
}

struct BearerScheme;

impl utoipa::Modify for BearerScheme {
    fn modify(&self, api: &mut utoipa::openapi::OpenApi) {
        let components = api.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "sluice",
        description = "Jobs that feed ML trainers: submit a pipeline, read it over Arrow Flight."
    ),
    modifiers(&BearerScheme),
    components(schemas(ApiError)),
    tags(
        (name = "jobs", description = "Pipelines delivered to trainers"),
        (name = "datasets", description = "Datasets on the storage side"),
        (name = "checkpoints", description = "Checkpoints trainers wrote over Flight"),
        (name = "ops", description = "Health and metrics"),
    )
)]
struct ApiDoc;

/// The routes and the OpenAPI document describing exactly them.
pub fn routes() -> (Router<AppState>, utoipa::openapi::OpenApi) {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(jobs::submit, jobs::list))
        .routes(routes!(jobs::get, jobs::cancel))
        .routes(routes!(jobs::explain))
        .routes(routes!(datasets::list, datasets::ingest))
        .routes(routes!(datasets::get))
        .routes(routes!(checkpoints::list, checkpoints::delete))
        .routes(routes!(ops::info))
        .routes(routes!(nodes::list))
        .routes(routes!(nodes::register))
        .routes(routes!(nodes::register_storage))
        .routes(routes!(nodes::remove))
        .routes(routes!(scrub::scrub))
        .routes(routes!(moves::drain))
        .routes(routes!(moves::rebalance))
        .routes(routes!(jobs::record))
        .routes(routes!(jobs::report))
        .routes(routes!(ops::healthz))
        .routes(routes!(ops::metrics))
        .split_for_parts()
}

async fn not_found(req: Request) -> ApiError {
    ApiError::new(
        Kind::NotFound,
        format!(
            "no route {} {} (see /openapi.json)",
            req.method(),
            req.uri().path()
        ),
    )
}

/// Largest request body (axum's default limit for JSON bodies).
const MAX_BODY: u64 = 2 << 20;
/// Largest oversized body read to its end before the 413 is sent.
const MAX_DRAINED: u64 = 64 << 20;

/// Refuses a body whose `content-length` is over [`MAX_BODY`] with 413,
/// after reading it to its end when it is at most [`MAX_DRAINED`]: a
/// server that answers while the client is still sending, and closes,
/// resets the connection, and the client sees a broken pipe instead of
/// the 413 (found by `scripts/bench_load.py`'s 3 MiB bodies). Larger
/// bodies are refused at once; a body without a length meets the JSON
/// extractor's limit as before.
async fn refuse_oversized(req: Request, next: Next) -> Response {
    let length = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let Some(length) = length.filter(|&n| n > MAX_BODY) else {
        return next.run(req).await;
    };
    if length <= MAX_DRAINED {
        let mut body = req.into_body().into_data_stream();
        while let Some(Ok(_)) = futures::StreamExt::next(&mut body).await {}
    }
    ApiError::payload_too_large(&format!("the request body of {length} bytes")).into_response()
}

/// The REST app over `state`.
pub fn app(state: AppState) -> Router {
    let (router, api) = routes();
    let api = Arc::new(api);
    router
        .route(
            "/openapi.json",
            get(move || {
                let api = Arc::clone(&api);
                async move { axum::Json(api.as_ref().clone()) }
            }),
        )
        .merge(dashboard::routes())
        .fallback(not_found)
        // Outermost first: the token is checked before a body is read.
        .layer(middleware::from_fn(refuse_oversized))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            access::authorize,
        ))
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The document names every route the router serves, with the methods
    /// the handlers answer.
    #[test]
    fn openapi_lists_the_routes() {
        let (_, api) = routes();
        let json = serde_json::to_value(&api).unwrap();
        let paths = json["paths"].as_object().unwrap();
        let expect = [
            ("/v1/jobs", vec!["get", "post"]),
            ("/v1/jobs/{id}", vec!["delete", "get"]),
            ("/v1/jobs/{id}/explain", vec!["get"]),
            ("/v1/datasets", vec!["get", "post"]),
            ("/v1/datasets/{name}", vec!["get"]),
            ("/v1/checkpoints", vec!["delete", "get"]),
            ("/v1/info", vec!["get"]),
            ("/v1/nodes", vec!["get"]),
            ("/v1/nodes/compute", vec!["post"]),
            ("/v1/nodes/storage", vec!["post"]),
            ("/v1/nodes/{kind}/{id}", vec!["delete"]),
            ("/v1/scrub", vec!["post"]),
            ("/v1/nodes/storage/{id}/drain", vec!["post"]),
            ("/v1/rebalance", vec!["post"]),
            ("/v1/jobs/{id}/record", vec!["get"]),
            ("/v1/jobs/{id}/progress", vec!["post"]),
            ("/healthz", vec!["get"]),
            ("/metrics", vec!["get"]),
        ];
        assert_eq!(paths.len(), expect.len(), "{:?}", paths.keys());
        for (path, methods) in expect {
            let mut got: Vec<&str> = paths[path]
                .as_object()
                .unwrap()
                .keys()
                .map(String::as_str)
                .collect();
            got.sort_unstable();
            assert_eq!(got, methods, "{path}");
        }
        assert!(json["components"]["schemas"]["JobSpec"].is_object());
        assert!(json["components"]["securitySchemes"]["bearer"].is_object());
    }
}
