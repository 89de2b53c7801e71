//! `sluice nodes`: a coordinator's nodes from the command line, over its
//! REST API: `list` (storage nodes up or down, compute nodes, storage
//! nodes in quarantine with what they hold) and `remove KIND ID`.

use http::Method;
use serde_json::Value;

use crate::cli::{Cli, NodesAction};
use crate::coordinator::urlencode;

/// Runs `action` against the REST API at `url`.
pub async fn run(cli: &Cli, url: &str, action: &NodesAction) -> anyhow::Result<()> {
    let client = crate::commands::place::rest_client(cli, url, cli.token.first().cloned())?;
    match action {
        NodesAction::List => {
            let c = client.call(Method::GET, "/v1/nodes", None).await?;
            for n in c["nodes"].as_array().into_iter().flatten() {
                let up = if n["up"].as_bool() == Some(true) {
                    "up"
                } else {
                    "down"
                };
                println!("storage\t{}\t{up}", text(&n["name"]));
            }
            for n in c["compute"].as_array().into_iter().flatten() {
                println!(
                    "compute\t{}\tseen {:.1} s ago",
                    text(&n["location"]),
                    n["last_seen_s"].as_f64().unwrap_or(0.0)
                );
            }
            for q in c["quarantined"].as_array().into_iter().flatten() {
                let held: Vec<String> = q["unknown"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|u| format!("{}@{}", text(&u["dataset"]), u["version"]))
                    .collect();
                println!(
                    "quarantined\t{}\tby {}\tholds {}",
                    text(&q["location"]),
                    text(&q["by"]),
                    held.join(", ")
                );
            }
        }
        NodesAction::Remove { kind, id } => {
            let path = format!("/v1/nodes/{}/{}", urlencode(kind), urlencode(id));
            let r = client.call(Method::DELETE, &path, None).await?;
            for n in r["removed"].as_array().into_iter().flatten() {
                println!("removed {kind} node {}", text(n));
            }
        }
    }
    Ok(())
}

fn text(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_string)
}
