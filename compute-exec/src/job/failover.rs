//! [`Failover`]: a job's storage nodes found lost, and the windows that
//! ran again elsewhere because of them.
//!
//! A window that meets a storage node it cannot reach marks the node lost
//! for [`LOST_FOR`] and runs again at once, each of its samples read from
//! another holder (`SampleIndex::takes` with the lost nodes avoided). Every
//! window of the job, on every stream, avoids a node while it is marked,
//! so one window pays for the discovery and the others never wait on it.
//! When the mark runs out the node is tried again: a node that came back
//! takes its share of the reads again, one still gone is marked again by
//! the first window that meets it (a refused connection: milliseconds).
//! Only a window some of whose samples have no holder left waits, for the
//! job's `storage_wait_s`, then fails naming the nodes; a window that ran
//! again after such a wait (its node came back) is counted too, as
//! `waited`.
//!
//! A replica whose bytes do not match their checksum is avoided by the
//! window that met it only: the read is served from another holder, and
//! the node stays in use for its other samples.
//!
//! What happened is kept for the job's status: per lost node, when it was
//! first met, the windows that ran again because of it, and why.

use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::replicas::holders::Avoid;
use crate::replicas::index::SampleIndex;

/// How long a node that could not be reached is left out of reads.
pub const LOST_FOR: Duration = Duration::from_secs(10);

/// One node's failover, as the job's status shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FailoverEvent {
    /// The storage node.
    pub node: String,
    /// What was met: `lost` (not reachable; the window ran on other
    /// holders), `waited` (not reachable, no other holder: the window ran
    /// again once it was back, within `storage_wait_s`) or `corrupt` (a
    /// replica's checksum did not match).
    pub what: String,
    /// When it was first met, seconds since the Unix epoch.
    pub at: f64,
    /// Windows that ran again because of it (on other holders, or on the
    /// node once it was back).
    pub windows: u64,
    /// The first error met.
    pub reason: String,
    /// The compute node whose windows met it (as its progress reports
    /// say); absent: this process's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
}

/// Most events one node's report may carry, and a job keeps of its own.
pub const MAX_EVENTS: usize = 64;

/// Longest reason an event may give.
pub const MAX_REASON: usize = 1024;

impl FailoverEvent {
    /// Why `self` (from a compute node's report) is not one, if it is not.
    pub fn check(&self, max_node: usize) -> Result<(), String> {
        if self.node.is_empty() || self.node.len() > max_node {
            return Err(format!("a failover's node must have 1 to {max_node} bytes"));
        }
        if !matches!(self.what.as_str(), "lost" | "waited" | "corrupt") {
            return Err(format!(
                "a failover is lost, waited or corrupt, not {:?}",
                self.what
            ));
        }
        if self.reason.len() > MAX_REASON || !self.at.is_finite() {
            return Err(format!(
                "a failover's reason has at most {MAX_REASON} bytes and its time is a number"
            ));
        }
        Ok(())
    }
}

/// What a job does when a node's replica is first found corrupt (it
/// scrubs and repairs that node: `crate::repair`).
pub type OnCorrupt = Box<dyn Fn(&str) + Send + Sync>;

/// See the module docs.
#[derive(Default)]
pub struct Failover {
    inner: Mutex<Inner>,
    on_corrupt: std::sync::OnceLock<OnCorrupt>,
}

impl std::fmt::Debug for Failover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Failover")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct Inner {
    /// Node → until when it is avoided.
    lost: Vec<(String, Instant)>,
    events: Vec<FailoverEvent>,
    /// Events not kept (past [`MAX_EVENTS`]).
    dropped: u64,
    /// Compute nodes' events, as their latest reports said (by node).
    reported: Vec<(String, Vec<FailoverEvent>)>,
}

