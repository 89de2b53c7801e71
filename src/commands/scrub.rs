//! `sluice scrub --url URL`: `POST /v1/scrub` on a running server, and
//! what each storage node found and what was repaired.

use crate::cli::DocFormat;
use crate::size::human;

/// Asks the server at `client` to scrub (see the module docs).
pub async fn run(
    client: crate::rest_client::RestClient,
    dataset: Option<&str>,
    rate_mb_s: Option<f64>,
    format: DocFormat,
) -> anyhow::Result<()> {
    let body = serde_json::json!({ "dataset": dataset, "rate_mb_s": rate_mb_s });
    let nodes = client
        .call(http::Method::POST, "/v1/scrub", Some(&body))
        .await?;
    if format == DocFormat::Json {
        println!("{}", serde_json::to_string_pretty(&nodes)?);
        return Ok(());
    }
    for n in nodes.as_array().into_iter().flatten() {
        let name = n["node"].as_str().unwrap_or_default();
        if let Some(e) = n["error"].as_str() {
            println!("{name}: scrub failed: {e}");
            continue;
        }
        let r = &n["report"];
        let bad = r["bad"].as_array().map_or(0, Vec::len);
        println!(
            "{name}: {} objects ({}) in {} version(s), {bad} bad, {:.1} s",
            r["objects"],
            human(r["bytes"].as_u64().unwrap_or_default()),
            r["versions"],
            r["seconds"].as_f64().unwrap_or_default()
        );
        for l in n["repairs"].as_array().into_iter().flatten() {
            println!(
                "  {} v{} {}: {}{}",
                l["dataset"].as_str().unwrap_or_default(),
                l["version"],
                l["key"].as_str().unwrap_or_default(),
                l["outcome"].as_str().unwrap_or_default(),
                l["from"]
                    .as_str()
                    .map_or_else(String::new, |f| format!(" (from {f})"))
            );
        }
    }
    Ok(())
}
