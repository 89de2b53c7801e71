//! `sluice job`: a running `serve`'s jobs from the command line, over its
//! REST API (the same calls the Python client makes): submit a pipeline
//! file, list, status (with `--watch`, a line a second until the job
//! ends), cancel, explain. An unknown id or an unreachable server is a
//! one-line error and a non-zero exit.

use std::time::Duration;

use anyhow::Context;
use http::Method;
use serde_json::{Value, json};

use crate::cli::{Cli, JobAction};

/// Runs `action` against the REST API at `url`.
pub async fn run(cli: &Cli, url: &str, action: &JobAction) -> anyhow::Result<()> {
    let client = super::place::rest_client(cli, url, cli.token.first().cloned())?;
    match action {
        JobAction::Submit {
            file,
            batch_size,
            epochs,
            world_size,
            seed,
            on_error,
            offload,
            resume,
        } => {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            let mut body = json!({
                "batch_size": batch_size,
                "epochs": epochs,
                "world_size": world_size,
                "on_error": on_error,
                "offload": offload,
            });
            let is_sql = file.extension().is_some_and(|e| e == "sql");
            body[if is_sql { "sql" } else { "plan" }] = Value::String(text);
            if let Some(seed) = seed {
                body["shuffle"] = json!({ "seed": seed });
            }
            if let Some(path) = resume {
                let state = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read {}", path.display()))?;
                body["resume"] = serde_json::from_str(&state)
                    .with_context(|| format!("{}: not a saved position (JSON)", path.display()))?;
            }
            let st = client.call(Method::POST, "/v1/jobs", Some(&body)).await?;
            println!("{}", str_of(&st["id"]));
            eprintln!("{}", line(&st));
        }
        JobAction::List => {
            let jobs = client.call(Method::GET, "/v1/jobs", None).await?;
            for st in jobs.as_array().into_iter().flatten() {
                println!("{}", line(st));
            }
        }
        JobAction::Status { id, watch } => loop {
            let st = client.call(Method::GET, &job_path(id), None).await?;
            println!("{}", line(&st));
            let state = str_of(&st["state"]);
            if !*watch || !matches!(state.as_str(), "pending" | "running") {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        },
        JobAction::Cancel { id } => {
            let st = client.call(Method::DELETE, &job_path(id), None).await?;
            println!("{}", line(&st));
        }
        JobAction::Explain { id } => {
            let ex = client
                .call(Method::GET, &format!("{}/explain", job_path(id)), None)
                .await?;
            match &ex["text"] {
                Value::String(t) => println!("{t}"),
                other => println!("{other}"),
            }
        }
    }
    Ok(())
}

fn job_path(id: &str) -> String {
    let safe: String = id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .collect();
    format!("/v1/jobs/{safe}")
}

fn str_of(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_string)
}

/// One job's line: id, state, progress, samples, rate, ETA, skipped and
/// the bottleneck its streams measured.
fn line(st: &Value) -> String {
    let progress = st["progress"].as_f64().unwrap_or(0.0);
    let rate = st["samples_per_s"].as_f64().unwrap_or(0.0);
    let delivered = st["delivered"].as_u64().unwrap_or(0);
    let mut out = format!(
        "{}  {}  {:.1}%  {} samples  {:.1}/s",
        str_of(&st["id"]),
        str_of(&st["state"]),
        progress * 100.0,
        delivered,
        rate
    );
    if progress > 0.0 && progress < 1.0 && rate > 0.0 {
        let left = delivered as f64 * (1.0 - progress) / progress / rate;
        out.push_str(&format!("  ETA {left:.0} s"));
    }
    if let Some(n) = st["skipped"].as_u64().filter(|&n| n > 0) {
        out.push_str(&format!("  skipped {n}"));
    }
    let b = &st["stages"]["bottleneck"];
    if let Some(tier) = b["tier"].as_str() {
        out.push_str(&format!("  bottleneck {tier}"));
        if let Some(stage) = b["stage"].as_str() {
            out.push_str(&format!(" ({stage})"));
        }
        if let Some(busy) = b["busy"].as_f64() {
            out.push_str(&format!(" {:.0}% busy", busy * 100.0));
        }
    } else if let Some(b) = st["observed"]["bottleneck"].as_str() {
        out.push_str(&format!("  bottleneck {b}"));
    }
    if let Some(e) = st["error"].as_str() {
        out.push_str(&format!("  error: {e}"));
    }
    out
}
