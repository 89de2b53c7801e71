//! The stream of an epoch: a rank's positions `from..to`, delivered in
//! batches of `batch_size`, in the epoch's order.
//!
//! ```text
//!  the job's plan, placed once at submit, bound to the epoch's UDF environment
//!    (`placed`: its seed/epoch literals, bad-sample log, cancel; nothing planned)
//!  positions from..to ─► windows of whole batches, sized by bytes (the first one
//!    batch; then about WINDOW_BYTES of output and at most WINDOW_TIME of work each,
//!    at most WINDOW_MAX samples and a sixteenth of the stream)
//!    ─► per window: the rows the node's output cache holds (a deterministic job's,
//!       `outputs`) come from memory; for the rest, the rows each node reads (row
//!       ids + slots) ─► the placed plan, run (a random job's decode stages from
//!       the node's stage cache, `sluice_udfs::stage_cache`) ─► their rows into the cache
//!       (each node's rows a message down the stream's feed on it: `crate::feeds`)
//!       (IN_FLIGHT windows at once, each on the jobs' runtime; storage nodes split
//!        theirs over their cores: no barrier at a window's end)
//!    ─► in order (`InOrder`: a window done before an older one is held and the
//!       next one starts, IN_FLIGHT + HELD at most) ─► rows back at their slots ─► batches
//!    ─► the reader's channel (full: the windows stop, then the reads)
//!  the last window of a whole epoch issued (and a reader reading it) ─► the
//!    rank's next epoch begun for its reader (`ahead`: taken over by the request
//!    for it, else dropped; one epoch ahead, see `NextEpoch`)
//!  every window and batch feeds the job's per-stage statistics (samples made,
//!    link bytes, windows ready, the reader's channel, time blocked on the reader:
//!    see `stages`); the UDFs time themselves into the job's clock
//!  an auto job on separate machines: every window feeds the job's meter; a
//!    review that finds the plan contradicted places the window plan again,
//!    and the next windows of every stream of the job run the new placement
//!    (see `adapt`, `placed`)
//! ```
//!
//! Memory per reader is bounded by `IN_FLIGHT + HELD + 1` windows of about
//! `WINDOW_BYTES` each and the channel's `CHANNEL_BATCHES` batches,
//! whatever the size of a sample, and the windows of all readers together
//! by the node's [`super::WindowBudget`] (each reserves its expected
//! output bytes before it runs): a window's length follows the output
//! bytes per sample of the windows before it. A slow reader stops the
//! windows, which stops the reads at the devices. Nothing per window
//! depends on the size of the dataset: the rows are named by id, the plan
//! is the epoch's.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use datafusion::physical_plan::collect;
use futures::StreamExt;
use sluice_flight::{SLOT, StorageEndpoint};
use sluice_udfs::env::Cancel;
use sluice_udfs::{OnError, UdfEnv};
use tokio::sync::mpsc;

use super::Job;
use super::adapt::{GAIN, Meter, choice_of, observed_link};
use super::ahead::NextEpoch;
use super::error::JobError;
use super::in_order::InOrder;
use super::query::udf_options;
use super::rebatch::Rebatcher;
use super::run::{Delivery, Ready};
use super::window_rows::WindowRows;
use crate::remote::with_takes;

/// Output bytes a window aims at.
pub const WINDOW_BYTES: u64 = 32 << 20;
/// Samples a window holds at most (unless a batch is larger).
pub const WINDOW_MAX: u64 = 512;
/// Windows running at once per reader.
pub const IN_FLIGHT: usize = 3;
/// Windows a reader may have beyond [`IN_FLIGHT`], done before an older
/// one and waiting for it (see [`InOrder`]): the cores go on with later
/// windows while one is late.
pub const HELD: usize = 3;
/// Batches made ahead of the reader.
pub const CHANNEL_BATCHES: usize = 2;

/// The positions `from..to` of rank `rank`'s share of `epoch`.
#[derive(Debug, Clone, Copy)]
pub struct Span {
    /// The rank.
    pub rank: u64,
    /// The epoch.
    pub epoch: u64,
    /// The first position.
    pub from: u64,
    /// The position after the last.
    pub to: u64,
}

