//! `sluice datasets`: datasets with their versions, sample counts and bytes.

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
