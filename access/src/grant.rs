//! [`Grant`]: what one token allows; [`Scope`]: the kinds of things.
//!
//! | scope    | allows |
//! |----------|--------|
//! | `read`   | list and read the datasets it names (queries, jobs, EXPLAIN), its jobs, and checkpoints under its prefixes |
//! | `ingest` | what `read` allows, and new versions of the datasets it names |
//! | `admin`  | everything a user can do: every job, nodes' removal, deleting any checkpoint |
//! | `node`   | a node's calls: registration, progress reports, the coordinator's calls to storage nodes |
//!
//! `admin` holds `read` and `ingest` but not `node`: an operator's token
//! is not a node's identity. Dataset patterns are globs in which `*`
//! matches any run of characters (`imagenet*`, `team-a/*`, `*`);
//! checkpoint entries are name prefixes (`alice/`; the empty prefix is
//! every name).

use std::collections::BTreeSet;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// A kind of access (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Read datasets, jobs and checkpoints.
    Read,
    /// Write new dataset versions.
    Ingest,
    /// Everything a user may do.
    Admin,
    /// A node of the cluster.
    Node,
}

impl Scope {
    /// Its name, as tokens files and errors write it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Ingest => "ingest",
            Self::Admin => "admin",
            Self::Node => "node",
        }
    }
}

impl std::str::FromStr for Scope {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "read" => Ok(Self::Read),
            "ingest" => Ok(Self::Ingest),
            "admin" => Ok(Self::Admin),
            "node" => Ok(Self::Node),
            other => Err(format!(
                "unknown scope {other:?}: one of read, ingest, admin, node"
            )),
        }
    }
}

/// What one token allows (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    name: String,
    scopes: BTreeSet<Scope>,
    datasets: Vec<String>,
    checkpoints: Vec<String>,
    shared: bool,
}

/// Who is calling: the grant of the token the call carried.
pub type Principal = Arc<Grant>;

impl Grant {
    /// A grant named `name` (who the audit log says called) of `scopes`,
    /// over the datasets matching `datasets` and the checkpoints under
    /// `checkpoints`.
    pub fn new(
        name: impl Into<String>,
        scopes: impl IntoIterator<Item = Scope>,
        datasets: Vec<String>,
        checkpoints: Vec<String>,
    ) -> Self {
        Self {
            name: name.into(),
            scopes: scopes.into_iter().collect(),
            datasets,
            checkpoints,
            shared: false,
        }
    }

    /// Every scope over every name: the caller of a server without
    /// tokens, and the holder of a `--token`.
    pub fn everything(name: impl Into<String>) -> Self {
        Self {
            shared: true,
            ..Self::new(
                name,
                [Scope::Read, Scope::Ingest, Scope::Admin, Scope::Node],
                vec!["*".into()],
                vec![String::new()],
            )
        }
    }

    /// Whether several callers may hold it (a `--token`, or the open
    /// server's caller), so that it names no one node: a node's identity
    /// binds its registration only when its token is its own, from a
    /// tokens file.
    pub fn shared(&self) -> bool {
        self.shared
    }

    /// The caller of a server without tokens.
    pub fn everyone() -> Principal {
        Arc::new(Self::everything("anyone"))
    }

