//! What the benchmarks share: generated objects ingested into a store,
//! the device's pages dropped between runs, medians, peak RSS, a scratch
//! dir removed on drop, and the JSON written beside the table.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use sluice_storage::{IngestOptions, IngestReport, IngestSource, OnError, Store};

use crate::size::human;

pub(super) struct RemoveOnDrop(pub(super) PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// A 64×64 JPEG of noise made exactly `size` bytes long: padded after the
/// end-of-image marker (which decoders ignore), or cut when smaller — ingest
/// only reads the header, and the scan benchmarks only move bytes.
pub(super) fn noise_jpeg(size: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let side = 64u32;
    let img = image::RgbImage::from_fn(side, side, |_, _| {
        let v = next();
        image::Rgb([v as u8, (v >> 8) as u8, (v >> 16) as u8])
    });
    let mut out = std::io::Cursor::new(Vec::new());
    let _ = img.write_to(&mut out, image::ImageFormat::Jpeg);
    let mut bytes = out.into_inner();
    while bytes.len() < size {
        let v = next();
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    bytes.truncate(size);
    bytes
}

/// Ingests `n` objects keyed `obj_00000000…`, cycling through `templates`;
/// returns the report and the ingest's wall time (building the objects in
/// memory is not timed).
pub(super) async fn ingest_objects(
    store: &std::sync::Arc<Store>,
    name: &str,
    templates: &[Vec<u8>],
    n: usize,
) -> anyhow::Result<(IngestReport, f64)> {
    let samples = (0..n)
        .map(|i| {
            (
                format!("obj_{i:08}"),
                templates[i % templates.len()].clone(),
            )
        })
        .collect();
    let t = Instant::now();
    let report = sluice_storage::ingest(
        store,
        name,
        IngestSource::Memory(samples),
        IngestOptions::with_policy(OnError::Fail),
    )
    .await?;
    Ok((report, t.elapsed().as_secs_f64()))
}

pub(super) async fn fill(
    store: &Arc<Store>,
    name: &str,
    bytes: u64,
    object_size: u64,
) -> anyhow::Result<u64> {
    let n = (bytes / object_size).max(1) as usize;
    let templates: Vec<Vec<u8>> = (0..16)
        .map(|i| noise_jpeg(object_size as usize, i + 1))
        .collect();
    let (report, seconds) = ingest_objects(store, name, &templates, n).await?;
    println!(
        "ingested {} objects of {} ({}) in {seconds:.1} s",
        report.samples,
        human(object_size),
        human(report.bytes),
    );
    Ok(report.bytes)
}

/// Drops the device file's pages from the page cache (O_DIRECT never uses
/// them, but the file backend and dd without iflag=direct would).
pub(super) fn drop_cache(path: &Path) {
    if let Ok(f) = std::fs::File::open(path) {
        use std::os::fd::AsRawFd;
        // SAFETY: posix_fadvise on a valid open descriptor has no memory effects.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
}

pub(super) fn write_json(path: Option<&Path>, doc: &serde_json::Value) -> anyhow::Result<()> {
    if let Some(p) = path {
        std::fs::write(p, serde_json::to_string_pretty(doc)?)
            .with_context(|| format!("write {}", p.display()))?;
    }
    Ok(())
}

pub(super) fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<u64>().ok())
            })
        })
        .map_or(0, |kib| kib * 1024)
}
