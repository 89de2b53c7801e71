//! Operations endpoints: `/healthz` (never needs a token) and `/metrics`
//! (Prometheus text exposition).

use std::fmt::Write;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use super::AppState;

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

fn label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Jobs by state and, per job, samples delivered, bytes per tier, skipped
/// samples and progress.
#[utoipa::path(get, path = "/metrics", operation_id = "metrics", tag = "ops",
    responses((status = 200, description = "Prometheus text format 0.0.4", body = String,
        content_type = "text/plain")),
    security(("bearer" = [])))]
pub async fn metrics(State(s): State<AppState>) -> impl IntoResponse {
    let mut out = String::new();
    gauge(
        &mut out,
        "sluice_up_seconds",
        "Seconds since the server started.",
        format!("{:.3}", s.started.elapsed().as_secs_f64()),
    );
    if let Some(store) = &s.ingest_store {
        let space = store.space();
        gauge(
            &mut out,
            "sluice_device_free_bytes",
            "Device bytes in chunks no dataset, checkpoint or upload holds.",
            space.free_chunks * space.chunk_size,
        );
        let cache = store.cache().stats();
        for (name, help, value) in [
            (
                "sluice_cache_budget_bytes",
                "Memory the node-wide object cache may hold.",
                cache.budget,
            ),
            (
                "sluice_cache_bytes",
                "Memory the node-wide object cache holds.",
                cache.bytes,
            ),
            (
                "sluice_cache_objects",
                "Objects in the node-wide object cache.",
                cache.objects,
            ),
        ] {
            gauge(&mut out, name, help, value);
        }
        for (name, help, value) in [
            (
                "sluice_cache_hits_total",
                "Object reads served from the node-wide cache.",
                cache.hits,
            ),
            (
                "sluice_cache_misses_total",
                "Object reads that went to the device.",
                cache.misses,
            ),
            (
                "sluice_cache_evictions_total",
                "Objects evicted from the node-wide cache.",
                cache.evictions,
            ),
        ] {
            metric(&mut out, "counter", name, help, value);
        }
    }
    if let Some(c) = &s.checkpoints {
        gauge(
            &mut out,
            "sluice_checkpoint_uploads",
            "Checkpoint uploads begun and not yet committed or aborted.",
            c.pending_uploads(),
        );
    }
    let outputs = s.jobs.session().output_cache().stats();
    for (name, help, value) in [
        (
            "sluice_output_cache_budget_bytes",
            "Memory the cache of deterministic jobs' output rows may hold.",
            outputs.budget,
        ),
        (
            "sluice_output_cache_bytes",
            "Memory the output rows in the cache count.",
            outputs.bytes,
        ),
        (
            "sluice_output_cache_rows",
            "Output rows in the cache.",
            outputs.rows,
        ),
    ] {
        gauge(&mut out, name, help, value);
    }
    for (name, help, value) in [
        (
            "sluice_output_cache_hits_total",
            "Samples of deterministic jobs served from the output cache.",
            outputs.hits,
        ),
        (
            "sluice_output_cache_misses_total",
            "Samples of deterministic jobs computed (not in the output cache).",
            outputs.misses,
        ),
        (
            "sluice_output_cache_evictions_total",
            "Rows evicted from the output cache.",
            outputs.evictions,
        ),
    ] {
        metric(&mut out, "counter", name, help, value);
    }
    let stages = sluice_udfs::stage_cache::StageCache::global().stats();
    for (name, help, value) in [
        (
            "sluice_stage_cache_budget_bytes",
            "Memory the cache of random jobs' decode stages may hold.",
            stages.budget,
        ),
        (
            "sluice_stage_cache_bytes",
            "Memory the decoded values in the stage cache count.",
            stages.bytes,
        ),
        (
            "sluice_stage_cache_values",
            "Decoded values in the stage cache.",
            stages.values,
        ),
    ] {
        gauge(&mut out, name, help, value);
    }
    for (name, help, value) in [
        (
            "sluice_stage_cache_hits_total",
            "Decodes served from the stage cache.",
            stages.hits,
        ),
        (
            "sluice_stage_cache_misses_total",
            "Decodes computed (not in the stage cache).",
            stages.misses,
        ),
        (
            "sluice_stage_cache_evictions_total",
            "Decoded values evicted from the stage cache.",
            stages.evictions,
        ),
    ] {
        metric(&mut out, "counter", name, help, value);
    }
    gauge(
        &mut out,
        "sluice_shm_mapped_bytes",
        "Bytes of the shared-memory segments open to trainers on this host.",
        sluice_flight::shm::mapped_bytes(),
    );
    let _ = writeln!(out, "# HELP sluice_jobs Jobs by state.");
    let _ = writeln!(out, "# TYPE sluice_jobs gauge");
    for (state, n) in s.jobs.counts() {
        let _ = writeln!(out, "sluice_jobs{{state=\"{state}\"}} {n}");
    }
    let statuses: Vec<_> = s.jobs.list().iter().map(|j| j.status()).collect();
    let families: [(&str, &str, &str); 4] = [
        (
            "sluice_job_delivered_samples_total",
            "counter",
            "Samples delivered to trainers.",
        ),
        (
            "sluice_job_skipped_samples_total",
            "counter",
            "Samples skipped or nulled.",
        ),
        (
            "sluice_job_bytes_total",
            "counter",
            "Bytes moved, by tier (link: storage to compute; trainer: Flight to trainers; \
             shm: shared memory to trainers on this host).",
        ),
        (
            "sluice_job_progress_ratio",
            "gauge",
            "Fraction of the job's positions delivered.",
        ),
    ];
    for (name, kind, help) in families {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for st in &statuses {
            let job = label(&st.id);
            match name {
                "sluice_job_delivered_samples_total" => {
                    let _ = writeln!(out, "{name}{{job=\"{job}\"}} {}", st.delivered);
                }
                "sluice_job_skipped_samples_total" => {
                    let _ = writeln!(out, "{name}{{job=\"{job}\"}} {}", st.skipped);
                }
                "sluice_job_bytes_total" => {
                    let _ = writeln!(
                        out,
                        "{name}{{job=\"{job}\",tier=\"link\"}} {}",
                        st.bytes.link
                    );
                    let _ = writeln!(
                        out,
                        "{name}{{job=\"{job}\",tier=\"trainer\"}} {}",
                        st.bytes.trainer
                    );
                    let _ = writeln!(out, "{name}{{job=\"{job}\",tier=\"shm\"}} {}", st.bytes.shm);
                }
                _ => {
                    let _ = writeln!(out, "{name}{{job=\"{job}\"}} {}", st.progress);
                }
            }
        }
    }
    stage_metrics(&mut out, &statuses);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        out,
    )
}

