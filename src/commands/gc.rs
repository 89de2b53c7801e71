//! `sluice gc`: removes metadata files that no committed version names,
//! and drops what failed ingests kept for their re-runs.
//!
//! Opening a data dir never deletes anything; this command is the one
//! place orphans (left by an interrupted ingest) go away, each logged.

use super::open_store;
use crate::cli::{Cli, DocFormat};

pub async fn run(cli: &Cli, dry_run: bool, format: DocFormat) -> anyhow::Result<()> {
    let store = open_store(cli)?;
    let (files, resumes) = if dry_run {
        let files = store.orphans().metadata_files.clone();
        (files, store.resume_records()?)
    } else {
        let report = store.collect_garbage().await?;
        (report.removed, report.resume_records)
    };
    match format {
        DocFormat::Json => println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "dry_run": dry_run,
                "metadata_files": files,
                "resume_records": resumes,
            }))?
        ),
        DocFormat::Table => {
            let verb = if dry_run { "would remove" } else { "removed" };
            for f in &files {
                println!("{verb} {}", f.display());
            }
            println!("{verb} {} orphaned metadata files", files.len());
            for d in &resumes {
                println!("{verb} what a failed ingest of '{d}' kept for a re-run");
            }
        }
    }
    Ok(())
}
