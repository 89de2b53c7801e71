//! `POST /v1/scrub`: every storage node reads back its objects against
//! their checksums, and each object found bad is rewritten from a good
//! replica (`sluice_compute::repair`). Admin only: it reads every byte.

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use serde::{Deserialize, Serialize};
use sluice_compute::repair::{NodeScrub, scrub_and_repair};
use sluice_flight::scrub::ScrubRequest;

use super::AppState;
use super::error::{ApiError, Kind};

/// What to scrub.
#[derive(Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScrubBody {
    /// Only this dataset; absent: every dataset.
    #[serde(default)]
    pub dataset: Option<String>,
    /// At most this many MB (10⁶ bytes) read a second on each node;
    /// absent: as fast as the devices go.
    #[serde(default)]
    pub rate_mb_s: Option<f64>,
}

/// Scrub every storage node and repair what is found from good replicas.
#[utoipa::path(post, path = "/v1/scrub", operation_id = "scrub", tag = "ops",
    request_body = ScrubBody,
    responses((status = 200, body = Vec<NodeScrub>), (status = 400, body = ApiError),
        (status = 401, body = ApiError), (status = 403, body = ApiError)),
    security(("bearer" = [])))]
pub async fn scrub(
    State(s): State<AppState>,
    body: Result<Json<ScrubBody>, JsonRejection>,
) -> Result<Json<Vec<NodeScrub>>, ApiError> {
    let Json(body) = body?;
    let req = request(&body)?;
    Ok(Json(run(&s, &req).await))
}

/// The nodes' request for `body`.
fn request(body: &ScrubBody) -> Result<ScrubRequest, ApiError> {
    let rate = match body.rate_mb_s {
        None => None,
        Some(r) if r.is_finite() && r > 0.0 => Some((r * 1e6) as u64),
        Some(r) => {
            return Err(ApiError::new(
                Kind::BadRequest,
                format!("rate_mb_s must be a positive number, not {r}"),
            ));
        }
    };
    Ok(ScrubRequest {
        dataset: body.dataset.clone(),
        rate_bytes_per_s: rate,
    })
}

/// Scrubs and repairs the nodes `s` reads (also `serve --scrub-every`).
pub async fn run(s: &AppState, req: &ScrubRequest) -> Vec<NodeScrub> {
    let session = s.jobs.session();
    if let Err(e) = session.refresh().await {
        tracing::warn!("scrub: {e}");
    }
    let schemas = session.table_schemas().await;
    let mut done = scrub_and_repair(&session.endpoints(), &schemas, req).await;
    // A scrub of every dataset reads the checkpoints' pieces too.
    if let (Some(c), None) = (&s.cluster_checkpoints, &req.dataset) {
        for (node, scrubbed) in c.scrub_and_repair(req.rate_bytes_per_s).await {
            if let Some(n) = done.iter_mut().find(|n| n.node == node) {
                n.checkpoints = Some(scrubbed);
            }
        }
    }
    for n in &done {
        match (&n.report, &n.error) {
            (Some(r), _) => tracing::info!(
                "scrub of {}: {} objects, {} bad, {} repaired, {:.1} s",
                n.node,
                r.objects,
                r.bad.len(),
                n.repairs.iter().filter(|l| l.outcome == "repaired").count(),
                r.seconds
            ),
            (None, Some(e)) => tracing::warn!("scrub of {}: {e}", n.node),
            (None, None) => {}
        }
    }
    done
}

/// `serve --scrub-every SECS --scrub-rate-mb-s R`: the period and request
/// of a background scrub; `None` when SECS is 0.
pub fn schedule(every_s: f64, rate_mb_s: f64) -> Option<(std::time::Duration, ScrubRequest)> {
    (every_s > 0.0).then(|| {
        let req = ScrubRequest {
            dataset: None,
            rate_bytes_per_s: Some((rate_mb_s.max(0.001) * 1e6) as u64),
        };
        (
            std::time::Duration::from_secs_f64(every_s.clamp(1.0, 1e9)),
            req,
        )
    })
}

/// Scrubs and repairs every `every`, in the background, for as long as
/// the server runs (`serve --scrub-every`).
pub fn every(state: AppState, every: std::time::Duration, req: ScrubRequest) {
    sluice_base::task::detach(async move {
        loop {
            tokio::time::sleep(every).await;
            run(&state, &req).await;
        }
    });
}
