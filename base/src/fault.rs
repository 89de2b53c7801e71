//! [`Fault`]: the one error vocabulary of sluice's services.
//!
//! Every error a node answers with — a job's, the storage engine's, the
//! link's, a UDF's bad sample, DataFusion's own — says what it is by two
//! names chosen in an exhaustive `match` in its own crate (a new variant
//! must choose; there is no catch-all):
//!
//! - its gRPC [`Code`] (a checksum mismatch is `DATA_LOSS` wherever it
//!   surfaces, a missing dataset `NOT_FOUND`, a node that went away
//!   `UNAVAILABLE`), from which REST derives its HTTP status;
//! - its **kind**, a stable snake_case name clients branch on
//!   (`checksum_mismatch`, `dataset_not_found`, `bad_sample`, …).
//!
//! [`status`] is the one place any of them becomes a `tonic::Status`: the
//! message is `kind: what happened` (what a person reads, and what every
//! Flight client passes through) and the status details carry the kind
//! in gRPC's richer error model (a `google.rpc.ErrorInfo` of domain
//! `sluice`, [`crate::error_details`]; what a gRPC client reads back, see
//! [`kind_of`]). An error of
//! ours that travels inside a [`DataFusionError`] goes in through
//! [`external`], which keeps its code and kind; [`fault_of`] finds it
//! again however DataFusion wrapped it, and [`status_of`] answers for any
//! DataFusion error, ours or the engine's.

use std::error::Error;
use std::fmt;

use crate::BadSample;
use datafusion_common::DataFusionError;
use tonic::{Code, Status};

use crate::error_details;

/// An error that knows its gRPC code and its stable kind.
pub trait Fault: Error + Send + Sync + 'static {
    /// The gRPC code it answers with.
    fn code(&self) -> Code;
    /// Its stable, machine-readable kind (snake_case).
    fn kind(&self) -> &str;
}

/// The status of `e`: its code, `kind: message`, and the kind as details.
pub fn status(e: &dyn Fault) -> Status {
    status_with(e.code(), e.kind(), &e.to_string())
}

/// The status of an error with `code` and `kind`, saying `message`.
pub fn status_with(code: Code, kind: &str, message: &str) -> Status {
    let message = format!("{kind}: {message}");
    let details = error_details::encode(code, &message, kind);
    Status::with_details(code, message, details.into())
}

/// The kind a status carries and its message without the kind's prefix,
/// as [`status`] made them; a status from elsewhere has no kind.
pub fn kind_of(s: &Status) -> (Option<String>, &str) {
    let message = s.message();
    match error_details::decode(s.details()) {
        Some(kind) => {
            let rest = message
                .strip_prefix(kind.as_str())
                .and_then(|m| m.strip_prefix(": "))
                .unwrap_or(message);
            (Some(kind), rest)
        }
        None => (None, message),
    }
}

/// One of our errors inside a [`DataFusionError`]: displays as the error
/// itself and keeps its code and kind (see [`external`]).
pub struct Coded(Box<dyn Fault>);

impl Coded {
    /// The error inside.
    pub fn fault(&self) -> &dyn Fault {
        self.0.as_ref()
    }
}

impl fmt::Debug for Coded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for Coded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl Error for Coded {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.0.source()
    }
}

/// `e` as a [`DataFusionError`] that [`fault_of`] finds again.
pub fn external(e: impl Fault) -> DataFusionError {
    DataFusionError::External(Box::new(Coded(Box::new(e))))
}

/// Our error inside `e`, however DataFusion wrapped it (context, an
/// Arrow error from a stream, a shared error), if there is one.
pub fn fault_of(e: &DataFusionError) -> Option<&dyn Fault> {
    let mut source: Option<&(dyn Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(c) = s.downcast_ref::<Coded>() {
            return Some(c.fault());
        }
        if let Some(bad) = s.downcast_ref::<BadSample>() {
            return Some(bad);
        }
        source = s.source();
    }
    None
}

impl Fault for BadSample {
    fn code(&self) -> Code {
        // The request is fine; the dataset holds a sample the pipeline
        // cannot use, and the job's policy is to fail on it.
        Code::FailedPrecondition
    }

    fn kind(&self) -> &str {
        "bad_sample"
    }
}

