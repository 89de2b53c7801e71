//! [`LinkError`]: what can go wrong between compute and a storage node,
//! and its mapping to `tonic::Status` (server side) and back (client side).

use datafusion::error::DataFusionError;
use tonic::{Code, Status};

/// An error on the link or on the far side of it.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The node cannot be reached.
    #[error("storage node {node} is unavailable: {reason}")]
    Unavailable {
        /// The node's URL.
        node: String,
        /// Why.
        reason: String,
    },
    /// The node does not hold the dataset.
    #[error("dataset {dataset} not found on storage node {node}")]
    DatasetNotFound {
        /// The dataset.
        dataset: String,
        /// The node's URL.
        node: String,
    },
    /// The node could not decode or plan the fragment.
    #[error("storage node {node} refused the fragment: {message}")]
    BadFragment {
        /// The node's URL.
        node: String,
        /// Why.
        message: String,
    },
    /// The fragment failed while running (a bad sample under `fail`, I/O).
    #[error("storage node {node}: {message}")]
    Execution {
        /// The node's URL.
        node: String,
        /// The node's message.
        message: String,
    },
    /// The request was refused for lack of credentials.
    #[error("storage node {node} refused the request: {message}")]
    Unauthenticated {
        /// The node's URL.
        node: String,
        /// The node's message.
        message: String,
    },
    /// Something local: encoding, a malformed reply.
    #[error("{0}")]
    Protocol(String),
}

/// Prefix a storage node puts before a missing dataset's name.
const NOT_FOUND_PREFIX: &str = "dataset not found: ";

impl LinkError {
    /// The error a client sees for `status` from `node`.
    pub fn from_status(node: &str, status: &Status) -> Self {
        let node = node.to_string();
        let message = status.message().to_string();
        match status.code() {
            Code::NotFound => match message.strip_prefix(NOT_FOUND_PREFIX) {
                Some(dataset) => Self::DatasetNotFound {
                    dataset: dataset.to_string(),
                    node,
                },
                None => Self::Execution { node, message },
            },
            Code::Unavailable | Code::DeadlineExceeded => Self::Unavailable {
                node,
                reason: message,
            },
            Code::InvalidArgument | Code::Unimplemented => Self::BadFragment { node, message },
            Code::Unauthenticated | Code::PermissionDenied => {
                Self::Unauthenticated { node, message }
            }
            _ => Self::Execution { node, message },
        }
    }

    /// A missing dataset, as a storage node reports it.
    pub fn not_found_status(dataset: &str) -> Status {
        Status::not_found(format!("{NOT_FOUND_PREFIX}{dataset}"))
    }
}

impl From<LinkError> for Status {
    fn from(e: LinkError) -> Status {
        match &e {
            LinkError::Unavailable { .. } => Status::unavailable(e.to_string()),
            LinkError::DatasetNotFound { dataset, .. } => LinkError::not_found_status(dataset),
            LinkError::BadFragment { message, .. } => Status::invalid_argument(message.clone()),
            LinkError::Execution { message, .. } => Status::internal(message.clone()),
            LinkError::Unauthenticated { message, .. } => Status::unauthenticated(message.clone()),
            LinkError::Protocol(m) => Status::internal(m.clone()),
        }
    }
}

impl From<LinkError> for DataFusionError {
    fn from(e: LinkError) -> Self {
        DataFusionError::External(Box::new(e))
    }
}

/// The status a storage node answers for a DataFusion error while planning
/// (`planning`) or running a fragment.
pub fn status_of(e: &DataFusionError, planning: bool) -> Status {
    let message = e.to_string();
    match e.find_root() {
        DataFusionError::Plan(_) | DataFusionError::SQL(..) | DataFusionError::SchemaError(..) => {
            Status::invalid_argument(message)
        }
        DataFusionError::NotImplemented(_) => Status::unimplemented(message),
        DataFusionError::ResourcesExhausted(_) => Status::resource_exhausted(message),
        _ if planning => Status::invalid_argument(message),
        _ => Status::internal(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_round_trip_through_status() {
        let node = "http://10.0.0.7:50051";
        let cases = [
            LinkError::DatasetNotFound {
                dataset: "pets".into(),
                node: node.into(),
            },
            LinkError::BadFragment {
                node: node.into(),
                message: "unknown UDF frobnicate".into(),
            },
            LinkError::Execution {
                node: node.into(),
                message: "decode_image: sample cat/1.jpg: truncated".into(),
            },
            LinkError::Unauthenticated {
                node: node.into(),
                message: "no token".into(),
            },
        ];
        for e in cases {
            let text = e.to_string();
            let back = LinkError::from_status(node, &Status::from(e));
            assert_eq!(back.to_string(), text);
        }
        let down = LinkError::Unavailable {
            node: node.into(),
            reason: "connection refused".into(),
        };
        let back = LinkError::from_status(node, &Status::from(down));
        assert!(matches!(back, LinkError::Unavailable { .. }), "{back}");
        assert!(back.to_string().contains(node));
    }

    #[test]
    fn planning_errors_are_invalid_arguments() {
        let e = DataFusionError::Plan("no such column".into());
        assert_eq!(status_of(&e, false).code(), Code::InvalidArgument);
        let e = DataFusionError::Execution("boom".into());
        assert_eq!(status_of(&e, false).code(), Code::Internal);
        assert_eq!(status_of(&e, true).code(), Code::InvalidArgument);
    }
}