/// A window's task, aborted when the stream no longer wants it (the
/// reader left, the job was cancelled, an earlier window failed).
struct Abort<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for Abort<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Wall time a window aims at, at most: a re-plan, a cancel or a slower
/// link acts at the next window, so a window is never minutes of work.
pub const WINDOW_TIME: Duration = Duration::from_millis(500);

/// A window holds at most this share of its stream's positions: twice
/// the [`IN_FLIGHT`] + [`HELD`] windows asked for ahead, rounded up to a
/// power of two (1/16), so those never hold most of a short stream and a
/// re-plan (or a slower link than the last window saw) acts on the rest
/// of it. A window is a message down an open feed, so small windows of a
/// short stream cost little.
pub const WINDOW_SHARE: u64 = (2 * (IN_FLIGHT + HELD) as u64).next_power_of_two();

/// Samples the next window of a stream of `span` positions holds, for
/// batches of `batch`, when a sample's output takes `bytes_per_sample`
/// and a window took `ns_per_sample` of wall time per sample (0: not known
/// yet): about [`WINDOW_BYTES`] and at most [`WINDOW_TIME`], at most
/// [`WINDOW_MAX`] samples and a [`WINDOW_SHARE`]th of the span, in whole
/// batches, at least one.
pub fn window_len(batch: u64, bytes_per_sample: u64, ns_per_sample: u64, span: u64) -> u64 {
    let batch = batch.max(1);
    let fits = WINDOW_BYTES / bytes_per_sample.max(1);
    let in_time = match ns_per_sample {
        0 => u64::MAX,
        ns => WINDOW_TIME.as_nanos() as u64 / ns,
    };
    let share = span / WINDOW_SHARE;
    (fits.min(in_time).min(WINDOW_MAX).min(share) / batch).max(1) * batch
}

/// How a window waits for a storage node that cannot be reached: it runs
/// again after 0.25 s, then twice as long each time (at most 5 s), until
/// the job's `storage_wait_s` has passed since the first failure.
struct Retry {
    until: Option<std::time::Instant>,
    wait: Duration,
    pause: Duration,
}

impl Retry {
    fn new(wait: Duration) -> Self {
        Self {
            until: None,
            wait,
            pause: Duration::from_millis(250),
        }
    }

    /// Sleeps before the next attempt, or gives `e` back when the wait is
    /// over (or there is none).
    async fn after(&mut self, e: JobError) -> Result<(), JobError> {
        let now = std::time::Instant::now();
        let until = *self.until.get_or_insert(now + self.wait);
        if now + self.pause > until {
            return Err(e);
        }
        tracing::warn!("{e}; retrying the window in {:?}", self.pause);
        tokio::time::sleep(self.pause).await;
        self.pause = (self.pause * 2).min(Duration::from_secs(5));
        Ok(())
    }
}

