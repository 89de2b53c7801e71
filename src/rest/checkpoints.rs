//! `/v1/checkpoints`: the checkpoints trainers wrote over Flight, listed
//! and deleted. Names hold `/`, so they travel as query parameters.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use sluice_access::Principal;
use sluice_flight::CheckpointEndpoint;
use sluice_flight::checkpoint::CheckpointInfo;

use super::AppState;
use super::error::{ApiError, Kind};

/// A checkpoint version.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Checkpoint {
    /// Its name (`prefix/file`).
    pub name: String,
    /// Its version: each commit of a name adds one.
    pub version: u64,
    /// Size in bytes.
    pub size: u64,
    /// Commit time, milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
}

impl From<CheckpointInfo> for Checkpoint {
    fn from(c: CheckpointInfo) -> Self {
        Self {
            name: c.name,
            version: c.version,
            size: c.size,
            created_unix_ms: c.created_unix_ms,
        }
    }
}

/// Which checkpoints to list.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only names starting with this.
    #[serde(default)]
    pub prefix: String,
}

/// Which checkpoint to delete.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeleteQuery {
    /// Its name.
    pub name: String,
    /// Only this version (default: all of them).
    #[serde(default)]
    pub version: Option<u64>,
}

fn store(s: &AppState) -> Result<&Arc<dyn CheckpointEndpoint>, ApiError> {
    s.checkpoints.as_ref().ok_or_else(|| {
        ApiError::new(
            Kind::CheckpointsDisabled,
            "this server keeps no checkpoints: they live on a `sluice serve` (its data dir, \
             or its cluster's storage nodes)",
        )
    })
}

/// Every version of the checkpoints under a prefix, by name then version
/// (those the caller's token may use).
#[utoipa::path(get, path = "/v1/checkpoints", operation_id = "list_checkpoints", tag = "checkpoints",
    params(ListQuery),
    responses((status = 200, body = Vec<Checkpoint>), (status = 401, body = ApiError),
        (status = 501, body = ApiError)),
    security(("bearer" = [])))]
pub async fn list(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Vec<Checkpoint>>, ApiError> {
    let Query(q) = query?;
    let list = store(&s)?
        .versions(&q.prefix)
        .await
        .map_err(|e| ApiError::status(&e))?;
    Ok(Json(
        list.into_iter()
            .filter(|c| who.may_checkpoint(&c.name))
            .map(Checkpoint::from)
            .collect(),
    ))
}

/// Deletes a checkpoint (every version, or one); its space is free at once.
#[utoipa::path(delete, path = "/v1/checkpoints", operation_id = "delete_checkpoint", tag = "checkpoints",
    params(DeleteQuery),
    responses((status = 200, description = "The versions deleted", body = Vec<Checkpoint>),
        (status = 400, body = ApiError), (status = 404, body = ApiError),
        (status = 401, body = ApiError), (status = 501, body = ApiError)),
    security(("bearer" = [])))]
pub async fn delete(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    query: Result<Query<DeleteQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Vec<Checkpoint>>, ApiError> {
    let Query(q) = query?;
    if !who.may_checkpoint(&q.name) {
        let why = format!("token {:?} may not use checkpoint {:?}", who.name(), q.name);
        return Err(super::access::refuse(
            &s,
            &who,
            "DELETE /v1/checkpoints",
            why,
        ));
    }
    let gone = store(&s)?
        .remove(&q.name, q.version)
        .await
        .map_err(|e| ApiError::status(&e))?;
    Ok(Json(gone.into_iter().map(Checkpoint::from).collect()))
}
