//! The groups of flags several commands take, flattened into each
//! (device backend, UDFs, decode limits, placement, node, query limits),
//! and the output formats.

use std::path::PathBuf;

use clap::ValueEnum;

use crate::size::parse_size;

/// SPDK's start-up options (built with the `spdk` feature).
#[cfg(feature = "spdk")]
#[derive(Debug, Clone, clap::Args)]
pub struct SpdkFlags {
    /// SPDK bdev config in SPDK's JSON format (as `spdk_tgt --json` reads):
    /// NVMe over PCIe, AIO, io_uring or malloc bdevs.
    #[arg(long, global = true, env = "SLUICE_SPDK_CONFIG")]
    pub spdk_config: Option<PathBuf>,
    /// Memory for SPDK's DMA buffers and pools, e.g. 2GiB (hugepages unless
    /// --spdk-no-huge).
    #[arg(long, global = true, env = "SLUICE_SPDK_MEM", default_value = "1GiB", value_parser = parse_size)]
    pub spdk_mem: u64,
    /// Run SPDK without hugepages (file-backed and malloc bdevs only).
    #[arg(long, global = true, env = "SLUICE_SPDK_NO_HUGE")]
    pub spdk_no_huge: bool,
    /// CPU mask of the core the SPDK thread polls on, e.g. 0x4.
    #[arg(long, global = true, env = "SLUICE_SPDK_CORE_MASK")]
    pub spdk_core_mask: Option<String>,
    /// A hugetlbfs mount other than the default.
    #[arg(long, global = true, env = "SLUICE_SPDK_HUGEDIR")]
    pub spdk_hugedir: Option<PathBuf>,
}

#[cfg(feature = "spdk")]
impl SpdkFlags {
    /// SPDK's options, when a config is given.
    pub fn options(&self) -> Option<sluice_storage::device::spdk::SpdkOptions> {
        let config = self.spdk_config.clone()?;
        Some(sluice_storage::device::spdk::SpdkOptions {
            mem_size_mb: u32::try_from(self.spdk_mem >> 20).unwrap_or(u32::MAX),
            no_huge: self.spdk_no_huge,
            core_mask: self.spdk_core_mask.clone(),
            hugedir: self.spdk_hugedir.clone(),
            ..sluice_storage::device::spdk::SpdkOptions::new(config)
        })
    }
}

/// Output format of `datasets` and `info`.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum DocFormat {
    /// Aligned text.
    Table,
    /// JSON.
    Json,
}

/// Output format of `sql`.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum RowFormat {
    /// Aligned text table.
    Table,
    /// CSV with a header.
    Csv,
    /// JSON lines: one object per row.
    Json,
    /// An Arrow IPC stream (binary, on stdout), extension types preserved.
    Arrow,
}

/// Options of the UDFs a query calls.
#[derive(Debug, Clone, clap::Args)]
pub struct UdfFlags {
    /// What a bad sample (corrupt, truncated, unsupported, over a limit) does:
    /// skip drops the row, null keeps it with NULL, fail stops the query.
    #[arg(long, default_value = "fail")]
    pub on_error: sluice_udfs::OnError,
    /// Job seed of the random UDFs.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Epoch of the random UDFs.
    #[arg(long, default_value_t = 0)]
    pub epoch: u64,
    /// Decoding limits (against a server: at most the server's own).
    #[command(flatten)]
    pub limits: DecodeLimitFlags,
}

impl UdfFlags {
    /// The UDF options these flags describe.
    pub fn options(&self) -> sluice_udfs::UdfOptions {
        sluice_udfs::UdfOptions {
            on_error: self.on_error,
            seed: self.seed,
            epoch: self.epoch,
            limits: self.limits.limits(),
            cache_stages: false,
        }
    }
}

