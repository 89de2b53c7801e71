//! [`ApiError`]: every REST error is JSON `{"code", "message"}` with a
//! stable code and a message naming the thing at fault. An error that
//! knows its gRPC code and kind ([`Fault`]) answers with that kind and the
//! HTTP status of that code ([`http_status`]), as Flight answers it; the
//! API's own errors are of a [`Kind`].

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use sluice_base::Fault;
use sluice_compute::JobError;
use tonic::Code;

pub use super::error_kind::Kind;

/// See the module docs.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ApiError {
    /// Stable, machine-readable: `invalid_json`, `invalid_options`,
    /// `invalid_plan`, `invalid_sql`, `not_a_pipeline`, `out_of_range`,
    /// `dataset_not_found`, `job_not_found`, `job_cancelled`, `job_failed`,
    /// `forbidden_path`, `ingest_disabled`, `ingest_failed`, `unauthorized`,
    /// `unavailable`, `internal`, and the kinds of the storage engine's
    /// errors (`checksum_mismatch`, `checkpoint_not_found`, …): the same
    /// kinds the Flight statuses carry.
    pub code: String,
    /// What went wrong, naming the culprit.
    pub message: String,
    #[serde(skip)]
    status: u16,
}

impl ApiError {
    /// An error of one of the REST API's own kinds.
    pub fn new(kind: Kind, message: impl Into<String>) -> Self {
        Self::coded(kind.status(), kind.code(), message)
    }

    /// An error with `status` and the kind `code` of an error the engine
    /// named (a [`Fault`]'s, a Flight status's).
    pub fn coded(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        Self {
            code: code.to_string(),
            message: message.into(),
            status: status.as_u16(),
        }
    }
}

impl ApiError {
    /// The error of any [`Fault`]: its kind, and the HTTP status of its
    /// code.
    pub fn fault(e: &dyn Fault) -> Self {
        Self::coded(http_status(e.code()), e.kind(), e.to_string())
    }

    /// The error a Flight service answered: its kind (`error` when it
    /// names none), and the HTTP status of its code.
    pub fn status(s: &tonic::Status) -> Self {
        let (kind, message) = sluice_base::fault::kind_of(s);
        Self::coded(
            http_status(s.code()),
            kind.as_deref().unwrap_or("error"),
            message,
        )
    }
}

impl From<JobError> for ApiError {
    fn from(e: JobError) -> Self {
        Self::fault(&e)
    }
}

/// The HTTP status of an error's gRPC code: REST and Flight answer one
/// error with one meaning (gRPC's own HTTP mapping, with 409 for a job
/// whose state forbids the request and 507 for a full device).
pub fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted | Code::Cancelled | Code::FailedPrecondition => {
            StatusCode::CONFLICT
        }
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::ResourceExhausted => StatusCode::INSUFFICIENT_STORAGE,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::DataLoss | Code::Internal | Code::Unknown => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl ApiError {
    /// 413 for `what` (a body) over the 2 MiB limit on request bodies.
    pub fn payload_too_large(what: &str) -> Self {
        Self::new(
            Kind::PayloadTooLarge,
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
        Self::new(Kind::InvalidJson, r.body_text())
    }
}

impl From<axum::extract::rejection::QueryRejection> for ApiError {
    fn from(r: axum::extract::rejection::QueryRejection) -> Self {
        Self::new(Kind::InvalidRequest, r.body_text())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, Json(self)).into_response()
    }
}
