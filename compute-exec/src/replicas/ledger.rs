//! [`PartLedger`]: the parts of datasets this cluster wrote, by node — what
//! a storage node that registers may bring.
//!
//! A dataset belongs to the cluster, not to whoever registers a node. The
//! coordinator's sharded ingest (`crate::ingest`) writes a version's parts
//! under its own transaction and, once every part has committed, notes
//! each (dataset, node, version) here. A storage node that registers
//! (`POST /v1/nodes/storage`) is admitted only if every dataset version it
//! holds is one the ledger gave it; one holding anything else (a dataset
//! ingested behind the cluster's back, a version the cluster never wrote)
//! is quarantined: listed with what it holds, read by no query. A node the
//! operator named at start (`serve --storage`) is the operator's word and
//! is not checked.
//!
//! Once admitted, a node is read at the version the ledger names for each
//! of its parts, whatever newer version it may list (`ComputeSession`'s
//! refresh asks [`PartLedger::version`]).
//!
//! It also keeps, per dataset, how the cluster's last ingest laid it out
//! ([`PartLayout`]: its replicas and each part's holders), from which a
//! dataset's replication health and its replicated reads follow.
//!
//! The ledger is one JSON file (`<data dir>/cluster/parts.json`), replaced
//! atomically at each commit (written beside, flushed, renamed), so a
//! coordinator that restarts still knows its cluster's parts.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// See the module docs.
#[derive(Debug, Default)]
pub struct PartLedger {
    path: Option<PathBuf>,
    parts: Mutex<Parts>,
}

/// (dataset, node) → the version the cluster wrote there last.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Parts {
    parts: BTreeMap<String, BTreeMap<String, u64>>,
    /// Dataset → how its last ingest is laid out.
    #[serde(default)]
    layouts: BTreeMap<String, PartLayout>,
    /// (dataset, node) → the last version the cluster wrote there before
    /// moving its parts away (`crate::moves`): what the node may still
    /// hold, and is told to retire.
    #[serde(default)]
    moved: BTreeMap<String, BTreeMap<String, u64>>,
}

/// How one sharded ingest laid out a dataset version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartLayout {
    /// How many nodes hold each part.
    pub replicas: u32,
    /// Part `p`'s holders, by node name.
    pub holders: Vec<Vec<String>>,
    /// Each holder's version.
    pub versions: BTreeMap<String, u64>,
}

impl PartLayout {
    /// Whether `node` at `version` holds what this layout wrote there.
    pub fn wrote(&self, node: &str, version: u64) -> bool {
        self.versions.get(node) == Some(&version)
    }

    /// Whether the nodes `listed`, each at the version `pins` names, hold
    /// every part this layout wrote: a node of `pins` not listed (lost)
    /// holds no sample the others do not.
    pub fn covered_by(
        &self,
        listed: &[&str],
        pins: &[(std::sync::Arc<dyn sluice_flight::StorageEndpoint>, u64)],
    ) -> bool {
        let pinned = |node: &str| pins.iter().find(|(e, _)| e.name() == node).map(|(_, v)| *v);
        listed
            .iter()
            .all(|n| pinned(n).is_some_and(|v| self.wrote(n, v)))
            && self
                .holders
                .iter()
                .all(|part| part.iter().any(|h| listed.contains(&h.as_str())))
    }
}

/// A node's dataset version the ledger does not know.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Unknown {
    /// The dataset.
    pub dataset: String,
    /// The version the node holds.
    pub version: u64,
    /// The version the cluster wrote there, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub known: Option<u64>,
}