    /// Who this is, as the audit log says it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its scopes.
    pub fn scopes(&self) -> impl Iterator<Item = Scope> + '_ {
        self.scopes.iter().copied()
    }

    /// Whether it holds `scope` (`ingest` holds `read`; `admin` holds
    /// both).
    pub fn has(&self, scope: Scope) -> bool {
        let held = |s| self.scopes.contains(&s);
        held(scope)
            || match scope {
                Scope::Read => held(Scope::Ingest) || held(Scope::Admin),
                Scope::Ingest => held(Scope::Admin),
                Scope::Admin | Scope::Node => false,
            }
    }

    /// Whether it names `dataset` (a name, or `name@version`).
    pub fn names_dataset(&self, dataset: &str) -> bool {
        let base = dataset.rsplit_once('@').map_or(dataset, |(d, _)| d);
        self.datasets.iter().any(|p| glob(p, base))
    }

    /// Whether it may read `dataset`.
    pub fn may_read(&self, dataset: &str) -> bool {
        self.has(Scope::Read) && self.names_dataset(dataset)
    }

    /// Whether it may write a new version of `dataset`.
    pub fn may_ingest(&self, dataset: &str) -> bool {
        self.has(Scope::Ingest) && self.names_dataset(dataset)
    }

    /// Whether it may read and write the checkpoint `name`.
    pub fn may_checkpoint(&self, name: &str) -> bool {
        self.has(Scope::Read)
            && self
                .checkpoints
                .iter()
                .any(|p| name.starts_with(p.as_str()))
    }

    /// Whether its datasets are every dataset (what a view listing all
    /// of them, such as `information_schema`, needs).
    pub fn every_dataset(&self) -> bool {
        self.datasets.iter().any(|p| p == "*")
    }
}

/// Whether `name` matches `pattern`, in which `*` matches any run of
/// characters (none included) and every other character itself.
pub fn glob(pattern: &str, name: &str) -> bool {
    let Some((head, rest)) = pattern.split_once('*') else {
        return pattern == name;
    };
    let Some(mut left) = name.strip_prefix(head) else {
        return false;
    };
    let parts: Vec<&str> = rest.split('*').collect();
    let (last, middle) = parts.split_last().unwrap_or((&"", &[]));
    for part in middle {
        match left.find(part) {
            Some(i) => left = &left[i + part.len()..],
            None => return false,
        }
    }
    left.len() >= last.len() && left.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_runs_of_characters() {
        for (p, n, want) in [
            ("*", "pets", true),
            ("*", "", true),
            ("pets", "pets", true),
            ("pets", "pets2", false),
            ("pets*", "pets", true),
            ("pets*", "pets-v2", true),
            ("pets*", "cats", false),
            ("*-train", "in-train", true),
            ("*-train", "in-val", false),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "acb", false),
            ("a*a", "a", false),
            ("team/*", "team/x", true),
            ("team/*", "teamx", false),
        ] {
            assert_eq!(glob(p, n), want, "{p} ~ {n}");
        }
    }

    #[test]
    fn scopes_allow_what_the_table_says() {
        let reader = Grant::new("r", [Scope::Read], vec!["pets*".into()], vec!["r/".into()]);
        assert!(reader.may_read("pets") && reader.may_read("pets@3"));
        assert!(!reader.may_read("cats"));
        assert!(!reader.may_ingest("pets"));
        assert!(reader.may_checkpoint("r/step-1") && !reader.may_checkpoint("other/step-1"));
        assert!(!reader.has(Scope::Admin) && !reader.has(Scope::Node));
        assert!(!reader.every_dataset());
        let admin = Grant::new("a", [Scope::Admin], vec!["*".into()], vec![String::new()]);
        assert!(admin.may_read("x") && admin.may_ingest("x") && admin.may_checkpoint("any"));
        assert!(!admin.has(Scope::Node), "an operator is not a node");
        let ingester = Grant::new("i", [Scope::Ingest], vec!["pets".into()], vec![]);
        assert!(ingester.may_read("pets") && ingester.may_ingest("pets"));
        assert!(!ingester.has(Scope::Admin));
        let node = Grant::new("n", [Scope::Node], vec!["*".into()], vec![]);
        assert!(
            !node.may_read("x"),
            "a node's identity reads no user data over REST"
        );
        assert!(Grant::everything("t").has(Scope::Node));
        assert_eq!("ingest".parse::<Scope>(), Ok(Scope::Ingest));
        assert!("root".parse::<Scope>().unwrap_err().contains("root"));
    }
}
