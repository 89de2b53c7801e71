//! [`Audit`]: the record of every refusal: who, what, when, from where.
//!
//! Each refusal is one JSON line, appended to the audit file when the
//! server has one (`--audit-log`), and logged under the `sluice::audit`
//! target either way:
//!
//! ```json
//! {"at":1795840000.25,"who":"alice","from":"10.0.0.7","what":"POST /v1/datasets","why":"may not ingest dataset \"cats\""}
//! ```
//!
//! `who` is the token's name, `no token` when the call carried none, and
//! `unknown token` when it carried one the server does not know (the
//! token itself is never written).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// See the module docs.
#[derive(Debug, Clone, Default)]
pub struct Audit {
    file: Option<Arc<Mutex<File>>>,
}

/// One refusal.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Refusal {
    /// Seconds since the Unix epoch.
    pub at: f64,
    /// The token's name, `no token` or `unknown token`.
    pub who: String,
    /// The caller's address, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// The route or call, and what it named.
    pub what: String,
    /// Why it was refused.
    pub why: String,
}

impl Audit {
    /// Refusals appended to the file at `path` (created 0600 if missing).
    pub fn to(path: &Path) -> Result<Self, String> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| format!("audit log {}: {e}", path.display()))?;
        Ok(Self {
            file: Some(Arc::new(Mutex::new(file))),
        })
    }

    /// Records that `who` (from `from`) was refused `what` because `why`.
    pub fn refused(&self, who: &str, from: Option<String>, what: &str, why: &str) {
        let at = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let r = Refusal {
            at,
            who: who.to_string(),
            from,
            what: what.chars().take(512).collect(),
            why: why.chars().take(512).collect(),
        };
        tracing::warn!(target: "sluice::audit", who = %r.who, from = ?r.from, what = %r.what,
            "refused: {}", r.why);
        let Some(file) = &self.file else { return };
        let Ok(mut line) = serde_json::to_string(&r) else {
            return;
        };
        line.push('\n');
        let mut f = file.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = f.write_all(line.as_bytes()) {
            tracing::error!("cannot write the audit log: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_refusal_is_one_line_of_json() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let audit = Audit::to(&path).unwrap();
        audit.refused(
            "alice",
            Some("10.0.0.7".into()),
            "POST /v1/datasets cats",
            "no ingest",
        );
        audit.refused("no token", None, "GET /v1/jobs", "a token is required");
        let lines: Vec<Refusal> = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].who, "alice");
        assert_eq!(lines[0].from.as_deref(), Some("10.0.0.7"));
        assert_eq!(lines[1].what, "GET /v1/jobs");
        assert!(lines[1].at > 1.7e9);
    }
}
