//! The compute side's errors: [`JobError`], what can go wrong with a job
//! (and with what a query plans and reads on the way), as typed variants that
//! carry the thing at fault, each with its gRPC code and stable kind
//! ([`Fault`]): the trainer's Flight status, REST's HTTP status and the
//! Python client's exception all follow from them.
//!
//! An error from a storage node keeps the node's code and kind
//! ([`JobError::Storage`]: a checksum mismatch is `DATA_LOSS` from the
//! node's device to the trainer), and a job that failed answers later
//! readers with the code of what failed it. [`UnknownDataset`]: a table no
//! storage node holds.

use std::error::Error;

use datafusion::error::DataFusionError;
use serde::{Deserialize, Serialize};
use sluice_base::fault::{Fault, engine, fault_of};
use sluice_flight::LinkError;
use tonic::Code;

/// See the module docs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobError {
    /// An option is out of range or malformed.
    #[error("invalid options: {0}")]
    InvalidOptions(String),
    /// The plan form does not compile.
    #[error("invalid plan: {0}")]
    InvalidPlan(String),
    /// The SQL does not parse or plan.
    #[error("invalid SQL: {0}")]
    InvalidSql(String),
    /// The SQL is a query but not a pipeline.
    #[error("not a pipeline: {0}")]
    NotAPipeline(String),
    /// A dataset (or a version of it) the pipeline reads does not exist.
    #[error("unknown dataset {dataset:?}")]
    DatasetNotFound {
        /// The table as named (`pets` or `pets@2`).
        dataset: String,
    },
    /// No job has that id.
    #[error("no job {job:?}")]
    JobNotFound {
        /// The id asked for.
        job: String,
    },
    /// A rank, epoch or offset past the job's.
    #[error("out of range: {what} {value} of a job with {what}s 0..{end}")]
    OutOfRange {
        /// `rank`, `epoch` or `offset`.
        what: &'static str,
        /// The one asked for.
        value: u64,
        /// The first past the job's.
        end: u64,
    },
    /// A compute node's progress report that this job cannot have: a
    /// rank, epoch or position outside it, a node the rank was never
    /// routed to, counts past what a report may carry. Refused whole:
    /// nothing of it is merged.
    #[error("progress report from {node} refused: {reason}")]
    BadReport {
        /// The node the report names.
        node: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The job was cancelled.
    #[error("job {job} was cancelled")]
    Cancelled {
        /// Its id.
        job: String,
    },
    /// The job failed earlier; `code` and `kind` are those of its cause.
    #[error("job {job} failed: {reason}")]
    Failed {
        /// Its id.
        job: String,
        /// The code of what failed it.
        code: Code,
        /// The kind of what failed it.
        kind: String,
        /// What failed it.
        reason: String,
    },
    /// A storage node the job needs cannot be reached.
    #[error("storage node {node} is not reachable: {reason}")]
    Unavailable {
        /// The node.
        node: String,
        /// Why.
        reason: String,
    },
    /// A storage node answered with an error: its code and kind are kept.
    #[error(transparent)]
    Storage(LinkError),
    /// A window failed in this process: a bad sample under `fail` in a
    /// stage that ran here, or the engine's own error.
    #[error("{message}")]
    Running {
        /// Its code.
        code: Code,
        /// Its kind.
        kind: String,
        /// What failed.
        message: String,
    },
    /// A bug of ours: a state that cannot be.
    #[error("{0}")]
    Internal(String),
}

impl Fault for JobError {
    fn code(&self) -> Code {
        match self {
            Self::InvalidOptions(_)
            | Self::InvalidPlan(_)
            | Self::InvalidSql(_)
            | Self::NotAPipeline(_)
            | Self::OutOfRange { .. }
            | Self::BadReport { .. } => Code::InvalidArgument,
            Self::DatasetNotFound { .. } | Self::JobNotFound { .. } => Code::NotFound,
            Self::Cancelled { .. } => Code::Cancelled,
            Self::Failed { code, .. } | Self::Running { code, .. } => *code,
            Self::Unavailable { .. } => Code::Unavailable,
            Self::Storage(e) => e.code(),
            Self::Internal(_) => Code::Internal,
        }
    }

