//! `/v1/jobs`: submit, list, look at, explain and cancel jobs.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use sluice_access::Principal;
use sluice_compute::JobSpec;
use sluice_compute::access::may_query;
use sluice_compute::job::adapt::Replan;
use sluice_compute::job::report::NodeReport;
use sluice_compute::job::stages::JobStages;
use sluice_compute::job::{Job, JobRecord, JobStatus, RankEndpoint};

use std::net::IpAddr;

use super::AppState;
use super::access::check;
use super::caller::Caller;
use super::error::{ApiError, Kind};

/// A job's placement: the text `sluice explain` prints and its JSON.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct JobExplain {
    /// The job id.
    pub id: String,
    /// The placement as text.
    pub text: String,
    /// The placement as data (fragments, cut, candidate cuts).
    #[schema(value_type = Object)]
    pub placement: serde_json::Value,
    /// Each move of the cut while the job ran (oldest first), with the
    /// measured rates that caused it; the placement above is the latest.
    pub replans: Vec<Replan>,
    /// What the job measured, stage by stage, from its first window to its
    /// last (absent before its first window): EXPLAIN ANALYZE.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analyze: Option<JobStages>,
}

/// Submit a job: a pipeline (`sql`, or `plan` as an object or YAML text)
/// and its options. The pipeline is planned before the answer, so bad SQL,
/// unknown datasets and bad options are refused here.
#[utoipa::path(post, path = "/v1/jobs", operation_id = "submit_job", tag = "jobs", request_body = JobSpec,
    responses(
        (status = 201, description = "Submitted (state pending, then running)", body = JobStatus),
        (status = 400, description = "Bad JSON, SQL, plan or options", body = ApiError),
        (status = 404, description = "Unknown dataset", body = ApiError),
        (status = 401, description = "No valid bearer token", body = ApiError),
    ),
    security(("bearer" = [])))]
pub async fn submit(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    Caller(near): Caller,
    body: Result<Json<JobSpec>, JsonRejection>,
) -> Result<(StatusCode, Json<JobStatus>), ApiError> {
    let Json(spec) = body?;
    // Its datasets are checked before it is planned: a refused job asks
    // no node anything.
    for part in spec.validate().unwrap_or_default() {
        check(&s, &who, "POST /v1/jobs", may_query(&who, &part.sql))?;
    }
    let job = s.jobs.submit(spec).await?;
    tracing::info!("job {} submitted", job.id());
    Ok((StatusCode::CREATED, Json(located(&s, &job, near))))
}

/// Ranks listed with their locations, at most this many.
pub const ENDPOINTS_LISTED: u64 = 4096;

/// `status` with the location each rank reads at, for a caller at `near`:
/// the registered compute node that serves it (one beside the caller, if
/// there is one), or this server's own Flight.
/// Each rank sent to a compute node is noted on the job: that node's
/// reports of it count.
fn located(s: &AppState, job: &Job, near: Option<IpAddr>) -> JobStatus {
    let mut status = job.status();
    let own = s.flight.clone();
    let ranks = status.spec.world_size.min(ENDPOINTS_LISTED);
    status.endpoints = (0..ranks)
        .zip(s.jobs.compute_nodes().serving_ranks(ranks, near))
        .map(|(rank, node)| RankEndpoint {
            rank,
            location: node.map_or_else(
                || own.clone(),
                |node| {
                    job.route(rank, &node);
                    node
                },
            ),
        })
        .collect();
    status
}

/// List jobs, oldest first.
#[utoipa::path(get, path = "/v1/jobs", operation_id = "list_jobs", tag = "jobs",
    responses((status = 200, body = Vec<JobStatus>), (status = 401, body = ApiError)),
    security(("bearer" = [])))]
pub async fn list(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    Caller(near): Caller,
) -> Json<Vec<JobStatus>> {
    Json(
        s.jobs
            .list()
            .iter()
            .filter(|j| j.may_be_read_by(&who).is_ok())
            .map(|j| located(&s, j, near))
            .collect(),
    )
}

/// The job `id`, if `who` may read it (a refusal is audited as `what`).
fn readable(s: &AppState, who: &Principal, id: &str, what: &str) -> Result<Arc<Job>, ApiError> {
    let job = s.jobs.get(id)?;
    check(s, who, what, job.may_be_read_by(who))?;
    Ok(job)
}

/// A job's state, progress, samples/s, bytes per tier and skipped samples.
#[utoipa::path(get, path = "/v1/jobs/{id}", operation_id = "get_job", tag = "jobs",
    params(("id" = String, Path, description = "Job id")),
    responses((status = 200, body = JobStatus), (status = 404, body = ApiError),
        (status = 401, body = ApiError)),
    security(("bearer" = [])))]
pub async fn get(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    Caller(near): Caller,
    Path(id): Path<String>,
) -> Result<Json<JobStatus>, ApiError> {
    let job = readable(&s, &who, &id, "GET /v1/jobs/{id}")?;
    Ok(Json(located(&s, &job, near)))
}

