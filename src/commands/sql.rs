//! `sluice sql "QUERY"`: DataFusion SQL over the datasets, with sluice's UDFs.
//!
//! Statements that change or reach outside the store (DDL such as
//! `CREATE EXTERNAL TABLE`, DML, `COPY`, `SET`) are refused: a query may
//! only read datasets. Bad samples met by the UDFs follow `--on-error`;
//! under `skip` and `null` a summary of them goes to stderr.

use datafusion::execution::context::SQLOptions;
use sluice_udfs::UdfEnv;

use super::{open_store, scan_options};
use crate::cli::{BinaryFormat, Cli, RowFormat, UdfFlags};
use crate::output::print_batches;

/// The options every user query runs under.
pub fn read_only() -> SQLOptions {
    SQLOptions::new()
        .with_allow_ddl(false)
        .with_allow_dml(false)
        .with_allow_statements(false)
}

/// Bad samples listed one per line before the rest are only counted.
const LISTED: usize = 20;

pub async fn run(
    cli: &Cli,
    query: &str,
    format: RowFormat,
    binary: BinaryFormat,
    udf: &UdfFlags,
) -> anyhow::Result<()> {
    let store = open_store(cli)?;
    let env = UdfEnv::new(udf.options());
    let ctx = sluice_storage::session_context_with(store, scan_options(cli), &env);
    let df = ctx.sql_with_options(query, read_only()).await?;
    let schema = std::sync::Arc::new(df.schema().as_arrow().clone());
    let batches = df.collect().await?;
    print_batches(&schema, &batches, format, binary)?;
    let (count, bad) = env.errors.snapshot();
    if count > 0 {
        let verb = match udf.on_error {
            sluice_udfs::OnError::Skip => "skipped",
            _ => "nulled",
        };
        eprintln!("{verb} {count} bad sample(s):");
        for b in bad.iter().take(LISTED) {
            eprintln!("  {} ({}): {}", b.key, b.udf, b.reason);
        }
        if count > LISTED as u64 {
            eprintln!("  … and {} more", count - LISTED as u64);
        }
    }
    Ok(())
}
