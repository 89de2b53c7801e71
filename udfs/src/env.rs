//! What the UDFs of one session share: options, limits, the log of bad
//! samples and the clock of their stages.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use sluice_base::BadSample;
pub use sluice_base::OnError;

use crate::stage_clock::{Site, StageClock};

/// Bounds on what one sample may decode to, checked from headers before decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Limits {
    /// Largest image (width × height), and largest video frame.
    pub max_pixels: u64,
    /// Most frames a video may have decoded.
    pub max_frames: u64,
    /// Largest decoded result of one sample, in bytes.
    pub max_decoded_bytes: u64,
    /// Longest a decode loop (video frames) may run on one sample, in
    /// milliseconds, checked between frames.
    #[serde(default = "default_sample_ms")]
    pub max_sample_ms: u64,
}

fn default_sample_ms() -> u64 {
    Limits::default().max_sample_ms
}

impl Default for Limits {
    /// 64 Mpx, 4096 frames, 1 GiB, 60 s: above any real training sample,
    /// far below what a crafted header can ask for.
    fn default() -> Self {
        Self {
            max_pixels: 64 << 20,
            max_frames: 4096,
            max_decoded_bytes: 1 << 30,
            max_sample_ms: 60_000,
        }
    }
}

impl Limits {
    /// These limits, none above `ceiling`'s: what a client asks for may
    /// lower a server's limits, never raise them.
    pub fn capped_by(self, ceiling: &Limits) -> Limits {
        Limits {
            max_pixels: self.max_pixels.min(ceiling.max_pixels),
            max_frames: self.max_frames.min(ceiling.max_frames),
            max_decoded_bytes: self.max_decoded_bytes.min(ceiling.max_decoded_bytes),
            max_sample_ms: self.max_sample_ms.min(ceiling.max_sample_ms),
        }
    }

    /// An error naming the time budget when `started` is longer ago than
    /// it allows; `what` is only called to word it.
    pub fn check_time(
        &self,
        started: std::time::Instant,
        what: impl FnOnce() -> String,
    ) -> Result<(), String> {
        if started.elapsed().as_millis() >= u128::from(self.max_sample_ms) {
            return Err(format!(
                "{} took {} ms or more, the limit (max_sample_ms)",
                what(),
                self.max_sample_ms
            ));
        }
        Ok(())
    }

    /// Checks a decoded size of `pixels` × `channels` bytes per frame, `frames` frames.
    pub fn check(&self, what: &str, pixels: u64, frames: u64, bytes: u64) -> Result<(), String> {
        if pixels > self.max_pixels {
            return Err(format!(
                "{what} has {pixels} pixels, over the limit of {} (max_pixels)",
                self.max_pixels
            ));
        }
        if frames > self.max_frames {
            return Err(format!(
                "{what} needs {frames} frames, over the limit of {} (max_frames)",
                self.max_frames
            ));
        }
        if bytes > self.max_decoded_bytes {
            return Err(format!(
                "{what} decodes to {bytes} bytes, over the limit of {} (max_decoded_bytes)",
                self.max_decoded_bytes
            ));
        }
        Ok(())
    }
}

/// The options of one session's UDFs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UdfOptions {
    /// Policy for bad samples.
    pub on_error: OnError,
    /// Job seed of the random UDFs.
    pub seed: u64,
    /// Epoch of the random UDFs.
    pub epoch: u64,
    /// Decoding limits.
    pub limits: Limits,
    /// Whether the plan's deterministic decode subexpressions are served
    /// from, and fill, the node's stage cache ([`crate::stage_cache`]): a
    /// job whose plan is random sets it (its decode is the same every
    /// epoch, the random stages after it are not).
    #[serde(default)]
    pub cache_stages: bool,
}

/// Samples skipped or nulled by the UDFs of a session (the first
/// [`ErrorLog::KEEP`] are kept; all are counted).
#[derive(Debug, Default)]
pub struct ErrorLog {
    inner: Mutex<(u64, Vec<BadSample>)>,
}

impl ErrorLog {
    /// Entries kept in full.
    pub const KEEP: usize = 1000;

    /// Records one bad sample.
    pub fn record(&self, sample: BadSample) {
        tracing::info!(
            "{}: bad sample '{}': {}",
            sample.udf,
            sample.key,
            sample.reason
        );
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.0 += 1;
        if g.1.len() < Self::KEEP {
            g.1.push(sample);
        }
    }

    /// Adds what another process recorded: `total` bad samples, of which
    /// `kept` were kept there.
    pub fn merge(&self, total: u64, kept: Vec<BadSample>) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.0 = g.0.saturating_add(total);
        let room = Self::KEEP.saturating_sub(g.1.len());
        g.1.extend(kept.into_iter().take(room));
    }

    /// How many were recorded, and the first ones.
    pub fn snapshot(&self) -> (u64, Vec<BadSample>) {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        (g.0, g.1.clone())
    }
}

/// The words of the error a cancelled UDF batch ends with.
pub const CANCELLED: &str = "the query was cancelled (its reader left or its job was cancelled)";

