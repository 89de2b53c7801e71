//! [`LinkError`]: what can go wrong between compute and a storage node,
//! its [`Fault`] code and kind, and its mapping to `tonic::Status` (what
//! a node answers) and back (what the client makes of the answer).

use datafusion::error::DataFusionError;
use tonic::{Code, Status};

use sluice_base::fault::{Fault, fault_of, kind_of};

/// An error on the link or on the far side of it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
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
    /// The fragment failed while running (a bad sample under `fail`, a
    /// checksum mismatch, I/O): the node's own code and kind.
    #[error("storage node {node}: {message}")]
    Execution {
        /// The node's URL.
        node: String,
        /// The node's gRPC code.
        code: Code,
        /// The node's kind of error (see [`sluice_base::fault`]).
        kind: String,
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

impl LinkError {
    /// A fragment's failure on `node`: `e`'s code, kind and message.
    pub fn execution(node: &str, e: &dyn Fault) -> Self {
        Self::Execution {
            node: node.to_string(),
            code: e.code(),
            kind: e.kind().to_string(),
            message: e.to_string(),
        }
    }

    /// A failure on `node` that is nobody's fault but the code's (a task
    /// that panicked, a reply that cannot be read).
    pub fn internal(node: &str, message: String) -> Self {
        Self::Execution {
            node: node.to_string(),
            code: Code::Internal,
            kind: EXECUTION.to_string(),
            message,
        }
    }

    /// A fragment's failure on `node` with a DataFusion error: ours inside
    /// it keeps its code and kind (see [`sluice_base::fault::code_of`]).
    pub fn running(node: &str, e: &DataFusionError) -> Self {
        match fault_of(e) {
            Some(f) => Self::execution(node, f),
            None => {
                let (code, kind) = sluice_base::fault::engine(e, false);
                Self::Execution {
                    node: node.to_string(),
                    code,
                    kind: kind.to_string(),
                    message: e.to_string(),
                }
            }
        }
    }

    /// The error a client sees for `status` from `node`: the node's kind
    /// (as [`sluice_base::fault::status`] sent it) decides, else its code.
    pub fn from_status(node: &str, status: &Status) -> Self {
        let node = node.to_string();
        let (kind, message) = kind_of(status);
        let (kind, message) = (kind.as_deref(), message.to_string());
        // A status the node never sent — the connection broke under a
        // stream (the node died, the link went down) — carries the
        // transport's error as its source: the node is unavailable.
        let broken = kind.is_none() && std::error::Error::source(status).is_some();
        match (kind, status.code()) {
            (Some(DATASET_NOT_FOUND), _) => Self::DatasetNotFound {
                dataset: message,
                node,
            },
            _ if broken => Self::Unavailable {
                node,
                reason: format!("the connection broke: {message}"),
            },
            (_, Code::Unavailable | Code::DeadlineExceeded) => Self::Unavailable {
                node,
                reason: message,
            },
            // A refusal without a kind is the node's authentication (its
            // interceptor names none); with one, it is that error's.
            (None | Some(UNAUTHENTICATED), Code::Unauthenticated | Code::PermissionDenied) => {
                Self::Unauthenticated { node, message }
            }
            // Whatever the node refused as the fragment's fault; a kind
            // the node named (a bad sample, a bad dataset name) stays its.
            (Some(BAD_FRAGMENT), _) | (None, Code::InvalidArgument | Code::Unimplemented) => {
                Self::BadFragment { node, message }
            }
            (kind, code) => Self::Execution {
                node,
                code,
                kind: kind.unwrap_or(EXECUTION).to_string(),
                message,
            },
        }
    }
}

const DATASET_NOT_FOUND: &str = "dataset_not_found";
const BAD_FRAGMENT: &str = "bad_fragment";
const EXECUTION: &str = "execution";
const UNAUTHENTICATED: &str = "unauthenticated";

impl Fault for LinkError {
    fn code(&self) -> Code {
        match self {
            Self::Unavailable { .. } => Code::Unavailable,
            Self::DatasetNotFound { .. } => Code::NotFound,
            Self::BadFragment { .. } => Code::InvalidArgument,
            Self::Execution { code, .. } => *code,
            Self::Unauthenticated { .. } => Code::Unauthenticated,
            Self::Protocol(_) => Code::Internal,
        }
    }

    fn kind(&self) -> &str {
        match self {
            Self::Unavailable { .. } => "node_unavailable",
            Self::DatasetNotFound { .. } => DATASET_NOT_FOUND,
            Self::BadFragment { .. } => BAD_FRAGMENT,
            Self::Execution { kind, .. } => kind,
            Self::Unauthenticated { .. } => UNAUTHENTICATED,
            Self::Protocol(_) => "protocol",
        }
    }
}

/// What a storage node answers for its own error: the code and kind of
/// [`Fault`], without the node's name (the client names the node it
/// asked). A compute node relaying a node's error to a trainer uses
/// [`sluice_base::fault::status`], which names it.
impl From<LinkError> for Status {
    fn from(e: LinkError) -> Status {
        let (code, kind) = (e.code(), e.kind().to_string());
        let message = match e {
            LinkError::Unavailable { reason, .. } => reason,
            LinkError::DatasetNotFound { dataset, .. } => dataset,
            LinkError::BadFragment { message, .. }
            | LinkError::Execution { message, .. }
            | LinkError::Unauthenticated { message, .. }
            | LinkError::Protocol(message) => message,
        };
        sluice_base::fault::status_with(code, &kind, &message)
    }
}

/// Inside DataFusion, a link error keeps its code and kind: `fault_of`
/// finds it again however the engine wrapped it.
impl From<LinkError> for DataFusionError {
    fn from(e: LinkError) -> Self {
        sluice_base::fault::external(e)
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
                code: Code::FailedPrecondition,
                kind: "bad_sample".into(),
                message: "decode_image: sample 'cat/1.jpg': truncated".into(),
            },
            LinkError::Execution {
                node: node.into(),
                code: Code::DataLoss,
                kind: "checksum_mismatch".into(),
                message: "checksum mismatch in dataset 'pets' version 1, key 'a'".into(),
            },
            LinkError::Unauthenticated {
                node: node.into(),
                message: "no token".into(),
            },
            LinkError::Unavailable {
                node: node.into(),
                reason: "connection refused".into(),
            },
        ];
        for e in cases {
            let (text, code, kind) = (e.to_string(), e.code(), e.kind().to_string());
            let back = LinkError::from_status(node, &Status::from(e));
            assert_eq!(back.to_string(), text);
            assert_eq!((back.code(), back.kind()), (code, kind.as_str()), "{text}");
        }
        // A protocol error is the client's own: it reaches the node's
        // clients as an internal error of kind `protocol`.
        let e = LinkError::Protocol("bad reply".into());
        assert_eq!((e.code(), e.kind()), (Code::Internal, "protocol"));
    }

    #[test]
    fn a_relayed_error_names_the_node_and_keeps_the_code() {
        let e = LinkError::Execution {
            node: "http://s1:50051".into(),
            code: Code::DataLoss,
            kind: "checksum_mismatch".into(),
            message: "stored crc32c 1, read 2".into(),
        };
        let s = sluice_base::fault::status(&e);
        assert_eq!(s.code(), Code::DataLoss);
        assert_eq!(
            s.message(),
            "checksum_mismatch: storage node http://s1:50051: stored crc32c 1, read 2"
        );
        // Inside a DataFusion error, as a window's failure reaches a job.
        let df = DataFusionError::from(e).context("window 2");
        assert_eq!(
            sluice_base::fault::status_of(&df, false).code(),
            Code::DataLoss
        );
    }

    #[test]
    fn a_status_without_a_kind_is_read_by_its_code() {
        let node = "n";
        let s = Status::invalid_argument("no such UDF");
        assert!(matches!(
            LinkError::from_status(node, &s),
            LinkError::BadFragment { .. }
        ));
        let s = Status::data_loss("torn");
        let e = LinkError::from_status(node, &s);
        assert_eq!((e.code(), e.kind()), (Code::DataLoss, "execution"));
        let s = Status::deadline_exceeded("slow");
        assert!(matches!(
            LinkError::from_status(node, &s),
            LinkError::Unavailable { .. }
        ));
        // The transport's own error (the node died mid-stream): no answer
        // of the node, but its connection broke.
        let s = Status::from_error(Box::new(std::io::Error::other("connection reset")));
        let e = LinkError::from_status(node, &s);
        assert!(matches!(e, LinkError::Unavailable { .. }), "{e}");
        assert_eq!(e.code(), Code::Unavailable);
    }
}
