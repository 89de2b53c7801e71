//! [`JobSpec`]: what a user submits — a pipeline (SQL or the plan form)
//! and the options of its delivery.

use serde::{Deserialize, Serialize};
use sluice_planner::Offload;
use sluice_udfs::OnError;

use super::error::JobError;
use super::order::{Layout, Shuffle};
use super::plan::PlanSpec;

/// Most rows a batch may have.
pub const MAX_BATCH: u64 = 1 << 16;
/// Most ranks a job may have.
pub const MAX_WORLD: u64 = 1 << 16;
/// Most epochs a job may have.
pub const MAX_EPOCHS: u64 = 1 << 20;

/// A job as submitted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// The pipeline as SQL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sql: Option<String>,
    /// The pipeline as a plan (an object, or its YAML text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanInput>,
    /// Rows per batch.
    #[serde(default = "default_batch")]
    pub batch_size: u64,
    /// Epochs.
    #[serde(default = "one")]
    pub epochs: u64,
    /// The shuffle (none: key order, every epoch the same).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shuffle: Option<Shuffle>,
    /// Ranks of the data-parallel trainer.
    #[serde(default = "one")]
    pub world_size: u64,
    /// Drop the tail of an epoch (full batches, same count on every rank)
    /// rather than pad by wrapping.
    #[serde(default)]
    pub drop_last: bool,
    /// Bad samples: `fail`, `null` or `skip`.
    #[serde(default)]
    #[schema(value_type = String, example = "skip")]
    pub on_error: OnError,
    /// Where stages run: `auto`, `storage`, `compute` or a cut index.
    #[serde(default)]
    pub offload: OffloadArg,
    /// Seconds a window waits, retrying, for a storage node that cannot
    /// be reached (restarting, or cut off) before its stream fails naming
    /// the node; 0 (the default): fail at once. A retried window reads the
    /// same rows: the trainer gets the same bytes as without the outage.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub storage_wait_s: f64,
    /// Where a training stopped (a trainer's saved state: see
    /// [`Resume`]): this job begins there, whatever its world size, batch
    /// size or workers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<Resume>,
}

/// A trainer's saved position: the epoch, and the global position in
/// its order before which every sample was trained on (see
/// `crate::job::order`). `samples` and `shuffle`, when given, are the
/// order's: a job whose own differ cannot continue it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Resume {
    /// The epoch to continue.
    pub epoch: u64,
    /// Samples of the epoch's global order already trained on.
    pub position: u64,
    /// The epoch's sample count when the state was saved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples: Option<u64>,
    /// The shuffle the order was drawn with (`null`: key order; absent:
    /// not checked).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<Shuffle>)]
    pub shuffle: Option<Option<Shuffle>>,
    /// Not a field: a saved state names its format.
    #[serde(default, rename = "sluice", skip_serializing_if = "Option::is_none")]
    pub format: Option<u64>,
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

/// The longest a window may wait for a storage node.
pub const MAX_STORAGE_WAIT_S: f64 = 3600.0;

/// A plan as an object or as YAML text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum PlanInput {
    /// YAML (or JSON) text.
    Text(String),
    /// The plan itself.
    Plan(PlanSpec),
}

/// An offload mode as JSON: `"auto"`, `"storage"`, `"compute"`, or a cut
/// (a number or its digits).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum OffloadArg {
    /// A cut index.
    Cut(usize),
    /// A mode's name.
    Name(String),
}

impl Default for OffloadArg {
    fn default() -> Self {
        Self::Name("auto".into())
    }
}

impl OffloadArg {
    /// The mode.
    pub fn offload(&self) -> Result<Offload, JobError> {
        match self {
            Self::Cut(n) => Ok(Offload::Cut(*n)),
            Self::Name(s) => s.parse().map_err(JobError::InvalidOptions),
        }
    }
}

fn default_batch() -> u64 {
    32
}

fn one() -> u64 {
    1
}

impl JobSpec {
    /// A job of `sql` with the default options.
    pub fn sql(sql: impl Into<String>) -> Self {
        Self {
            sql: Some(sql.into()),
            plan: None,
            batch_size: default_batch(),
            epochs: 1,
            shuffle: None,
            world_size: 1,
            drop_last: false,
            on_error: OnError::default(),
            offload: OffloadArg::default(),
            storage_wait_s: 0.0,
            resume: None,
        }
    }

