//! Moving replicated parts between storage nodes (`sluice_compute::moves`),
//! admin only:
//! - `POST /v1/nodes/storage/{id}/drain`: every part the node holds is
//!   copied to nodes without a copy; once no job reads its versions they
//!   are retired, and the node holds nothing (then `sluice nodes remove`);
//! - `POST /v1/rebalance`: parts move onto nodes that hold fewer (one
//!   that joined), until the load is even;
//! - `serve --lost-after SECS`: a node that does not answer for that long
//!   is lost, and its parts are re-replicated from their other holders.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use sluice_compute::moves::lost::LostNodes;
use sluice_compute::moves::{MoveReport, Why, move_dataset};

use super::AppState;
use super::error::ApiError;

/// Move every part node `id` (its location, or its `host:port`) holds to
/// other nodes; its versions are retired once no job reads them.
#[utoipa::path(post, path = "/v1/nodes/storage/{id}/drain", operation_id = "drain_node",
    tag = "ops",
    params(("id" = String, Path, description = "The node's location or host:port")),
    responses((status = 200, body = Vec<MoveReport>), (status = 404, body = ApiError),
        (status = 401, body = ApiError), (status = 403, body = ApiError)),
    security(("bearer" = [])))]
pub async fn drain(
    State(s): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Vec<MoveReport>>, ApiError> {
    let session = s.jobs.session();
    let node = session
        .endpoints()
        .iter()
        .map(|e| e.name().to_string())
        .find(|n| {
            n == &id
                || n.split_once("://")
                    .is_some_and(|(_, a)| a.trim_end_matches('/') == id)
        })
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "node_not_found",
                format!("no storage node {id:?}"),
            )
        })?;
    let ledger = session.ledger();
    let held: Vec<String> = ledger
        .laid_out_datasets()
        .into_iter()
        .filter(|d| {
            ledger
                .layout(d)
                .is_some_and(|l| l.versions.contains_key(&node))
        })
        .collect();
    run(&s, &held, &Why::Drain(node)).await.map(Json)
}

/// Spread every dataset's parts evenly over the storage nodes.
#[utoipa::path(post, path = "/v1/rebalance", operation_id = "rebalance", tag = "ops",
    responses((status = 200, body = Vec<MoveReport>), (status = 401, body = ApiError),
        (status = 403, body = ApiError)),
    security(("bearer" = [])))]
pub async fn rebalance(State(s): State<AppState>) -> Result<Json<Vec<MoveReport>>, ApiError> {
    let datasets = s.jobs.session().ledger().laid_out_datasets();
    run(&s, &datasets, &Why::Rebalance).await.map(Json)
}

/// Moves each of `datasets` for `why`, one at a time, never beside a
/// sharded ingest; the first error stops it (the datasets before it
/// moved).
async fn run(s: &AppState, datasets: &[String], why: &Why) -> Result<Vec<MoveReport>, ApiError> {
    let _one = s.ingests.exclusive().await;
    let mut out = Vec::with_capacity(datasets.len());
    for d in datasets {
        let report = move_dataset(&s.jobs, d, why).await.map_err(|e| {
            let mut err = ApiError::fault(&e);
            err.message = format!("{why} of {d}: {e}");
            err
        })?;
        out.push(report);
    }
    Ok(out)
}

/// `serve --lost-after SECS`: watches the storage nodes for as long as the
/// server runs, and re-replicates the parts of those lost (none when
/// SECS is 0).
pub fn watch_lost(state: AppState, after_s: f64) {
    if after_s <= 0.0 {
        return;
    }
    let lost = Arc::new(LostNodes::new(Duration::from_secs_f64(after_s.min(1e9))));
    sluice_base::task::detach(async move {
        loop {
            tokio::time::sleep(lost.period()).await;
            for r in lost.tick(&state.jobs, &state.ingests).await {
                tracing::warn!(
                    "{} of {}: {} part copies, {} parts still short",
                    r.why,
                    r.dataset,
                    r.moves.len(),
                    r.short.len()
                );
            }
        }
    });
}
