//! The stream of an epoch: a rank's positions `from..to`, delivered in
//! batches of `batch_size`, in the epoch's order, as one staged pipeline
//! whose whole shape is [`Job::produce`]:
//!
//! ```text
//!  the job's plan, placed once at submit, bound to the stream's epoch
//!    (`crate::job::placed`: its seed/epoch literals, bad-sample log, cancel)
//!  windows   positions from..to ─► windows of whole batches, sized by bytes
//!            and the stream's pace (`windows`, `pace`; the last one cut
//!            begins the next epoch of a whole-epoch stream:
//!            `crate::job::ahead`)
//!  fetch     per window: output cache ─► window budget ─► the plan, run on
//!            the jobs' runtime over the rows' ids ─► retry a lost node
//!            (`fetch`)
//!  in order  WINDOWS_RUNNING windows at once, WINDOWS_WAITING more done
//!            early and waiting (`crate::job::in_order`)
//!  rebatch   rows back at their slots ─► batches; the finish stage
//!            (normalize) runs as they are cut (`crate::job::rebatch`)
//!  sink      the reader's channel (`deliver`): full, the windows stop,
//!            then the reads
//! ```
//!
//! Sizing, statistics, re-planning and bad samples are the job's
//! [`observe::Observe`]r's, told at each window and batch, not the
//! stages'. Every knob is in [`options`], with its reason. Nothing per
//! window depends on the size of the dataset: rows are named by id, the
//! plan is the epoch's.

pub mod deliver;
pub mod fetch;
pub mod observe;
pub mod options;
pub mod pace;
pub mod windows;

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use futures::StreamExt;
use sluice_udfs::OnError;
use sluice_udfs::UdfEnv;
use sluice_udfs::env::Cancel;

use self::deliver::{Sink, deliver};
use self::fetch::Fetch;
use self::observe::JobObserver;
use self::options::{WINDOWS_RUNNING, WINDOWS_WAITING};
use self::windows::{Sizing, Span, windows};
use super::Job;
use super::ahead::NextEpoch;
use super::in_order::InOrder;
use super::placed::StreamPlan;
use super::query::udf_options;
use super::rebatch::Rebatcher;
use super::run::Ready;
use crate::error::JobError;
use crate::replicas::index::SampleIndex;
use crate::session::output_cache::OutputCache;

impl Job {
    /// Runs the windows of `span` and hands their batches to `sink` until
    /// the span ends or the reader leaves. A whole epoch's stream begins
    /// the next epoch when it cuts its last window (`next`, see
    /// [`super::ahead`]); `cancel` stops its UDFs.
    pub(super) async fn produce(
        self: &Arc<Self>,
        ready: &Arc<Ready>,
        span: Span,
        next: Arc<NextEpoch>,
        sink: &impl Sink,
        cancel: Cancel,
    ) -> Result<(), JobError> {
        let asked = std::time::Instant::now();
        let plan = self.bind(span.epoch, cancel)?;
        // However this stream ends (the reader left, the job was
        // cancelled, a window failed), its UDFs stop at their next row.
        let _stop = plan.udfs().cancel.on_drop();
        tracing::debug!(job = %self.id(), rank = span.rank, epoch = span.epoch,
            from = span.from, to = span.to,
            bound_ms = asked.elapsed().as_secs_f64() * 1e3, "a stream begins");
        let batch = self.spec().batch_size;
        let sizing = Sizing::default();
        let fetched = Arc::new(AtomicU64::new(0));
        let fetch = Fetch {
            ready: Arc::clone(ready),
            order: ready.order(span.epoch),
            layout: ready.layout_of(span.epoch),
            rank: span.rank,
            worker: span.worker,
            plan: Arc::clone(&plan),
            budget: self.session().window_budget().clone(),
            outputs: self.output_cache(&ready.index),
            schema: Arc::clone(self.rows_schema()),
            storage_wait: Duration::from_secs_f64(self.spec().storage_wait_s),
            sizing: sizing.clone(),
            fetched: Arc::clone(&fetched),
        };
        let last = self.next_epoch_after(ready, span, next);
        let cut = windows(span, batch, sizing.clone(), last);
        let windows = InOrder::new(
            cut.map(move |(a, b)| fetch.window(a, b)),
            WINDOWS_RUNNING,
            WINDOWS_WAITING,
        );
        let rebatch = Rebatcher::new(
            Arc::clone(self.schema()),
            self.finishes().cloned(),
            batch as usize,
            span.from,
        );
        let observer = JobObserver::start(self, &plan, sizing, fetched).await;
        deliver(windows, rebatch, span.to, observer, sink).await
    }

    /// The job's plan, placed at submit (or since re-placed), bound to
    /// `epoch` and to UDFs `cancel` stops: nothing is planned again.
    fn bind(&self, epoch: u64, cancel: Cancel) -> Result<Arc<StreamPlan>, JobError> {
        let mut options = udf_options(self.spec(), epoch, self.session().limits());
        // A random job's decode stages are the same every epoch: the
        // node's stage cache keeps them (a deterministic job's whole rows
        // are the output cache's).
        options.cache_stages = !self.placed().same_every_epoch();
        let udfs = UdfEnv::cancelled_by(options, self.stage_stats().clock(), cancel);
        Ok(Arc::new(self.placed().for_stream(&udfs)?))
    }

    /// What a stream of `span` does when it cuts its last window: a whole
    /// epoch's begins the rank's next epoch, once (`next`).
    fn next_epoch_after(
        self: &Arc<Self>,
        ready: &Arc<Ready>,
        span: Span,
        next: Arc<NextEpoch>,
    ) -> Option<Box<dyn FnOnce() + Send>> {
        if !ready.whole_epoch(&span) {
            return None;
        }
        let (job, ready) = (Arc::clone(self), Arc::clone(ready));
        Some(Box::new(move || {
            if next.mark(NextEpoch::ISSUED) {
                job.read_ahead(&ready, span.rank, span.epoch + 1);
            }
        }))
    }
}

impl Job {
    /// The node's output cache and this job's identity in it, when the
    /// job qualifies (see the module docs) and the cache is enabled.
    /// `index` is the job's: its pins name the versions its keys are rows of.
    fn output_cache(&self, index: &SampleIndex) -> Option<(Arc<OutputCache>, u64)> {
        let cache = self.session().output_cache();
        if !cache.enabled()
            || self.spec().on_error == OnError::Null
            || !self.placed().same_every_epoch()
        {
            return None;
        }
        let pins: Vec<String> = index
            .pins()
            .iter()
            .map(|p| format!("{}@{}", p.node, p.version))
            .collect();
        let identity = format!(
            "{}\n{:?}\n{:?}\n{}",
            self.sql(),
            self.spec().on_error,
            self.session().limits(),
            pins.join(",")
        );
        let id = cache.identity(&identity);
        Some((Arc::clone(cache), id))
    }
}