/// The per-stage statistics of the jobs that have any (the last seconds of
/// a running job, the whole of an idle one): gauges per stage, tier and
/// queue, and the bottleneck as a gauge of 1 labelled with its tier and
/// stage.
fn stage_metrics(out: &mut String, statuses: &[sluice_compute::job::JobStatus]) {
    let families = [
        (
            "sluice_job_stage_samples_per_second",
            "Samples a stage evaluated per second, by job, tier, node and UDF.",
        ),
        (
            "sluice_job_stage_seconds_per_sample",
            "Time per sample of a stage (quantile mean or 0.9).",
        ),
        (
            "sluice_job_stage_busy_ratio",
            "Share of its tier's cores a stage kept busy.",
        ),
        (
            "sluice_job_tier_busy_ratio",
            "Share of a tier's capacity in use (storage, link, compute, cpu, trainer).",
        ),
        (
            "sluice_job_queue_occupancy",
            "Mean occupancy of a buffer between stages (windows, reader).",
        ),
        (
            "sluice_job_bottleneck",
            "1 for the tier (and stage) holding the job back.",
        ),
    ];
    for (name, help) in families {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} gauge");
        for st in statuses {
            let Some(v) = &st.stages else { continue };
            let job = label(&st.id);
            let stage = |s: &sluice_compute::job::stages::StageView| {
                format!(
                    "job=\"{job}\",tier=\"{}\",node=\"{}\",udf=\"{}\"",
                    s.tier,
                    label(&s.node),
                    label(&s.udf)
                )
            };
            match name {
                "sluice_job_stage_samples_per_second" => {
                    for s in &v.stages {
                        let _ = writeln!(out, "{name}{{{}}} {}", stage(s), s.samples_per_s);
                    }
                }
                "sluice_job_stage_seconds_per_sample" => {
                    for s in &v.stages {
                        let l = stage(s);
                        let _ =
                            writeln!(out, "{name}{{{l},quantile=\"mean\"}} {}", s.mean_ms / 1e3);
                        let _ = writeln!(out, "{name}{{{l},quantile=\"0.9\"}} {}", s.p90_ms / 1e3);
                    }
                }
                "sluice_job_stage_busy_ratio" => {
                    for s in &v.stages {
                        let _ = writeln!(out, "{name}{{{}}} {}", stage(s), s.busy);
                    }
                }
                "sluice_job_tier_busy_ratio" => {
                    for t in &v.tiers {
                        if let Some(b) = t.busy {
                            let _ =
                                writeln!(out, "{name}{{job=\"{job}\",tier=\"{}\"}} {b}", t.tier);
                        }
                    }
                }
                "sluice_job_queue_occupancy" => {
                    for q in &v.queues {
                        let _ = writeln!(
                            out,
                            "{name}{{job=\"{job}\",queue=\"{}\"}} {}",
                            q.queue, q.mean
                        );
                    }
                }
                _ => {
                    if let Some(b) = &v.bottleneck {
                        let _ = writeln!(
                            out,
                            "{name}{{job=\"{job}\",tier=\"{}\",stage=\"{}\"}} 1",
                            b.tier,
                            label(b.stage.as_deref().unwrap_or(""))
                        );
                    }
                }
            }
        }
    }
}

/// One unlabelled gauge: its help, type and value lines.
fn gauge(out: &mut String, name: &str, help: &str, value: impl std::fmt::Display) {
    metric(out, "gauge", name, help, value);
}

/// One unlabelled metric of `kind`: its help, type and value lines.
fn metric(out: &mut String, kind: &str, name: &str, help: &str, value: impl std::fmt::Display) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    let _ = writeln!(out, "{name} {value}");
}