    /// Checks the options and returns the pipeline's SQL.
    pub fn validate(&self) -> Result<String, JobError> {
        let bad = |m: String| Err(JobError::InvalidOptions(m));
        if !(1..=MAX_BATCH).contains(&self.batch_size) {
            return bad(format!(
                "batch_size must be in 1..={MAX_BATCH}, not {}",
                self.batch_size
            ));
        }
        if !(1..=MAX_EPOCHS).contains(&self.epochs) {
            return bad(format!(
                "epochs must be in 1..={MAX_EPOCHS}, not {}",
                self.epochs
            ));
        }
        if !(1..=MAX_WORLD).contains(&self.world_size) {
            return bad(format!(
                "world_size must be in 1..={MAX_WORLD}, not {}",
                self.world_size
            ));
        }
        if !(0.0..=MAX_STORAGE_WAIT_S).contains(&self.storage_wait_s) {
            return bad(format!(
                "storage_wait_s must be in 0..={MAX_STORAGE_WAIT_S}, not {}",
                self.storage_wait_s
            ));
        }
        if let Some(s) = &self.shuffle
            && (s.block_size == 0 || s.window == 0)
        {
            return bad("shuffle.block_size and shuffle.window must be at least 1".into());
        }
        if let Some(r) = &self.resume {
            check_resume(r, self)?;
        }
        self.offload.offload()?;
        match (&self.sql, &self.plan) {
            (Some(sql), None) if !sql.trim().is_empty() => Ok(sql.clone()),
            (None, Some(PlanInput::Plan(p))) => p.to_sql(),
            (None, Some(PlanInput::Text(t))) => PlanSpec::from_yaml(t)?.to_sql(),
            (Some(_), Some(_)) => bad("give either sql or plan, not both".into()),
            _ => bad("give the pipeline as sql or as plan".into()),
        }
    }

    /// The layout of this job's `epoch` over `samples` samples: from the
    /// resumed position in the epoch it resumes, whole after it.
    pub fn layout(&self, samples: u64, epoch: u64) -> Layout {
        let start = match &self.resume {
            Some(r) if r.epoch == epoch => r.position.min(samples),
            _ => 0,
        };
        Layout {
            samples,
            world_size: self.world_size,
            batch_size: self.batch_size,
            drop_last: self.drop_last,
            shuffle: self.shuffle,
            start,
        }
    }

    /// The first epoch this job reads: the one it resumes, or 0.
    pub fn first_epoch(&self) -> u64 {
        self.resume.as_ref().map_or(0, |r| r.epoch)
    }

    /// Checks a resumed job against the samples its pipeline gives: the
    /// saved position was taken over the same epoch order.
    pub fn check_samples(&self, samples: u64) -> Result<(), JobError> {
        match &self.resume {
            Some(Resume {
                samples: Some(saved),
                ..
            }) if *saved != samples => Err(JobError::InvalidOptions(format!(
                "resume: the saved position is in an epoch of {saved} samples, and this \
                 job's pipeline gives {samples} (another dataset version or filter?): its \
                 order is another, so the position means nothing here"
            ))),
            Some(r) if r.position > samples => Err(JobError::InvalidOptions(format!(
                "resume: position {} is past this job's {samples} samples",
                r.position
            ))),
            _ => Ok(()),
        }
    }
}

/// A field that is present, `null` or not (absent is `None`).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<Shuffle>>, D::Error> {
    Option::<Shuffle>::deserialize(d).map(Some)
}

/// A resumed position that cannot be this job's: its epoch is past the
/// job's, or its order was drawn with another shuffle.
fn check_resume(r: &Resume, spec: &JobSpec) -> Result<(), JobError> {
    let bad = |m: String| Err(JobError::InvalidOptions(format!("resume: {m}")));
    if r.format.is_some_and(|f| f != 1) {
        return bad(format!(
            "a saved state of format {:?}; this server reads 1",
            r.format
        ));
    }
    if r.epoch >= spec.epochs {
        return bad(format!(
            "epoch {} is past the job's epochs 0..{}",
            r.epoch, spec.epochs
        ));
    }
    if let Some(saved) = &r.shuffle
        && *saved != spec.shuffle
    {
        let says = |s: &Option<Shuffle>| {
            s.as_ref().map_or_else(
                || "no shuffle".to_string(),
                |s| format!("shuffle seed {} ({:?})", s.seed, s.mode).to_lowercase(),
            )
        };
        return bad(format!(
            "the position was saved in an order drawn with {}, and this job has {}: \
             give it the same shuffle",
            says(saved),
            says(&spec.shuffle)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_checked_and_named() {
        let spec: JobSpec = serde_json::from_value(serde_json::json!({
            "sql": "SELECT key FROM pets", "batch_size": 0
        }))
        .unwrap();
        assert!(
            spec.validate()
                .unwrap_err()
                .to_string()
                .contains("batch_size")
        );
        let e = serde_json::from_value::<JobSpec>(serde_json::json!({
            "sql": "SELECT 1", "batchsize": 4
        }))
        .unwrap_err();
        assert!(e.to_string().contains("batchsize"), "{e}");
        let spec: JobSpec = serde_json::from_value(serde_json::json!({
            "sql": "SELECT key FROM pets", "offload": "sideways"
        }))
        .unwrap();
        assert!(
            spec.validate()
                .unwrap_err()
                .to_string()
                .contains("sideways")
        );
        let spec: JobSpec = serde_json::from_value(serde_json::json!({
            "plan": "source: pets\noutputs: [key]", "offload": 1,
            "shuffle": {"seed": 3, "mode": "block"}
        }))
        .unwrap();
        assert_eq!(spec.validate().unwrap(), "SELECT \"key\" FROM \"pets\"");
        assert_eq!(spec.offload.offload().unwrap(), Offload::Cut(1));
        let none: JobSpec = serde_json::from_value(serde_json::json!({})).unwrap();
        assert!(
            none.validate()
                .unwrap_err()
                .to_string()
                .contains("sql or as plan")
        );
    }
}
