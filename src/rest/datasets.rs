//! `/v1/datasets`: the datasets the storage side holds, and ingest of a
//! directory or manifest under an allowed root: into the data dir
//! (embedded mode), or spread over the storage nodes.

use std::path::Path as FsPath;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use sluice_access::Principal;
use sluice_base::Fault;
use sluice_storage::ingest::Confinement;
use sluice_storage::ingest::objects::ObjectUrl;
use sluice_storage::{IngestOptions, IngestSource, OnError};
use tonic::Code;

use super::AppState;
use super::access::refuse;
use super::error::{ApiError, Kind, http_status};

/// A column of a dataset.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Column {
    /// Its name.
    pub name: String,
    /// Its Arrow type.
    #[serde(rename = "type")]
    pub data_type: String,
    /// Whether it may be null.
    pub nullable: bool,
}

/// A dataset (merged over the storage nodes holding it).
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Dataset {
    /// Its name.
    pub name: String,
    /// Samples in its latest version.
    pub samples: u64,
    /// Bytes of its samples.
    pub bytes: u64,
    /// Its columns.
    pub columns: Vec<Column>,
    /// The latest version on each node holding it.
    #[serde(default)]
    pub versions: Vec<NodeVersion>,
    /// What its objects are, from the probed sample of them: `image`,
    /// `video`, `array` or `bytes`, most common first.
    #[serde(default)]
    pub formats: Vec<String>,
    /// For a version the cluster's ingest spread over storage nodes: its
    /// parts fully replicated, under-replicated and lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication: Option<sluice_compute::session::replication::Replication>,
}

/// A node's latest version of a dataset.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct NodeVersion {
    /// The storage node.
    pub node: String,
    /// The version.
    pub version: u64,
}

/// The kinds of objects in a probed sample, most common first.
fn formats(sample: &[sluice_udfs::cost::SampleStats]) -> Vec<String> {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for s in sample {
        let kind = if s.frames > 1.0 {
            "video"
        } else if s.width > 0.0 && s.height > 0.0 {
            "image"
        } else if s.elements > 0.0 {
            "array"
        } else {
            "bytes"
        };
        match counts.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, n)) => *n += 1,
            None => counts.push((kind, 1)),
        }
    }
    counts.sort_by_key(|c| std::cmp::Reverse(c.1));
    counts.into_iter().map(|(k, _)| k.to_string()).collect()
}

/// An ingest request: a directory (ImageFolder: class dirs become `label`)
/// or a manifest, read on the server, under one of its `--ingest-root`s;
/// or an object store's prefix or manifest (`s3://bucket/prefix`, also
/// `gs://`, `az://`, `http(s)://`) under one of its `--ingest-url-allow`s.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IngestRequest {
    /// The dataset (a new version if it exists).
    pub name: String,
    /// The source directory or manifest file, or an object store's URL.
    pub path: String,
    /// A manifest (CSV/Parquet with a `path` column) relative to `path`.
    #[serde(default)]
    pub manifest: Option<String>,
    /// Unreadable files: `skip` (default) or `fail`.
    #[serde(default)]
    pub on_error: Option<String>,
    /// How many storage nodes hold each part (over remote storage nodes:
    /// default 2 when there are at least 2, else 1; the embedded default
    /// holds one copy).
    #[serde(default)]
    pub replicas: Option<u32>,
}

async fn all(s: &AppState) -> Result<Vec<Dataset>, ApiError> {
    let session = s.jobs.session();
    session
        .refresh()
        .await
        .map_err(|e| ApiError::new(Kind::Unavailable, e.to_string()))?;
    let mut out = Vec::new();
    for (name, schema, stats) in session.datasets().await {
        let versions = session
            .versions(&name)
            .await
            .into_iter()
            .map(|(node, version)| NodeVersion { node, version })
            .collect();
        out.push(Dataset {
            samples: stats.samples,
            bytes: stats.bytes,
            columns: schema
                .fields()
                .iter()
                .map(|f| Column {
                    name: f.name().clone(),
                    data_type: f.data_type().to_string(),
                    nullable: f.is_nullable(),
                })
                .collect(),
            versions,
            formats: formats(&stats.sample),
            replication: session.replication(&name).await,
            name,
        });
    }
    Ok(out)
}

/// List datasets.
#[utoipa::path(get, path = "/v1/datasets", operation_id = "list_datasets", tag = "datasets",
    responses((status = 200, body = Vec<Dataset>), (status = 401, body = ApiError)),
    security(("bearer" = [])))]
