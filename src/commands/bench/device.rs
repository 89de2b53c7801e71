//! `sluice bench device`: raw reads through a device backend, for comparing
//! backends on the same device (and against SPDK's `bdevperf`, see
//! `scripts/bench_spdk.py`).
//!
//! Opens the device named by `--device` (a file, a block device, or with
//! `--device-backend spdk` a `bdev:NAME`) without a data dir and keeps
//! `--depth` reads of `--io-size` in flight for `--seconds`: random aligned
//! offsets or a sequential sweep. Nothing is written. Each read goes through
//! the `Device` trait exactly as a scan's does: a pool buffer lent to the
//! backend and handed back. Prints IOPS and MiB/s, the median of `--runs`,
//! and writes them as JSON with `--json`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sluice_base::task::SpawnedTask;
use sluice_storage::device::{Device, DeviceOptions, open_device};

use crate::cli::Cli;
use crate::cli::Pattern;
use crate::size::human;

/// What one configuration measured.
#[derive(Debug, serde::Serialize)]
struct Report {
    backend: &'static str,
    device: PathBuf,
    pattern: Pattern,
    io_size: u64,
    depth: usize,
    seconds: f64,
    runs: Vec<f64>,
    iops: f64,
    mib_per_s: f64,
}

/// Runs the benchmark with the global device flags.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    cli: &Cli,
    pattern: Pattern,
    io_size: u64,
    depth: usize,
    seconds: f64,
    runs: usize,
    json: Option<&Path>,
) -> anyhow::Result<()> {
    let path = cli
        .device
        .clone()
        .context("bench device needs --device (a file, block device or bdev:NAME)")?;
    let opts = DeviceOptions {
        backend: cli.device_backend,
        queue_depth: depth.max(1),
        pool: sluice_storage::buffer::PoolOptions {
            fixed_count: depth.clamp(1, 256),
            fixed_size: io_size as usize,
            ..Default::default()
        },
        #[cfg(feature = "spdk")]
        spdk: cli.spdk.options(),
        ..DeviceOptions::default()
    };
    let device = open_device(&path, &opts)
        .with_context(|| format!("cannot open device {}", path.display()))?;
    let bs = device.block_size() as u64;
    if io_size == 0 || !io_size.is_multiple_of(bs) || io_size > device.capacity() {
        bail!(
            "--io-size {io_size} must be a positive multiple of the block size {bs} \
             and at most the device's {} bytes",
            device.capacity()
        );
    }
    let info = device.describe();
    eprintln!(
        "bench device: {} on {} ({}), {pattern:?}, {} reads, depth {depth}, {seconds} s × {runs}",
        info.backend,
        info.path.display(),
        human(info.capacity),
        human(io_size),
    );
    // One warm-up run (pool, caches, SPDK's first-touch of DMA memory).
    measure(&device, pattern, io_size, depth, seconds.min(1.0), 0).await?;
    let mut rates = Vec::new();
    for run in 0..runs.max(1) {
        let iops = measure(&device, pattern, io_size, depth, seconds, run as u64 + 1).await?;
        eprintln!("  run {}: {iops:.0} IOPS", run + 1);
        rates.push(iops);
    }
    let mut sorted = rates.clone();
    sorted.sort_by(f64::total_cmp);
    let iops = sorted[sorted.len() / 2];
    let report = Report {
        backend: info.backend,
        device: info.path,
        pattern,
        io_size,
        depth,
        seconds,
        runs: rates,
        iops,
        mib_per_s: iops * io_size as f64 / (1u64 << 20) as f64,
    };
    println!(
        "{:<8} {:<40} {:>12.0} IOPS {:>10.1} MiB/s",
        report.backend,
        report.device.display().to_string(),
        report.iops,
        report.mib_per_s
    );
    if let Some(path) = json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

/// Keeps `depth` reads in flight for `seconds`; returns completed reads per second.
async fn measure(
    device: &Arc<dyn Device>,
    pattern: Pattern,
    io_size: u64,
    depth: usize,
    seconds: f64,
    seed: u64,
) -> anyhow::Result<f64> {
    let slots = device.capacity() / io_size;
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let workers: Vec<_> = (0..depth.max(1) as u64)
        .map(|w| {
            let (device, stop, done, next) = (
                Arc::clone(device),
                Arc::clone(&stop),
                Arc::clone(&done),
                Arc::clone(&next),
            );
            SpawnedTask::spawn(async move {
                let mut x = (seed << 32 | w).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                let mut buf = device.pool().get(io_size as usize)?;
                while !stop.load(Ordering::Relaxed) {
                    let slot = match pattern {
                        Pattern::Randread => {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            x % slots
                        }
                        Pattern::Read => next.fetch_add(1, Ordering::Relaxed) % slots,
                    };
                    buf = device.read_at(slot * io_size, buf).await?;
                    done.fetch_add(1, Ordering::Relaxed);
                }
                anyhow::Ok(())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    let count = done.load(Ordering::Relaxed);
    let elapsed = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().await??;
    }
    Ok(count as f64 / elapsed)
}
