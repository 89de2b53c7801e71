//! `sluice gc`: removes metadata files that no committed version names.
//!
//! Opening a data dir never deletes anything; this command is the one
//! place orphans (left by an interrupted ingest) go away, each logged.

use super::open_store;
use crate::cli::{Cli, DocFormat};

pub async fn run(cli: &Cli, dry_run: bool, format: DocFormat) -> anyhow::Result<()> {
    let store = open_store(cli)?;
    let files = if dry_run {
        store.orphans().metadata_files.clone()
    } else {
        store.collect_garbage().await?.removed
    };
    match format {
        DocFormat::Json => println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "dry_run": dry_run,
                "metadata_files": files,
            }))?
        ),
        DocFormat::Table => {
            let verb = if dry_run { "would remove" } else { "removed" };
            for f in &files {
                println!("{verb} {}", f.display());
            }
            println!("{verb} {} orphaned metadata files", files.len());
        }
    }
    Ok(())
}
