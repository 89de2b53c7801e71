//! Command-line arguments (clap): [`Cli`], the flags every command
//! shares, and [`Command`], one variant per command (each run by its file
//! in `commands/`).
//!
//! Modules:
//! - `flags`: the groups of flags several commands take (device, UDFs,
//!   decode limits, placement, node, query limits) and the output formats;
//! - `actions`: the subcommands of `checkpoints`, `job`, `certs`, `tokens`
//!   and `nodes`;
//! - `bench`: `BenchCommand`, the benchmarks of `sluice bench`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::size::parse_size;

mod actions;
mod bench;
mod flags;

pub use actions::{CertsAction, CheckpointAction, JobAction, NodesAction, TokensAction};
pub use bench::{BenchCommand, Pattern};
#[cfg(feature = "spdk")]
pub use flags::SpdkFlags;
use flags::parse_rate;
pub use flags::{
    BinaryFormat, DocFormat, ExplainFormat, NodeFlags, PlaceFlags, QueryLimitFlags, RateArg,
    RowFormat, UdfFlags,
};
use sluice_storage::device::Backend;

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
        #[arg(long, default_value = "skip", value_parser = sluice_storage::OnError::parse_ingest)]
        on_error: sluice_storage::OnError,
        /// Ingest only part I of N (`I/N`): every N-th sample of the sorted
        /// source from the I-th, for one of N storage nodes (shard files,
        /// when there are at least N: every N-th file from the I-th).
        #[arg(long, conflicts_with = "url")]
        shard: Option<sluice_storage::NodeShare>,
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
    /// interrupted ingest leaves them; nothing else ever deletes them), and
    /// free what failed ingests from object stores kept for their re-runs.
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
        which: BenchCommand,
    },
}