    fn kind(&self) -> &str {
        match self {
            Self::InvalidOptions(_) => "invalid_options",
            Self::InvalidPlan(_) => "invalid_plan",
            Self::InvalidSql(_) => "invalid_sql",
            Self::NotAPipeline(_) => "not_a_pipeline",
            Self::DatasetNotFound { .. } => "dataset_not_found",
            Self::JobNotFound { .. } => "job_not_found",
            Self::OutOfRange { .. } => "out_of_range",
            Self::BadReport { .. } => "bad_report",
            Self::Cancelled { .. } => "job_cancelled",
            Self::Failed { .. } => "job_failed",
            Self::Unavailable { .. } => "unavailable",
            Self::Storage(e) => e.kind(),
            Self::Running { kind, .. } => kind,
            Self::Internal(_) => "internal",
        }
    }
}

/// Why a job failed, as its record keeps it across a restart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// The gRPC code of the cause (as its number).
    pub code: i32,
    /// The kind of the cause.
    pub kind: String,
}

impl JobError {
    /// The error of planning a pipeline's SQL: a dataset no node holds,
    /// a node's refusal, or the SQL's own fault.
    pub fn planning(e: &DataFusionError) -> Self {
        match Self::ours(e) {
            Some(ours) => ours,
            None => match engine(e, true) {
                (Code::InvalidArgument | Code::Unimplemented, _) => Self::InvalidSql(e.to_string()),
                (code, kind) => Self::Running {
                    code,
                    kind: kind.to_string(),
                    message: e.to_string(),
                },
            },
        }
    }

    /// The error of running a job's window.
    pub fn running(e: &DataFusionError) -> Self {
        Self::ours(e).unwrap_or_else(|| {
            let (code, kind) = engine(e, false);
            Self::Running {
                code,
                kind: kind.to_string(),
                message: e.to_string(),
            }
        })
    }

    /// A storage node's error, as a job's: a dataset it does not hold and
    /// a node that cannot be reached are the job's own kinds.
    pub fn link(e: LinkError) -> Self {
        match e {
            LinkError::DatasetNotFound { dataset, .. } => Self::DatasetNotFound { dataset },
            LinkError::Unavailable { node, reason } => Self::Unavailable { node, reason },
            other => Self::Storage(other),
        }
    }

    /// Our error inside `e`, as a job's.
    fn ours(e: &DataFusionError) -> Option<Self> {
        let fault = fault_of(e)?;
        let err: &(dyn Error + 'static) = fault;
        if let Some(u) = err.downcast_ref::<UnknownDataset>() {
            return Some(Self::DatasetNotFound {
                dataset: u.0.clone(),
            });
        }
        if let Some(link) = err.downcast_ref::<LinkError>() {
            return Some(Self::link(link.clone()));
        }
        // Ours, met in this process (a bad sample of a stage that ran
        // here): its own code, kind and message.
        Some(Self::Running {
            code: fault.code(),
            kind: fault.kind().to_string(),
            message: fault.to_string(),
        })
    }

    /// The failure of a job this error failed.
    pub fn failure(&self) -> Failure {
        Failure {
            code: self.code() as i32,
            kind: self.kind().to_string(),
        }
    }

    /// The error a reader of job `job` meets once `reason` (of `failure`)
    /// failed it; a record from before failures were kept is internal.
    pub fn failed(job: &str, reason: &str, failure: Option<&Failure>) -> Self {
        let (code, kind) = failure.map_or((Code::Internal, "internal".to_string()), |f| {
            (Code::from_i32(f.code), f.kind.clone())
        });
        Self::Failed {
            job: job.to_string(),
            code,
            kind,
            reason: reason.to_string(),
        }
    }
}

/// A table that no storage node holds (`pets`, or `pets@9` of a dataset
/// with no version 9 on any node).
#[derive(Debug, Clone, thiserror::Error)]
#[error("dataset {0:?} not found: no storage node holds it")]
pub struct UnknownDataset(pub String);

impl Fault for UnknownDataset {
    fn code(&self) -> Code {
        Code::NotFound
    }

