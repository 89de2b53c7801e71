//! `sluice bench scan`, `random` and `catalog`: the storage path against
//! the device's own limit (`dd iflag=direct`, `fio`) on the same device
//! file, and the catalog at a million objects.

use std::path::Path;
use std::process::Command as Process;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use arrow::array::{Array, AsArray};
use arrow::datatypes::{UInt32Type, UInt64Type};
use futures::{StreamExt, TryStreamExt};
use sluice_storage::device::DeviceExt;
use sluice_storage::scan::ScanOptions;
use sluice_storage::{Store, StoreOptions};

use crate::size::human;

use super::fixture::{drop_cache, fill, ingest_objects, median, peak_rss_bytes, write_json};

fn dd_direct(path: &Path, bytes: u64) -> anyhow::Result<f64> {
    let bs = 4u64 << 20;
    let count = bytes.div_ceil(bs);
    let t = Instant::now();
    let out = Process::new("dd")
        .arg(format!("if={}", path.display()))
        .arg("of=/dev/null")
        .arg("iflag=direct")
        .arg(format!("bs={bs}"))
        .arg(format!("count={count}"))
        .output()
        .context("run dd")?;
    if !out.status.success() {
        bail!("dd failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok((count * bs) as f64 / t.elapsed().as_secs_f64())
}

fn fio_available() -> bool {
    Process::new("fio")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs fio on the device file and returns (bytes/s, IOPS).
fn fio(
    path: &Path,
    rw: &str,
    bs: u64,
    depth: usize,
    size: u64,
    runtime_s: u64,
) -> anyhow::Result<(f64, f64)> {
    let out = Process::new("fio")
        .args([
            "--name=baseline",
            "--ioengine=io_uring",
            "--direct=1",
            "--output-format=json",
        ])
        .arg(format!("--filename={}", path.display()))
        .arg(format!("--rw={rw}"))
        .arg(format!("--bs={bs}"))
        .arg(format!("--iodepth={depth}"))
        .arg(format!("--size={size}"))
        .arg(format!("--runtime={runtime_s}"))
        .arg("--time_based=0")
        .output()
        .context("run fio")?;
    if !out.status.success() {
        bail!("fio failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).context("parse fio output")?;
    let read = &doc["jobs"][0]["read"];
    let bw = read["bw_bytes"].as_f64().unwrap_or(0.0);
    let iops = read["iops"].as_f64().unwrap_or(0.0);
    Ok((bw, iops))
}

/// Scan depths tried: devices differ in the depth they like (NVMe wants
/// many requests in flight; some virtual disks are fastest at one).
const SCAN_DEPTHS: [usize; 3] = [1, 2, 8];

pub(super) async fn scan(
    opts: &StoreOptions,
    bytes: u64,
    object_size: u64,
    runs: usize,
    json: Option<&Path>,
) -> anyhow::Result<()> {
    let store = Store::open(opts)?;
    let device_path = store.device().describe().path;
    let written = fill(&store, "bench", bytes, object_size).await?;
    let mut ours: Vec<Vec<f64>> = vec![Vec::new(); SCAN_DEPTHS.len()];
    let (mut dd, mut fio_qd1, mut fio_qd8) = (Vec::new(), Vec::new(), Vec::new());
    let has_fio = fio_available();
    for _ in 0..runs.max(1) {
        for (i, depth) in SCAN_DEPTHS.iter().enumerate() {
            let ctx = sluice_storage::session_context_with(
                Arc::clone(&store),
                ScanOptions {
                    reads_in_flight: *depth,
                    ..ScanOptions::default()
                },
                &sluice_udfs::UdfEnv::new(Default::default()),
            );
            drop_cache(&device_path);
            let t = Instant::now();
            let mut stream = ctx
                .sql("SELECT data FROM bench")
                .await?
                .execute_stream()
                .await?;
            let mut seen = 0u64;
            while let Some(batch) = stream.try_next().await? {
                let data = batch.column(0).as_binary::<i32>();
                seen += (data.value_offsets()[data.len()] - data.value_offsets()[0]) as u64;
            }
            if seen != written {
                bail!("scan returned {seen} bytes, {written} were ingested");
            }
            ours[i].push(seen as f64 / t.elapsed().as_secs_f64());
        }
        drop_cache(&device_path);
        dd.push(dd_direct(&device_path, written)?);
        if has_fio {
            fio_qd1.push(fio(&device_path, "read", 4 << 20, 1, written, 60)?.0);
            fio_qd8.push(fio(&device_path, "read", 4 << 20, 8, written, 60)?.0);
        }
    }
    let backend = store.device().describe().backend;
    let mib = |v: f64| v / 1048576.0;
    println!();
    println!(
        "sequential scan of {} ({} objects, {} backend, 4 MiB reads), median of {runs}",
        human(written),
        human(object_size),
        backend
    );
    println!("{:<40} {:>10}", "", "MiB/s");
    let mut doc = serde_json::json!({
        "bench": "scan", "bytes": written, "object_size": object_size, "backend": backend,
    });
    let mut best_ours = 0f64;
    for (depth, v) in SCAN_DEPTHS.iter().zip(ours) {
        let m = median(v);
        best_ours = best_ours.max(m);
        println!(
            "{:<40} {:>10.0}",
            format!("sluice SELECT data, {depth} reads in flight"),
            mib(m)
        );
        doc[format!("sluice_depth{depth}_bytes_per_s")] = m.into();
    }
    let mut best_base = median(dd);
    println!("{:<40} {:>10.0}", "dd iflag=direct bs=4M", mib(best_base));
    doc["dd_bytes_per_s"] = best_base.into();
    if has_fio {
        for (name, v) in [
            ("fio io_uring read bs=4M qd=1", fio_qd1),
            ("fio io_uring read bs=4M qd=8", fio_qd8),
        ] {
            let m = median(v);
            best_base = best_base.max(m);
            println!("{name:<40} {:>10.0}", mib(m));
            doc[name.replace(' ', "_")] = m.into();
        }
    } else {
        println!("{:<40} {:>10}", "fio (not installed)", "-");
    }
    println!(
        "ratio best sluice / best baseline: {:.2}",
        best_ours / best_base
    );
    doc["ratio_vs_best"] = (best_ours / best_base).into();
    write_json(json, &doc)
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn random(
    opts: &StoreOptions,
    bytes: u64,
    object_size: u64,
    depth: usize,
    reads: usize,
    runs: usize,
    json: Option<&Path>,
) -> anyhow::Result<()> {
    let store = Store::open(opts)?;
    let device = Arc::clone(store.device());
    let device_path = device.describe().path;
    let written = fill(&store, "bench", bytes, object_size).await?;
    let ctx = sluice_storage::session_context(Arc::clone(&store));
    let meta = ctx
        .sql("SELECT chunk, \"offset\", length, crc32c FROM bench")
        .await?
        .collect()
        .await?;
    let chunk_size = store.chunk_size();
    let mut extents = Vec::new();
    for b in &meta {
        let (c, o, l, k) = (
            b.column(0).as_primitive::<UInt64Type>(),
            b.column(1).as_primitive::<UInt64Type>(),
            b.column(2).as_primitive::<UInt64Type>(),
            b.column(3).as_primitive::<UInt32Type>(),
        );
        for i in 0..b.num_rows() {
            extents.push((c.value(i) * chunk_size + o.value(i), l.value(i), k.value(i)));
        }
    }
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut ours = Vec::new();
    let mut fio_iops = Vec::new();
    let has_fio = fio_available();
    for _ in 0..runs.max(1) {
        let picks: Vec<(u64, u64, u32)> = (0..reads)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                extents[(x % extents.len() as u64) as usize]
            })
            .collect();
        let t = Instant::now();
        let dev = Arc::clone(&device);
        futures::stream::iter(picks)
            .map(|(off, len, crc)| {
                let dev = Arc::clone(&dev);
                async move {
                    let (buf, at) = dev.read_covering(off, len).await?;
                    let actual = crc32c::crc32c(&buf.as_slice()[at..at + len as usize]);
                    if actual != crc {
                        bail!("checksum mismatch at {off}");
                    }
                    Ok(())
                }
            })
            .buffer_unordered(depth)
            .try_collect::<Vec<()>>()
            .await?;
        ours.push(reads as f64 / t.elapsed().as_secs_f64());
        if has_fio {
            fio_iops.push(fio(&device_path, "randread", object_size, depth, written, 20)?.1);
        }
    }
    let ours = median(ours);
    println!();
    println!(
        "random reads of {} objects over {}, {depth} in flight, {} backend, median of {runs}",
        human(object_size),
        human(written),
        device.describe().backend
    );
    println!("{:<44} {:>10}", "", "IOPS");
    println!("{:<44} {:>10.0}", "sluice object reads (crc-checked)", ours);
    let mut doc = serde_json::json!({
        "bench": "random", "bytes": written, "object_size": object_size, "depth": depth,
        "sluice_iops": ours,
    });
    if fio_iops.is_empty() {
        println!("{:<44} {:>10}", "fio randread (not installed)", "-");
    } else {
        let f = median(fio_iops);
        println!(
            "{:<44} {:>10.0}",
            format!("fio io_uring randread bs={} qd={depth}", human(object_size)),
            f
        );
        println!("ratio sluice / fio: {:.2}", ours / f);
        doc["fio_iops"] = f.into();
        doc["ratio_vs_fio"] = (ours / f).into();
    }
    write_json(json, &doc)
}

pub(super) async fn catalog(
    opts: &StoreOptions,
    samples: usize,
    json: Option<&Path>,
) -> anyhow::Result<()> {
    let store = Store::open(opts)?;
    // The smallest valid image: the metadata path is what is measured.
    let png = {
        let mut out = std::io::Cursor::new(Vec::new());
        image::RgbImage::new(1, 1).write_to(&mut out, image::ImageFormat::Png)?;
        out.into_inner()
    };
    let (report, ingest_s) = ingest_objects(&store, "catalog", &[png], samples).await?;
    let ctx = sluice_storage::session_context(Arc::clone(&store));
    let t = Instant::now();
    let count = ctx
        .sql("SELECT count(*) FROM catalog")
        .await?
        .collect()
        .await?;
    let count_s = t.elapsed().as_secs_f64();
    let n = count[0]
        .column(0)
        .as_primitive::<arrow::datatypes::Int64Type>()
        .value(0);
    let probe = format!("obj_{:08}", samples / 2);
    let t = Instant::now();
    let hit = ctx
        .sql(&format!(
            "SELECT key, length FROM catalog WHERE key = '{probe}'"
        ))
        .await?
        .collect()
        .await?;
    let filter_s = t.elapsed().as_secs_f64();
    let hits: usize = hit.iter().map(|b| b.num_rows()).sum();
    if n as usize != samples || hits != 1 {
        bail!("catalog bench: count {n} (want {samples}), filter hits {hits} (want 1)");
    }
    let rate = report.samples as f64 / ingest_s;
    let rss = peak_rss_bytes();
    println!();
    println!("catalog scale: {samples} objects");
    println!(
        "{:<40} {:>14}",
        "ingest (probe, crc, pack, metadata, commit)",
        format!("{rate:.0} samples/s")
    );
    println!(
        "{:<40} {:>14}",
        "SELECT count(*)",
        format!("{:.3} s", count_s)
    );
    println!(
        "{:<40} {:>14}",
        "WHERE key = '…' (1 row)",
        format!("{:.3} s", filter_s)
    );
    println!("{:<40} {:>14}", "peak RSS", human(rss));
    write_json(
        json,
        &serde_json::json!({
            "bench": "catalog", "samples": samples, "ingest_samples_per_s": rate,
            "count_s": count_s, "filter_s": filter_s, "peak_rss_bytes": rss,
        }),
    )
}