/// A job's record — its spec, the versions it pinned, its state and
/// progress — from which a compute node plans the job to serve its ranks.
#[utoipa::path(get, path = "/v1/jobs/{id}/record", operation_id = "get_job_record", tag = "jobs",
    params(("id" = String, Path, description = "Job id")),
    responses((status = 200, description = "The job's record"), (status = 404, body = ApiError),
        (status = 401, body = ApiError)),
    security(("bearer" = [])))]
pub async fn record(
    State(s): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<JobRecord>, ApiError> {
    Ok(Json(s.jobs.get(&id)?.record()))
}

/// A compute node's report of what it delivered for a job whose ranks it
/// serves (`sluice_compute::job::report`): merged into the job's progress,
/// bytes and bad samples here.
#[utoipa::path(post, path = "/v1/jobs/{id}/progress", operation_id = "report_job_progress",
    tag = "jobs", params(("id" = String, Path, description = "Job id")),
    request_body(content = Object, description = "The node's report"),
    responses((status = 200, description = "Merged"), (status = 400, body = ApiError),
        (status = 404, body = ApiError), (status = 401, body = ApiError)),
    security(("bearer" = [])))]
pub async fn report(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    body: Result<Json<NodeReport>, JsonRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Json(report) = body?;
    let job = s.jobs.get(&id)?;
    // A node's own token reports only for the location it registered.
    if !who.shared() {
        let owner = s.jobs.compute_nodes().owner_of(&report.node);
        if owner.as_deref() != Some(who.name()) {
            let why = format!(
                "token {:?} did not register the compute node {:?}",
                who.name(),
                report.node.chars().take(64).collect::<String>()
            );
            return Err(super::access::refuse(
                &s,
                &who,
                "POST /v1/jobs/{id}/progress",
                why,
            ));
        }
    }
    let node = report.node.clone();
    // A report a node cannot have made honestly is audited as well as
    // refused.
    if let Err(e) = job.merge_report(report) {
        s.auth.audit().refused(
            who.name(),
            None,
            "POST /v1/jobs/{id}/progress",
            &e.to_string(),
        );
        return Err(e.into());
    }
    tracing::debug!("job {id}: progress from {node}");
    Ok(Json(serde_json::json!({ "merged": true })))
}

/// Cancel a job: streams in flight end, its resources are freed; it stays
/// listed as cancelled.
#[utoipa::path(delete, path = "/v1/jobs/{id}", operation_id = "cancel_job", tag = "jobs",
    params(("id" = String, Path, description = "Job id")),
    responses((status = 200, body = JobStatus), (status = 404, body = ApiError),
        (status = 401, body = ApiError)),
    security(("bearer" = [])))]
pub async fn cancel(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<JobStatus>, ApiError> {
    readable(&s, &who, &id, "DELETE /v1/jobs/{id}")?;
    let job = s.jobs.cancel(&id)?;
    tracing::info!("job {id} cancelled");
    Ok(Json(job.status()))
}

/// Where the job's stages run and why.
#[utoipa::path(get, path = "/v1/jobs/{id}/explain", operation_id = "explain_job", tag = "jobs",
    params(("id" = String, Path, description = "Job id")),
    responses((status = 200, body = JobExplain), (status = 404, body = ApiError),
        (status = 401, body = ApiError)),
    security(("bearer" = [])))]
pub async fn explain(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<JobExplain>, ApiError> {
    let job = readable(&s, &who, &id, "GET /v1/jobs/{id}/explain")?;
    let e = job.explanation();
    let placement = serde_json::from_str(&e.to_json())
        .map_err(|err| ApiError::new(Kind::Internal, err.to_string()))?;
    let replans = job.adaptive().history();
    let mut text = e.to_text();
    for r in &replans {
        let m = &r.measured;
        text.push_str(&format!(
            "\nre-planned {:.1} s in, after {} samples: {} -> {} ({} bound: {:.0} samples/s, \
             link {:.1} Mbit/s, storage CPU {}, compute CPU {:.0}%, waiting on the reader {:.0}%; \
             new estimate {:.0}/s)",
            r.at_s,
            r.after_samples,
            r.from,
            r.to,
            m.bottleneck,
            m.samples_per_s,
            m.link_bytes_per_s * 8.0 / 1e6,
            m.storage_busy
                .map_or("unknown".into(), |b| format!("{:.0}%", b * 100.0)),
            m.compute_busy * 100.0,
            m.trainer_wait * 100.0,
            r.estimated_per_s,
        ));
    }
    let analyze = job.stage_view(true);
    if let Some(a) = &analyze {
        text.push_str("\n\n");
        text.push_str(&a.to_text());
    }
    Ok(Json(JobExplain {
        id,
        text,
        placement,
        replans,
        analyze,
    }))
}
