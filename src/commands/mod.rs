//! One file per command; [`run`] dispatches.
//!
//! Modules:
//! - [`bench`]: `sluice bench`: the storage path measured against the
//!   device's own limit;
//! - `certs`: `sluice certs`: the cluster's certificates, so that a cluster
//!   speaks TLS without an outside PKI;
//! - `checkpoints`: `sluice checkpoints`: list, delete, or copy out the
//!   checkpoints of the data dir;
//! - `datasets`: `sluice datasets`: datasets with their versions, sample
//!   counts and bytes;
//! - `explain`: `sluice explain "QUERY"`: where each stage would run and why;
//! - `gc`: `sluice gc`: removes metadata files that no committed version
//!   names;
//! - `gen_sample`: `sluice gen-sample DIR`: a small generated ImageFolder
//!   dataset;
//! - `info`: `sluice info`: the data dir's device, backend and free space;
//! - `ingest`: `sluice ingest DATASET SOURCE`: a new dataset version from a
//!   directory, a manifest or an object store's prefix;
//! - `job`: `sluice job`: a running `serve`'s jobs from the command line,
//!   over its REST API;
//! - `membership`: `sluice nodes`: a coordinator's nodes from the command
//!   line, over its REST API;
//! - `nodes`: the node processes: `sluice storage-node`, `sluice
//!   compute-node` and `sluice serve`;
//! - [`place`]: the compute session a command plans and runs queries with:
//!   over remote storage nodes;
//! - `scrub`: `sluice scrub --url URL`: `POST /v1/scrub` on a running server;
//! - `sql`: `sluice sql "QUERY"`: DataFusion SQL over the datasets, with
//!   sluice's UDFs;
//! - `tokens`: `sluice tokens`: the tokens file an operator keeps
//!   (`sluice_access::TokenFile`);
//! - `udfs`: `sluice udfs [--calibrate]`: the UDFs, their arguments and cost
//!   profiles.

pub mod bench;
mod certs;
mod checkpoints;
mod datasets;
mod explain;
mod gc;
mod gen_sample;
mod info;
mod ingest;
mod job;
mod membership;
mod nodes;
pub mod place;
mod scrub;
mod sql;
mod tokens;
mod udfs;

use std::sync::Arc;

use anyhow::Context;
use sluice_storage::scan::ScanOptions;
use sluice_storage::{Store, StoreOptions};

use crate::cli::{Cli, Command};

/// Store options from the global flags.
pub fn store_options(cli: &Cli) -> StoreOptions {
    StoreOptions {
        backend: cli.device_backend,
        device_path: cli.device.clone(),
        device_size: cli.device_size,
        chunk_size: cli.chunk_size,
        cache_memory: cli.cache_memory,
        #[cfg(feature = "spdk")]
        spdk: cli.spdk.options(),
        ..StoreOptions::new(&cli.data_dir)
    }
}

/// Scan tuning from the global flags.
pub fn scan_options(cli: &Cli) -> ScanOptions {
    ScanOptions {
        reads_in_flight: cli.scan_depth.max(1),
        max_read: cli.max_read.max(4096),
        ..ScanOptions::default()
    }
}

/// Opens (creating if needed) the data dir named by the global flags.
pub fn open_store(cli: &Cli) -> anyhow::Result<Arc<Store>> {
    Store::open(&store_options(cli))
        .with_context(|| format!("cannot open data dir {}", cli.data_dir.display()))
}