/// What one sample may decode to. On a query these are asked for; on a
/// server they are the ceiling no client can raise.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct DecodeLimitFlags {
    /// Largest image or video frame a sample may decode to, in pixels.
    #[arg(long, default_value_t = sluice_udfs::Limits::default().max_pixels)]
    pub max_pixels: u64,
    /// Most video frames a sample may need decoded.
    #[arg(long, default_value_t = sluice_udfs::Limits::default().max_frames)]
    pub max_frames: u64,
    /// Largest decoded result of one sample, e.g. 1GiB.
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    pub max_decoded_bytes: u64,
    /// Longest a video sample's decode loop may run, in milliseconds.
    #[arg(long, default_value_t = sluice_udfs::Limits::default().max_sample_ms)]
    pub max_sample_ms: u64,
}

impl DecodeLimitFlags {
    /// The limits these flags describe.
    pub fn limits(&self) -> sluice_udfs::Limits {
        sluice_udfs::Limits {
            max_pixels: self.max_pixels,
            max_frames: self.max_frames,
            max_decoded_bytes: self.max_decoded_bytes,
            max_sample_ms: self.max_sample_ms,
        }
    }
}

/// Where a query's stages run and what the planner assumes.
#[derive(Debug, Clone, clap::Args)]
pub struct PlaceFlags {
    /// Where stages run: auto (the cost model decides), storage, compute,
    /// or a cut index (the first N stages on storage).
    #[arg(long, default_value = "auto")]
    pub offload: sluice_planner::Offload,
    /// Storage nodes to run storage fragments on (comma-separated URLs);
    /// without it, the data dir is served in this process.
    #[arg(long, value_delimiter = ',', conflicts_with = "connect")]
    pub storage: Vec<String>,
    /// Send the query to a compute node (`sluice compute-node` or `sluice serve`) instead.
    #[arg(long)]
    pub connect: Option<String>,
    /// Resources: cores of the storage side (in process: threads of the
    /// in-process storage node; remote: what the planner assumes).
    #[arg(long)]
    pub storage_cores: Option<usize>,
    /// Resources: cores of the compute side.
    #[arg(long)]
    pub compute_cores: Option<usize>,
    /// Resources: the storage→compute link the planner assumes, e.g. 10Gbit
    /// (default: the nodes' link limits, else a measured probe).
    #[arg(long, value_parser = parse_rate)]
    pub link_bandwidth: Option<RateArg>,
    /// Experiment knob: limit the in-process storage node's link to this
    /// rate (token bucket), e.g. 1Gbit.
    #[arg(long, value_parser = parse_rate)]
    pub link_limit: Option<RateArg>,
    /// Plan with the UDF profiles alone: no timing of the pipeline's stages
    /// on a sample of its dataset (by default auto placement and EXPLAIN
    /// are calibrated on it).
    #[arg(long)]
    pub no_calibrate: bool,
}

/// A link rate from the command line (`None`: unlimited).
#[derive(Debug, Clone, Copy)]
pub struct RateArg(pub Option<f64>);

pub(super) fn parse_rate(s: &str) -> Result<RateArg, String> {
    sluice_planner::resources::parse_rate(s).map(RateArg)
}

/// Options of a node process.
#[derive(Debug, Clone, clap::Args)]
pub struct NodeFlags {
    /// Address to serve Arrow Flight on (port 0 picks a free one).
    #[arg(long)]
    pub listen: Option<String>,
    /// Threads given to storage fragments (default: all cores).
    #[arg(long)]
    pub cores: Option<usize>,
    /// Experiment knob: limit the outgoing link to this rate (token bucket), e.g. 1Gbit.
    #[arg(long, value_parser = parse_rate)]
    pub link_limit: Option<RateArg>,
    /// This node's decoding limits: a fragment may ask for less, never more.
    #[command(flatten)]
    pub decode: DecodeLimitFlags,
    /// The coordinator's REST API (`http://host:port` of `sluice serve`):
    /// this node registers there, so the coordinator reads it and spreads
    /// ingests over it without being given its address.
    #[arg(long)]
    pub coordinator: Option<String>,
    /// The Flight location the coordinator and compute nodes reach this
    /// node at (default: `http://` and the address it listens on).
    #[arg(long)]
    pub advertise: Option<String>,
    /// Directories a coordinator's ingest may read beneath (repeatable;
    /// none: this node takes no ingest over the network). Sources are
    /// read at the path the coordinator was given: the nodes and the
    /// coordinator share a filesystem there.
    #[arg(long)]
    pub ingest_root: Vec<PathBuf>,
    /// Object-store prefixes a coordinator's ingest may read beneath
    /// (`s3://bucket/prefix`, `gs://…`, `az://…`, `http(s)://…`;
    /// repeatable; none: no ingest from object stores). Each node reads
    /// its own part from the store with its own credentials.
    #[arg(long)]
    pub ingest_url_allow: Vec<String>,
    /// Memory for this node's cache of random jobs' decode stages (0:
    /// none; default: an eighth of the memory available at start).
    #[arg(long, env = "SLUICE_STAGE_CACHE_MEMORY", value_parser = parse_size)]
    pub stage_cache_memory: Option<u64>,
}