impl Failover {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The pins of `index` every window avoids now: the nodes marked lost.
    pub fn avoid(&self, index: &SampleIndex) -> Avoid {
        let now = Instant::now();
        let mut inner = self.lock();
        inner.lost.retain(|(_, until)| *until > now);
        let mut out = Avoid::default();
        for (node, _) in &inner.lost {
            out.extend(&index.pins_of(node));
        }
        out
    }

    /// Marks `node` lost (for [`LOST_FOR`]) after a window met `reason`
    /// on it; `rerun`: the window runs again on other holders (counted).
    pub fn lost(&self, node: &str, reason: &str, rerun: bool) {
        let until = Instant::now() + LOST_FOR;
        let mut inner = self.lock();
        match inner.lost.iter_mut().find(|(n, _)| n == node) {
            Some(mark) => mark.1 = until,
            None => inner.lost.push((node.to_string(), until)),
        }
        if rerun {
            inner.note(node, "lost", reason);
        }
    }

    /// Counts a window that waited for `node` (met `reason` on it, with no
    /// other holder for some of its samples) and ran again once it could.
    pub fn waited(&self, node: &str, reason: &str) {
        self.lock().note(node, "waited", reason);
    }

    /// Counts a window run again because `node`'s replica of one of its
    /// samples is corrupt; the first time for `node`, calls the job's
    /// [`OnCorrupt`].
    pub fn corrupt(&self, node: &str, reason: &str) {
        tracing::error!("{reason}; the window is read again from another replica");
        let first = self.lock().note(node, "corrupt", reason);
        if first && let Some(repair) = self.on_corrupt.get() {
            repair(node);
        }
    }

    /// What to do when a node's replica is first found corrupt (set once).
    pub fn on_corrupt(&self, repair: OnCorrupt) {
        let _ = self.on_corrupt.set(repair);
    }

    /// What happened here, oldest first, and how many events were not
    /// kept.
    pub fn events(&self) -> (Vec<FailoverEvent>, u64) {
        let inner = self.lock();
        (inner.events.clone(), inner.dropped)
    }

    /// Every event: this process's, then each compute node's as reported.
    pub fn all_events(&self) -> Vec<FailoverEvent> {
        let inner = self.lock();
        let mut out = inner.events.clone();
        for (node, events) in &inner.reported {
            out.extend(events.iter().map(|e| FailoverEvent {
                via: Some(node.clone()),
                ..e.clone()
            }));
        }
        out
    }

    /// A windows' count of what happened here: it grows with every event.
    pub fn tally(&self) -> u64 {
        let inner = self.lock();
        inner.dropped + inner.events.iter().map(|e| e.windows).sum::<u64>()
    }

    /// Takes compute node `node`'s events (its report's whole list, already
    /// checked), in place of what it said before.
    pub fn reported(&self, node: &str, events: Vec<FailoverEvent>) {
        if events.is_empty() {
            return;
        }
        let mut inner = self.lock();
        if let Some(said) = inner.reported.iter_mut().find(|(n, _)| n == node) {
            said.1 = events;
        } else if inner.reported.len() < MAX_EVENTS {
            inner.reported.push((node.to_string(), events));
        } else {
            inner.dropped += 1;
        }
    }
}

impl Inner {
    /// Counts one more window for (`node`, `what`); whether it is the
    /// first.
    fn note(&mut self, node: &str, what: &str, reason: &str) -> bool {
        if let Some(e) = self
            .events
            .iter_mut()
            .rev()
            .find(|e| e.node == node && e.what == what)
        {
            e.windows += 1;
            return false;
        }
        if self.events.len() >= MAX_EVENTS {
            self.dropped += 1;
            return false;
        }
        let then = match what {
            "waited" => "its windows ran again once it was back",
            _ => "its windows run on other holders",
        };
        tracing::warn!("storage node {node} {what}: {reason}; {then}");
        self.events.push(FailoverEvent {
            node: node.to_string(),
            what: what.to_string(),
            at: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            windows: 1,
            reason: reason.chars().take(MAX_REASON / 4).collect(),
            via: None,
        });
        true
    }
}
