//! `sluice sql "QUERY"`: DataFusion SQL over the datasets.
//!
//! Statements that change or reach outside the store (DDL such as
//! `CREATE EXTERNAL TABLE`, DML, `COPY`, `SET`) are refused: a query may
//! only read datasets.

use datafusion::execution::context::SQLOptions;

use super::{open_store, scan_options};
use crate::cli::{BinaryFormat, Cli, RowFormat};
use crate::output::print_batches;

/// The options every user query runs under.
pub fn read_only() -> SQLOptions {
    SQLOptions::new()
        .with_allow_ddl(false)
        .with_allow_dml(false)
        .with_allow_statements(false)
}

pub async fn run(
    cli: &Cli,
    query: &str,
    format: RowFormat,
    binary: BinaryFormat,
) -> anyhow::Result<()> {
    let store = open_store(cli)?;
    let ctx = sluice_storage::session_context_with(store, scan_options(cli));
    let df = ctx.sql_with_options(query, read_only()).await?;
    let schema = std::sync::Arc::new(df.schema().as_arrow().clone());
    let batches = df.collect().await?;
    print_batches(&schema, &batches, format, binary)
}
