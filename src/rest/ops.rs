//! Operations endpoints: `/healthz` (never needs a token) and `/metrics`
//! (Prometheus text exposition, [`super::metrics`]).

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use super::AppState;
use super::error::{ApiError, Kind};

/// Where the rest of the service is.
#[derive(Debug, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct ServiceInfo {
    /// sluice's version.
    pub version: String,
    /// The Arrow Flight address trainers read jobs from (`grpc://host:port`;
    /// an unspecified host means the REST host).
    pub flight: String,
    /// Whether bearer tokens are required.
    pub auth: bool,
}

/// The service: version and the Flight address.
#[utoipa::path(get, path = "/v1/info", operation_id = "service_info", tag = "ops",
    responses((status = 200, body = ServiceInfo), (status = 401, body = super::error::ApiError)),
    security(("bearer" = [])))]
pub async fn info(State(s): State<AppState>) -> axum::Json<ServiceInfo> {
    axum::Json(ServiceInfo {
        version: env!("CARGO_PKG_VERSION").to_string(),
        flight: s.flight.clone(),
        auth: s.auth.enabled(),
    })
}

/// Liveness: `ok` while the server answers.
#[utoipa::path(get, path = "/healthz", operation_id = "healthz", tag = "ops",
    responses((status = 200, description = "The server is up", body = String, content_type = "text/plain")))]
pub async fn healthz() -> &'static str {
    "ok\n"
}

/// Jobs by state and, per job, samples delivered, bytes per tier, skipped
/// samples and progress.
#[utoipa::path(get, path = "/metrics", operation_id = "metrics", tag = "ops",
    responses((status = 200, description = "Prometheus text format 0.0.4", body = String,
        content_type = "text/plain")),
    security(("bearer" = [])))]
pub async fn metrics(State(s): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    let text = super::metrics::Readings::take(&s)
        .text()
        .map_err(|e| ApiError::new(Kind::Internal, format!("cannot write the metrics: {e}")))?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    ))
}