impl Job {
    /// Runs the windows of `span` and sends their batches until the span
    /// ends or the reader leaves. A whole epoch's stream begins the next
    /// epoch when it issues its last window (see [`super::ahead`]).
    pub(super) async fn produce(
        self: &Arc<Self>,
        ready: &Arc<Ready>,
        span: Span,
        next: Arc<NextEpoch>,
        tx: &mpsc::Sender<Result<Delivery, JobError>>,
        cancel: Cancel,
    ) -> Result<(), JobError> {
        let Span {
            rank,
            epoch,
            from,
            to,
        } = span;
        let asked = std::time::Instant::now();
        let mut options = udf_options(self.spec(), epoch, self.session().limits());
        // A random job's decode stages are the same every epoch: the node's
        // stage cache keeps them (a deterministic job's whole rows are the
        // output cache's).
        options.cache_stages = !self.placed().same_every_epoch();
        let udfs = UdfEnv::cancelled_by(options, self.stage_stats().clock(), cancel);
        // However this stream ends (the reader left, the job was cancelled,
        // a window failed), the UDFs of its windows stop at their next row.
        let _stop = udfs.cancel.on_drop();
        // The job's plan, placed at submit (or since re-placed), bound to
        // this epoch: nothing is planned again.
        let plan = Arc::new(self.placed().for_stream(&udfs)?);
        tracing::debug!(job = %self.id(), rank, epoch, from, to,
            bound_ms = asked.elapsed().as_secs_f64() * 1e3, "a stream begins");
        let order = ready.order(epoch);
        let batch = self.spec().batch_size;
        // Output bytes per sample of the last window done (0: none yet).
        // The first window is one batch and reserves a whole window's
        // bytes; each later one's length and reservation follow from it.
        let per_sample = Arc::new(AtomicU64::new(0));
        // Wall time per sample of the last window done (0: none yet).
        let ns_per_sample = Arc::new(AtomicU64::new(0));
        let starts = futures::stream::unfold(from, {
            let per_sample = Arc::clone(&per_sample);
            let ns_per_sample = Arc::clone(&ns_per_sample);
            move |start| {
                let len = match per_sample.load(Ordering::Relaxed) {
                    0 => batch.max(1),
                    each => window_len(
                        batch,
                        each,
                        ns_per_sample.load(Ordering::Relaxed),
                        to - from,
                    ),
                };
                futures::future::ready((start < to).then(|| ((start, len), start + len)))
            }
        });
        let runtime = self.runtime().clone();
        let budget = self.session().window_budget().clone();
        let storage_wait = Duration::from_secs_f64(self.spec().storage_wait_s);
        let held = Arc::clone(ready);
        let estimate = Arc::clone(&per_sample);
        // Each new window runs the job's plan as it is then: a re-plan
        // replaces it, windows in flight finish under the one they began.
        let plan_of = Arc::clone(&plan);
        // Windows done and not yet taken by the loop below.
        let ready_windows = Arc::new(AtomicU64::new(0));
        let done = Arc::clone(&ready_windows);
        let mut next_epoch = (from == 0 && to == ready.layout.per_rank())
            .then(|| (Arc::clone(self), Arc::clone(ready)));
        // A deterministic job's rows are kept for its later epochs (and
        // other jobs of the same identity): see `outputs`.
        let outputs = self.output_cache(&ready.index);
        let schema = Arc::clone(self.rows_schema());
        let windows = starts.map(move |(start, len)| {
            let stop = (start + len).min(to);
            if stop >= to
                && let Some((job, ready)) = next_epoch.take()
                && next.mark(NextEpoch::ISSUED)
            {
                job.read_ahead(&ready, rank, epoch + 1);
            }
            let samples = held.layout.rank_samples(&order, rank, start, stop);
            let plan = plan_of.plan();
            let task = Arc::clone(plan_of.task());
            let (runtime, budget, done) = (runtime.clone(), budget.clone(), Arc::clone(&done));
            let (ready, outputs, schema) =
                (Arc::clone(&held), outputs.clone(), Arc::clone(&schema));
            let per_sample = estimate.load(Ordering::Relaxed);
            async move {
                let plan = plan?;
                // The rows the cache holds; the plan runs for the rest.
                let (mut rows, keys) = match &outputs {
                    Some((cache, id)) => {
                        let keys = ready.index.keys(&samples);
                        (WindowRows::from_cache(cache.lookup(*id, &keys)), keys)
                    }
                    None => (
                        WindowRows::from_cache(vec![None; samples.len()]),
                        Vec::new(),
                    ),
                };
                let need: Vec<usize> = (0..samples.len())
                    .filter(|&i| rows.at[i].is_none())
                    .collect();
                // Room among all streams' windows first, then the work.
                let bytes = match per_sample {
                    0 => WINDOW_BYTES,
                    b => b.saturating_mul(need.len() as u64),
                };
                let room = budget.reserve(bytes).await;
                let began = std::time::Instant::now();
                if !need.is_empty() {
                    let run: Vec<u64> = need.iter().map(|&i| samples[i]).collect();
                    let takes = ready.index.takes(&run);
                    let mut retry = Retry::new(storage_wait);
                    let batches = loop {
                        let (plan, takes, task) =
                            (Arc::clone(&plan), takes.clone(), Arc::clone(&task));
                        let mut run = Abort(runtime.spawn(async move {
                            let plan = with_takes(plan, &takes)?;
                            collect(plan, task).await
                        }));
                        let attempt = (&mut run.0)
                            .await
                            .map_err(|e| JobError::Internal(e.to_string()))?
                            .map_err(|e| JobError::running(&e));
                        match attempt {
                            Err(e @ JobError::Unavailable { .. }) => retry.after(e).await?,
                            other => break other?,
                        }
                    };
                    let made = WindowRows::from_plan(&batches, &schema, SLOT, need.len())?;
                    if let Some((cache, id)) = &outputs {
                        // Each batch's bytes per row are measured once,
                        // by `rows`, before the cache's lock is taken.
                        let rows = made
                            .rows()
                            .map(|(slot, row, len)| (keys[need[slot]], row, len));
                        cache.insert(*id, rows);
                    }
                    rows.fill(&need, made);
                }
                done.fetch_add(1, Ordering::Relaxed);
                Ok::<_, JobError>((start, samples, rows, room, began.elapsed()))
            }
        });
        let mut windows = InOrder::new(Box::pin(windows), IN_FLIGHT, HELD);
        let adapting = self.adaptive().may_move(self.offload());
        let nodes: Vec<_> = self.pins().iter().map(|(e, _)| Arc::clone(e)).collect();
        let mut meter = if adapting {
            Some(Meter::start(&nodes).await)
        } else {
            None
        };
        let mut made = 0u64;
        let mut rebatch = Rebatcher::new(
            Arc::clone(self.schema()),
            self.finishes().cloned(),
            batch as usize,
            from,
        );
        let mut reported = 0;
        // Bad samples met since the last batch sent (see `Delivery::bad`).
        let mut unsent_bad = None;
        let mut missing_total = 0u64;
        let stats = self.stage_stats();
        let mut last_window = std::time::Instant::now();
        while let Some(w) = windows.next().await {
            // `room` is given back when the last batch with a row of this
            // window is gone (sent, or dropped with its reader).
            let (start, samples, rows, room, took) = w?;
            tracing::trace!(job = %self.id(), rank, epoch, start, samples = samples.len(),
                took_ms = took.as_secs_f64() * 1e3, since_asked_ms = asked.elapsed().as_secs_f64() * 1e3,
                "a window is done");
            let ready_now = ready_windows.fetch_sub(1, Ordering::Relaxed);
            let ns = took.as_nanos() as u64 / (samples.len() as u64).max(1);
            ns_per_sample.store(ns.max(1), Ordering::Relaxed);
            let count = rows.len().max(1) as u64;
            per_sample.store((rows.bytes() / count).max(1), Ordering::Relaxed);
            let (total, bad) = udfs.errors.snapshot();
            if total > reported {
                // Counted when the next batch reaches a reader.
                let fresh = bad.into_iter().skip(reported as usize);
                let (count, kept) = unsent_bad.get_or_insert_with(|| (0, Vec::new()));
                *count += total - reported;
                kept.extend(fresh);
                reported = total;
            }
            let link = plan.tally().bytes.swap(0, Ordering::Relaxed);
            self.record_link(link);
            made += samples.len() as u64;
            stats.window(samples.len() as u64, link, ready_now, last_window.elapsed());
            if let Some(m) = meter.as_mut() {
                m.window(samples.len() as u64, link);
                if m.due() {
                    self.review(m, &nodes, made).await;
                }
            }
            let missing = rebatch.add(rows, start, Arc::new(room));
            missing_total += missing.len() as u64;
            self.check_missing(&missing, &samples, start, missing_total, total)?;
            let stop = start + samples.len() as u64;
            while let Some(mut cut) = rebatch.next(stop >= to)? {
                cut.bad = unsent_bad.take();
                let waiting = std::time::Instant::now();
                let queued = (CHANNEL_BATCHES - tx.capacity().min(CHANNEL_BATCHES)) as u64;
                // While the reader takes its time (a trainer's encoding
                // runs as it receives), the windows go on: those done are
                // held and the next ones start.
                let sent = tokio::select! {
                    biased;
                    sent = tx.send(Ok(cut)) => sent,
                    never = windows.keep_running() => match never {},
                };
                if sent.is_err() {
                    return Ok(());
                }
                stats.sent(queued, waiting.elapsed());
                if let Some(m) = meter.as_mut() {
                    m.waited(waiting.elapsed());
                }
            }
            last_window = std::time::Instant::now();
        }
        if let Some(mut cut) = rebatch.finish(to)? {
            cut.bad = unsent_bad.take();
            let _closed = tx.send(Ok(cut)).await;
        }
        // Met after the last batch (its samples all skipped): the reader
        // has had every batch of the span.
        if let Some((count, kept)) = unsent_bad {
            self.record_bad(count, kept);
        }
        Ok(())
    }

