//! Command-line arguments.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use sluice_storage::device::Backend;

use crate::size::parse_size;

/// sluice: preprocessing pipelines for ML trainers, next to the data.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about)]
pub struct Cli {
    /// Data directory (catalog, metadata and the file-backed device).
    #[arg(
        long,
        global = true,
        env = "SLUICE_DATA_DIR",
        default_value = "./sluice-data"
    )]
    pub data_dir: PathBuf,
    /// Device backend: auto (io_uring, else file), uring, file, or spdk
    /// (an SPDK bdev named by --device bdev:NAME; built with `--features spdk`).
    #[arg(
        long,
        global = true,
        env = "SLUICE_DEVICE_BACKEND",
        default_value = "auto"
    )]
    pub device_backend: Backend,
    /// A block device or file to use as the device (only when creating the data dir).
    #[arg(long, global = true, env = "SLUICE_DEVICE")]
    pub device: Option<PathBuf>,
    /// Size of a new device file, e.g. 16GiB (sparse; only when creating the data dir).
    #[arg(long, global = true, env = "SLUICE_DEVICE_SIZE", default_value = "16GiB", value_parser = parse_size)]
    pub device_size: u64,
    /// Chunk size of a new data dir, e.g. 4MiB.
    #[arg(long, global = true, env = "SLUICE_CHUNK_SIZE", default_value = "4MiB", value_parser = parse_size)]
    pub chunk_size: u64,
    /// Memory for the node-wide cache of raw objects, e.g. 8GiB (0: none;
    /// default: a quarter of the memory available at start).
    #[arg(long, global = true, env = "SLUICE_CACHE_MEMORY", value_parser = parse_size)]
    pub cache_memory: Option<u64>,
    /// Device reads in flight per scan partition.
    #[arg(long, global = true, env = "SLUICE_SCAN_DEPTH", default_value_t = 8)]
    pub scan_depth: usize,
    /// Largest coalesced device read of a scan, e.g. 4MiB.
    #[arg(long, global = true, env = "SLUICE_MAX_READ", default_value = "4MiB", value_parser = parse_size)]
    pub max_read: u64,
    /// Bearer tokens: the ones `serve` accepts (comma-separated), or the
    /// one a client (`--connect`) sends.
    #[arg(
        long,
        global = true,
        env = "SLUICE_TOKEN",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub token: Vec<String>,
    /// The memory every query and job of this process shares, e.g. 8GiB
    /// (default: half the memory available at start): a query past it
    /// fails, the process goes on. "Available", here and in the caches'
    /// defaults, is the host's, or what the process's memory cgroup's
    /// limit leaves if that is less.
    #[arg(long, global = true, env = "SLUICE_MEMORY_LIMIT", value_parser = parse_size)]
    pub memory_limit: Option<u64>,
    /// The token this process presents to the other nodes of its cluster
    /// (a tokens file's `node` token: registration, progress reports,
    /// calls to storage nodes); default: the first --token.
    #[arg(long, global = true, env = "SLUICE_NODE_TOKEN", hide_env_values = true)]
    pub node_token: Option<String>,
    /// The tokens file `serve` and the nodes accept (scoped tokens, kept
    /// hashed; read again on SIGHUP): see `sluice tokens`.
    #[arg(long, global = true, env = "SLUICE_TOKENS")]
    pub tokens: Option<PathBuf>,
    /// Append every refused call (who, what, when, from where) to this
    /// file, one JSON line each.
    #[arg(long, global = true, env = "SLUICE_AUDIT_LOG")]
    pub audit_log: Option<PathBuf>,
    /// This process's certificate (PEM; `sluice certs node`): its
    /// listeners serve TLS with it, and it presents it to the nodes it
    /// calls. Given with --tls-key.
    #[arg(long, global = true, env = "SLUICE_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, global = true, env = "SLUICE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// The cluster's CA certificate (PEM; `sluice certs ca`): the servers
    /// this process calls over `https://` and `grpc+tls://` are checked
    /// against it, and so are the nodes that call a storage node.
    #[arg(long, global = true, env = "SLUICE_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// Serve plain text on an address other than loopback (on a network
    /// you trust; without it such a listener needs --tls-cert).
    #[arg(long, global = true, env = "SLUICE_INSECURE")]
    pub insecure: bool,
    /// How to start SPDK for `--device-backend spdk`.
    #[cfg(feature = "spdk")]
    #[command(flatten)]
    pub spdk: SpdkFlags,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

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

