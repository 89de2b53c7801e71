//! `sluice ingest DATASET SOURCE`: a new dataset version from a directory,
//! a manifest or an object store's prefix (`s3://`, `gs://`, `az://`,
//! `http(s)://`) — into the data dir, or (`--url`) through a running
//! server, which spreads it over its storage nodes.

use std::io::IsTerminal;
use std::path::Path;

use indicatif::{ProgressBar, ProgressStyle};
use sluice_storage::ingest::objects::ObjectUrl;
use sluice_storage::{IngestOptions, IngestSource, NodeShare, OnError};

use super::open_store;
use crate::cli::{Cli, DocFormat};
use crate::size::human;

pub async fn run(
    cli: &Cli,
    dataset: &str,
    source: &Path,
    manifest: Option<&Path>,
    on_error: OnError,
    shard: Option<NodeShare>,
    format: DocFormat,
) -> anyhow::Result<()> {
    let store = open_store(cli)?;
    let source = IngestSource::from_arg(
        &source.to_string_lossy(),
        manifest.map(|m| m.to_string_lossy()).as_deref(),
        None,
    )?;
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} {pos}/{len} samples ({per_sec}) {msg} [{elapsed_precise}, eta {eta}]",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar
    });
    let progress_bar = bar.clone();
    let opts = IngestOptions {
        on_error,
        progress: Some(Box::new(move |p| {
            if let Some(bar) = &progress_bar {
                bar.set_length(p.total);
                bar.set_position(p.done);
                if p.done % 64 == 0 || p.done == p.total {
                    let secs = bar.elapsed().as_secs_f64().max(1e-3);
                    let rate = (p.bytes as f64 / secs) as u64;
                    bar.set_message(format!("{} ({}/s)", human(p.bytes), human(rate)));
                }
            }
        })),
        // The CLI reads what its user can; a server confines to its roots.
        confine: None,
        shard,
    };
    let result = sluice_storage::ingest(&store, dataset, source, opts).await;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let report = result?;
    match format {
        DocFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        DocFormat::Table => {
            let rate = report.samples as f64 / report.seconds.max(1e-9);
            println!(
                "ingested '{}' version {}: {} samples, {} in {} chunks, {:.2} s ({:.0} samples/s, {}/s)",
                report.dataset,
                report.version,
                report.samples,
                human(report.bytes),
                report.chunks,
                report.seconds,
                rate,
                human((report.bytes as f64 / report.seconds.max(1e-9)) as u64),
            );
            if !report.columns.is_empty() {
                println!("columns: {}", report.columns.join(", "));
            }
            if !report.skipped.is_empty() {
                println!("skipped {}:", report.skipped.len());
                for s in &report.skipped {
                    println!("  {}: {}", s.key, s.reason);
                }
            }
        }
    }
    Ok(())
}

/// `--shard I/N` with `--replicas R`: this node's R parts; `--replicas`
/// alone is an error (one data dir holds one copy).
pub fn replicated(
    shard: Option<NodeShare>,
    replicas: Option<u32>,
) -> anyhow::Result<Option<NodeShare>> {
    match (shard, replicas) {
        (_, None) => Ok(shard),
        (Some(s), Some(r)) => Ok(Some(
            NodeShare::new(s.index, s.count, r).map_err(anyhow::Error::msg)?,
        )),
        (None, Some(1)) => Ok(None),
        (None, Some(r)) => anyhow::bail!(
            "--replicas {r}: a data dir holds one copy; use it with --url (a cluster) or \
             --shard I/N"
        ),
    }
}

/// What `sluice ingest --url` asks the server to ingest.
#[derive(Debug)]
pub struct Remote<'a> {
    /// The dataset.
    pub dataset: &'a str,
    /// The source, on the server's host.
    pub source: &'a Path,
    /// A manifest under `source`.
    pub manifest: Option<&'a Path>,
    /// Unreadable objects.
    pub on_error: OnError,
    /// Nodes holding each part (`None`: the server's default).
    pub replicas: Option<u32>,
}

/// `sluice ingest --url URL`: `POST /v1/datasets` on the server at `url`.
pub async fn remote(
    url: &str,
    client: crate::rest_client::RestClient,
    ask: Remote<'_>,
    format: DocFormat,
) -> anyhow::Result<()> {
    let Remote {
        dataset,
        source,
        manifest,
        on_error,
        replicas,
    } = ask;
    // The server reads the path on its host: made absolute here, since a
    // relative one would resolve against the server's directory. A URL
    // (an object store's) goes as it is.
    let arg = source.to_string_lossy();
    let path = if ObjectUrl::is_url(&arg) {
        arg.into_owned()
    } else {
        std::path::absolute(source)?.display().to_string()
    };
    let body = serde_json::json!({
        "name": dataset,
        "path": path,
        "manifest": manifest,
        "on_error": on_error.to_string(),
        "replicas": replicas,
    });
    let report = client
        .call(http::Method::POST, "/v1/datasets", Some(&body))
        .await?;
    match format {
        DocFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        DocFormat::Table => {
            let parts = report["parts"].as_array().map_or(1, Vec::len);
            let copies = report["replicas"].as_u64().unwrap_or(1);
            println!(
                "ingested '{dataset}' through {url}: {} samples, {} over {parts} storage node(s), \
                 {copies} cop{} of each part, {:.2} s",
                report["samples"],
                human(report["bytes"].as_u64().unwrap_or_default()),
                if copies == 1 { "y" } else { "ies" },
                report["seconds"].as_f64().unwrap_or_default(),
            );
            if let Some(parts) = report["parts"].as_array() {
                for p in parts {
                    println!(
                        "  {}: version {}, {} samples",
                        p["node"].as_str().unwrap_or_default(),
                        p["version"],
                        p["samples"]
                    );
                }
            }
            if let Some(skipped) = report["skipped"].as_array().filter(|s| !s.is_empty()) {
                println!("skipped {}:", skipped.len());
                for s in skipped {
                    println!(
                        "  {}: {}",
                        s["key"].as_str().unwrap_or_default(),
                        s["reason"].as_str().unwrap_or_default()
                    );
                }
            }
        }
    }
    Ok(())
}
