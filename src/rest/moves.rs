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
use sluice_compute::checkpoints::moves::CheckpointMoves;
use sluice_compute::moves::lost::LostNodes;
use sluice_compute::moves::{MoveReport, Why, move_dataset};

use super::AppState;
use super::error::{ApiError, Kind};

/// What a drain moved.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct Drained {
    /// Each dataset moved.
    pub datasets: Vec<MoveReport>,
    /// The checkpoint stripes moved (on a cluster that keeps them).
    pub checkpoints: Option<CheckpointMoves>,
}

/// Move every part and checkpoint stripe node `id` (its location, or its
/// `host:port`) holds to other nodes; its dataset versions are retired
/// once no job reads them, its checkpoint pieces at once.
#[utoipa::path(post, path = "/v1/nodes/storage/{id}/drain", operation_id = "drain_node",
    tag = "ops",
    params(("id" = String, Path, description = "The node's location or host:port")),
    responses((status = 200, body = Drained), (status = 404, body = ApiError),
        (status = 401, body = ApiError), (status = 403, body = ApiError)),
    security(("bearer" = [])))]
pub async fn drain(
    State(s): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Drained>, ApiError> {
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
        .ok_or_else(|| ApiError::new(Kind::NodeNotFound, format!("no storage node {id:?}")))?;
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
    let why = Why::Drain(node.clone());
    let datasets = run(&s, &held, &why).await?;
    let checkpoints = match &s.cluster_checkpoints {
        Some(c) => Some(
            c.move_away(std::slice::from_ref(&node), &why.to_string())
                .await
                .map_err(|e| ApiError::fault(&e))?,
        ),
        None => None,
    };
    Ok(Json(Drained {
        datasets,
        checkpoints,
    }))
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
        let mut was_lost: Vec<String> = Vec::new();
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
            // Checkpoint stripes: copied once, then the lost node's pieces
            // are no longer named (only stripes with nowhere to go are
            // looked at again); a lost node back holds pieces no version
            // names any more, which a sweep deletes at once.
            let gone = lost.lost();
            if let Some(c) = &state.cluster_checkpoints {
                if !gone.is_empty() {
                    let why = format!("re-replication of {}", gone.join(", "));
                    if let Err(e) = c.move_away(&gone, &why).await {
                        tracing::warn!("{why}: checkpoints: {e}");
                    }
                }
                if was_lost.iter().any(|n| !gone.contains(n)) {
                    c.sweep().await;
                }
            }
            was_lost = gone;
        }
    });
}
