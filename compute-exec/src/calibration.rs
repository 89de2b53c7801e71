//! Calibration on the job's own data, the compute side's part: the
//! planner's probes (each pipeline's storage fragment at every cut, over a
//! sample of the dataset) are timed on the storage nodes holding the
//! dataset, and the measured costs replace the profiles' for that plan.
//!
//! ```text
//!  Planner::probes(plan) ─► per cut: physical fragment (one partition)
//!     ─► StorageEndpoint::time on every node holding the dataset
//!        (in process: timed here; remote: the `time_fragment` action)
//!        with the time inside each UDF's calls
//!     ─► Calibration::Measured { storage CPU per object per cut: the
//!        read, plus each stage's own time (calibrate::from_stages) }
//!        or Calibration::Fallback { why } — never an error of the query
//! ```
//!
//! Results are kept per pipeline, dataset size and node set, so a job's
//! epochs and repeated EXPLAINs time a pipeline once. Samples are timed
//! under the `skip` policy: a bad object costs what it costs and does not
//! end the calibration; a sample of nothing but bad objects is a fallback
//! that names the first of them.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::execution::{SessionState, SessionStateBuilder};
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::ExecutionPlan;
use sluice_base::BadSample;
use sluice_flight::StorageEndpoint;
use sluice_planner::{Calibration, CalibrationOptions, CutTiming, DatasetStats, Planner, Probes};
use sluice_udfs::{OnError, UdfEnv, UdfOptions};
use tokio::sync::Mutex;

/// Calibrations already made, by pipeline, dataset size and nodes.
#[derive(Debug, Default)]
pub struct CalibrationCache {
    made: Mutex<HashMap<String, Calibration>>,
}

/// Calibrates every pipeline of `plan`: measured where the nodes answer,
/// a named fallback where they cannot.
pub async fn calibrate(
    planner: &Planner,
    plan: &LogicalPlan,
    holders: &HashMap<String, Vec<Arc<dyn StorageEndpoint>>>,
    state: &SessionState,
    options: &UdfOptions,
    settings: CalibrationOptions,
    cache: &CalibrationCache,
) -> HashMap<String, Calibration> {
    let probes = match planner.probes(plan, settings.sample) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!("calibration: cannot make the probes: {e}");
            return HashMap::new();
        }
    };
    let mut out = HashMap::new();
    for probe in probes {
        let nodes = holders.get(&probe.dataset).cloned().unwrap_or_default();
        let stats = planner.stats.get(&probe.dataset);
        let cached_as = cache_key(&probe.key, stats, &nodes);
        if let Some(c) = cache.made.lock().await.get(&cached_as) {
            out.insert(probe.key, c.clone());
            continue;
        }
        let c = time_probe(&probe, &nodes, state, options, settings).await;
        if let Calibration::Fallback { reason } = &c {
            tracing::warn!("calibration of {}: {reason}", probe.key);
        }
        cache.made.lock().await.insert(cached_as, c.clone());
        out.insert(probe.key, c);
    }
    out
}

fn cache_key(
    key: &str,
    stats: Option<&DatasetStats>,
    nodes: &[Arc<dyn StorageEndpoint>],
) -> String {
    let (samples, bytes) = stats.map_or((0, 0), |s| (s.samples, s.bytes));
    let names: Vec<&str> = nodes.iter().map(|n| n.name()).collect();
    format!(
        "{key} | {samples} samples, {bytes} bytes | {}",
        names.join(",")
    )
}

/// Times each cut's fragment on every node; the first failure is the
/// fallback's reason.
async fn time_probe(
    probe: &Probes,
    nodes: &[Arc<dyn StorageEndpoint>],
    state: &SessionState,
    options: &UdfOptions,
    settings: CalibrationOptions,
) -> Calibration {
    match measure(probe, nodes, state, options, settings).await {
        Ok(cuts) => Calibration::Measured {
            cuts,
            nodes: nodes.iter().map(|n| n.name().to_string()).collect(),
        },
        Err(reason) => Calibration::Fallback { reason },
    }
}

