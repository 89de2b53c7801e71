//! Jobs: a pipeline and the options of its delivery to a data-parallel
//! trainer — batches, epochs, shuffle, ranks, drop-last, error policy,
//! offload.
//!
//! - [`spec`]: [`JobSpec`] as submitted;
//! - [`plan`]: the YAML/JSON plan form of a pipeline, compiled to SQL;
//! - [`order`]: the job maths — every epoch's order and each rank's share;
//! - [`query`]: the plan of a job — its SQL as a pipeline, and the plan
//!   every window runs (with each row's slot);
//! - [`placed`]: that plan prepared and placed once per job, bound to each
//!   stream's epoch; a re-plan replaces it for every stream;
//! - [`rank_batch`]: [`RankBatch`], a batch of a rank's stream as its
//!   reader gets it;
//! - [`run`]: [`Job`] — its states, and a rank's share of an epoch from
//!   any offset;
//! - [`pipeline`]: the stream of an epoch as one staged pipeline —
//!   windows, fetch, in order, rebatch, sink — its knobs in one place and
//!   what the job learns from it behind an observer;
//! - [`in_order`]: windows run as cores free up, handed on in order;
//! - [`ahead`]: each rank's next epoch, begun before its reader asks;
//! - [`window_rows`]: a window's output row by slot, from its plan, the
//!   output cache or both;
//! - [`rebatch`]: rows back in the epoch's order, in batches;
//! - [`finish`]: the last stage (normalize) run as batches are written
//!   out, into the trainer's slot;
//! - [`status`]: states, progress, rates, bytes per tier;
//! - [`stages`]: per-stage statistics — rates, time per sample, queues,
//!   the bottleneck and its headroom;
//! - [`stage_view`]: what those statistics say, as status and EXPLAIN
//!   ANALYZE show them;
//! - [`adapt`]: re-planning under load — tiers measured as the job runs,
//!   the cut moved at a window when they contradict the plan;
//! - [`store`]: the job records that survive a restart;
//! - [`registry`]: [`Jobs`], the jobs of a node;
//! - [`cluster`]: many compute nodes — which serves each rank, and how a
//!   node finds a job the coordinator holds;
//! - [`coverage`]: `Progress`: the bookkeeping behind a job's status;
//! - [`failover`]: `Failover`: a job's storage nodes found lost, and the
//!   windows that ran again elsewhere because of them;
//! - [`mix`]: a weighted mixture's epoch: which source each position of the
//!   epoch's global sequence reads;
//! - [`mix_plan`]: a mixture's window plan: each part's placed plan with its
//!   name as a `source` column;
//! - [`mix_sql`]: a mixture in SQL: the pipeline reads `mix(…)` where it
//!   would read a dataset;
//! - [`mix_status`]: what a job's status says of its mixture;
//! - [`report`]: `NodeReport`: what a compute node serving some of a job's
//!   ranks tells the coordinator;
//! - [`routes`]: `RankRoutes`: which compute nodes each rank of a job was
//!   sent to.

pub mod adapt;
pub mod ahead;
pub mod cluster;
pub mod coverage;
pub mod failover;
pub mod finish;
pub mod in_order;
pub mod mix;
pub mod mix_plan;
pub mod mix_sql;
pub mod mix_status;
pub mod order;
pub mod pipeline;
pub mod placed;
pub mod plan;
pub mod query;
pub mod rank_batch;
pub mod rebatch;
pub mod registry;
pub mod report;
pub mod routes;
pub mod run;
pub mod spec;
pub mod stage_view;
pub mod stages;
pub mod status;
pub mod store;
pub mod window_rows;

pub use crate::error::{Failure, JobError};
pub use cluster::{ComputeNodes, JobSource};
pub use order::{EpochShape, Shuffle, ShuffleMode};
pub use plan::{MixPart, PlanInput, PlanSpec};
pub use rank_batch::RankBatch;
pub use registry::Jobs;
pub use run::Job;
pub use spec::{JobSpec, OffloadArg, Resume};
pub use status::{JobState, JobStatus, RankEndpoint, TierBytes};
pub use store::{JobRecord, JobStore};