/// Whether the work of a session's UDFs is still wanted.
///
/// DataFusion stops a query by dropping its streams and aborting its
/// tasks, but a UDF evaluating a batch is one synchronous call that no
/// abort reaches: a batch of clips can decode for minutes after its reader
/// left. The UDFs check this flag before each row and the decode loops
/// between frames, so the CPU stops within one row's (or one frame's)
/// work of a cancel. Set by whoever owns the query's output stream, through
/// [`Cancel::on_drop`].
///
/// A flag may be the [`Cancel::child`] of another (a job's stream of the
/// job): cancelling the parent stops the child's work too, so whoever
/// cancels a whole needs no list of its parts.
#[derive(Debug, Clone, Default)]
pub struct Cancel {
    flag: Arc<AtomicBool>,
    parent: Option<Box<Cancel>>,
}

impl Cancel {
    /// Stops the work (and its children's).
    pub fn cancel(&self) {
        self.flag.store(true, Ordering::Relaxed);
    }

    /// Whether [`Cancel::cancel`] was called on it or on a parent.
    pub fn is_cancelled(&self) -> bool {
        self.flag.load(Ordering::Relaxed) || self.parent.as_ref().is_some_and(|p| p.is_cancelled())
    }

    /// A flag of its own that this one's cancel sets too.
    pub fn child(&self) -> Self {
        Self {
            flag: Arc::default(),
            parent: Some(Box::new(self.clone())),
        }
    }

    /// An error naming the cancel, once it happened.
    pub fn check(&self) -> Result<(), String> {
        if self.is_cancelled() {
            return Err(CANCELLED.to_owned());
        }
        Ok(())
    }

    /// A guard that cancels when dropped: kept by the output stream, it
    /// stops the UDFs when the stream is dropped however that happens.
    pub fn on_drop(&self) -> CancelOnDrop {
        CancelOnDrop(self.clone())
    }
}

/// See [`Cancel::on_drop`].
#[derive(Debug)]
pub struct CancelOnDrop(Cancel);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// Shared by the UDFs of one session.
#[derive(Debug, Default)]
pub struct UdfEnv {
    /// The options.
    pub options: UdfOptions,
    /// Bad samples met so far.
    pub errors: Arc<ErrorLog>,
    /// Whether the work is still wanted.
    pub cancel: Cancel,
    /// Where the time of its UDFs went.
    pub clock: Arc<StageClock>,
    /// Where its UDFs run.
    pub site: Site,
}

impl UdfEnv {
    /// An environment with `options`.
    pub fn new(options: UdfOptions) -> Arc<Self> {
        Self::timed(options, Arc::default())
    }

    /// An environment with `options` whose UDFs record their time in
    /// `clock` (a job's, shared by all its streams).
    pub fn timed(options: UdfOptions, clock: Arc<StageClock>) -> Arc<Self> {
        Self::cancelled_by(options, clock, Cancel::default())
    }

    /// The same as [`UdfEnv::timed`], stopped by `cancel`: a flag its
    /// owner sets where the stop happens (a job's cancel, a reader's
    /// stream dropped), not from a task that may wait for a thread behind
    /// the very UDFs it would stop.
    pub fn cancelled_by(options: UdfOptions, clock: Arc<StageClock>, cancel: Cancel) -> Arc<Self> {
        Arc::new(Self {
            options,
            errors: Arc::default(),
            cancel,
            clock,
            site: Site::default(),
        })
    }

    /// The same environment (options, bad samples, cancel, clock) for UDFs
    /// that run at `site`: a storage node's share of a query.
    pub fn at(&self, site: Site) -> Arc<Self> {
        Arc::new(Self {
            options: self.options,
            errors: Arc::clone(&self.errors),
            cancel: self.cancel.clone(),
            clock: Arc::clone(&self.clock),
            site,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parent_s_cancel_stops_its_children_and_not_the_other_way() {
        let job = Cancel::default();
        let (a, b) = (job.child(), job.child());
        let guard = a.on_drop();
        drop(guard);
        assert!(a.is_cancelled() && !b.is_cancelled() && !job.is_cancelled());
        assert!(b.check().is_ok());
        job.cancel();
        assert!(b.is_cancelled() && b.child().is_cancelled());
        assert_eq!(b.check().unwrap_err(), CANCELLED);
    }

    #[test]
    fn limits_name_the_one_exceeded() {
        let l = Limits::default();
        assert!(l.check("x", 10, 1, 30).is_ok());
        let e = l
            .check("image 100000x100000", 10_000_000_000, 1, 0)
            .unwrap_err();
        assert!(
            e.contains("max_pixels") && e.contains("100000x100000"),
            "{e}"
        );
        assert!(l.check("v", 1, 5000, 1).unwrap_err().contains("max_frames"));
        assert!(
            l.check("a", 1, 1, 2 << 30)
                .unwrap_err()
                .contains("max_decoded_bytes")
        );
    }

    #[test]
    fn policies_parse() {
        for p in ["skip", "null", "fail"] {
            assert_eq!(p.parse::<OnError>().unwrap().to_string(), p);
        }
        assert!("drop".parse::<OnError>().unwrap_err().contains("'drop'"));
    }
}
