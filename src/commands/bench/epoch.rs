//! `sluice bench epoch`: a job's epoch at scale.
//!
//! For each dataset size N: ingest N tiny PNGs (8×8), start an in-process
//! storage node and a compute session over it, submit a trivial job
//! (`resize(decode_image(data), 16, 16)`, shuffled), and time submit →
//! first batch (the job's planning and its one O(N) index) and one epoch
//! of its one rank. What is measured is the job machinery per sample —
//! windows, takes, reads, the reorder, the batches' messages — which must not grow
//! with N; the decode of an 8×8 PNG costs next to nothing. The resident
//! memory the job and the node's in-memory metadata add is reported too.
//! Then an elastic resume: a job of 3 ranks resumed from the middle of
//! the epoch (as a trainer's saved state gives it), timed from submit to
//! its first batch; and the same epoch as a weighted mixture of three
//! datasets (the same PNG, in thirds), whose rate is printed beside the
//! single dataset's.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use futures::TryStreamExt;
use sluice_compute::job::mix::MixEpoch;
use sluice_compute::job::{MixPart, OffloadArg, Resume, Shuffle, ShuffleMode};
use sluice_compute::{ComputeSession, JobSpec, Jobs, ResourceHints};
use sluice_storage::scan::ScanOptions;
use sluice_storage::{StorageNode, Store, StoreOptions};

use super::fixture::{ingest_objects, write_json};

/// One size's figures.
#[derive(Debug, serde::Serialize)]
struct Row {
    samples: usize,
    ingest_s: f64,
    index_s: f64,
    first_batch_s: f64,
    resumed_first_batch_s: f64,
    epoch_s: f64,
    samples_per_s: f64,
    /// The same epoch as a 3-part mixture of the dataset's thirds.
    mix_samples_per_s: f64,
    rss_added_bytes: u64,
}

/// Resident bytes now.
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

pub async fn epoch(
    opts: &StoreOptions,
    sizes: &[usize],
    batch: u64,
    json: Option<&Path>,
) -> anyhow::Result<()> {
    let png = {
        let mut out = std::io::Cursor::new(Vec::new());
        image::RgbImage::from_fn(8, 8, |x, y| image::Rgb([x as u8 * 30, y as u8 * 30, 7]))
            .write_to(&mut out, image::ImageFormat::Png)?;
        out.into_inner()
    };
    let mut rows = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let dir = opts.data_dir.join(format!("epoch-{i}"));
        let store = Store::open(&StoreOptions {
            data_dir: dir,
            ..opts.clone()
        })?;
        let name = format!("tiny{i}");
        let (_, ingest_s) = ingest_objects(&store, &name, std::slice::from_ref(&png), n).await?;
        for (part, share) in parts(n) {
            let part = format!("{name}_{part}");
            ingest_objects(&store, &part, std::slice::from_ref(&png), share).await?;
        }
        let cores = sluice_planner::resources::machine_cores();
        let node = StorageNode::new(store, ScanOptions::default(), cores, None)?;
        let session = ComputeSession::new(
            vec![node],
            sluice_udfs::cost::default_profiles(),
            ResourceHints::default(),
        );
        let jobs = Jobs::new(Arc::new(session))?;
        let mut spec = JobSpec::sql(format!(
            "SELECT key, resize(decode_image(data), 16, 16) AS x FROM {name}"
        ));
        spec.batch_size = batch;
        spec.offload = OffloadArg::Name("auto".into());
        spec.shuffle = Some(Shuffle {
            seed: 1,
            mode: ShuffleMode::Full,
            block_size: 64,
            window: 1024,
        });
        let rss0 = rss_bytes();
        let one = Timed::epoch(&jobs, spec.clone()).await?;
        let rss_added_bytes = rss_bytes().saturating_sub(rss0);
        anyhow::ensure!(one.got == n, "epoch delivered {} of {n} samples", one.got);
        let mixed = Timed::epoch(&jobs, mixture(spec.clone(), &name, n)).await?;
        anyhow::ensure!(mixed.got == n, "the mixture delivered {} of {n}", mixed.got);
        let resumed_first_batch_s = resumed_first_batch(&jobs, spec, n as u64).await?;
        rows.push(Row {
            samples: n,
            ingest_s,
            index_s: one.index_s,
            first_batch_s: one.first_batch_s,
            resumed_first_batch_s,
            epoch_s: one.epoch_s,
            samples_per_s: n as f64 / one.epoch_s,
            mix_samples_per_s: n as f64 / mixed.epoch_s,
            rss_added_bytes,
        });
    }
    print_rows(batch, &rows);
    write_json(
        json,
        &serde_json::json!({"bench": "epoch", "batch": batch, "sizes": rows}),
    )
}