fn parse_rate(s: &str) -> Result<RateArg, String> {
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
            .unwrap_or_else(sluice_compute::job::OutputCache::default_budget)
    }

    /// The job streams' budget for windows in flight.
    pub fn stream_memory(&self) -> u64 {
        self.stream_memory
            .unwrap_or_else(sluice_compute::job::WindowBudget::default_bytes)
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

/// What `sluice checkpoints` does.
#[derive(Debug, Subcommand)]
pub enum CheckpointAction {
    /// Every version of the checkpoints whose names start with a prefix.
    List {
        /// Name prefix (empty: all).
        #[arg(long, default_value = "")]
        prefix: String,
        /// Output format.
        #[arg(long, value_enum, default_value = "table")]
        format: DocFormat,
    },
    /// Delete a checkpoint (every version, or one) and free its space.
    Delete {
        /// Its name.
        name: String,
        /// Only this version.
        #[arg(long)]
        version: Option<u64>,
    },
    /// Copy a checkpoint version (the newest by default) to a file, checking every extent.
    Get {
        /// Its name.
        name: String,
        /// The file to write.
        out: PathBuf,
        /// Which version.
        #[arg(long)]
        version: Option<u64>,
    },
}

/// What `sluice job` does, against a running `serve`.
#[derive(Debug, Subcommand)]
pub enum JobAction {
    /// Submit a pipeline: a .sql file, or a plan as .yaml/.yml/.json.
    Submit {
        /// The pipeline file.
        file: PathBuf,
        /// Samples per batch.
        #[arg(long, default_value_t = 32)]
        batch_size: u64,
        /// Epochs.
        #[arg(long, default_value_t = 1)]
        epochs: u64,
        /// Trainer ranks.
        #[arg(long, default_value_t = 1)]
        world_size: u64,
        /// Shuffle every epoch with this seed (none: key order).
        #[arg(long)]
        seed: Option<u64>,
        /// What a bad sample does: skip, null or fail.
        #[arg(long, default_value = "skip")]
        on_error: String,
        /// Where stages run: auto, storage or compute.
        #[arg(long, default_value = "auto")]
        offload: String,
        /// Continue a training from the position a trainer saved (a JSON
        /// file of `job.state_dict(...)`): with any world size or batch size.
        #[arg(long)]
        resume: Option<PathBuf>,
    },
    /// Every job, a line each.
    List,
    /// One job's state, progress, rate, ETA, skipped samples and bottleneck.
    Status {
        /// The job id.
        id: String,
        /// Print a line a second until the job is done, failed or cancelled.
        #[arg(long)]
        watch: bool,
    },
    /// Cancel a job: its streams end, its resources are freed.
    Cancel {
        /// The job id.
        id: String,
    },
    /// Where a job's stages run and why (and each re-plan).
    Explain {
        /// The job id.
        id: String,
    },
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Ingest a directory (ImageFolder or flat), a manifest, or shards (WebDataset tars, TFRecord, Parquet with the images inside) as a new dataset version.
    Ingest {
        /// Dataset name (letters, digits, '_' and '-').
        dataset: String,
        /// A directory, a manifest file (.csv, .jsonl, .parquet) with a `path` column, or shards: a .tar (WebDataset), .tfrecord or .parquet (an `image` column of bytes) file, a directory of them, or a glob such as `shards/train-*.tar`. Or an object store's prefix or manifest: `s3://bucket/prefix` (credentials and `AWS_ENDPOINT_URL` from the environment or the AWS profile files), `gs://`, `az://`, `http(s)://`.
        source: PathBuf,
        /// A manifest whose relative paths resolve against SOURCE.
        #[arg(long)]
        manifest: Option<PathBuf>,
        /// What to do with unreadable or unrecognised objects.
        #[arg(long, default_value = "skip")]
        on_error: sluice_storage::OnError,
        /// Ingest only part I of N (`I/N`): every N-th sample of the sorted
        /// source from the I-th, for one of N storage nodes (shard files,
        /// when there are at least N: every N-th file from the I-th).
        #[arg(long, conflicts_with = "url")]
        shard: Option<sluice_storage::Shard>,
        /// How many storage nodes hold each part: through `--url`, the
        /// cluster's replication factor (default 2 with at least 2 storage
        /// nodes); with `--shard I/N`, this node keeps parts I, I-1, …,
        /// I-R+1 of N.
        #[arg(long)]
        replicas: Option<u32>,
        /// Ingest through a running server's REST API instead of into the
        /// data dir: the server reads SOURCE (an absolute path on its host,
        /// beneath its --ingest-root) and, over remote storage nodes,
        /// spreads the version across them, committed on all or none.
        #[arg(long)]
        url: Option<String>,
        /// Summary format.
        #[arg(long, value_enum, default_value = "table")]
        format: DocFormat,
    },
    /// List datasets with their versions, sample counts and bytes.
    Datasets {
        /// List a running server's datasets (`GET /v1/datasets`) instead
        /// of the data dir's: over storage nodes, with each version's
        /// replication (parts fully replicated, under-replicated, lost).
        #[arg(long)]
        url: Option<String>,
        /// Output format.
        #[arg(long, value_enum, default_value = "table")]
        format: DocFormat,
    },
    /// Run a SQL query over the datasets.
    Sql {
        /// The query (DataFusion SQL; DDL, DML and COPY are refused).
        query: String,
        /// Output format.
        #[arg(long, value_enum, default_value = "table")]
        format: RowFormat,
        /// How to print binary columns such as `data`.
        #[arg(long, value_enum, default_value = "length")]
        binary: BinaryFormat,
        /// UDF options.
        #[command(flatten)]
        udf: UdfFlags,
        /// Placement.
        #[command(flatten)]
        place: PlaceFlags,
    },
    /// Show where each stage of a query would run and why: the candidate
    /// cuts with their estimated rates, the choice, and both fragments.
    Explain {
        /// The query.
        query: String,
        /// Output format.
        #[arg(long, value_enum, default_value = "text")]
        format: ExplainFormat,
        /// UDF options.
        #[command(flatten)]
        udf: UdfFlags,
        /// Placement.
        #[command(flatten)]
        place: PlaceFlags,
    },
    /// Serve the data dir's datasets to compute nodes over Arrow Flight.
    StorageNode {
        /// Node options.
        #[command(flatten)]
        node: NodeFlags,
    },
    /// Answer queries over Arrow Flight, running storage fragments on remote storage nodes.
    ComputeNode {
        /// Address to serve Arrow Flight on (port 0 picks a free one).
        #[arg(long, default_value = "127.0.0.1:50052")]
        listen: String,
        /// Storage nodes (comma-separated URLs); with --coordinator, also
        /// every storage node registered there.
        #[arg(long, value_delimiter = ',', required_unless_present = "coordinator")]
        storage: Vec<String>,
        /// The coordinator's REST API (`http://host:port` of `sluice serve`):
        /// this node registers there, is given trainer ranks, and serves the
        /// coordinator's jobs.
        #[arg(long)]
        coordinator: Option<String>,
        /// The Flight location trainers reach this node at (default:
        /// `grpc://` and the address it listens on).
        #[arg(long)]
        advertise: Option<String>,
        /// Resources: cores storage nodes give fragments (default: what they say).
        #[arg(long)]
        storage_cores: Option<usize>,
        /// Resources: cores of this node.
        #[arg(long)]
        compute_cores: Option<usize>,
        /// Resources: the link the planner assumes (default: measured).
        #[arg(long, value_parser = parse_rate)]
        link_bandwidth: Option<RateArg>,
        /// Query limits.
        #[command(flatten)]
        limits: QueryLimitFlags,
    },
    /// The embedded default: a storage node over the data dir and a compute
    /// node in one process, with the REST API (jobs, datasets) and Arrow
    /// Flight (trainers' job streams and SQL queries).
    Serve {
        /// Address of Arrow Flight: job streams and queries (port 0 picks a free one).
        #[arg(long, alias = "listen", default_value = "127.0.0.1:50052")]
        flight: String,
        /// Address of the REST API (port 0 picks a free one).
        #[arg(long, default_value = "127.0.0.1:8080")]
        rest: String,
        /// Directories `POST /v1/datasets` may ingest from (repeatable; none: REST ingest is off).
        #[arg(long)]
        ingest_root: Vec<PathBuf>,
        /// Object-store prefixes `POST /v1/datasets` may ingest from
        /// (`s3://bucket/prefix`, `gs://…`, `az://…`, `http(s)://…`;
        /// repeatable; none: no ingest from object stores over REST). A URL
        /// outside them is refused before any request is sent.
        #[arg(long)]
        ingest_url_allow: Vec<String>,
        /// Remote storage nodes (comma-separated URLs) instead of the data dir:
        /// this process is then the coordinator (the compute side, with jobs
        /// and REST); storage nodes may also register with it.
        #[arg(long, value_delimiter = ',', conflicts_with = "loopback")]
        storage: Vec<String>,
        /// No storage of its own even with no --storage: the storage nodes
        /// are those that register (`storage-node --coordinator`).
        #[arg(long, conflicts_with = "loopback")]
        remote_storage: bool,
        /// Join the two sides over loopback Flight (serialising fragments
        /// and batches) instead of in-process.
        #[arg(long)]
        loopback: bool,
        /// Threads of the storage side (default: all cores).
        #[arg(long)]
        storage_cores: Option<usize>,
        /// Resources: cores of the compute side.
        #[arg(long)]
        compute_cores: Option<usize>,
        /// Experiment knob: limit the storage→compute link (token bucket), e.g. 1Gbit.
        #[arg(long, value_parser = parse_rate)]
        link_limit: Option<RateArg>,
        /// Checkpoints: versions kept per name (the newest).
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..))]
        checkpoint_keep: u64,
        /// Checkpoints: seconds an upload may sit idle before it is aborted
        /// and its space freed (a writer that died).
        #[arg(long, default_value_t = 120.0)]
        checkpoint_idle_timeout: f64,
        /// Checkpoints on a cluster: copies of each stripe on distinct
        /// storage nodes (default: 2 with at least 2 nodes).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        checkpoint_replicas: Option<u32>,
        /// Checkpoints on a cluster: seconds between sweeps of the storage
        /// nodes for pieces no committed version names (left by a
        /// coordinator killed mid-commit).
        #[arg(long, default_value_t = 600.0)]
        checkpoint_sweep_every: f64,
        /// Jobs: seconds a job may sit finished, or running with no reader,
        /// before it is forgotten with its record.
        #[arg(long, default_value_t = 7.0 * 86_400.0)]
        job_ttl: f64,
        /// Scrub every storage node every this many seconds (in the
        /// background, at `--scrub-rate-mb-s`), repairing bad objects from
        /// good replicas; 0: never (`sluice scrub` asks for one).
        #[arg(long, default_value_t = 0.0)]
        scrub_every: f64,
        /// The background scrub's read rate on each node, MB a second.
        #[arg(long, default_value_t = 50.0)]
        scrub_rate_mb_s: f64,
        /// A storage node that does not answer for this many seconds is
        /// lost: the parts it held are copied from their other holders to
        /// nodes without a copy; 0: never (a drain moves them by hand).
        #[arg(long, default_value_t = 600.0)]
        lost_after: f64,
        /// Query limits.
        #[command(flatten)]
        limits: QueryLimitFlags,
    },
    /// Jobs of a running `serve`: submit, list, status [--watch], cancel, explain.
    Job {
        /// The server's REST API.
        #[arg(long, env = "SLUICE_URL", default_value = "http://127.0.0.1:8080")]
        url: String,
        /// What to do.
        #[command(subcommand)]
        action: JobAction,
    },
    /// Checkpoints in the data dir: list, delete, or copy one out to a file.
    Checkpoints {
        /// What to do.
        #[command(subcommand)]
        action: CheckpointAction,
    },
    /// List the UDFs with their cost profiles; --calibrate measures the profiles here.
    Udfs {
        /// Measure the cost profiles on this machine and save them in the data dir.
        #[arg(long)]
        calibrate: bool,
        /// Output format.
        #[arg(long, value_enum, default_value = "table")]
        format: DocFormat,
    },
    /// Show the data dir: device, backend, free space.
    Info {
        /// Output format.
        #[arg(long, value_enum, default_value = "table")]
        format: DocFormat,
    },
    /// Remove metadata files that no committed dataset version names (an
    /// interrupted ingest leaves them). Nothing else ever deletes them.
    Gc {
        /// List what would be removed, remove nothing.
        #[arg(long)]
        dry_run: bool,
        /// Output format.
        #[arg(long, value_enum, default_value = "table")]
        format: DocFormat,
    },
    /// Write a small generated ImageFolder dataset (JPEG and PNG) to DIR.
    GenSample {
        /// Output directory.
        dir: PathBuf,
        /// Number of classes.
        #[arg(long, default_value_t = 3)]
        classes: u32,
        /// Images per class.
        #[arg(long, default_value_t = 20)]
        per_class: u32,
        /// Seed for the generated pixels.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// The nodes of a running coordinator: list them (with those in
    /// quarantine), or take one out.
    Nodes {
        /// The coordinator's REST API (before or after the action).
        #[arg(
            long,
            global = true,
            env = "SLUICE_URL",
            default_value = "http://127.0.0.1:8080"
        )]
        url: String,
        /// What to do.
        #[command(subcommand)]
        action: NodesAction,
    },
    /// Spread every dataset's parts evenly over the storage nodes (after
    /// one joined), online (an admin token).
    Rebalance {
        /// The server's REST API.
        #[arg(long, env = "SLUICE_URL", default_value = "http://127.0.0.1:8080")]
        url: String,
    },
    /// Every storage node of a running server reads back its objects
    /// against their checksums; each bad one is rewritten from a good
    /// replica on another node (`POST /v1/scrub`, admin).
    Scrub {
        /// The server's REST API.
        #[arg(long, env = "SLUICE_URL", default_value = "http://127.0.0.1:8080")]
        url: String,
        /// Only this dataset.
        #[arg(long)]
        dataset: Option<String>,
        /// At most this many MB read a second on each node.
        #[arg(long)]
        rate_mb_s: Option<f64>,
        /// Output format.
        #[arg(long, value_enum, default_value = "table")]
        format: DocFormat,
    },
    /// Scoped tokens: make one (its secret printed once, its hash added to
    /// the tokens file), hash a secret, or list a file's tokens.
    Tokens {
        /// What to do.
        #[command(subcommand)]
        action: TokensAction,
    },
    /// The cluster's TLS certificates: a CA, and a certificate per node
    /// signed by it (for --tls-ca, --tls-cert and --tls-key).
    Certs {
        /// What to make.
        #[command(subcommand)]
        action: CertsAction,
    },
    /// Benchmarks of the storage path against the device's own limit.
    Bench {
        /// Which benchmark.
        #[command(subcommand)]
        which: crate::commands::bench::BenchCommand,
    },
}

