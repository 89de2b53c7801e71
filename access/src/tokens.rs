//! [`TokenFile`]: the tokens a server accepts, as its operator writes them.
//!
//! ```yaml
//! # sluice tokens: the server reads this file again on SIGHUP.
//! tokens:
//!   - name: alice                 # who the audit log says called
//!     hash: blake3:9f2c…          # of the secret; the secret is not here
//!     scopes: [read]
//!     datasets: ["pets", "imagenet*"]   # default: ["*"]
//!     checkpoints: ["alice/"]           # default: [""] (every name)
//!   - name: storage-1
//!     hash: blake3:41d0…
//!     scopes: [node]
//! ```
//!
//! Secrets are 32 random bytes, written `slc_` and 64 hex digits. A secret
//! of 256 random bits needs no salt and no slow hash: nobody can guess one
//! from its BLAKE3 hash, and hashing it takes no time on every call (the
//! way API tokens are kept by most services). A file that cannot be read,
//! or that has two tokens of one name or one hash, is an error naming the
//! entry; a server being told to reload such a file keeps the tokens it
//! had.

use std::collections::HashSet;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::grant::{Grant, Scope};

/// The prefix of a sluice secret.
pub const SECRET_PREFIX: &str = "slc_";
/// The prefix of a stored hash.
pub const HASH_PREFIX: &str = "blake3:";

/// See the module docs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenFile {
    /// The tokens.
    #[serde(default)]
    pub tokens: Vec<TokenEntry>,
}

/// One token of a [`TokenFile`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenEntry {
    /// Who holds it.
    pub name: String,
    /// `blake3:` and the hex digest of the secret.
    pub hash: String,
    /// What it may do.
    pub scopes: Vec<Scope>,
    /// Dataset name patterns.
    #[serde(default = "every_dataset")]
    pub datasets: Vec<String>,
    /// Checkpoint name prefixes.
    #[serde(default = "every_checkpoint")]
    pub checkpoints: Vec<String>,
}

fn every_dataset() -> Vec<String> {
    vec!["*".into()]
}

fn every_checkpoint() -> Vec<String> {
    vec![String::new()]
}

/// The hash a tokens file keeps of `secret` (its surrounding whitespace
/// ignored).
pub fn hash(secret: &str) -> String {
    format!(
        "{HASH_PREFIX}{}",
        blake3::hash(secret.trim().as_bytes()).to_hex()
    )
}

/// A new random secret.
pub fn new_secret() -> Result<String, String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| format!("no randomness for a token: {e}"))?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("{SECRET_PREFIX}{hex}"))
}

impl TokenFile {
    /// The file at `path`, checked.
    pub fn read(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("tokens file {}: {e}", path.display()))?;
        let file: Self = serde_yaml::from_str(&text)
            .map_err(|e| format!("tokens file {}: {e}", path.display()))?;
        file.check()
            .map_err(|e| format!("tokens file {}: {e}", path.display()))?;
        Ok(file)
    }

    /// Writes it to `path` (readable by its owner only), replacing it
    /// atomically.
    pub fn write(&self, path: &Path) -> Result<(), String> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let text = format!(
            "# sluice tokens: the server reads this file again on SIGHUP.\n{}",
            serde_yaml::to_string(self).map_err(|e| e.to_string())?
        );
        let tmp = path.with_extension("tmp");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| format!("{}: {e}", tmp.display()))?;
        f.write_all(text.as_bytes())
            .and_then(|()| f.sync_all())
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Every entry well formed, names and hashes unique.
    pub fn check(&self) -> Result<(), String> {
        let (mut names, mut hashes) = (HashSet::new(), HashSet::new());
        for t in &self.tokens {
            let digest = t.hash.strip_prefix(HASH_PREFIX).unwrap_or("");
            if digest.len() != 64 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(format!(
                    "token {:?}: hash must be {HASH_PREFIX} and 64 hex digits \
                     (`sluice tokens hash` prints it)",
                    t.name
                ));
            }
            if t.name.trim().is_empty() {
                return Err("a token without a name".into());
            }
            if t.scopes.is_empty() {
                return Err(format!("token {:?} has no scopes", t.name));
            }
            if !names.insert(t.name.as_str()) {
                return Err(format!("two tokens are named {:?}", t.name));
            }
            if !hashes.insert(t.hash.to_ascii_lowercase()) {
                return Err(format!("token {:?} has the hash of another", t.name));
            }
        }
        Ok(())
    }

    /// Each entry's lowercase hash with its grant.
    pub fn grants(&self) -> Vec<(String, Grant)> {
        self.tokens
            .iter()
            .map(|t| {
                (
                    t.hash.to_ascii_lowercase(),
                    Grant::new(
                        t.name.clone(),
                        t.scopes.iter().copied(),
                        t.datasets.clone(),
                        t.checkpoints.clone(),
                    ),
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_round_trips_and_keeps_no_secret() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.yaml");
        let secret = new_secret().unwrap();
        assert!(secret.starts_with(SECRET_PREFIX) && secret.len() == 68);
        let file = TokenFile {
            tokens: vec![TokenEntry {
                name: "alice".into(),
                hash: hash(&secret),
                scopes: vec![Scope::Read],
                datasets: vec!["pets*".into()],
                checkpoints: vec!["alice/".into()],
            }],
        };
        file.write(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains(&secret));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(TokenFile::read(&path).unwrap(), file);
    }

    #[test]
    fn defaults_and_bad_entries() {
        let h = hash("x");
        let f: TokenFile = serde_yaml::from_str(&format!(
            "tokens:\n  - {{name: a, hash: '{h}', scopes: [read]}}"
        ))
        .unwrap();
        assert_eq!(f.tokens[0].datasets, ["*"]);
        assert_eq!(f.tokens[0].checkpoints, [""]);
        for (yaml, needle) in [
            (
                "tokens:\n  - {name: a, hash: 'x', scopes: [read]}",
                "hash must be",
            ),
            (
                &format!("tokens:\n  - {{name: a, hash: '{h}', scopes: []}}"),
                "no scopes",
            ),
            (
                &format!(
                    "tokens:\n  - {{name: a, hash: '{h}', scopes: [read]}}\n  - {{name: a, hash: '{}', scopes: [read]}}",
                    hash("y")
                ),
                "two tokens are named",
            ),
            (
                &format!(
                    "tokens:\n  - {{name: a, hash: '{h}', scopes: [read]}}\n  - {{name: b, hash: '{h}', scopes: [read]}}"
                ),
                "hash of another",
            ),
        ] {
            let f: TokenFile = serde_yaml::from_str(yaml).unwrap();
            let e = f.check().unwrap_err();
            assert!(e.contains(needle), "{e}");
        }
        assert!(
            serde_yaml::from_str::<TokenFile>("tokens:\n  - {name: a, hash: 'x', scopes: [root]}")
                .is_err()
        );
    }
}
