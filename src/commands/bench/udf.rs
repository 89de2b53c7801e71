//! `sluice bench udf --dir DIR --sql "…"`: the cost of a UDF pipeline per core.
//!
//! The files of DIR are loaded into memory as a table `files(key, data)` of
//! one partition, and the query runs with one target partition, so the UDFs
//! run on one core with no I/O: the figure is comparable with a
//! single-process Python loop over the same bytes (see
//! `scripts/bench_udfs.py`, which runs both and prints the ratio).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use arrow::array::{ArrayRef, BinaryArray, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use datafusion::datasource::MemTable;
use datafusion::prelude::{SessionConfig, SessionContext};
use futures::StreamExt;
use sluice_udfs::{UdfEnv, UdfOptions};

/// Rows per in-memory batch.
const BATCH: usize = 32;

fn load(dir: &Path) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            let key = p
                .file_name()
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_default();
            let bytes =
                std::fs::read(&p).with_context(|| format!("cannot read {}", p.display()))?;
            Ok((key, bytes))
        })
        .collect()
}

fn table(files: &[(String, Vec<u8>)]) -> anyhow::Result<MemTable> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("key", DataType::Utf8, false),
        Field::new("data", DataType::Binary, false),
    ]));
    let batches = files
        .chunks(BATCH)
        .map(|c| {
            let keys: ArrayRef = Arc::new(StringArray::from_iter_values(
                c.iter().map(|f| f.0.as_str()),
            ));
            let data: ArrayRef = Arc::new(BinaryArray::from_iter_values(
                c.iter().map(|f| f.1.as_slice()),
            ));
            RecordBatch::try_new(Arc::clone(&schema), vec![keys, data])
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(MemTable::try_new(schema, vec![batches])?)
}

pub async fn run(dir: &Path, sql: &str, runs: usize, json: Option<&Path>) -> anyhow::Result<()> {
    let files = load(dir)?;
    anyhow::ensure!(!files.is_empty(), "no files in {}", dir.display());
    let config = SessionConfig::new()
        .with_target_partitions(1)
        .with_batch_size(BATCH);
    let ctx = SessionContext::new_with_config(config);
    ctx.register_table("files", Arc::new(table(&files)?))?;
    let env = UdfEnv::new(UdfOptions {
        seed: 1,
        ..UdfOptions::default()
    });
    sluice_udfs::register(&ctx, &env);
    let mut rates = Vec::new();
    for run in 0..=runs.max(1) {
        let t = Instant::now();
        let mut stream = ctx.sql(sql).await?.execute_stream().await?;
        let mut rows = 0usize;
        while let Some(b) = stream.next().await {
            rows += b?.num_rows();
        }
        let rate = rows as f64 / t.elapsed().as_secs_f64();
        // The first pass warms caches and is not counted.
        if run > 0 {
            rates.push(rate);
        }
    }
    rates.sort_by(f64::total_cmp);
    let median = rates[rates.len() / 2];
    println!(
        "{} samples, {median:.1} samples/s per core (median of {})",
        files.len(),
        rates.len()
    );
    if let Some(path) = json {
        let doc =
            serde_json::json!({ "samples": files.len(), "samples_per_s": median, "runs": rates });
        std::fs::write(path, serde_json::to_vec_pretty(&doc)?)?;
    }
    Ok(())
}