    fn kind(&self) -> &str {
        "dataset_not_found"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_base::fault::{external, status};

    fn node_error(code: Code, kind: &str) -> LinkError {
        LinkError::Execution {
            node: "http://s1:50051".into(),
            code,
            kind: kind.into(),
            message: "what the node said".into(),
        }
    }

    /// Every variant, its code and its kind: the status a trainer gets.
    #[test]
    fn each_variant_answers_its_code() {
        let cases: Vec<(JobError, Code, &str)> = vec![
            (
                JobError::InvalidOptions("batch_size 0".into()),
                Code::InvalidArgument,
                "invalid_options",
            ),
            (
                JobError::InvalidPlan("stage 1".into()),
                Code::InvalidArgument,
                "invalid_plan",
            ),
            (
                JobError::InvalidSql("SELEC".into()),
                Code::InvalidArgument,
                "invalid_sql",
            ),
            (
                JobError::NotAPipeline("a join".into()),
                Code::InvalidArgument,
                "not_a_pipeline",
            ),
            (
                JobError::DatasetNotFound {
                    dataset: "pets@9".into(),
                },
                Code::NotFound,
                "dataset_not_found",
            ),
            (
                JobError::JobNotFound { job: "j-1".into() },
                Code::NotFound,
                "job_not_found",
            ),
            (
                JobError::OutOfRange {
                    what: "rank",
                    value: 4,
                    end: 2,
                },
                Code::InvalidArgument,
                "out_of_range",
            ),
            (
                JobError::BadReport {
                    node: "grpc://10.0.0.9:1".into(),
                    reason: "rank 7 of a job with ranks 0..2".into(),
                },
                Code::InvalidArgument,
                "bad_report",
            ),
            (
                JobError::Cancelled { job: "j-1".into() },
                Code::Cancelled,
                "job_cancelled",
            ),
            (
                JobError::failed(
                    "j-1",
                    "checksum mismatch",
                    Some(&Failure {
                        code: Code::DataLoss as i32,
                        kind: "checksum_mismatch".into(),
                    }),
                ),
                Code::DataLoss,
                "job_failed",
            ),
            (
                JobError::Unavailable {
                    node: "http://s1".into(),
                    reason: "refused".into(),
                },
                Code::Unavailable,
                "unavailable",
            ),
            (
                JobError::Storage(node_error(Code::DataLoss, "checksum_mismatch")),
                Code::DataLoss,
                "checksum_mismatch",
            ),
            (
                JobError::Storage(node_error(Code::FailedPrecondition, "bad_sample")),
                Code::FailedPrecondition,
                "bad_sample",
            ),
            (
                JobError::Running {
                    code: Code::FailedPrecondition,
                    kind: "bad_sample".into(),
                    message: "decode_image: sample 'a': truncated".into(),
                },
                Code::FailedPrecondition,
                "bad_sample",
            ),
            (
                JobError::Internal("a bug".into()),
                Code::Internal,
                "internal",
            ),
        ];
        for (e, code, kind) in cases {
            let s = status(&e);
            assert_eq!((s.code(), e.kind()), (code, kind), "{e}");
            assert_eq!(s.message(), format!("{kind}: {e}"));
        }
    }

    #[test]
    fn a_nodes_error_keeps_its_code_through_the_engine() {
        let e = DataFusionError::from(node_error(Code::DataLoss, "checksum_mismatch"))
            .context("window at position 64");
        let job = JobError::running(&e);
        assert_eq!(
            (job.code(), job.kind()),
            (Code::DataLoss, "checksum_mismatch")
        );
        assert!(job.to_string().contains("http://s1:50051"), "{job}");
        // A job it failed answers later readers with the same code.
        let later = JobError::failed("j-1", &job.to_string(), Some(&job.failure()));
        assert_eq!(later.code(), Code::DataLoss);
    }

    #[test]
    fn an_unknown_dataset_is_typed_not_read_from_text() {
        let e = external(UnknownDataset("pets".into()));
        assert_eq!(
            JobError::planning(&e),
            JobError::DatasetNotFound {
                dataset: "pets".into()
            }
        );
        let e = DataFusionError::from(LinkError::DatasetNotFound {
            dataset: "pets@3".into(),
            node: "n".into(),
        });
        assert_eq!(
            JobError::planning(&e),
            JobError::DatasetNotFound {
                dataset: "pets@3".into()
            }
        );
        // The engine's own refusal while planning is the SQL's fault.
        let e = DataFusionError::Plan("no column data2".into());
        assert_eq!(JobError::planning(&e).kind(), "invalid_sql");
        // At run time, the engine's failure keeps its code.
        let e = DataFusionError::ResourcesExhausted("memory".into());
        assert_eq!(JobError::running(&e).code(), Code::ResourceExhausted);
    }
}
