//! The subcommands of `sluice checkpoints`, `job`, `certs`, `tokens` and
//! `nodes`.

use std::path::PathBuf;

use clap::Subcommand;

use super::flags::DocFormat;

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
