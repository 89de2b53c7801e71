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
        self.offload.offload()?;
        match (&self.sql, &self.plan) {
            (Some(sql), None) if !sql.trim().is_empty() => Ok(sql.clone()),
            (None, Some(PlanInput::Plan(p))) => p.to_sql(),
            (None, Some(PlanInput::Text(t))) => PlanSpec::from_yaml(t)?.to_sql(),
            (Some(_), Some(_)) => bad("give either sql or plan, not both".into()),
            _ => bad("give the pipeline as sql or as plan".into()),
        }
    }

    /// The layout of this job's epochs over `samples` samples.
    pub fn layout(&self, samples: u64) -> Layout {
        Layout {
            samples,
            world_size: self.world_size,
            batch_size: self.batch_size,
            drop_last: self.drop_last,
            shuffle: self.shuffle,
        }
    }
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
