//! `sluice explain "QUERY"`: where each stage would run and why.

use sluice_compute::{QueryClient, QueryTicket};
use sluice_udfs::UdfEnv;

use super::place;
use crate::cli::{Cli, ExplainFormat, PlaceFlags, UdfFlags};

pub async fn run(
    cli: &Cli,
    query: &str,
    format: ExplainFormat,
    udf: &UdfFlags,
    flags: &PlaceFlags,
) -> anyhow::Result<()> {
    let query = sluice_compute::explain::explained(query).unwrap_or(query);
    let explanation = match &flags.connect {
        Some(url) => {
            let ticket = QueryTicket {
                sql: query.to_string(),
                offload: flags.offload,
                udf: udf.options(),
            };
            QueryClient::new(url, super::place::tls(cli)?)?
                .with_token(cli.token.first().cloned())
                .explain(&ticket)
                .await?
        }
        None => {
            let session = place::session(cli, flags)?;
            let env = UdfEnv::new(udf.options());
            session
                .explain(query, flags.offload, &env)
                .await?
                .explanation
        }
    };
    match format {
        ExplainFormat::Text => print!("{}", explanation.to_text()),
        ExplainFormat::Json => println!("{}", explanation.to_json()),
    }
    Ok(())
}