pub async fn list(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
) -> Result<Json<Vec<Dataset>>, ApiError> {
    let mut listed = all(&s).await?;
    listed.retain(|d| who.may_read(&d.name));
    Ok(Json(listed))
}

/// One dataset.
#[utoipa::path(get, path = "/v1/datasets/{name}", operation_id = "get_dataset", tag = "datasets",
    params(("name" = String, Path, description = "Dataset name")),
    responses((status = 200, body = Dataset), (status = 404, body = ApiError),
        (status = 401, body = ApiError)),
    security(("bearer" = [])))]
pub async fn get(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Json<Dataset>, ApiError> {
    if let Err(why) = sluice_compute::access::may_read(&who, &name) {
        return Err(refuse(&s, &who, "GET /v1/datasets/{name}", why));
    }
    all(&s)
        .await?
        .into_iter()
        .find(|d| d.name == name)
        .map(Json)
        .ok_or_else(|| ApiError::new(Kind::DatasetNotFound, format!("unknown dataset {name:?}")))
}

/// The parts of a committed sharded ingest, noted as the cluster's: a node
/// that registers later may bring them, and only them, and the layout
/// (replicas, holders) says the dataset's replication
/// (`sluice_compute::ledger`).
fn note_in_ledger(s: &AppState, name: &str, report: &sluice_compute::ingest::ShardedReport) {
    let parts: Vec<(String, u64)> = report
        .parts
        .iter()
        .map(|p| (p.node.clone(), p.version))
        .collect();
    let layout = sluice_compute::replicas::ledger::PartLayout {
        replicas: report.replicas,
        holders: report.holders.clone(),
        versions: parts.iter().cloned().collect(),
    };
    let ledger = s.jobs.session().ledger();
    if let Err(e) = ledger
        .committed(name, &parts)
        .and_then(|()| ledger.laid_out(name, layout))
    {
        tracing::error!("ingest of {name}: cannot note its parts in the ledger: {e}");
    }
}

/// Replicas asked of a server that holds its data itself.
fn one_copy(req: &IngestRequest) -> ApiError {
    ApiError::new(
        Kind::BadReplicas,
        format!(
            "replicas {}: this server holds its data itself (one node, one copy); replicas \
             need a cluster of storage nodes",
            req.replicas.unwrap_or_default()
        ),
    )
}

/// An ingest error as REST answers it: a path outside the roots is 403
/// `forbidden_path`, a full device 507 `device_full`, a storage node that
/// cannot be reached 503, a fault of the server or its storage (an I/O
/// error, a damaged catalog, a partial commit) 5xx — each with its own
/// kind; anything the request, its source or its objects caused is 400
/// `ingest_failed`. The message names the dataset, the source and, when
/// remote, the node.
fn ingest_error(e: &dyn Fault, req: &IngestRequest) -> ApiError {
    let message = format!("ingest of {} into {}: {e}", req.path, req.name);
    match e.code() {
        Code::InvalidArgument | Code::NotFound | Code::OutOfRange | Code::AlreadyExists => {
            ApiError::new(Kind::IngestFailed, message)
        }
        code => ApiError::coded(http_status(code), e.kind(), message),
    }
}

/// A source admitted for a REST ingest.
struct Admitted {
    /// What storage nodes are sent: the path or URL, as admitted.
    path: String,
    /// The manifest, as nodes are sent it (a path; for a URL, the key
    /// below it as asked).
    manifest: Option<String>,
    /// The roots every local object is read beneath.
    confine: Option<std::sync::Arc<Confinement>>,
    /// The source, for an ingest into the server's own data dir.
    source: sluice_storage::Result<IngestSource>,
}

/// The request's source, beneath the server's `--ingest-root`s or (a
/// URL) its `--ingest-url-allow` prefixes; refused before any file is
/// opened or any request sent.
fn admit_source(s: &AppState, req: &IngestRequest) -> sluice_storage::Result<Admitted> {
    if ObjectUrl::is_url(&req.path) {
        let allow = &s.ingest_url_allow;
        let url = allow.admit(&req.path)?;
        if let Some(m) = &req.manifest {
            allow.admit(&url.join(m)?.to_string())?;
        }
        let source = IngestSource::from_arg(&req.path, req.manifest.as_deref(), Some(allow));
        return Ok(Admitted {
            path: url.to_string(),
            manifest: req.manifest.clone(),
            confine: None,
            source,
        });
    }
    // Every object, and every row of a manifest, is read beneath the roots.
    let confine = Confinement::new(&s.ingest_roots)?;
    let path = confine.admit(FsPath::new(&req.path))?;
    let manifest = match &req.manifest {
        Some(m) => Some(confine.admit(&path.join(m))?),
        None => None,
    };
    Ok(Admitted {
        source: Ok(IngestSource::from_cli(&path, manifest.as_deref())),
        path: path.display().to_string(),
        manifest: manifest.map(|m| m.display().to_string()),
        confine: Some(std::sync::Arc::new(confine)),
    })
}

/// Ingest a directory or manifest on the server into a new dataset version
/// (only under the server's `--ingest-root`s). In embedded mode the server
/// writes it to its own data dir; over remote storage nodes the version is
/// spread across all of them and committed on all or none
/// (`sluice_compute::ingest`), each node reading the source at the same
/// path beneath its own `--ingest-root`.
#[utoipa::path(post, path = "/v1/datasets", operation_id = "ingest_dataset", tag = "datasets", request_body = IngestRequest,
    responses(
        (status = 201, description = "The ingest report", body = Object),
        (status = 400, body = ApiError), (status = 403, body = ApiError),
        (status = 401, body = ApiError), (status = 503, body = ApiError),
        (status = 507, body = ApiError),
    ),
    security(("bearer" = [])))]
