//! `/metrics`: the server's readings in the Prometheus text format 0.0.4,
//! written by `prometheus-client` (the format, label escaping and the
//! `_total` suffix of counters are the library's).
//!
//! Every reading is taken when the scrape arrives ([`Readings::take`]) and
//! encoded by a [`Collector`]: nothing is kept between scrapes, so a
//! forgotten job's series simply stops. What is exported:
//! - the server: uptime, the device's free bytes, the node-wide object
//!   cache, checkpoint uploads, the output and stage caches, shared memory;
//! - jobs by state, and per job: samples delivered and skipped, bytes per
//!   tier, progress;
//! - per job with statistics: each stage's rate, time per sample and busy
//!   share, each tier's busy share, each queue's occupancy, and the
//!   bottleneck (a gauge of 1 labelled with its tier and stage).

use std::fmt::Error;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use sluice_compute::job::JobStatus;
use sluice_compute::session::output_cache::OutputCacheStats;
use sluice_storage::cache::CacheStats;
use sluice_udfs::stage_cache::StageCacheStats;

use super::AppState;

/// Labels of one series.
type Labels = Vec<(&'static str, String)>;

/// What the server reads at one scrape.
#[derive(Debug)]
pub struct Readings {
    up_s: f64,
    device_free: Option<u64>,
    cache: Option<CacheStats>,
    uploads: Option<u64>,
    regions: Option<u64>,
    outputs: OutputCacheStats,
    stages: StageCacheStats,
    shm: u64,
    jobs: Vec<(&'static str, usize)>,
    statuses: Vec<JobStatus>,
}

impl Readings {
    /// The readings of the server `s` now.
    pub fn take(s: &AppState) -> Self {
        Self {
            up_s: s.started.elapsed().as_secs_f64(),
            device_free: s.ingest_store.as_ref().map(|store| {
                let space = store.space();
                space.free_chunks * space.chunk_size
            }),
            cache: s.ingest_store.as_ref().map(|store| store.cache().stats()),
            uploads: s.checkpoints.as_ref().map(|c| c.pending_uploads() as u64),
            regions: s.checkpoints.as_ref().map(|c| c.lent_regions() as u64),
            outputs: s.jobs.session().output_cache().stats(),
            stages: sluice_udfs::stage_cache::StageCache::global().stats(),
            shm: sluice_shm::segment::mapped_bytes(),
            jobs: s.jobs.counts().into_iter().collect(),
            statuses: s.jobs.list().iter().map(|j| j.status()).collect(),
        }
    }

    /// The readings in the Prometheus text format.
    pub fn text(self) -> Result<String, Error> {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self));
        let mut out = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)?;
        Ok(out)
    }

    /// The server's own readings.
    fn server(&self, e: &mut DescriptorEncoder<'_>) -> Result<(), Error> {
        gauge(
            e,
            "sluice_up_seconds",
            "Seconds since the server started.",
            self.up_s,
        )?;
        if let Some(free) = self.device_free {
            let help = "Device bytes in chunks no dataset, checkpoint or upload holds.";
            gauge(e, "sluice_device_free_bytes", help, free)?;
        }
        if let Some(c) = &self.cache {
            let what = "the node-wide object cache";
            cache(
                e,
                "sluice_cache",
                [
                    (
                        "budget_bytes",
                        &format!("Memory {what} may hold."),
                        c.budget,
                    ),
                    ("bytes", &format!("Memory {what} holds."), c.bytes),
                    ("objects", &format!("Objects in {what}."), c.objects),
                ],
                [
                    (
                        "hits",
                        "Object reads served from the node-wide cache.",
                        c.hits,
                    ),
                    ("misses", "Object reads that went to the device.", c.misses),
                    (
                        "evictions",
                        "Objects evicted from the node-wide cache.",
                        c.evictions,
                    ),
                ],
            )?;
        }
        if let Some(n) = self.uploads {
            let help = "Checkpoint uploads begun and not yet committed or aborted.";
            gauge(e, "sluice_checkpoint_uploads", help, n)?;
        }
        if let Some(n) = self.regions {
            let help = "Shared-memory regions lent to checkpoint writers and readers on this host.";
            gauge(e, "sluice_checkpoint_regions", help, n)?;
        }
        self.job_caches(e)?;
        let help = "Bytes of the shared-memory segments open to trainers on this host.";
        gauge(e, "sluice_shm_mapped_bytes", help, self.shm)
    }

    /// The caches jobs read through: deterministic jobs' output rows, and
    /// random jobs' decode stages.
    fn job_caches(&self, e: &mut DescriptorEncoder<'_>) -> Result<(), Error> {
        let o = &self.outputs;
        cache(
            e,
            "sluice_output_cache",
            [
                (
                    "budget_bytes",
                    "Memory the cache of deterministic jobs' output rows may hold.",
                    o.budget,
                ),
                (
                    "bytes",
                    "Memory the output rows in the cache count.",
                    o.bytes,
                ),
                ("rows", "Output rows in the cache.", o.rows),
            ],
            [
                (
                    "hits",
                    "Samples of deterministic jobs served from the output cache.",
                    o.hits,
                ),
                (
                    "misses",
                    "Samples of deterministic jobs computed (not in the output cache).",
                    o.misses,
                ),
                (
                    "evictions",
                    "Rows evicted from the output cache.",
                    o.evictions,
                ),
            ],
        )?;
        let st = &self.stages;
        cache(
            e,
            "sluice_stage_cache",
            [
                (
                    "budget_bytes",
                    "Memory the cache of random jobs' decode stages may hold.",
                    st.budget,
                ),
                (
                    "bytes",
                    "Memory the decoded values in the stage cache count.",
                    st.bytes,
                ),
                ("values", "Decoded values in the stage cache.", st.values),
            ],
            [
                ("hits", "Decodes served from the stage cache.", st.hits),
                (
                    "misses",
                    "Decodes computed (not in the stage cache).",
                    st.misses,
                ),
                (
                    "evictions",
                    "Decoded values evicted from the stage cache.",
                    st.evictions,
                ),
            ],
        )?;
        Ok(())
    }

    /// Jobs by state, and each job's delivery.
    fn jobs(&self, e: &mut DescriptorEncoder<'_>) -> Result<(), Error> {
        let by_state = self
            .jobs
            .iter()
            .map(|(state, n)| (vec![("state", state.to_string())], *n as u64));
        family(
            e,
            "sluice_jobs",
            "Jobs by state.",
            MetricType::Gauge,
            by_state,
        )?;
        let job = |st: &JobStatus| vec![("job", st.id.clone())];
        let each = |f: fn(&JobStatus) -> u64| self.statuses.iter().map(move |st| (job(st), f(st)));
        let help = "Samples delivered to trainers.";
        let name = "sluice_job_delivered_samples";
        family(e, name, help, MetricType::Counter, each(|st| st.delivered))?;
        let help = "Samples skipped or nulled.";
        let name = "sluice_job_skipped_samples";
        family(e, name, help, MetricType::Counter, each(|st| st.skipped))?;
        let bytes = self.statuses.iter().flat_map(|st| {
            [
                ("link", st.bytes.link),
                ("trainer", st.bytes.trainer),
                ("shm", st.bytes.shm),
            ]
            .map(|(tier, b)| {
                let mut l = job(st);
                l.push(("tier", tier.to_string()));
                (l, b)
            })
        });
        let help = "Bytes moved, by tier (link: storage to compute; trainer: Flight to \
                    trainers; shm: shared memory to trainers on this host).";
        family(e, "sluice_job_bytes", help, MetricType::Counter, bytes)?;
        let help = "Fraction of the job's positions delivered.";
        let name = "sluice_job_progress_ratio";
        let progress = self.statuses.iter().map(|st| (job(st), st.progress));
        family(e, name, help, MetricType::Gauge, progress)
    }

    /// The per-stage statistics of the jobs that have any.
    fn stages(&self, e: &mut DescriptorEncoder<'_>) -> Result<(), Error> {
        let viewed = || {
            self.statuses
                .iter()
                .filter_map(|st| st.stages.as_ref().map(|v| (st.id.as_str(), v)))
        };
        let stage = |job: &str, s: &sluice_compute::job::stages::StageView| -> Labels {
            vec![
                ("job", job.to_string()),
                ("tier", s.tier.clone()),
                ("node", s.node.clone()),
                ("udf", s.udf.clone()),
            ]
        };
        let rows = viewed()
            .flat_map(|(j, v)| v.stages.iter().map(move |s| (stage(j, s), s.samples_per_s)));
        let help = "Samples a stage evaluated per second, by job, tier, node and UDF.";
        gauges(e, "sluice_job_stage_samples_per_second", help, rows)?;
        let rows = viewed().flat_map(|(j, v)| {
            v.stages.iter().flat_map(move |s| {
                [("mean", s.mean_ms), ("0.9", s.p90_ms)].map(|(q, ms)| {
                    let mut l = stage(j, s);
                    l.push(("quantile", q.to_string()));
                    (l, ms / 1e3)
                })
            })
        });
        let help = "Time per sample of a stage (quantile mean or 0.9).";
        gauges(e, "sluice_job_stage_seconds_per_sample", help, rows)?;
        let rows = viewed().flat_map(|(j, v)| v.stages.iter().map(move |s| (stage(j, s), s.busy)));
        let help = "Share of its tier's cores a stage kept busy.";
        gauges(e, "sluice_job_stage_busy_ratio", help, rows)?;
        let rows = viewed().flat_map(|(j, v)| {
            v.tiers.iter().filter_map(move |t| {
                t.busy
                    .map(|b| (vec![("job", j.to_string()), ("tier", t.tier.clone())], b))
            })
        });
        let help = "Share of a tier's capacity in use (storage, link, compute, cpu, trainer).";
        gauges(e, "sluice_job_tier_busy_ratio", help, rows)?;
        let rows = viewed().flat_map(|(j, v)| {
            v.queues.iter().map(move |q| {
                (
                    vec![("job", j.to_string()), ("queue", q.queue.clone())],
                    q.mean,
                )
            })
        });
        let help = "Mean occupancy of a buffer between stages (windows, reader).";
        gauges(e, "sluice_job_queue_occupancy", help, rows)?;
        let rows = viewed().filter_map(|(j, v)| {
            v.bottleneck.as_ref().map(|b| {
                let stage = b.stage.clone().unwrap_or_default();
                let labels = vec![
                    ("job", j.to_string()),
                    ("tier", b.tier.clone()),
                    ("stage", stage),
                ];
                (labels, 1u64)
            })
        });
        let help = "1 for the tier (and stage) holding the job back.";
        family(e, "sluice_job_bottleneck", help, MetricType::Gauge, rows)
    }
}

