//! `sluice udfs [--calibrate]`: the UDFs, their arguments and cost profiles.
//!
//! Without `--calibrate` the profiles shown are those the planner uses: the
//! built-in defaults, overridden by `udf-profiles.json` in the data dir when
//! a calibration saved one. `--calibrate` invokes every UDF on generated
//! samples at two sizes, fits `ns = per_call + per_unit × work`, prints the
//! result beside the defaults, and saves it.

use anyhow::Context;
use sluice_udfs::cost::{PROFILES_FILE, Profiles, default_profiles, load_profiles};
use sluice_udfs::udf::SPECS;

use crate::cli::{Cli, DocFormat};

pub fn run(cli: &Cli, calibrate: bool, format: DocFormat) -> anyhow::Result<()> {
    let path = cli.data_dir.join(PROFILES_FILE);
    let profiles: Profiles = if calibrate {
        eprintln!("calibrating: invoking every UDF on generated samples …");
        let measured = tokio::task::block_in_place(sluice_udfs::calibrate::calibrate)?;
        std::fs::create_dir_all(&cli.data_dir)
            .with_context(|| format!("cannot create {}", cli.data_dir.display()))?;
        std::fs::write(&path, serde_json::to_vec_pretty(&measured)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("saved {}", path.display());
        measured
    } else {
        load_profiles(&path).map_err(anyhow::Error::msg)?
    };
    let defaults = default_profiles();
    match format {
        DocFormat::Json => {
            let rows: Vec<serde_json::Value> = SPECS
                .iter()
                .map(|s| {
                    serde_json::json!({
                        "name": s.name,
                        "usage": s.usage(),
                        "random": s.random,
                        "follows_error_policy": s.keyed,
                        "profile": profiles.get(s.name),
                        "default_profile": defaults.get(s.name),
                    })
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&rows)?);
        }
        DocFormat::Table => {
            println!(
                "{:<64} {:>10} {:>10} {:>10}  unit",
                "udf", "ns/call", "ns/unit", "default"
            );
            for s in SPECS {
                let p = profiles.get(s.name);
                let d = defaults.get(s.name).map_or(0.0, |d| d.per_unit_ns);
                println!(
                    "{:<64} {:>10.0} {:>10.3} {:>10.3}  {}",
                    s.usage(),
                    p.map_or(0.0, |p| p.per_call_ns),
                    p.map_or(0.0, |p| p.per_unit_ns),
                    d,
                    p.map_or("", |p| p.unit.as_str())
                );
            }
        }
    }
    Ok(())
}
