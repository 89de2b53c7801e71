//! `sluice bench`: the storage path measured against the device's own limit,
//! in the same run, on the same device file.
//!
//! - `scan`: a sequential scan of a dataset's `data` through SQL, against
//!   `dd iflag=direct` (and `fio` when installed) reading the same bytes;
//! - `random`: random object reads (crc-checked, many in flight) against
//!   `fio --rw=randread` at the same block size and depth;
//! - `catalog`: ingest of 1,000,000 small objects' metadata, `count(*)`, a
//!   selective filter, and peak RSS.
//!
//! Each prints a table with our figure, the baseline's and the ratio, and
//! writes the same as JSON (`--json FILE`). Runs repeat and report medians:
//! the machine is shared and noisy.
//!
//! Modules:
//! - `storage`: `scan`, `random` and `catalog`;
//! - `device`: `sluice bench device`: raw reads through a device backend;
//! - `epoch`: `sluice bench epoch`: a job's epoch at scale;
//! - `udf`: `sluice bench udf`: the cost of a UDF pipeline per core;
//! - `fixture`: what they share (objects ingested, pages dropped, medians,
//!   JSON).

use sluice_storage::StoreOptions;

use crate::cli::{BenchCommand, Cli};

mod device;
mod epoch;
mod fixture;
mod storage;
mod udf;

use fixture::RemoveOnDrop;
use storage::{catalog, random, scan};

/// Says, on stderr, when a benchmark runs on a build without optimisation
/// of sluice's own crates: its figures are not what a deployment gets.
fn warn_if_debug(what: &str) {
    if cfg!(debug_assertions) {
        eprintln!(
            "warning: {what} on a debug build: the figures are not a deployment's; \
             build with `cargo build --release` (see the README) to measure"
        );
    }
}

pub async fn run(cli: &Cli, which: &BenchCommand) -> anyhow::Result<()> {
    warn_if_debug("sluice bench");
    if let BenchCommand::Device {
        pattern,
        io_size,
        depth,
        seconds,
        runs,
        json,
    } = which
    {
        // No data dir: the device itself, read only.
        return device::run(
            cli,
            *pattern,
            *io_size,
            *depth,
            *seconds,
            *runs,
            json.as_deref(),
        )
        .await;
    }
    // Benchmarks use their own data dir beside the configured one, so they
    // never touch real datasets; it is removed afterwards.
    let dir = cli.data_dir.with_file_name(format!(
        "{}-bench-{}",
        cli.data_dir
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_else(|| "sluice".into()),
        std::process::id()
    ));
    let _cleanup = RemoveOnDrop(dir.clone());
    let opts = StoreOptions {
        backend: cli.device_backend,
        chunk_size: cli.chunk_size,
        ..StoreOptions::new(&dir)
    };
    match which {
        BenchCommand::Scan {
            bytes,
            object_size,
            runs,
            json,
        } => scan(&opts, *bytes, *object_size, *runs, json.as_deref()).await,
        BenchCommand::Random {
            bytes,
            object_size,
            depth,
            reads,
            runs,
            json,
        } => {
            random(
                &opts,
                *bytes,
                *object_size,
                *depth,
                *reads,
                *runs,
                json.as_deref(),
            )
            .await
        }
        BenchCommand::Catalog { samples, json } => catalog(&opts, *samples, json.as_deref()).await,
        BenchCommand::Epoch {
            samples,
            batch,
            json,
        } => {
            epoch::epoch(&opts, samples, *batch, json.as_deref()).await?;
            Ok(())
        }
        BenchCommand::Udf {
            dir,
            sql,
            runs,
            json,
        } => udf::run(dir, sql, *runs, json.as_deref()).await,
        BenchCommand::Device { .. } => unreachable!("run before the bench data dir is made"),
    }
}
