//! [`JobStore`]: the records of a node's jobs, so that they survive a
//! restart of the server (SIGTERM or `kill -9`).
//!
//! One JSON file per job in the store's directory (`<data dir>/jobs/`),
//! replaced atomically — written beside, flushed, renamed, the directory
//! flushed — so a crash leaves the previous record or the new one, never
//! half of one. A record holds what makes the job the same job: its spec,
//! the dataset version it pinned on each node, its state and which
//! positions were delivered. The samples' row ids are not kept: they are
//! listed again from the pinned versions, which never change, so the
//! same job reads the same samples in the same order, bit-identical.
//!
//! A record that cannot be read back (a file cut short by a disk, written
//! by a newer sluice, or holding numbers no job can have) is set aside in
//! `rejected/` beside a `.error` file naming what is wrong with it, and
//! the server starts without it: no record can stop a start.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sluice_base::BadSample;

use super::coverage::ProgressRecord;
use super::spec::JobSpec;
use super::status::JobState;
use crate::error::Failure;
use crate::replicas::index::Pin;

/// What the store keeps of a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    /// Its id.
    pub id: String,
    /// What was submitted.
    pub spec: JobSpec,
    /// When, in seconds since the Unix epoch.
    pub created: f64,
    /// The version it reads on each node.
    pub pins: Vec<Pin>,
    /// A mixture's pins, part by part (`pins` is the first part's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mix_pins: Vec<Vec<Pin>>,
    /// How the cluster laid out each part's version (replicas and their
    /// holders), part by part, where its ingest did.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layouts: Vec<Option<crate::replicas::ledger::PartLayout>>,
    /// Its state when saved.
    pub state: JobState,
    /// Why it failed, if it did.
    pub error: Option<String>,
    /// The code and kind of what failed it (absent in records written
    /// before they were kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    /// What was delivered.
    pub progress: ProgressRecord,
    /// Bad samples skipped or nulled.
    pub skipped: u64,
    /// The first of them, named.
    pub bad_samples: Vec<BadSample>,
    /// The compute nodes its ranks were sent to (absent in records
    /// written before they were kept).
    #[serde(default, skip_serializing_if = "super::routes::RankRoutes::is_empty")]
    pub routes: super::routes::RankRoutes,
}

impl JobRecord {
    /// The versions pinned, part by part (one part unless a mixture).
    pub fn part_pins(&self) -> Vec<Vec<Pin>> {
        if self.mix_pins.is_empty() {
            vec![self.pins.clone()]
        } else {
            self.mix_pins.clone()
        }
    }
}

/// See the module docs.
#[derive(Debug)]
pub struct JobStore {
    dir: PathBuf,
}

impl JobStore {
    /// The store in `dir`, created if missing.
    pub fn open(dir: impl Into<PathBuf>) -> std::io::Result<Self> {
        let dir = dir.into();
        fs::create_dir_all(&dir)?;
        Ok(Self { dir })
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, id: &str) -> std::io::Result<PathBuf> {
        let ok = !id.is_empty()
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !ok {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a job id of letters, digits, '-' and '_'",
            ));
        }
        Ok(self.dir.join(format!("{id}.json")))
    }

    /// Saves `record`, replacing the job's previous record atomically.
    pub fn save(&self, record: &JobRecord) -> std::io::Result<()> {
        let path = self.path(&record.id)?;
        let tmp = path.with_extension("json.tmp");
        let bytes = serde_json::to_vec(record).map_err(std::io::Error::other)?;
        let mut f = File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, &path)?;
        File::open(&self.dir)?.sync_all()
    }

    /// Forgets the job `id`.
    pub fn remove(&self, id: &str) -> std::io::Result<()> {
        match fs::remove_file(self.path(id)?) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Every record saved, oldest first; unreadable ones are set aside
    /// (see the module docs).
    pub fn load(&self) -> std::io::Result<Vec<JobRecord>> {
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.dir)? {
            let path = entry?.path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            match fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice::<JobRecord>(&b).map_err(|e| e.to_string()))
            {
                Ok(r) => out.push(r),
                Err(e) => match self.set_aside(&path, &e) {
                    Ok(to) => tracing::warn!(
                        "job record {}: {e}; set aside as {}",
                        path.display(),
                        to.display()
                    ),
                    Err(moved) => tracing::warn!(
                        "job record {}: {e}; ignored (cannot set it aside: {moved})",
                        path.display()
                    ),
                },
            }
        }
        out.sort_by(|a, b| a.created.total_cmp(&b.created).then(a.id.cmp(&b.id)));
        Ok(out)
    }
}

impl JobStore {
    /// Moves the record at `path` into `rejected/`, with `why` beside it
    /// in a `.error` file; where it went.
    fn set_aside(&self, path: &Path, why: &str) -> std::io::Result<PathBuf> {
        let aside = self.dir.join("rejected");
        fs::create_dir_all(&aside)?;
        let name = path.file_name().unwrap_or_default();
        let to = aside.join(name);
        fs::write(to.with_extension("error"), format!("{why}\n"))?;
        fs::rename(path, &to)?;
        Ok(to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, created: f64) -> JobRecord {
        JobRecord {
            id: id.into(),
            spec: serde_json::from_str(r#"{"sql": "SELECT key FROM d"}"#).unwrap(),
            created,
            pins: vec![Pin {
                node: "n".into(),
                version: 3,
            }],
            mix_pins: Vec::new(),
            layouts: Vec::new(),
            state: JobState::Running,
            error: None,
            failure: None,
            progress: ProgressRecord::default(),
            skipped: 0,
            bad_samples: vec![],
            routes: Default::default(),
        }
    }

    #[test]
    fn a_record_that_cannot_be_read_back_is_set_aside_naming_why() {
        let dir = tempfile::tempdir().unwrap();
        let store = JobStore::open(dir.path().join("jobs")).unwrap();
        store.save(&record("job-1", 1.0)).unwrap();
        let mut bad = serde_json::to_value(record("job-2", 2.0)).unwrap();
        // What a report near u64::MAX left in a record before reports
        // were checked: a range that wraps.
        bad["progress"]["ranges"] = serde_json::json!([[[7, 9], [[18446744073709551615u64, 1]]]]);
        fs::write(store.dir().join("job-2.json"), bad.to_string()).unwrap();
        fs::write(store.dir().join("job-3.json"), b"{\"id\": ").unwrap();
        let loaded = store.load().unwrap();
        assert_eq!(loaded.len(), 1);
        assert_eq!(loaded[0].id, "job-1");
        let why = fs::read_to_string(store.dir().join("rejected/job-2.error")).unwrap();
        assert!(why.contains("runs backwards"), "{why}");
        assert!(store.dir().join("rejected/job-3.json").exists());
        assert!(!store.dir().join("job-2.json").exists());
        assert_eq!(
            store.load().unwrap().len(),
            1,
            "set aside once, not read again"
        );
    }

    #[test]
    fn records_are_saved_replaced_listed_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let store = JobStore::open(dir.path().join("jobs")).unwrap();
        store.save(&record("job-2", 2.0)).unwrap();
        store.save(&record("job-1", 1.0)).unwrap();
        let mut r = record("job-1", 1.0);
        r.state = JobState::Done;
        store.save(&r).unwrap();
        let all = store.load().unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0], r);
        store.remove("job-1").unwrap();
        store.remove("job-1").unwrap();
        assert_eq!(store.load().unwrap().len(), 1);
        assert!(store.save(&record("../x", 0.0)).is_err());
    }
}