/// [`time_probe`]'s timings of each cut, or why there are none.
async fn measure(
    probe: &Probes,
    nodes: &[Arc<dyn StorageEndpoint>],
    state: &SessionState,
    options: &UdfOptions,
    settings: CalibrationOptions,
) -> Result<Vec<CutTiming>, String> {
    if nodes.is_empty() {
        return Err("no storage node holds the dataset".into());
    }
    let timer = Timer {
        nodes,
        options: UdfOptions {
            on_error: OnError::Skip,
            ..*options
        },
        budget: settings.budget,
    };
    // What a run costs on each node before its first object.
    let empty = single_partition(&probe.empty, state)
        .await
        .map_err(|e| format!("cannot plan the empty fragment: {e}"))?;
    let overhead = timer.overheads(&empty).await?;
    let mut cuts = Vec::with_capacity(probe.fragments.len());
    let mut udf_ns = Vec::with_capacity(probe.fragments.len());
    let (mut deepest_rows, mut deepest_bad) = (0, 0);
    let mut first_bad = None;
    for (k, fragment) in probe.fragments.iter().enumerate() {
        let physical = single_partition(fragment, state)
            .await
            .map_err(|e| format!("cannot plan cut {k}'s fragment: {e}"))?;
        let (cut, times, bad) = timer.cut(k, &physical, &overhead, &mut first_bad).await?;
        if cut.objects == 0 {
            return Err(format!("cut {k}'s sample read no object"));
        }
        (deepest_rows, deepest_bad) = (cut.objects, bad);
        cuts.push(cut);
        udf_ns.push(times);
    }
    if deepest_bad >= deepest_rows {
        let example = first_bad.map_or(String::new(), |b| {
            format!(" (the first, {}: {}: {})", b.key, b.udf, b.reason)
        });
        return Err(format!(
            "every sampled object was a bad sample{example}; nothing to time the stages on"
        ));
    }
    // Each stage at its own time where the levels can be told apart.
    Ok(sluice_planner::calibrate::from_stages(&cuts, &udf_ns, &probe.stages).unwrap_or(cuts))
}

/// Runs fragments on the storage nodes under the calibration's options.
struct Timer<'a> {
    nodes: &'a [Arc<dyn StorageEndpoint>],
    options: UdfOptions,
    budget: std::time::Duration,
}

impl Timer<'_> {
    /// The CPU time of `empty` (a fragment over no object) on each node.
    async fn overheads(&self, empty: &Arc<dyn ExecutionPlan>) -> Result<Vec<u64>, String> {
        let mut overhead = Vec::with_capacity(self.nodes.len());
        for node in self.nodes {
            let udfs = UdfEnv::new(self.options);
            match node.time(Arc::clone(empty), udfs, self.budget).await {
                Ok(t) => overhead.push(t.cpu_ns),
                Err(e) => return Err(format!("timing on {} failed: {e}", node.name())),
            }
        }
        Ok(overhead)
    }

    /// Cut `k`'s fragment (`physical`) timed on every node, less each
    /// node's `overhead`: its timing, each UDF's time, and its bad
    /// samples; the first bad sample met goes to `first_bad`.
    async fn cut(
        &self,
        k: usize,
        physical: &Arc<dyn ExecutionPlan>,
        overhead: &[u64],
        first_bad: &mut Option<BadSample>,
    ) -> Result<(CutTiming, std::collections::BTreeMap<String, u64>, u64), String> {
        let mut cut = CutTiming::default();
        let mut times = std::collections::BTreeMap::<String, u64>::new();
        let mut bad = 0;
        for (node, overhead) in self.nodes.iter().zip(overhead) {
            let udfs = UdfEnv::new(self.options);
            let t = node
                .time(Arc::clone(physical), Arc::clone(&udfs), self.budget)
                .await
                .map_err(|e| format!("timing cut {k} on {} failed: {e}", node.name()))?;
            // A fragment keeps a bad sample's row (NULL where the UDF
            // refused it; the skip policy's filter runs on the compute
            // side): rows are the objects read.
            cut.objects += t.rows;
            cut.cpu_ns += t.cpu_ns.saturating_sub(*overhead) as f64;
            for (udf, ns) in t.udf_ns {
                *times.entry(udf).or_default() += ns;
            }
            bad += t.bad;
            if first_bad.is_none() {
                *first_bad = udfs.errors.snapshot().1.into_iter().next();
            }
        }
        Ok((cut, times, bad))
    }
}

/// `fragment` planned in one partition, as a fragment table plans it (the
/// storage node spreads it over its cores once bound).
async fn single_partition(
    fragment: &LogicalPlan,
    state: &SessionState,
) -> datafusion::common::Result<Arc<dyn ExecutionPlan>> {
    let config = state.config().clone().with_target_partitions(1);
    let single = SessionStateBuilder::new_from_existing(state.clone())
        .with_config(config)
        .build();
    single
        .query_planner()
        .create_physical_plan(fragment, &single)
        .await
}