impl PartLedger {
    /// The ledger kept in `dir` (created if missing; read if there).
    pub fn open(dir: &Path) -> std::io::Result<Self> {
        fs::create_dir_all(dir)?;
        let path = dir.join("parts.json");
        let parts = match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}: {e}", path.display()),
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Parts::default(),
            Err(e) => return Err(e),
        };
        Ok(Self {
            path: Some(path),
            parts: Mutex::new(parts),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Parts> {
        self.parts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes that the cluster committed `version` of `dataset` on each of
    /// `nodes`, and saves the ledger.
    pub fn committed(&self, dataset: &str, parts: &[(String, u64)]) -> std::io::Result<()> {
        let mut p = self.lock();
        let of = p.parts.entry(dataset.to_string()).or_default();
        for (node, version) in parts {
            of.insert(node.clone(), *version);
        }
        if let Some(m) = p.moved.get_mut(dataset) {
            m.retain(|n, _| !parts.iter().any(|(node, _)| node == n));
        }
        self.save(&p)
    }

    /// Notes that `nodes` no longer hold `dataset` (its parts moved
    /// elsewhere), and saves the ledger.
    pub fn released(&self, dataset: &str, nodes: &[String]) -> std::io::Result<()> {
        let mut p = self.lock();
        let gone: Vec<(String, u64)> = match p.parts.get_mut(dataset) {
            Some(of) => {
                let gone = of
                    .iter()
                    .filter(|(n, _)| nodes.contains(n))
                    .map(|(n, v)| (n.clone(), *v))
                    .collect();
                of.retain(|n, _| !nodes.contains(n));
                gone
            }
            None => Vec::new(),
        };
        p.moved.entry(dataset.to_string()).or_default().extend(gone);
        self.save(&p)
    }

    /// Whether `version` of `dataset` on `node` is one the cluster wrote
    /// there and then moved away: stale, to be retired, never read.
    pub fn moved_away(&self, dataset: &str, node: &str, version: u64) -> bool {
        self.lock()
            .moved
            .get(dataset)
            .and_then(|m| m.get(node))
            .is_some_and(|v| version <= *v)
    }

    /// Notes how the committed ingest of `dataset` is laid out (after
    /// [`PartLedger::committed`]), and saves the ledger.
    pub fn laid_out(&self, dataset: &str, layout: PartLayout) -> std::io::Result<()> {
        let mut p = self.lock();
        p.layouts.insert(dataset.to_string(), layout);
        self.save(&p)
    }

    /// How the cluster's last ingest of `dataset` is laid out, if it made
    /// one.
    pub fn layout(&self, dataset: &str) -> Option<PartLayout> {
        self.lock().layouts.get(dataset).cloned()
    }

    /// The datasets the cluster's ingests laid out.
    pub fn laid_out_datasets(&self) -> Vec<String> {
        self.lock().layouts.keys().cloned().collect()
    }

    /// The version of `dataset` the cluster wrote on `node`, if any.
    pub fn version(&self, dataset: &str, node: &str) -> Option<u64> {
        self.lock().parts.get(dataset)?.get(node).copied()
    }

    /// What of `held` (a node's datasets and their latest versions) the
    /// cluster did not write on `node`: a version newer than the ledger's,
    /// or a dataset it never wrote there. Empty: the node may join.
    pub fn unknown(&self, node: &str, held: &[(String, u64)]) -> Vec<Unknown> {
        held.iter()
            .filter_map(|(dataset, version)| {
                let known = self.version(dataset, node);
                (known.is_none_or(|k| *version > k)).then(|| Unknown {
                    dataset: dataset.clone(),
                    version: *version,
                    known,
                })
            })
            .collect()
    }

    fn save(&self, parts: &Parts) -> std::io::Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let tmp = path.with_extension("tmp");
        let mut f = File::create(&tmp)?;
        f.write_all(&serde_json::to_vec_pretty(parts)?)?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent() {
            File::open(dir)?.sync_all()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_may_bring_only_what_the_cluster_wrote_there() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = PartLedger::open(dir.path()).unwrap();
        let a = "http://10.0.0.11:50051";
        ledger
            .committed(
                "pets",
                &[(a.into(), 3), ("http://10.0.0.12:50051".into(), 2)],
            )
            .unwrap();
        assert!(ledger.unknown(a, &[("pets".into(), 3)]).is_empty());
        assert!(
            ledger.unknown(a, &[("pets".into(), 2)]).is_empty(),
            "an older one"
        );
        assert_eq!(
            ledger.unknown(a, &[("pets".into(), 4), ("cats".into(), 1)]),
            [
                Unknown {
                    dataset: "pets".into(),
                    version: 4,
                    known: Some(3)
                },
                Unknown {
                    dataset: "cats".into(),
                    version: 1,
                    known: None
                }
            ]
        );
        assert_eq!(
            ledger
                .unknown("http://10.0.0.99:1", &[("pets".into(), 3)])
                .len(),
            1,
            "another node's part is not this one's"
        );
        let layout = PartLayout {
            replicas: 2,
            holders: vec![vec![a.into(), "b".into()], vec!["b".into(), a.into()]],
            versions: [(a.to_string(), 3), ("b".to_string(), 2)].into(),
        };
        ledger.laid_out("pets", layout.clone()).unwrap();
        // A restarted coordinator knows its parts and their layout.
        let again = PartLedger::open(dir.path()).unwrap();
        assert_eq!(again.version("pets", a), Some(3));
        assert_eq!(again.layout("pets"), Some(layout));
        assert_eq!(again.layout("cats"), None);
        // Its parts moved away, a node may not bring them back: they are
        // stale (to be retired), and a newer version is unknown.
        again.released("pets", &[a.to_string()]).unwrap();
        assert_eq!(again.version("pets", a), None);
        assert_eq!(again.unknown(a, &[("pets".into(), 3)]).len(), 1);
        assert!(again.moved_away("pets", a, 3) && again.moved_away("pets", a, 2));
        assert!(!again.moved_away("pets", a, 4) && !again.moved_away("cats", a, 1));
        // Written there again, it is no longer stale.
        again.committed("pets", &[(a.into(), 5)]).unwrap();
        assert!(!again.moved_away("pets", a, 3));
    }
}
