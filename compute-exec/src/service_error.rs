//! [`ServiceError`]: what a compute node's Flight service answers when a
//! call itself is wrong or cannot be served — as opposed to an error of a
//! job, a query or a storage node, which carry their own codes and kinds.
//! Each variant chooses its gRPC code and stable kind in one exhaustive
//! `match` ([`Fault`]), and becomes a `tonic::Status` only through
//! [`sluice_flight::fault::status`] (see [`ServiceError::status`]).

use sluice_flight::Fault;
use tonic::{Code, Status};

/// See the module docs.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The request is malformed: a descriptor, ticket, body or header
    /// this service cannot read.
    #[error("{0}")]
    BadRequest(String),
    /// The service does not do this (`DoExchange`, checkpoints where none
    /// are kept).
    #[error("{0}")]
    NotServed(String),
    /// A descriptor names neither a dataset nor a job.
    #[error("{0}")]
    NotFound(String),
    /// Shared memory was asked for and this host cannot give it.
    #[error("{0}")]
    NoSharedMemory(String),
    /// A batch, schema or message could not be written.
    #[error("{0}")]
    Encoding(String),
}

impl Fault for ServiceError {
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

impl ServiceError {
    /// The status it answers with.
    pub fn status(self) -> Status {
        sluice_flight::fault::status(&self)
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
    use sluice_flight::fault::kind_of;

    #[test]
    fn every_variant_has_its_code_and_kind_on_the_wire() {
        let cases = [
            (
                ServiceError::BadRequest("x".into()),
                Code::InvalidArgument,
                "invalid_request",
            ),
            (
                ServiceError::NotServed("x".into()),
                Code::Unimplemented,
                "not_served",
            ),
            (
                ServiceError::NotFound("x".into()),
                Code::NotFound,
                "not_found",
            ),
            (
                ServiceError::NoSharedMemory("x".into()),
                Code::FailedPrecondition,
                "shm_unavailable",
            ),
            (
                ServiceError::Encoding("x".into()),
                Code::Internal,
                "encoding",
            ),
        ];
        for (e, code, kind) in cases {
            let s = e.status();
            assert_eq!(s.code(), code);
            assert_eq!(kind_of(&s), (Some(kind.to_string()), "x"));
        }
    }
}
