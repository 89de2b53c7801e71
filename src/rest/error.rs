//! [`ApiError`]: every REST error is JSON `{"code", "message"}` with a
//! stable code and a message naming the thing at fault.

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use sluice_compute::JobError;

/// See the module docs.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ApiError {
    /// Stable, machine-readable: `invalid_json`, `invalid_options`,
    /// `invalid_plan`, `invalid_sql`, `not_a_pipeline`, `out_of_range`,
    /// `dataset_not_found`, `job_not_found`, `job_cancelled`, `job_failed`,
    /// `forbidden_path`, `ingest_disabled`, `ingest_failed`, `unauthorized`,
    /// `unavailable`, `internal`.
    pub code: String,
    /// What went wrong, naming the culprit.
    pub message: String,
    #[serde(skip)]
    status: u16,
}

impl ApiError {
    /// An error with `status`, `code` and `message`.
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        Self {
            code: code.to_string(),
            message: message.into(),
            status: status.as_u16(),
        }
    }
}

impl From<JobError> for ApiError {
    fn from(e: JobError) -> Self {
        let status = match &e {
            JobError::InvalidOptions(_)
            | JobError::InvalidPlan(_)
            | JobError::InvalidSql(_)
            | JobError::NotAPipeline(_)
            | JobError::OutOfRange(_) => StatusCode::BAD_REQUEST,
            JobError::DatasetNotFound(_) | JobError::JobNotFound(_) => StatusCode::NOT_FOUND,
            JobError::Cancelled(_) | JobError::Failed(..) => StatusCode::CONFLICT,
            JobError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            JobError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self::new(status, e.code(), e.to_string())
    }
}

impl ApiError {
    /// 413 for `what` (a body) over the 2 MiB limit on request bodies.
    pub fn payload_too_large(what: &str) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("{what} is over the 2 MiB limit"),
        )
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        // A body over the limit is refused as such, not as bad JSON.
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            return Self::payload_too_large("the request body");
        }
        Self::new(StatusCode::BAD_REQUEST, "invalid_json", r.body_text())
    }
}

impl From<axum::extract::rejection::QueryRejection> for ApiError {
    fn from(r: axum::extract::rejection::QueryRejection) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", r.body_text())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, Json(self)).into_response()
    }
}
