//! What a job reports: its state and progress, rates, bytes per tier and
//! skipped samples ([`JobStatus`]); the bookkeeping behind it is
//! `crate::job::coverage`.

use serde::{Deserialize, Serialize};
use sluice_base::BadSample;

use super::JobSpec;
use super::adapt::{Observed, Replan};
use super::mix_status::MixStatus;
use super::stages::JobStages;

/// The life of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Submitted; its samples are being listed.
    Pending,
    /// Readable.
    Running,
    /// Every position of every (rank, epoch) was delivered; still readable.
    Done,
    /// It cannot go on (see its error).
    Failed,
    /// Cancelled by a user; its resources are freed.
    Cancelled,
}

impl JobState {
    /// Whether the job is over for good.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Failed | Self::Cancelled)
    }
}

/// Bytes a job moved, per tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TierBytes {
    /// Arrow values storage fragments sent to the compute side.
    pub link: u64,
    /// Flight messages sent to trainers.
    pub trainer: u64,
    /// Batches handed to trainers on this host through shared memory
    /// (their IPC messages' bytes), instead of Flight.
    #[serde(default)]
    pub shm: u64,
}

/// A job as the REST API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobStatus {
    /// Its id.
    pub id: String,
    /// Its state.
    pub state: JobState,
    /// Why it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The kind of what failed it (`checksum_mismatch`, `bad_sample`,
    /// `unavailable`, …: the kinds of the Flight and REST errors).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<String>,
    /// Where each rank reads (a coordinator fills them in: the compute
    /// node that serves the rank, or the coordinator itself).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<RankEndpoint>,
    /// Seconds since the Unix epoch when it was submitted.
    pub created: f64,
    /// What was submitted.
    pub spec: JobSpec,
    /// The SQL its plan form compiled to (absent when it was submitted as
    /// SQL: `spec.sql` is that).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sql: Option<String>,
    /// Samples per epoch (known once running).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub samples: Option<u64>,
    /// Samples each rank reads per epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub samples_per_rank: Option<u64>,
    /// A resumed job's first epoch: where it begins, and what each rank
    /// reads of it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resumed: Option<ResumedEpoch>,
    /// A mixture's parts: weights, sizes and the shares realised so far.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mix: Option<MixStatus>,
    /// Fraction of all (rank, epoch) positions delivered, 0 to 1.
    pub progress: f64,
    /// Samples delivered to trainers (re-reads included).
    pub delivered: u64,
    /// Delivered samples per second, from the first read to the last
    /// delivery.
    pub samples_per_s: f64,
    /// Bytes per tier.
    pub bytes: TierBytes,
    /// Samples skipped or nulled by the error policy, or gone from the
    /// dataset since the job listed it.
    pub skipped: u64,
    /// The first of them, with the reason.
    #[schema(value_type = Vec<Object>)]
    pub bad_samples: Vec<BadSample>,
    /// Storage nodes its windows found lost, or whose replica was
    /// corrupt, and the windows that ran again on other holders because
    /// of each (`crate::job::failover`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failovers: Vec<crate::job::failover::FailoverEvent>,
    /// What its streams measured last, per tier (jobs whose cut may move:
    /// `auto`, on separate machines).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<Observed>,
    /// Each move of its cut while it ran, with the measurements that caused it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replans: Vec<Replan>,
    /// Each rank's progress: its latest epoch and the epochs it finished.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<RankProgress>,
    /// Per stage and tier: rates, time per sample, queues, the bottleneck
    /// (the last seconds while it runs; the whole job once idle).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stages: Option<JobStages>,
}

/// The epoch a resumed job begins in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ResumedEpoch {
    /// The epoch.
    pub epoch: u64,
    /// The global position it begins at.
    pub start: u64,
    /// Samples each rank reads of it.
    pub samples_per_rank: u64,
}

/// One rank's progress.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RankProgress {
    /// The rank.
    pub rank: u64,
    /// The latest epoch it read.
    pub epoch: u64,
    /// Positions of that epoch delivered.
    pub delivered: u64,
    /// Positions per epoch of each rank.
    pub of: u64,
    /// Epochs whose every position it was delivered.
    pub epochs_done: u64,
}

/// The Flight location a rank reads at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RankEndpoint {
    /// The rank.
    pub rank: u64,
    /// `grpc://host:port` of the node that serves it.
    pub location: String,
}
