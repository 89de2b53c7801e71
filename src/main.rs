//! # sluice
//!
//! The `sluice` binary: a dataflow service that feeds ML trainers. This
//! crate is the top of the stack — CLI, configuration and wiring; the
//! storage engine lives in `sluice-storage` (`storage-exec/`), the UDFs in
//! `sluice-udfs` (`udfs/`).
//!
//! ```text
//! sluice [--data-dir DIR] ingest DATASET SOURCE [--manifest FILE] [--on-error skip|fail]
//! sluice [--data-dir DIR] datasets [--format table|json]
//! sluice [--data-dir DIR] sql "QUERY" [--format table|csv|json|arrow] [--binary length|hex|base64]
//!        [--on-error skip|null|fail] [--seed N] [--epoch N] [--max-pixels N] [--max-frames N] [--max-decoded-bytes SIZE]
//! sluice [--data-dir DIR] udfs [--calibrate]
//! sluice [--data-dir DIR] info
//! sluice [--data-dir DIR] bench scan|random|catalog|udf
//! sluice job submit FILE | list | status ID [--watch] | cancel ID | explain ID   [--url URL]
//! sluice gen-sample DIR
//! ```
//!
//! Every command exits non-zero with a one-line `error: …` on failure.
//!
//! Modules:
//! - `cli`: command-line arguments;
//! - `commands`: one file per command;
//! - `coordinator`: a node's link to its coordinator (`sluice serve`), over
//!   the coordinator's REST API;
//! - `output`: printing query results: aligned table, CSV, JSON lines, or an
//!   Arrow IPC stream;
//! - `rest`: the REST API (axum), documented by the OpenAPI document it
//!   serves at `/openapi.json`;
//! - `rest_client`: a small client of the REST API for the CLI's `job`
//!   commands and a compute node's calls to its coordinator;
//! - `size`: byte sizes on the command line: `512`, `64KiB`, `4MiB`, `16GiB`,
//!   `1G`.

mod cli;
mod commands;
mod coordinator;
mod output;
mod rest;
mod rest_client;
mod size;

use clap::Parser;

/// Keeps large buffers (decoded images, tensor batches) in the malloc heap
/// rather than a fresh mmap each: glibc maps allocations over 128 KiB and
/// unmaps them on free, so every batch paid a page fault per 4 KiB. Two
/// arenas with a generous top pad keep freed batch memory for the next
/// batch.
fn tune_malloc() {
    // SAFETY: mallopt only sets glibc allocator parameters; it is called
    // before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
        libc::mallopt(libc::M_TOP_PAD, 512 << 20);
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

fn main() -> std::process::ExitCode {
    tune_malloc();
    let cli = cli::Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    // One memory budget for every query and job of the process.
    sluice_udfs::memory_budget::MemoryBudget::global().configure(
        cli.memory_limit
            .unwrap_or_else(sluice_udfs::memory_budget::MemoryBudget::default_size),
    );
    // Planning recurses over expressions (`1+1+…+1` with hundreds of
    // terms): every thread gets a stack deep ones fit in. Named apart
    // from the executors' threads (`sluice-cpu`, …): in `serve` this
    // runtime answers REST and Flight and writes shared-memory slots.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .thread_name("sluice-service")
        .thread_stack_size(sluice_base::executor::STACK_BYTES)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(commands::run(cli));
    // The command's stores are closed by now: stop SPDK cleanly if it ran.
    // Something still holding a DMA buffer makes it refuse, and the exit
    // hook parks the SPDK thread instead.
    #[cfg(feature = "spdk")]
    if let Err(e) = sluice_storage::device::spdk::shutdown() {
        tracing::debug!("{e}");
    }
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// The error chain on one line, leaving out causes whose text an outer error
/// already printed (DataFusion and storage errors embed their sources). An
/// error of ours inside DataFusion's is printed as itself, without the
/// engine's wrapping ("External error: …").
fn one_line(e: &anyhow::Error) -> String {
    let mut msg = String::new();
    for cause in e.chain() {
        let ours = cause
            .downcast_ref::<datafusion::error::DataFusionError>()
            .and_then(sluice_base::fault::fault_of);
        let text = ours.map_or_else(|| cause.to_string(), ToString::to_string);
        if msg.contains(&text) {
            continue;
        }
        if !msg.is_empty() {
            msg.push_str(": ");
        }
        msg.push_str(&text);
    }
    msg.replace('\n', " ")
}
