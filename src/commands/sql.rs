//! `sluice sql "QUERY"`: DataFusion SQL over the datasets, with sluice's UDFs.
//!
//! The query is planned by the offload-aware planner (`--offload`) and its
//! storage fragments run on an in-process storage node over the data dir,
//! on remote storage nodes (`--storage URL,…`), or the whole query on a
//! compute node (`--connect URL`). `EXPLAIN QUERY` prints the placement.
//!
//! Statements that change or reach outside the store (DDL such as
//! `CREATE EXTERNAL TABLE`, DML, `COPY`, `SET`) are refused: a query may
//! only read datasets. Bad samples met by the UDFs follow `--on-error`;
//! under `skip` and `null` a summary of them goes to stderr.

use futures::TryStreamExt;
use sluice_base::BadSample;
use sluice_compute::{QueryClient, QueryTicket};
use sluice_udfs::UdfEnv;

use super::place;
use crate::cli::{BinaryFormat, Cli, PlaceFlags, RowFormat, UdfFlags};
use crate::output::print_batches;

/// Bad samples listed one per line before the rest are only counted.
const LISTED: usize = 20;

pub async fn run(
    cli: &Cli,
    query: &str,
    format: RowFormat,
    binary: BinaryFormat,
    udf: &UdfFlags,
    flags: &PlaceFlags,
) -> anyhow::Result<()> {
    let (schema, batches, count, bad) = match &flags.connect {
        Some(url) => {
            let ticket = QueryTicket {
                sql: query.to_string(),
                offload: flags.offload,
                udf: udf.options(),
            };
            let r = QueryClient::new(url, super::place::tls(cli)?)?
                .with_token(cli.token.first().cloned())
                .query(&ticket)
                .await?;
            (r.schema, r.batches, r.report.bad_total, r.report.bad)
        }
        None => {
            let session = place::session(cli, flags)?;
            let env = UdfEnv::new(udf.options());
            let stream = session.execute(query, flags.offload, &env).await?;
            let schema = stream.schema();
            let batches: Vec<_> = stream.try_collect().await?;
            let (count, bad) = env.errors.snapshot();
            (schema, batches, count, bad)
        }
    };
    print_batches(&schema, &batches, format, binary)?;
    summarize(udf.on_error, count, &bad);
    Ok(())
}

/// Lists bad samples on stderr.
fn summarize(policy: sluice_udfs::OnError, count: u64, bad: &[BadSample]) {
    if count == 0 {
        return;
    }
    let verb = match policy {
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