/// Runs the parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match &cli.command {
        Command::Ingest { .. } => ingest_command(&cli).await,
        Command::Datasets {
            url: Some(url),
            format,
        } => {
            datasets::remote(
                place::rest_client(&cli, url, cli.token.first().cloned())?,
                *format,
            )
            .await
        }
        Command::Datasets { url: None, format } => datasets::run(&cli, *format),
        Command::Sql {
            query,
            format,
            binary,
            udf,
            place,
        } => sql::run(&cli, query, *format, *binary, udf, place).await,
        Command::Explain {
            query,
            format,
            udf,
            place,
        } => explain::run(&cli, query, *format, udf, place).await,
        Command::StorageNode { node } => nodes::storage_node(&cli, node).await,
        Command::ComputeNode {
            listen,
            storage,
            coordinator,
            advertise,
            storage_cores,
            compute_cores,
            link_bandwidth,
            limits,
        } => {
            let hints = place::hints(*storage_cores, *compute_cores, *link_bandwidth);
            let cluster = nodes::Cluster {
                coordinator: coordinator.as_deref(),
                advertise: advertise.as_deref(),
            };
            nodes::compute_node(&cli, listen, storage, cluster, hints, *limits).await
        }
        Command::Serve { .. } => serve_command(&cli).await,
        Command::Checkpoints { action } => checkpoints::run(&cli, action).await,
        Command::Job { url, action } => job::run(&cli, url, action).await,
        Command::Udfs { calibrate, format } => udfs::run(&cli, *calibrate, *format),
        Command::Info { format } => info::run(&cli, *format),
        Command::Gc { dry_run, format } => gc::run(&cli, *dry_run, *format).await,
        Command::GenSample {
            dir,
            classes,
            per_class,
            seed,
        } => gen_sample::run(dir, *classes, *per_class, *seed),
        Command::Nodes { url, action } => membership::run(&cli, url, action).await,
        Command::Rebalance { url } => membership::rebalance(&cli, url).await,
        Command::Scrub {
            url,
            dataset,
            rate_mb_s,
            format,
        } => {
            let client = place::rest_client(&cli, url, cli.token.first().cloned())?;
            scrub::run(client, dataset.as_deref(), *rate_mb_s, *format).await
        }
        Command::Tokens { action } => tokens::run(action),
        Command::Certs { action } => certs::run(action),
        Command::Bench { which } => bench::run(&cli, which).await,
    }
}

/// `sluice ingest`: through a server's REST API (`--url`), or into this
/// data dir.
async fn ingest_command(cli: &Cli) -> anyhow::Result<()> {
    match &cli.command {
        Command::Ingest {
            dataset,
            source,
            manifest,
            on_error,
            shard: _,
            replicas,
            url: Some(url),
            format,
        } => {
            ingest::remote(
                url,
                place::rest_client(cli, url, cli.token.first().cloned())?,
                ingest::Remote {
                    dataset,
                    source,
                    manifest: manifest.as_deref(),
                    on_error: *on_error,
                    replicas: *replicas,
                },
                *format,
            )
            .await
        }
        Command::Ingest {
            dataset,
            source,
            manifest,
            on_error,
            shard,
            replicas,
            url: None,
            format,
        } => {
            let shard = ingest::replicated(*shard, *replicas)?;
            ingest::run(
                cli,
                dataset,
                source,
                manifest.as_deref(),
                *on_error,
                shard,
                *format,
            )
            .await
        }
        _ => unreachable!("run sends only `ingest` here"),
    }
}

/// `sluice serve`: its options as the server's addresses, limits and
/// schedules.
async fn serve_command(cli: &Cli) -> anyhow::Result<()> {
    let Command::Serve {
        flight,
        rest,
        ingest_root,
        ingest_url_allow,
        storage,
        remote_storage,
        loopback,
        storage_cores,
        compute_cores,
        link_limit,
        checkpoint_keep,
        checkpoint_idle_timeout,
        checkpoint_replicas,
        checkpoint_sweep_every,
        job_ttl,
        scrub_every,
        scrub_rate_mb_s,
        lost_after,
        limits,
    } = &cli.command
    else {
        unreachable!("run sends only `serve` here");
    };
    let hints = place::hints(None, *compute_cores, None);
    let addrs = nodes::ServeAddrs {
        flight,
        rest,
        ingest_roots: ingest_root,
        ingest_url_allow: sluice_storage::ingest::objects::UrlAllow::new(ingest_url_allow)?,
        storage,
        remote_storage: *remote_storage,
        checkpoints: sluice_storage::checkpoint::CheckpointOptions {
            keep: *checkpoint_keep as usize,
            idle_timeout: std::time::Duration::from_secs_f64(
                checkpoint_idle_timeout.clamp(0.1, 86_400.0),
            ),
            // One machine's store: its trainers hold tokens.
            passes: false,
        },
        cluster_checkpoints: (
            *checkpoint_replicas,
            std::time::Duration::from_secs_f64(checkpoint_sweep_every.clamp(0.1, 1e9)),
        ),
        job_ttl: std::time::Duration::from_secs_f64(job_ttl.clamp(1.0, 1e9)),
        scrub: crate::rest::scrub::schedule(*scrub_every, *scrub_rate_mb_s),
        lost_after: *lost_after,
        limits: *limits,
    };
    nodes::serve(cli, &addrs, *loopback, *storage_cores, *link_limit, hints).await
}