/// Limits on each SQL query a compute node (or `serve`) runs.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct QueryLimitFlags {
    /// Memory one query's operators (sorts, joins, aggregations) may hold;
    /// past it a sort spills to disk and other operators fail the query
    /// with `ResourcesExhausted`.
    #[arg(long, default_value = "4GiB", value_parser = parse_size)]
    pub query_memory: u64,
    /// Seconds a SQL query may run before it is stopped with an error
    /// (0: no limit). Job streams are not queries and have none.
    #[arg(long, default_value_t = 3600.0)]
    pub query_timeout: f64,
    /// Output bytes all job streams may have in flight together (windows
    /// being decoded or cut into batches); past it, windows wait for room
    /// (default: a quarter of the memory available at start, at most 2GiB).
    #[arg(long, env = "SLUICE_STREAM_MEMORY", value_parser = parse_size)]
    pub stream_memory: Option<u64>,
    /// Memory for the node-wide cache of deterministic jobs' output rows,
    /// e.g. 4GiB: their later epochs skip the reads and stages for the rows
    /// it holds (0: none; default: an eighth of the memory available at
    /// start).
    #[arg(long, env = "SLUICE_OUTPUT_CACHE_MEMORY", value_parser = parse_size)]
    pub output_cache_memory: Option<u64>,
    /// Memory for the node-wide cache of random jobs' decode stages, e.g.
    /// 4GiB: the decode under a random crop or flip is done once per
    /// object's bytes (0: none; default: an eighth of the memory available
    /// at start).
    #[arg(long, env = "SLUICE_STAGE_CACHE_MEMORY", value_parser = parse_size)]
    pub stage_cache_memory: Option<u64>,
    /// The server's decoding limits: a query or job may ask for less, never more.
    #[command(flatten)]
    pub decode: DecodeLimitFlags,
    /// Plan with the UDF profiles alone: no timing of a pipeline's stages
    /// on a sample of its dataset before auto placement and EXPLAIN.
    #[arg(long)]
    pub no_calibrate: bool,
}

impl QueryLimitFlags {
    /// The output cache's budget.
    pub fn output_cache(&self) -> u64 {
        self.output_cache_memory
            .unwrap_or_else(sluice_compute::session::output_cache::OutputCache::default_budget)
    }

    /// The job streams' budget for windows in flight.
    pub fn stream_memory(&self) -> u64 {
        self.stream_memory
            .unwrap_or_else(sluice_compute::session::window_budget::WindowBudget::default_bytes)
    }

    /// The stage cache's budget.
    pub fn stage_cache(&self) -> u64 {
        self.stage_cache_memory
            .unwrap_or_else(sluice_udfs::stage_cache::StageCache::default_budget)
    }

    /// The time limit, if there is one.
    pub fn timeout(&self) -> Option<std::time::Duration> {
        (self.query_timeout > 0.0)
            .then(|| std::time::Duration::from_secs_f64(self.query_timeout.min(1e9)))
    }
}

/// Output format of `explain`.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum ExplainFormat {
    /// Text with a table of candidates.
    Text,
    /// JSON.
    Json,
}

/// How binary columns are printed.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum BinaryFormat {
    /// Their length in bytes.
    Length,
    /// Lower-case hex.
    Hex,
    /// Standard base64.
    Base64,
}
