//! `sluice nodes`: a coordinator's nodes from the command line, over its
//! REST API: `list` (storage nodes up or down, compute nodes, storage
//! nodes in quarantine with what they hold), `remove KIND ID` and
//! `drain ID`; and `sluice rebalance`.

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
        NodesAction::Drain { id } => {
            let path = format!("/v1/nodes/storage/{}/drain", urlencode(id));
            let drained = client.call(Method::POST, &path, None).await?;
            print_moves(&drained["datasets"]);
            let c = &drained["checkpoints"];
            if !c.is_null() {
                println!(
                    "checkpoints: {} version(s), {} stripe copies, {} bytes",
                    c["versions"], c["stripes"], c["bytes"]
                );
                for short in c["short"].as_array().into_iter().flatten() {
                    println!("short\t{}", text(short));
                }
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

/// `sluice rebalance --url URL`.
pub async fn rebalance(cli: &Cli, url: &str) -> anyhow::Result<()> {
    let client = crate::commands::place::rest_client(cli, url, cli.token.first().cloned())?;
    print_moves(&client.call(Method::POST, "/v1/rebalance", None).await?);
    Ok(())
}

/// One line per dataset moved, one per copy made, one per part short.
fn print_moves(reports: &Value) {
    if reports.as_array().is_none_or(Vec::is_empty) {
        println!("nothing to move: no dataset the cluster ingested has parts there");
    }
    for r in reports.as_array().into_iter().flatten() {
        println!(
            "{}: {}: {} part copies, {} drops, {:.1} s",
            text(&r["dataset"]),
            text(&r["why"]),
            r["moves"].as_array().map_or(0, Vec::len),
            r["drops"].as_array().map_or(0, Vec::len),
            r["seconds"].as_f64().unwrap_or(0.0)
        );
        for m in r["moves"].as_array().into_iter().flatten() {
            println!(
                "  part {} {} -> {}",
                m["part"],
                text(&m["from"]),
                text(&m["to"])
            );
        }
        for v in r["versions"].as_array().into_iter().flatten() {
            println!(
                "  {} now at version {} ({} samples, {} copied in, {} dropped)",
                text(&v["node"]),
                v["version"],
                v["samples"],
                v["copied"],
                v["dropped"]
            );
        }
        for s in r["short"].as_array().into_iter().flatten() {
            println!("  part {} still short: {}", s["part"], text(&s["why"]));
        }
        for t in r["retiring"].as_array().into_iter().flatten() {
            let waiting = t["waiting_for"].as_array().map_or(0, Vec::len);
            println!(
                "  {} retires its versions through {} once {waiting} job(s) reading them end",
                text(&t["node"]),
                t["through"]
            );
        }
    }
}

fn text(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_string)
}
