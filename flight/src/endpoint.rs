//! [`StorageEndpoint`]: what the compute side needs of a storage node —
//! its datasets, its cores, its control actions — whether the node is
//! another process (over Flight) or this one.
//!
//! Running a storage fragment is not one of them. A node in this process
//! runs fragments itself ([`InProcessNode`]); a node reached by network
//! runs them as tasks of the distributed engine's worker, reached over
//! the connection [`StorageEndpoint::channel`] holds (the compute crate's
//! `engine` module, the one data plane between hosts).

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::ExecutionPlan;
use serde::{Deserialize, Serialize};
use sluice_planner::DatasetStats;
use sluice_udfs::UdfEnv;

use crate::copy::{CopyIn, Retire, Retired};
use crate::error::LinkError;
use crate::feed::Feed;
use crate::ingest::{IngestPart, IngestedPart, PreparedPart};
use crate::scrub::{RepairObject, Repaired, ScrubReport, ScrubRequest};

/// A dataset as a storage node lists it.
#[derive(Debug, Clone)]
pub struct RemoteDataset {
    /// Its name.
    pub name: String,
    /// Its latest version on that node (what a job pins).
    pub version: u64,
    /// Its table schema.
    pub schema: SchemaRef,
    /// Its statistics on that node.
    pub stats: DatasetStats,
}

/// A storage node's description of itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Threads it gives to fragments.
    pub cores: usize,
    /// The bytes per second its link is limited to, if it is.
    pub link_limit: Option<f64>,
    /// CPU time its process has used so far, ns: a running job compares
    /// two readings with the wall clock to see how busy the node is.
    #[serde(default)]
    pub cpu_ns: u64,
    /// Fragments it has run so far: a job's window costs one on each node
    /// holding some of its rows.
    #[serde(default)]
    pub fragments: u64,
    /// Fragment streams it has opened so far: a query's fragment, or a
    /// job stream's feed, each decoded and bound to a session once (its
    /// round trips on the storage link).
    #[serde(default)]
    pub streams: u64,
}

/// What a storage node measured running a fragment without sending it
/// (calibration, [`StorageEndpoint::time`]).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct FragmentTiming {
    /// Rows the fragment made: one per object read (a fragment keeps a
    /// bad sample's row, NULL where its UDF refused it).
    pub rows: u64,
    /// Samples its UDFs refused.
    pub bad: u64,
    /// CPU time of the node's process while the fragment ran, ns.
    pub cpu_ns: u64,
    /// Wall-clock time, ns.
    pub wall_ns: u64,
    /// Whether it ran to its end within the time it was given.
    pub complete: bool,
    /// Time inside each UDF's calls, ns, by UDF name (the UDFs' own
    /// clock): a stage's cost measured apart from the rest of the run.
    /// Empty from a node that does not report it.
    #[serde(default)]
    pub udf_ns: std::collections::BTreeMap<String, u64>,
}

/// A storage node in this process: the fragments it runs need no
/// transport.
#[async_trait]
pub trait InProcessNode: Send + Sync {
    /// Runs `fragment` (whose leaves are `DatasetScanExec`s) with the UDF
    /// options of `udfs`, streaming its output in one partition. Bad
    /// samples the node meets are added to `udfs`' log.
    async fn execute(
        &self,
        fragment: Arc<dyn ExecutionPlan>,
        udfs: Arc<UdfEnv>,
    ) -> Result<SendableRecordBatchStream, LinkError>;

    /// Opens a feed of `fragment` (whose leaves are `DatasetScanExec`s)
    /// with the UDF options of `udfs`: bound once, then run for each
    /// window of a job stream (see [`crate::feed`]). Bad samples the node
    /// meets are added to `udfs`' log.
    async fn feed(
        self: Arc<Self>,
        fragment: Arc<dyn ExecutionPlan>,
        udfs: Arc<UdfEnv>,
    ) -> Result<Arc<dyn Feed>, LinkError>;
}

/// A storage node, seen from the compute side.
#[async_trait]
pub trait StorageEndpoint: Send + Sync + fmt::Debug {
    /// Its name in messages: a URL, or `in-process`.
    fn name(&self) -> &str;

    /// What this process presents when it calls the node, for a node
    /// reached over the network (`None`: a node in this process).
    fn credential(&self) -> Option<&crate::Credential> {
        None
    }

