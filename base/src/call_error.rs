//! [`CallError`]: what a node's Flight service (a compute node's or a
//! storage node's) answers when a call itself is wrong or cannot be
//! served — as opposed to an error of a job, a query or the storage
//! engine, which carry their own codes and kinds.
//! Each variant chooses its gRPC code and stable kind in one exhaustive
//! `match` ([`Fault`]), and becomes a `tonic::Status` only through
//! [`crate::fault::status`] (see [`CallError::status`]).

use crate::fault::Fault;
use tonic::{Code, Status};

/// See the module docs.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The request is malformed: a descriptor, ticket, body or header
    /// this service cannot read.
    #[error("{0}")]
    BadRequest(String),
    /// The service does not do this (`DoExchange` on a compute node,
    /// `Handshake` on a storage node, checkpoints where none are kept).
    #[error("{0}")]
    NotServed(String),
    /// A descriptor or ticket names nothing this node has.
    #[error("{0}")]
    NotFound(String),
    /// Shared memory was asked for and this host cannot give it.
    #[error("{0}")]
    NoSharedMemory(String),
    /// A batch, schema or message could not be written, or a task of the
    /// call's failed.
    #[error("{0}")]
    Encoding(String),
}

impl Fault for CallError {
    fn code(&self) -> Code {
        match self {
            Self::BadRequest(_) => Code::InvalidArgument,
            Self::NotServed(_) => Code::Unimplemented,
            Self::NotFound(_) => Code::NotFound,
            Self::NoSharedMemory(_) => Code::FailedPrecondition,
            Self::Encoding(_) => Code::Internal,
        }
    }

    fn kind(&self) -> &str {
        match self {
            Self::BadRequest(_) => "invalid_request",
            Self::NotServed(_) => "not_served",
            Self::NotFound(_) => "not_found",
            Self::NoSharedMemory(_) => "shm_unavailable",
            Self::Encoding(_) => "encoding",
        }
    }
}

impl CallError {
    /// The status it answers with.
    pub fn status(self) -> Status {
        crate::fault::status(&self)
    }

    /// A malformed request, as a status.
    pub fn bad_request(why: impl std::fmt::Display) -> Status {
        Self::BadRequest(why.to_string()).status()
    }

    /// Something not written, as a status.
    pub fn encoding(why: impl std::fmt::Display) -> Status {
        Self::Encoding(why.to_string()).status()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::kind_of;

    #[test]
    fn every_variant_has_its_code_and_kind_on_the_wire() {
        let cases = [
            (
                CallError::BadRequest("x".into()),
                Code::InvalidArgument,
                "invalid_request",
            ),
            (
                CallError::NotServed("x".into()),
                Code::Unimplemented,
                "not_served",
            ),
            (CallError::NotFound("x".into()), Code::NotFound, "not_found"),
            (
                CallError::NoSharedMemory("x".into()),
                Code::FailedPrecondition,
                "shm_unavailable",
            ),
            (CallError::Encoding("x".into()), Code::Internal, "encoding"),
        ];
        for (e, code, kind) in cases {
            let s = e.status();
            assert_eq!(s.code(), code);
            assert_eq!(kind_of(&s), (Some(kind.to_string()), "x"));
        }
    }
}
