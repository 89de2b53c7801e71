//! `sluice tokens`: the tokens file an operator keeps
//! (`sluice_access::TokenFile`). `add` makes a random secret, adds its
//! hash to the file and prints the secret once; `hash` prints the hash of
//! a secret read from stdin (for files kept by a configuration system);
//! `list` and `remove` read and edit the file. A running server reads the
//! file again on SIGHUP.

use std::io::Read;
use std::path::Path;

use sluice_access::tokens::{TokenEntry, hash, new_secret};
use sluice_access::{Scope, TokenFile};

use crate::cli::TokensAction;

/// Runs `action`.
pub fn run(action: &TokensAction) -> anyhow::Result<()> {
    match action {
        TokensAction::Add {
            file,
            name,
            scope,
            dataset,
            checkpoint,
        } => add(file, name, scope, dataset, checkpoint),
        TokensAction::Hash => {
            let mut secret = String::new();
            std::io::stdin().read_to_string(&mut secret)?;
            anyhow::ensure!(!secret.trim().is_empty(), "no secret on stdin");
            println!("{}", hash(&secret));
            Ok(())
        }
        TokensAction::List { file } => {
            let f = TokenFile::read(file).map_err(anyhow::Error::msg)?;
            for t in &f.tokens {
                let scopes: Vec<&str> = t.scopes.iter().map(|s| s.name()).collect();
                println!(
                    "{}\tscopes={}\tdatasets={}\tcheckpoints={}",
                    t.name,
                    scopes.join(","),
                    t.datasets.join(","),
                    t.checkpoints
                        .iter()
                        .map(|c| if c.is_empty() { "*" } else { c })
                        .collect::<Vec<_>>()
                        .join(",")
                );
            }
            Ok(())
        }
        TokensAction::Remove { file, name } => {
            let mut f = TokenFile::read(file).map_err(anyhow::Error::msg)?;
            let before = f.tokens.len();
            f.tokens.retain(|t| &t.name != name);
            anyhow::ensure!(
                f.tokens.len() < before,
                "no token named {name:?} in {}",
                file.display()
            );
            f.write(file).map_err(anyhow::Error::msg)?;
            eprintln!("removed {name:?}; send the server SIGHUP to forget it");
            Ok(())
        }
    }
}

fn add(
    file: &Path,
    name: &str,
    scopes: &[Scope],
    datasets: &[String],
    checkpoints: &[String],
) -> anyhow::Result<()> {
    let mut f = if file.exists() {
        TokenFile::read(file).map_err(anyhow::Error::msg)?
    } else {
        TokenFile::default()
    };
    let secret = new_secret().map_err(anyhow::Error::msg)?;
    f.tokens.push(TokenEntry {
        name: name.to_string(),
        hash: hash(&secret),
        scopes: scopes.to_vec(),
        datasets: if datasets.is_empty() {
            vec!["*".into()]
        } else {
            datasets.to_vec()
        },
        checkpoints: if checkpoints.is_empty() {
            vec![String::new()]
        } else {
            checkpoints.to_vec()
        },
    });
    f.check().map_err(anyhow::Error::msg)?;
    f.write(file).map_err(anyhow::Error::msg)?;
    eprintln!(
        "token {name:?} added to {} (send a running server SIGHUP); its secret, shown once:",
        file.display()
    );
    println!("{secret}");
    Ok(())
}