impl Collector for Readings {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> Result<(), Error> {
        self.server(&mut e)?;
        self.jobs(&mut e)?;
        self.stages(&mut e)
    }
}

/// One unlabelled gauge.
fn gauge<N>(e: &mut DescriptorEncoder<'_>, name: &str, help: &str, value: N) -> Result<(), Error>
where
    ConstGauge<N>: EncodeMetric,
{
    ConstGauge::new(value).encode(e.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

/// A cache's gauges and counters (`(suffix, help, value)` each) under
/// `prefix`.
fn cache(
    e: &mut DescriptorEncoder<'_>,
    prefix: &str,
    gauges: [(&str, &str, u64); 3],
    counters: [(&str, &str, u64); 3],
) -> Result<(), Error> {
    for (suffix, help, value) in gauges {
        gauge(e, &format!("{prefix}_{suffix}"), help, value)?;
    }
    for (suffix, help, value) in counters {
        counter(e, &format!("{prefix}_{suffix}"), help, value)?;
    }
    Ok(())
}

/// One unlabelled counter (`name` without its `_total`).
fn counter(e: &mut DescriptorEncoder<'_>, name: &str, help: &str, value: u64) -> Result<(), Error> {
    ConstCounter::new(value).encode(e.encode_descriptor(name, help, None, MetricType::Counter)?)
}

/// A labelled family of gauges.
fn gauges(
    e: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: impl Iterator<Item = (Labels, f64)>,
) -> Result<(), Error> {
    family(e, name, help, MetricType::Gauge, rows)
}

/// A labelled family of `kind` (gauges, or counters named without their
/// `_total`), one series per row.
fn family<N>(
    e: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    kind: MetricType,
    rows: impl Iterator<Item = (Labels, N)>,
) -> Result<(), Error>
where
    ConstGauge<N>: EncodeMetric,
    ConstCounter<N>: EncodeMetric,
{
    let mut m = e.encode_descriptor(name, help, None, kind)?;
    for (labels, value) in rows {
        match kind {
            MetricType::Counter => ConstCounter::new(value).encode(m.encode_family(&labels)?)?,
            _ => ConstGauge::new(value).encode(m.encode_family(&labels)?)?,
        }
    }
    Ok(())
}
