//! `sluice checkpoints`: list, delete, or copy out the checkpoints of the
//! data dir (trainers write them through `sluice serve`; see
//! `sluice_storage::checkpoint`).

use std::io::Write;
use std::sync::Arc;

use anyhow::Context;
use futures::TryStreamExt;
use sluice_storage::checkpoint::{CheckpointOptions, Checkpoints};

use super::open_store;
use crate::cli::{CheckpointAction, Cli, DocFormat};
use crate::size::human;

pub async fn run(cli: &Cli, action: &CheckpointAction) -> anyhow::Result<()> {
    let store = open_store(cli)?;
    let checkpoints = Checkpoints::new(store, CheckpointOptions::default());
    match action {
        CheckpointAction::List { prefix, format } => {
            let list = checkpoints.list(prefix)?;
            match format {
                DocFormat::Json => println!("{}", serde_json::to_string_pretty(&list)?),
                DocFormat::Table => {
                    println!("{:<48} {:>7} {:>11}", "CHECKPOINT", "VERSION", "BYTES");
                    for c in &list {
                        println!("{:<48} {:>7} {:>11}", c.name, c.version, human(c.size));
                    }
                }
            }
        }
        CheckpointAction::Delete { name, version } => {
            for v in checkpoints.delete(name, *version)? {
                println!("deleted checkpoint '{}' version {}", v.name, v.version);
            }
        }
        CheckpointAction::Get { name, out, version } => {
            let record = Arc::new(checkpoints.get(name, *version)?);
            let mut file = std::fs::File::create(out)
                .with_context(|| format!("cannot create {}", out.display()))?;
            let mut bytes = checkpoints.read(Arc::clone(&record), 0, record.size);
            while let Some(buf) = bytes.try_next().await? {
                file.write_all(&buf)
                    .with_context(|| format!("cannot write {}", out.display()))?;
            }
            file.sync_all()?;
            eprintln!(
                "checkpoint '{}' version {}: {} bytes to {}",
                record.name,
                record.version,
                record.size,
                out.display()
            );
        }
    }
    Ok(())
}
