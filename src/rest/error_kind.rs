//! [`Kind`]: the REST API's own error kinds, each with its HTTP status and
//! the stable code a client matches on. The kinds of the engine's errors
//! (a [`sluice_base::Fault`]'s) come with them instead (`ApiError::fault`).

use axum::http::StatusCode;

/// See the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// No such route.
    NotFound,
    /// The request's parameters are out of range.
    BadRequest,
    /// A body that is not the JSON the route takes.
    InvalidJson,
    /// A request axum could not take apart (its path, its query).
    InvalidRequest,
    /// A body over the size limit.
    PayloadTooLarge,
    /// A cluster's ingest asked for a number of copies this server cannot
    /// keep.
    BadReplicas,
    /// Ingest over REST is off (no allowed root or URL).
    IngestDisabled,
    /// An ingest the request itself made fail (its source, its options).
    IngestFailed,
    /// No dataset of that name.
    DatasetNotFound,
    /// No node of that id.
    NodeNotFound,
    /// A node's location is not one.
    InvalidLocation,
    /// A node kind other than `storage` or `compute`.
    NoSuchNodeType,
    /// A plain-text location on a cluster that speaks TLS.
    TlsRequired,
    /// A node whose certificate is not the cluster's for its host.
    NodeIdentity,
    /// A node that did not answer when asked.
    NodeUnreachable,
    /// A node holding what the cluster never wrote.
    Quarantined,
    /// Registrations past the coordinator's bounds.
    TooManyNodes,
    /// This server keeps no checkpoints.
    CheckpointsDisabled,
    /// No valid bearer token.
    Unauthorized,
    /// A token whose grant does not cover the call.
    Forbidden,
    /// The storage side did not answer.
    Unavailable,
    /// A fault of the server's own.
    Internal,
}

impl Kind {
    /// The stable code clients match on.
    pub fn code(self) -> &'static str {
        match self {
            Self::NotFound => "not_found",
            Self::BadRequest => "bad_request",
            Self::InvalidJson => "invalid_json",
            Self::InvalidRequest => "invalid_request",
            Self::PayloadTooLarge => "payload_too_large",
            Self::BadReplicas => "bad_replicas",
            Self::IngestDisabled => "ingest_disabled",
            Self::IngestFailed => "ingest_failed",
            Self::DatasetNotFound => "dataset_not_found",
            Self::NodeNotFound => "node_not_found",
            Self::InvalidLocation => "invalid_location",
            Self::NoSuchNodeType => "invalid_kind",
            Self::TlsRequired => "tls_required",
            Self::NodeIdentity => "node_identity",
            Self::NodeUnreachable => "node_unreachable",
            Self::Quarantined => "quarantined",
            Self::TooManyNodes => "too_many_nodes",
            Self::CheckpointsDisabled => "checkpoints_disabled",
            Self::Unauthorized => "unauthorized",
            Self::Forbidden => "forbidden",
            Self::Unavailable => "unavailable",
            Self::Internal => "internal",
        }
    }

    /// Its HTTP status.
    pub fn status(self) -> StatusCode {
        match self {
            Self::NotFound | Self::DatasetNotFound | Self::NodeNotFound => StatusCode::NOT_FOUND,
            Self::BadRequest
            | Self::InvalidJson
            | Self::InvalidRequest
            | Self::BadReplicas
            | Self::IngestFailed
            | Self::InvalidLocation
            | Self::NoSuchNodeType
            | Self::TlsRequired
            | Self::NodeIdentity
            | Self::NodeUnreachable
            | Self::Quarantined => StatusCode::BAD_REQUEST,
            Self::IngestDisabled | Self::Forbidden => StatusCode::FORBIDDEN,
            Self::TooManyNodes => StatusCode::TOO_MANY_REQUESTS,
            Self::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::CheckpointsDisabled => StatusCode::NOT_IMPLEMENTED,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Kind; 22] = [
        Kind::NotFound,
        Kind::BadRequest,
        Kind::InvalidJson,
        Kind::InvalidRequest,
        Kind::PayloadTooLarge,
        Kind::BadReplicas,
        Kind::IngestDisabled,
        Kind::IngestFailed,
        Kind::DatasetNotFound,
        Kind::NodeNotFound,
        Kind::InvalidLocation,
        Kind::NoSuchNodeType,
        Kind::TlsRequired,
        Kind::NodeIdentity,
        Kind::NodeUnreachable,
        Kind::Quarantined,
        Kind::TooManyNodes,
        Kind::CheckpointsDisabled,
        Kind::Unauthorized,
        Kind::Forbidden,
        Kind::Unavailable,
        Kind::Internal,
    ];

    #[test]
    fn every_kind_has_its_own_code_and_an_error_status() {
        let codes: std::collections::BTreeSet<_> = ALL.iter().map(|k| k.code()).collect();
        assert_eq!(codes.len(), ALL.len(), "two kinds share a code");
        for k in ALL {
            assert!(
                k.status().is_client_error() || k.status().is_server_error(),
                "{k:?}"
            );
            assert!(
                k.code()
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{k:?}"
            );
        }
    }
}
