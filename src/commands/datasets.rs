//! `sluice datasets`: datasets with their versions, sample counts and
//! bytes; with `--url`, a server's, with their replication over storage
//! nodes.

use super::open_store;
use crate::cli::{Cli, DocFormat};
use crate::size::human;

#[derive(serde::Serialize)]
struct DatasetDoc {
    name: String,
    latest_version: u64,
    samples: u64,
    bytes: u64,
    versions: Vec<sluice_storage::catalog::VersionRecord>,
}

pub fn run(cli: &Cli, format: DocFormat) -> anyhow::Result<()> {
    let store = open_store(cli)?;
    let catalog = store.catalog();
    let mut docs = Vec::new();
    for name in catalog.dataset_names()? {
        let versions = catalog.versions(&name)?;
        let Some(latest) = versions.last() else {
            continue;
        };
        docs.push(DatasetDoc {
            name: name.clone(),
            latest_version: latest.version,
            samples: latest.samples,
            bytes: latest.bytes,
            versions,
        });
    }
    match format {
        DocFormat::Json => println!("{}", serde_json::to_string_pretty(&docs)?),
        DocFormat::Table => {
            println!(
                "{:<24} {:>7} {:>9} {:>12} {:>11}",
                "DATASET", "LATEST", "VERSIONS", "SAMPLES", "BYTES"
            );
            for d in &docs {
                println!(
                    "{:<24} {:>7} {:>9} {:>12} {:>11}",
                    d.name,
                    d.latest_version,
                    d.versions.len(),
                    d.samples,
                    human(d.bytes)
                );
            }
        }
    }
    Ok(())
}

/// `sluice datasets --url URL`: `GET /v1/datasets` on the server.
pub async fn remote(
    client: crate::rest_client::RestClient,
    format: DocFormat,
) -> anyhow::Result<()> {
    let listed: serde_json::Value = client.call(http::Method::GET, "/v1/datasets", None).await?;
    if format == DocFormat::Json {
        println!("{}", serde_json::to_string_pretty(&listed)?);
        return Ok(());
    }
    println!(
        "{:<24} {:>12} {:>11} {:>6}  REPLICATION",
        "DATASET", "SAMPLES", "BYTES", "NODES"
    );
    for d in listed.as_array().into_iter().flatten() {
        let nodes = d["versions"].as_array().map_or(0, Vec::len);
        println!(
            "{:<24} {:>12} {:>11} {:>6}  {}",
            d["name"].as_str().unwrap_or_default(),
            d["samples"],
            human(d["bytes"].as_u64().unwrap_or_default()),
            nodes,
            replication(&d["replication"])
        );
    }
    Ok(())
}

/// A dataset's replication in a few words: `2 copies: 3 parts full`, with
/// the under-replicated and lost parts when there are any.
fn replication(r: &serde_json::Value) -> String {
    if r.is_null() {
        return "-".into();
    }
    let n = |k: &str| r[k].as_u64().unwrap_or_default();
    let mut out = format!(
        "{} copies: {} of {} parts full",
        n("replicas"),
        n("full"),
        n("parts")
    );
    if n("under") > 0 {
        out += &format!(", {} under-replicated", n("under"));
    }
    if n("lost") > 0 {
        out += &format!(", {} LOST", n("lost"));
    }
    out
}