    /// The connection this process holds to the node, for a node reached
    /// over the network: its other services (the engine's worker) share it.
    fn channel(&self) -> Option<tonic::transport::Channel> {
        None
    }

    /// Whether it runs on this machine (in this process, or at a loopback
    /// address), sharing this machine's cores: the planner then costs both
    /// sides as one pool.
    fn on_this_host(&self) -> bool {
        is_loopback(self.name())
    }

    /// Its cores and link limit.
    async fn node_info(&self) -> Result<NodeInfo, LinkError>;

    /// The datasets it holds.
    async fn datasets(&self) -> Result<Vec<RemoteDataset>, LinkError>;

    /// The schema of `table`: a dataset, or `dataset@N` for version N.
    async fn table_schema(&self, table: &str) -> Result<SchemaRef, LinkError>;

    /// The node as one in this process, whose fragments run here
    /// (`None`: a node reached by network, whose fragments run on the
    /// engine's worker).
    fn in_process(self: Arc<Self>) -> Option<Arc<dyn InProcessNode>> {
        None
    }

    /// Runs `fragment` as it would for a query, for at most
    /// `budget`, without sending its rows: what its stages cost there.
    async fn time(
        &self,
        fragment: Arc<dyn ExecutionPlan>,
        udfs: Arc<UdfEnv>,
        budget: std::time::Duration,
    ) -> Result<FragmentTiming, LinkError>;

    /// Measures the link by fetching `bytes`: bytes per second, or `None`
    /// when the node is in this process.
    async fn probe(&self, bytes: u64) -> Result<Option<f64>, LinkError>;

    /// Prepares this node's part of an ingest: every object written, the
    /// version held uncommitted under `part.txn` (see
    /// [`crate::ingest`]).
    async fn prepare_ingest(&self, part: &IngestPart) -> Result<PreparedPart, LinkError>;

    /// Commits the part prepared under `txn` (its report), or drops it
    /// (`None`; dropping one the node does not hold is no error).
    async fn finish_ingest(
        &self,
        txn: &str,
        commit: bool,
    ) -> Result<Option<IngestedPart>, LinkError>;

    /// Reads back its objects against their checksums
    /// ([`crate::scrub`]).
    async fn scrub(&self, req: &ScrubRequest) -> Result<ScrubReport, LinkError>;

    /// Rewrites one of its objects with good bytes ([`crate::scrub`]).
    async fn repair_object(&self, req: &RepairObject) -> Result<Repaired, LinkError>;

    /// Writes a new version of `req.dataset` from the rows of its own it
    /// keeps and `rows` (another holder's, in the table schema), held
    /// uncommitted under `req.txn` until [`StorageEndpoint::finish_ingest`]
    /// ([`crate::copy`]).
    async fn copy_in(
        &self,
        req: &CopyIn,
        rows: SendableRecordBatchStream,
    ) -> Result<PreparedPart, LinkError>;

    /// Deletes versions it no longer needs to hold ([`crate::copy`]).
    async fn retire(&self, req: &Retire) -> Result<Retired, LinkError>;
}

/// Whether a node address (`http://127.0.0.1:7000`, `[::1]:7000`,
/// `localhost:7000`) is on this host's loopback.
pub fn is_loopback(address: &str) -> bool {
    let rest = address.split_once("://").map_or(address, |(_, r)| r);
    let host_port = rest.split('/').next().unwrap_or(rest);
    let host = match host_port.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(v6),
        None => host_port.rsplit_once(':').map_or(host_port, |(h, _)| h),
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A storage node's identity within a process: its endpoint's address in
/// memory (names need not be unique: every in-process node has the same).
pub fn endpoint_id(endpoint: &std::sync::Arc<dyn StorageEndpoint>) -> usize {
    std::sync::Arc::as_ptr(endpoint).cast::<()>() as usize
}

#[cfg(test)]
mod tests {
    use super::is_loopback;

    #[test]
    fn loopback_addresses_are_this_host() {
        for a in [
            "http://127.0.0.1:7000",
            "127.0.0.2:9",
            "http://[::1]:7000",
            "localhost:80",
            "grpc://LOCALHOST:1/x",
        ] {
            assert!(is_loopback(a), "{a}");
        }
        for a in ["http://10.0.0.2:7000", "storage-1:7000", "[fe80::1]:7"] {
            assert!(!is_loopback(a), "{a}");
        }
    }
}
