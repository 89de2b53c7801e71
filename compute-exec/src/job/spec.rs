//! [`JobSpec`]: what a user submits — a pipeline (SQL or the plan form)
//! and the options of its delivery.

use serde::{Deserialize, Serialize};
use sluice_planner::Offload;
use sluice_udfs::OnError;

use super::mix::MixEpoch;
use super::mix_sql::{mix_in_sql, with_source};
use super::order::{EpochShape, Shuffle};
use super::plan::{MixPart, PlanInput};
use crate::error::JobError;

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
    /// A weighted mixture: the parts read together, interleaved by weight
    /// (see `crate::job::mix`). A part names a dataset the job's pipeline
    /// (`sql` or `plan`) reads in place of its own source, or gives its
    /// own pipeline; their output columns must agree. Each row then
    /// carries its part's name in a `source` column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mix: Option<Vec<MixPart>>,
    /// What ends a mixture's epoch (default: `first_exhausted`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mix_epoch: Option<MixEpoch>,
}

/// Most parts a mixture may have.
pub const MAX_PARTS: usize = 64;

/// A pipeline of a job, as SQL: the job's one, or a part of a mixture.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    /// Its name (`source`), empty for a job that is not a mixture.
    pub name: String,
    /// Its weight.
    pub weight: f64,
    /// Its SQL.
    pub sql: String,
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
            mix: None,
            mix_epoch: None,
        }
    }

    /// Checks the options and returns the job's pipelines: its one, or
    /// the parts of its mixture.
    pub fn validate(&self) -> Result<Vec<Part>, JobError> {
        let hoisted;
        let this = match self.plan_mix()? {
            Some(h) => {
                hoisted = h;
                &hoisted
            }
            None => self,
        };
        this.validate_hoisted()
    }

    /// This spec with a plan's `mix` (and `mix_epoch`) made the job's
    /// own, the plan without them: what a job runs and shows.
    pub fn hoisted(self) -> Result<Self, JobError> {
        Ok(self.plan_mix()?.unwrap_or(self))
    }

    /// The spec hoisted, when its plan (or its SQL, reading `mix(…)`, see
    /// `crate::job::mix_sql`) names a mixture.
    fn plan_mix(&self) -> Result<Option<Self>, JobError> {
        if let Some(sql) = &self.sql
            && let Some((sql, mix, rule)) = mix_in_sql(sql)?
        {
            if self.mix.is_some() {
                return Err(JobError::InvalidOptions(
                    "give mix in the SQL or beside it, not both".into(),
                ));
            }
            return Ok(Some(Self {
                sql: Some(sql),
                mix: Some(mix),
                mix_epoch: rule.or(self.mix_epoch),
                ..self.clone()
            }));
        }
        let Some(plan) = &self.plan else {
            return Ok(None);
        };
        let mut plan = plan.parsed()?;
        let Some(mix) = plan.mix.take() else {
            return Ok(None);
        };
        if self.mix.is_some() {
            return Err(JobError::InvalidOptions(
                "give mix in the plan or beside it, not both".into(),
            ));
        }
        let mix_epoch = plan.mix_epoch.take().or(self.mix_epoch);
        Ok(Some(Self {
            plan: Some(PlanInput::Plan(plan)),
            mix: Some(mix),
            mix_epoch,
            ..self.clone()
        }))
    }

    fn validate_hoisted(&self) -> Result<Vec<Part>, JobError> {
        self.check_options()?;
        let pipeline = self.pipeline();
        let Some(parts) = &self.mix else {
            return Ok(vec![Part {
                name: String::new(),
                weight: 1.0,
                sql: pipeline?,
            }]);
        };
        if parts.is_empty() || parts.len() > MAX_PARTS {
            return Err(JobError::InvalidOptions(format!(
                "mix: give 1 to {MAX_PARTS} parts, not {}",
                parts.len()
            )));
        }
        let mut out: Vec<Part> = Vec::with_capacity(parts.len());
        for (i, p) in parts.iter().enumerate() {
            let part = self
                .part(p, pipeline.as_ref())
                .map_err(|e| JobError::InvalidOptions(format!("mix part {}: {e}", i + 1)))?;
            if out.iter().any(|o| o.name == part.name) {
                return Err(JobError::InvalidOptions(format!(
                    "mix part {}: another part is named {:?} (give each a name)",
                    i + 1,
                    part.name
                )));
            }
            out.push(part);
        }
        Ok(out)
    }

    /// A mixture's part as SQL, `pipeline` being the job's own.
    fn part(&self, p: &MixPart, pipeline: Result<&String, &JobError>) -> Result<Part, JobError> {
        let bad = |m: String| Err(JobError::InvalidOptions(m));
        if !(p.weight.is_finite() && p.weight > 0.0) {
            return bad(format!("weight must be above 0, not {}", p.weight));
        }
        let sql = match (&p.dataset, &p.sql, &p.plan) {
            (Some(d), None, None) => match (&self.plan, pipeline) {
                (Some(plan), _) => {
                    let mut plan = plan.parsed()?;
                    plan.source = d.clone();
                    plan.to_sql()?
                }
                (None, Ok(sql)) => with_source(sql, d)?,
                (None, Err(e)) => {
                    return bad(format!(
                        "it names dataset {d:?}, and the job's own pipeline is missing or \
                         wrong: {e}"
                    ));
                }
            },
            (None, Some(sql), None) if !sql.trim().is_empty() => sql.clone(),
            (None, None, Some(plan)) => plan.parsed()?.to_sql()?,
            _ => return bad("give one of dataset, sql or plan".into()),
        };
        let name = match (&p.name, &p.dataset) {
            (Some(n), _) | (None, Some(n)) => n.clone(),
            (None, None) => return bad("a part with its own pipeline needs a name".into()),
        };
        Ok(Part {
            name,
            weight: p.weight,
            sql,
        })
    }

    /// Checks the options.
    fn check_options(&self) -> Result<(), JobError> {
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
        Ok(())
    }

    /// The pipeline's SQL (of a mixture: the pipeline its parts that name
    /// a dataset read).
    fn pipeline(&self) -> Result<String, JobError> {
        let bad = |m: String| Err(JobError::InvalidOptions(m));
        match (&self.sql, &self.plan) {
            (Some(sql), None) if !sql.trim().is_empty() => Ok(sql.clone()),
            (None, Some(plan)) => plan.parsed()?.to_sql(),
            (Some(_), Some(_)) => bad("give either sql or plan, not both".into()),
            _ => bad("give the pipeline as sql or as plan".into()),
        }
    }

    /// The layout of this job's `epoch` over `samples` samples: from the
    /// resumed position in the epoch it resumes, whole after it.
    pub fn layout(&self, samples: u64, epoch: u64) -> EpochShape {
        let start = match &self.resume {
            Some(r) if r.epoch == epoch => r.position.min(samples),
            _ => 0,
        };
        EpochShape {
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
        assert_eq!(
            spec.validate().unwrap()[0].sql,
            "SELECT \"key\" FROM \"pets\""
        );
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