    /// Reviews the plan with what `meter` measured: under an observed
    /// link that contradicts the plan's, places the job's window plan
    /// again, and makes it the job's plan (every stream's next windows run
    /// it) if it promises [`GAIN`] × the observed rate. A failed re-plan
    /// keeps the plan that runs.
    async fn review(&self, meter: &mut Meter, nodes: &[Arc<dyn StorageEndpoint>], made: u64) {
        let cores = self.placed().prepared().resources().compute_cores;
        let observed = meter.review(nodes, cores).await;
        if !self.adaptive().observed(&observed) {
            return;
        }
        let Some(link) = observed_link(&observed, self.adaptive().assumed_link()) else {
            return;
        };
        let placed = match self.placed().place_under(link).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(
                    "job {}: re-planning failed, keeping the plan: {e}",
                    self.id()
                );
                return;
            }
        };
        let before = choice_of(&self.explanation());
        let after = choice_of(&placed.explanation);
        let promised = placed
            .explanation
            .pipelines
            .first()
            .map_or(0.0, |p| p.rates.per_s);
        if after == before || promised < GAIN * observed.samples_per_s {
            return;
        }
        tracing::info!(
            "job {}: {} bound at {:.0} samples/s ({:.0} B/s over the link): {before} -> {after}",
            self.id(),
            observed.bottleneck,
            observed.samples_per_s,
            observed.link_bytes_per_s
        );
        self.placed().replace(placed.plan);
        self.adaptive().moved(placed.explanation, observed, made);
    }

    /// A sample with no row is one the error policy skipped, and named;
    /// any other is lost, and the stream fails naming it rather than end
    /// short. Under `skip`, no more rows may be missing than samples were
    /// skipped.
    fn check_missing(
        &self,
        missing: &[u32],
        samples: &[u64],
        start: u64,
        missing_total: u64,
        skipped_total: u64,
    ) -> Result<(), JobError> {
        let Some(&first) = missing.first() else {
            return Ok(());
        };
        let skipping = self.spec().on_error == OnError::Skip;
        if skipping && missing_total <= skipped_total {
            return Ok(());
        }
        let position = start + u64::from(first);
        let at = self
            .locate(samples[first as usize])
            .map_or_else(String::new, |(node, version, row)| {
                format!(" (row {row} of version {version} on {node})")
            });
        Err(JobError::Internal(format!(
            "{} sample(s) of this window came back from no storage node, the first at \
             position {position}{at}",
            missing.len()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_hold_whole_batches_of_about_window_bytes() {
        let long = 1 << 20;
        // Tiny samples: the most samples a window holds.
        assert_eq!(window_len(64, 100, 0, long), WINDOW_MAX);
        assert_eq!(window_len(100, 100, 0, long), 500);
        // 786 KB tensors: 42 fit, in batches of 16.
        assert_eq!(window_len(16, 786_432, 0, long), 32);
        // A batch over the budget is still one batch.
        assert_eq!(window_len(256, 1 << 20, 0, long), 256);
        assert_eq!(window_len(0, 0, 0, long), WINDOW_MAX);
        // 10 ms a sample: 50 fit in half a second, in whole batches of 16.
        assert_eq!(window_len(16, 100, 10_000_000, long), 48);
        // A second a sample: still one batch.
        assert_eq!(window_len(16, 100, 1_000_000_000, long), 16);
        // A stream of 480: a sixteenth of it, in whole batches of 8.
        assert_eq!(window_len(8, 100, 0, 480), 24);
        // Shorter than sixteen batches: one batch a window.
        assert_eq!(window_len(8, 100, 0, 80), 8);
    }
}