/// The code and kind of an error of the engine itself (no error of ours
/// inside), by its root: `planning` says the error came while planning a
/// query, where whatever the engine refuses is the query's fault.
pub fn engine(e: &DataFusionError, planning: bool) -> (Code, &'static str) {
    use DataFusionError as E;
    let (code, kind) = match e.find_root() {
        E::Plan(_) | E::SQL(..) | E::SchemaError(..) => (Code::InvalidArgument, "invalid_plan"),
        E::Configuration(_) => (Code::InvalidArgument, "invalid_configuration"),
        E::NotImplemented(_) | E::Substrait(_) => (Code::Unimplemented, "not_implemented"),
        E::ResourcesExhausted(_) => (Code::ResourceExhausted, "resources_exhausted"),
        E::IoError(_) | E::ObjectStore(_) | E::ParquetError(_) => (Code::Internal, "io"),
        E::ArrowError(..) => (Code::Internal, "arrow"),
        E::Execution(_) | E::ExecutionJoin(_) | E::Ffi(_) => (Code::Internal, "execution"),
        E::Internal(_) => (Code::Internal, "internal"),
        // An error that is not DataFusion's and not ours (a library's).
        E::External(_) => (Code::Internal, "external"),
        // Wrappers: `find_root` walked through them to their source; one
        // left here wraps nothing more specific.
        E::Context(..) | E::Diagnostic(..) | E::Collection(_) | E::Shared(_) => {
            (Code::Internal, "execution")
        }
    };
    match code {
        Code::Internal | Code::ResourceExhausted if planning => (Code::InvalidArgument, kind),
        _ => (code, kind),
    }
}

/// The code and kind of any DataFusion error: ours inside it, or the
/// engine's (see [`engine`]).
pub fn code_of(e: &DataFusionError, planning: bool) -> (Code, &str) {
    match fault_of(e) {
        Some(f) => (f.code(), f.kind()),
        None => engine(e, planning),
    }
}

/// The status of any DataFusion error: ours inside it answers as itself
/// (its own message, without DataFusion's prefixes), the engine's by
/// [`engine`].
pub fn status_of(e: &DataFusionError, planning: bool) -> Status {
    match fault_of(e) {
        Some(f) => status(f),
        None => {
            let (code, kind) = engine(e, planning);
            status_with(code, kind, &e.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("stored crc32c 0000beef, read 0000dead")]
    struct Corrupt;

    impl Fault for Corrupt {
        fn code(&self) -> Code {
            Code::DataLoss
        }
        fn kind(&self) -> &str {
            "checksum_mismatch"
        }
    }

    #[test]
    fn ours_is_found_however_datafusion_wraps_it() {
        let wrapped = [
            external(Corrupt),
            external(Corrupt).context("reading window 3"),
            DataFusionError::ArrowError(
                Box::new(datafusion_common::arrow::error::ArrowError::ExternalError(
                    Box::new(external(Corrupt)),
                )),
                None,
            ),
            DataFusionError::Shared(std::sync::Arc::new(external(Corrupt))),
        ];
        for e in &wrapped {
            let s = status_of(e, false);
            assert_eq!(s.code(), Code::DataLoss, "{e}");
            assert_eq!(
                s.message(),
                "checksum_mismatch: stored crc32c 0000beef, read 0000dead"
            );
            assert_eq!(
                kind_of(&s),
                (
                    Some("checksum_mismatch".to_string()),
                    "stored crc32c 0000beef, read 0000dead"
                )
            );
        }
    }

    #[test]
    fn the_engines_errors_have_a_code_each() {
        let cases = [
            (
                DataFusionError::Plan("no column x".into()),
                Code::InvalidArgument,
            ),
            (
                DataFusionError::Configuration("x".into()),
                Code::InvalidArgument,
            ),
            (
                DataFusionError::NotImplemented("x".into()),
                Code::Unimplemented,
            ),
            (
                DataFusionError::ResourcesExhausted("x".into()),
                Code::ResourceExhausted,
            ),
            (DataFusionError::Execution("boom".into()), Code::Internal),
            (DataFusionError::Internal("bug".into()), Code::Internal),
            (
                DataFusionError::IoError(std::io::Error::other("disk")),
                Code::Internal,
            ),
        ];
        for (e, code) in cases {
            assert_eq!(status_of(&e, false).code(), code, "{e}");
        }
        // While planning, what the engine refuses is the query's fault.
        let e = DataFusionError::Execution("boom".into());
        assert_eq!(status_of(&e, true).code(), Code::InvalidArgument);
    }

    #[test]
    fn a_bad_sample_is_a_failed_precondition() {
        let e = DataFusionError::External(Box::new(BadSample {
            udf: "decode_image".into(),
            key: "cat/1.jpg".into(),
            reason: "truncated".into(),
        }));
        let s = status_of(&e, false);
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert_eq!(kind_of(&s).0.as_deref(), Some("bad_sample"));
        assert!(s.message().contains("cat/1.jpg"), "{}", s.message());
    }

    #[test]
    fn a_status_from_elsewhere_has_no_kind() {
        let s = Status::internal("checksum_mismatch: looks like ours");
        assert_eq!(kind_of(&s), (None, "checksum_mismatch: looks like ours"));
    }
}