pub async fn ingest(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    body: Result<Json<IngestRequest>, JsonRejection>,
) -> Result<(StatusCode, Json<serde_json::Value>), ApiError> {
    let Json(req) = body?;
    if !who.may_ingest(&req.name) {
        let why = format!(
            "token {:?} may not ingest dataset {:?}",
            who.name(),
            req.name
        );
        return Err(refuse(&s, &who, "POST /v1/datasets", why));
    }
    let from_store = ObjectUrl::is_url(&req.path);
    if from_store && s.ingest_url_allow.is_empty() {
        return Err(ApiError::new(
            Kind::IngestDisabled,
            "ingest from object stores over REST is off: start `sluice serve` with \
             --ingest-url-allow URL",
        ));
    }
    if !from_store && s.ingest_roots.is_empty() {
        return Err(ApiError::new(
            Kind::IngestDisabled,
            "ingest over REST is off: start `sluice serve` with --ingest-root DIR",
        ));
    }
    let fail = |e: &dyn Fault| ingest_error(e, &req);
    sluice_storage::ingest::validate_dataset_name(&req.name).map_err(|e| fail(&e))?;
    let on_error: OnError = match req.on_error.as_deref() {
        None => OnError::Skip,
        Some(p) => {
            OnError::parse_ingest(p).map_err(|e: String| ApiError::new(Kind::IngestFailed, e))?
        }
    };
    let admitted = admit_source(&s, &req).map_err(|e| fail(&e))?;
    let json = match &s.ingest_store {
        Some(_) if req.replicas.is_some_and(|r| r != 1) => return Err(one_copy(&req)),
        Some(store) => {
            let opts = IngestOptions {
                confine: admitted.confine,
                ..IngestOptions::with_policy(on_error)
            };
            let source = admitted.source.map_err(|e| fail(&e))?;
            let report = sluice_storage::ingest(store, &req.name, source, opts)
                .await
                .map_err(|e| fail(&e))?;
            tracing::info!(
                "ingested {} version {} ({} samples)",
                report.dataset,
                report.version,
                report.samples
            );
            serde_json::to_value(&report)
        }
        None => {
            let sharded = sluice_compute::ingest::IngestRequest {
                dataset: req.name.clone(),
                path: admitted.path,
                manifest: admitted.manifest,
                on_error: on_error.to_string(),
                replicas: req.replicas,
            };
            let nodes = s.jobs.session().endpoints();
            let report = s
                .ingests
                .run(&nodes, &sharded)
                .await
                .map_err(|e| fail(&e))?;
            note_in_ledger(&s, &req.name, &report);
            // The new parts are listed before the next job pins versions.
            if let Err(e) = s.jobs.session().refresh().await {
                tracing::warn!("after ingesting {}: {e}", req.name);
            }
            serde_json::to_value(&report)
        }
    }
    .map_err(|e| ApiError::new(Kind::Internal, e.to_string()))?;
    Ok((StatusCode::CREATED, Json(json)))
}