/// Submit → first batch of `spec` resumed by 3 ranks at the middle of its
/// first epoch of `samples` (an odd position: no shape divides it).
async fn resumed_first_batch(jobs: &Jobs, mut spec: JobSpec, samples: u64) -> anyhow::Result<f64> {
    spec.world_size = 3;
    spec.resume = Some(Resume {
        epoch: 0,
        position: (samples / 2) | 1,
        samples: Some(samples),
        shuffle: Some(spec.shuffle),
        format: Some(1),
    });
    let t = Instant::now();
    let job = jobs.submit(spec).await?;
    let mut stream = Box::pin(job.deliver(2, 0, 0, None).await?);
    anyhow::ensure!(
        stream.try_next().await?.is_some(),
        "the resumed job delivered nothing"
    );
    Ok(t.elapsed().as_secs_f64())
}

/// The figures as a table.
fn print_rows(batch: u64, rows: &[Row]) {
    let base = rows.first().map_or(1.0, |r| r.samples_per_s);
    println!();
    println!("job epoch at scale (decode + resize 16x16 of 8x8 PNGs, batch {batch}, one rank)");
    println!(
        "{:>10} {:>10} {:>14} {:>16} {:>16} {:>12} {:>14} {:>10} {:>20}",
        "samples",
        "ingest s",
        "submit→index s",
        "submit→batch s",
        "resumed→batch s",
        "samples/s",
        "3-mix samples/s",
        "vs first",
        "RSS added B/sample"
    );
    for r in rows {
        println!(
            "{:>10} {:>10.1} {:>14.3} {:>16.3} {:>16.3} {:>12.0} {:>14.0} {:>10.2} {:>20.1}",
            r.samples,
            r.ingest_s,
            r.index_s,
            r.first_batch_s,
            r.resumed_first_batch_s,
            r.samples_per_s,
            r.mix_samples_per_s,
            r.samples_per_s / base,
            r.rss_added_bytes as f64 / r.samples as f64
        );
    }
}

/// A mixture's three parts and their samples: thirds of `n` (the first
/// takes the rest), weighted as they hold.
fn parts(n: usize) -> [(&'static str, usize); 3] {
    [("a", n - 2 * (n / 3)), ("b", n / 3), ("c", n / 3)]
}

/// `spec` over the three parts of dataset `name`'s `n` samples (see
/// [`parts`]), weighted by their sizes: an epoch (`resample`) of `n`.
fn mixture(mut spec: JobSpec, name: &str, n: usize) -> JobSpec {
    spec.mix = Some(
        parts(n)
            .iter()
            .map(|(part, share)| MixPart {
                dataset: Some(format!("{name}_{part}")),
                sql: None,
                plan: None,
                weight: *share as f64 / n.max(1) as f64,
                name: None,
            })
            .collect(),
    );
    spec.mix_epoch = Some(MixEpoch::Resample);
    spec
}

/// One epoch of a job, timed.
struct Timed {
    index_s: f64,
    first_batch_s: f64,
    epoch_s: f64,
    got: usize,
}

impl Timed {
    /// Submits `spec` and reads its rank 0's epoch 0 whole.
    async fn epoch(jobs: &Jobs, spec: JobSpec) -> anyhow::Result<Self> {
        let t = Instant::now();
        let job = jobs.submit(spec).await?;
        job.layout().await?;
        let index_s = t.elapsed().as_secs_f64();
        let mut stream = Box::pin(job.deliver(0, 0, 0, None).await?);
        let first = stream.try_next().await?;
        let first_batch_s = t.elapsed().as_secs_f64();
        // Each batch is laid out as a trainer's read lays it out (its
        // message, borrowing the windows' buffers; a finished column, see
        // `job::finish`, made as a read over Flight makes it).
        let mut got = match first {
            Some(d) => {
                let _message = d.rows.encode()?.made();
                d.num_rows()
            }
            None => 0,
        };
        let t = Instant::now();
        while let Some(d) = stream.try_next().await? {
            let _message = d.rows.encode()?.made();
            got += d.num_rows();
        }
        Ok(Self {
            index_s,
            first_batch_s,
            epoch_s: first_batch_s + t.elapsed().as_secs_f64(),
            got,
        })
    }
}
