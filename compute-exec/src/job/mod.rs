//! Jobs: a pipeline and the options of its delivery to a data-parallel
//! trainer — batches, epochs, shuffle, ranks, drop-last, error policy,
//! offload.
//!
//! - [`spec`]: [`JobSpec`] as submitted and [`JobError`] with stable codes;
//! - [`plan`]: the YAML/JSON plan form of a pipeline, compiled to SQL;
//! - [`order`]: the job maths — every epoch's order and each rank's share;
//! - [`run`]: [`Job`] — planning, listing the samples, delivering a rank's
//!   share of an epoch from any offset;
//! - [`rebatch`]: rows back in the epoch's order, in batches;
//! - [`status`]: states, progress, rates, bytes per tier;
//! - [`registry`]: [`Jobs`], the jobs of a node.

pub mod order;
pub mod plan;
pub mod rebatch;
pub mod registry;
pub mod run;
pub mod spec;
pub mod status;

pub use order::{Layout, Shuffle, ShuffleMode};
pub use plan::PlanSpec;
pub use registry::Jobs;
pub use run::{Delivery, Job};
pub use spec::{JobError, JobSpec, OffloadArg, PlanInput};
pub use status::{JobState, JobStatus, TierBytes};