/// `sluice certs` actions.
#[derive(Debug, Subcommand)]
pub enum CertsAction {
    /// Make the cluster's CA: DIR/ca.pem (what every node and client is
    /// given as --tls-ca) and DIR/ca.key (kept where certificates are
    /// issued, and nowhere else).
    Ca {
        /// The directory (created if missing).
        dir: PathBuf,
        /// Years the CA is valid.
        #[arg(long, default_value_t = 10)]
        years: u32,
    },
    /// Issue a node's certificate, signed by DIR's CA: DIR/NAME.pem and
    /// DIR/NAME.key, valid for the host names and addresses given (the
    /// ones in the node's locations), as server and as client.
    Node {
        /// The directory holding the CA.
        dir: PathBuf,
        /// The node's name (letters, digits, `.`, `-`, `_`).
        name: String,
        /// Its host names and IP addresses.
        #[arg(required = true)]
        hosts: Vec<String>,
        /// Days the certificate is valid.
        #[arg(long, default_value_t = 365)]
        days: u32,
    },
}

/// `sluice tokens` actions.
#[derive(Debug, Subcommand)]
pub enum TokensAction {
    /// Make a token: its hash goes into FILE (created if missing), its
    /// secret to stdout, once.
    Add {
        /// The tokens file.
        file: PathBuf,
        /// Who holds it (the audit log's name for its calls).
        name: String,
        /// Its scopes: read, ingest, admin, node (comma-separated).
        #[arg(long, value_delimiter = ',', required = true)]
        scope: Vec<sluice_access::Scope>,
        /// Dataset name patterns it may touch (`*` matches any run of
        /// characters; repeatable; default: every dataset).
        #[arg(long)]
        dataset: Vec<String>,
        /// Checkpoint name prefixes it may read and write (repeatable;
        /// default: every checkpoint).
        #[arg(long)]
        checkpoint: Vec<String>,
    },
    /// Print the hash a tokens file keeps of the secret read from stdin.
    Hash,
    /// List the tokens of FILE (names, scopes, datasets; never secrets).
    List {
        /// The tokens file.
        file: PathBuf,
    },
    /// Take the token NAME out of FILE (a running server forgets it on
    /// SIGHUP).
    Remove {
        /// The tokens file.
        file: PathBuf,
        /// Its name.
        name: String,
    },
}

/// `sluice nodes` actions.
#[derive(Debug, Subcommand)]
pub enum NodesAction {
    /// The storage nodes (up or down), the compute nodes and the
    /// quarantined storage nodes.
    List,
    /// Take node ID (its location or host:port) of KIND (storage or
    /// compute) out of the cluster (an admin token).
    Remove {
        /// storage or compute.
        kind: String,
        /// Its location or host:port.
        id: String,
    },
    /// Copy every part storage node ID holds to other nodes, then retire
    /// its copies once no job reads them (an admin token); take it out
    /// with `remove` after.
    Drain {
        /// Its location or host:port.
        id: String,
    },
}
