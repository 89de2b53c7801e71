//! What a [`ComputeSession`] is built with, and what its jobs and queries
//! read back: calibration, the memory of queries and streams, the output
//! cache, the decoding limits, the cluster's ledger, and [`RepairNode`],
//! what its jobs do with a storage node found holding a corrupt replica.

use std::sync::Arc;

use futures::future::BoxFuture;

use super::ComputeSession;
use super::output_cache::OutputCache;
use super::window_budget::WindowBudget;
use crate::replicas::ledger::PartLedger;
use sluice_planner::CalibrationOptions;

/// What a session's jobs do with a storage node whose replica a read found
/// corrupt: given the session, the node's name and the datasets the job
/// reads, scrub that node's copy of them and rewrite what is bad from the
/// other holders. Installed by whoever builds the session
/// (`crate::repair::on_corrupt`, a floor above the jobs); without one the
/// reads still go around the bad copy, and a scrub repairs it later.
#[derive(Clone)]
pub struct RepairNode(pub Arc<RepairFn>);

/// The function a [`RepairNode`] holds: (session, node, datasets) → the
/// repair, run in the background.
pub type RepairFn =
    dyn Fn(Arc<ComputeSession>, String, Vec<String>) -> BoxFuture<'static, ()> + Send + Sync;

impl std::fmt::Debug for RepairNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RepairNode")
    }
}

impl ComputeSession {
    /// Whether (and how) plans are calibrated on their datasets' own
    /// objects before auto placement and for EXPLAIN (`None`: never; the
    /// UDF profiles alone decide). On by default.
    pub fn with_calibration(mut self, calibration: Option<CalibrationOptions>) -> Self {
        self.calibration = calibration;
        self
    }

    /// The job streams of this session hold at most `bytes` of output in
    /// flight together (windows decoding, or waiting to be cut into
    /// batches); past it their windows wait for room.
    pub fn with_stream_memory(mut self, bytes: u64) -> Self {
        self.windows = WindowBudget::new(bytes);
        self
    }

    /// Deterministic jobs keep up to `bytes` of output rows for their
    /// later epochs (see [`OutputCache`]; 0, the default: none).
    pub fn with_output_cache(mut self, bytes: u64) -> Self {
        self.outputs = Arc::new(OutputCache::new(bytes));
        self
    }

    /// The node's cache of deterministic jobs' output rows.
    pub fn output_cache(&self) -> &Arc<OutputCache> {
        &self.outputs
    }

    /// The server's decoding limits: jobs run under them, and a query's
    /// own limits are capped by them (a client may lower them, never
    /// raise them).
    pub fn with_limits(mut self, limits: sluice_udfs::Limits) -> Self {
        self.limits = limits;
        self
    }

    /// See [`ComputeSession::with_limits`].
    pub fn limits(&self) -> &sluice_udfs::Limits {
        &self.limits
    }

    /// The budget the job streams' windows reserve from.
    pub fn window_budget(&self) -> &WindowBudget {
        &self.windows
    }

    /// Each query's own memory pool holds at most `bytes`: its sorts
    /// spill to disk past it and its other operators (joins,
    /// aggregations) fail with `ResourcesExhausted` instead of growing the
    /// process until the allocator aborts.
    pub fn with_query_memory(mut self, bytes: usize) -> Self {
        self.query_memory = bytes.max(1 << 20);
        self
    }

    /// Keeps the cluster's parts in `ledger` (the coordinator's, in its
    /// data dir).
    pub fn with_ledger(mut self, ledger: Arc<PartLedger>) -> Self {
        self.ledger = ledger;
        self
    }

    /// The parts of datasets this cluster wrote.
    pub fn ledger(&self) -> &Arc<PartLedger> {
        &self.ledger
    }

    /// What its jobs do with a node found holding a corrupt replica (see
    /// [`RepairNode`]; none by default).
    pub fn with_repair(mut self, repair: RepairNode) -> Self {
        self.repair = Some(repair);
        self
    }

    /// See [`ComputeSession::with_repair`].
    pub fn repair(&self) -> Option<&RepairNode> {
        self.repair.as_ref()
    }
}
