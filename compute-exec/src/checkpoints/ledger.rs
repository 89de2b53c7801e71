//! [`CheckpointLedger`]: the coordinator's record of the cluster's
//! committed checkpoints — what makes a version exist. A redb database
//! (`<data dir>/cluster/checkpoints.redb`):
//!
//! | table | key | value |
//! |---|---|---|
//! | `striped` | (name, version) | [`StripedVersion`] as JSON |
//! | `striped_last` | name | the highest version ever committed |
//!
//! A version's pieces are committed on their storage nodes first; the
//! ledger's write transaction is the commit point of the whole version
//! (every stripe and replica durable before it). Pieces a node holds that
//! no version here names (a coordinator killed between the two) are
//! swept ([`super::sweep`]). Version numbers are never reused.

use std::path::Path;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use sluice_flight::checkpoint::CheckpointInfo;

const STRIPED: TableDefinition<'_, (&str, u64), &[u8]> = TableDefinition::new("striped");
const LAST: TableDefinition<'_, &str, u64> = TableDefinition::new("striped_last");

/// One node's piece of a version: the stripes it holds, back to back, as
/// a checkpoint version of its own there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Piece {
    /// The storage node (its URL).
    pub node: String,
    /// The piece's name there.
    pub local: String,
    /// Its version there.
    pub local_version: u64,
    /// The stripes it holds, ascending; stripe `stripes[i]` starts at
    /// `i × unit` in the piece.
    pub stripes: Vec<u64>,
}

/// A committed version of a cluster checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StripedVersion {
    /// Its name.
    pub name: String,
    /// Its version.
    pub version: u64,
    /// Size in bytes.
    pub size: u64,
    /// Commit time, milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// Bytes per stripe.
    pub unit: u64,
    /// Copies of each stripe.
    pub replicas: u32,
    /// Where the stripes are.
    pub pieces: Vec<Piece>,
}

impl StripedVersion {
    /// What a listing shows of it.
    pub fn info(&self) -> CheckpointInfo {
        CheckpointInfo {
            name: self.name.clone(),
            version: self.version,
            size: self.size,
            created_unix_ms: self.created_unix_ms,
        }
    }

    /// The holders of stripe `s`: each piece holding it, and where it
    /// starts there.
    pub fn holders(&self, s: u64) -> Vec<(&Piece, u64)> {
        self.pieces
            .iter()
            .filter_map(|p| {
                p.stripes
                    .binary_search(&s)
                    .ok()
                    .map(|i| (p, i as u64 * self.unit))
            })
            .collect()
    }
}

/// An error of the ledger's database, naming its file.
#[derive(Debug, thiserror::Error)]
#[error("the cluster's checkpoint ledger {path}: {reason}")]
pub struct LedgerError {
    path: String,
    reason: String,
}

/// See the module docs.
#[derive(Debug)]
pub struct CheckpointLedger {
    db: Database,
    path: String,
}

impl CheckpointLedger {
    /// Opens (or creates) the ledger in `dir`.
    pub fn open(dir: &Path) -> Result<Self, LedgerError> {
        let path = dir.join("checkpoints.redb");
        let shown = path.display().to_string();
        let err = |e: &dyn std::fmt::Display| LedgerError {
            path: shown.clone(),
            reason: e.to_string(),
        };
        std::fs::create_dir_all(dir).map_err(|e| err(&e))?;
        let db = Database::create(&path).map_err(|e| err(&e))?;
        let txn = db.begin_write().map_err(|e| err(&e))?;
        txn.open_table(STRIPED).map_err(|e| err(&e))?;
        txn.open_table(LAST).map_err(|e| err(&e))?;
        txn.commit().map_err(|e| err(&e))?;
        Ok(Self { db, path: shown })
    }

    fn err(&self, e: impl std::fmt::Display) -> LedgerError {
        LedgerError {
            path: self.path.clone(),
            reason: e.to_string(),
        }
    }

    fn decode(&self, bytes: &[u8]) -> Result<StripedVersion, LedgerError> {
        serde_json::from_slice(bytes).map_err(|e| self.err(e))
    }

    fn versions_of<T: ReadableTable<(&'static str, u64), &'static [u8]>>(
        &self,
        table: &T,
        name: &str,
    ) -> Result<Vec<StripedVersion>, LedgerError> {
        let mut out = Vec::new();
        for entry in table
            .range((name, 0)..=(name, u64::MAX))
            .map_err(|e| self.err(e))?
        {
            let (_, v) = entry.map_err(|e| self.err(e))?;
            out.push(self.decode(v.value())?);
        }
        Ok(out)
    }

    /// Records each of `versions` as the next version of its name (their
    /// `version`s are set here) and drops the versions past the newest
    /// `keep` of each name, in one durable transaction; the versions
    /// dropped (whose pieces the caller deletes).
    pub fn commit(
        &self,
        versions: &mut [StripedVersion],
        keep: usize,
    ) -> Result<Vec<StripedVersion>, LedgerError> {
        let txn = self.db.begin_write().map_err(|e| self.err(e))?;
        let mut dropped = Vec::new();
        {
            let mut table = txn.open_table(STRIPED).map_err(|e| self.err(e))?;
            let mut last = txn.open_table(LAST).map_err(|e| self.err(e))?;
            for v in versions.iter_mut() {
                let existing = self.versions_of(&table, &v.name)?;
                let highest = last
                    .get(v.name.as_str())
                    .map_err(|e| self.err(e))?
                    .map(|g| g.value())
                    .unwrap_or(0);
                v.version = highest + 1;
                last.insert(v.name.as_str(), v.version)
                    .map_err(|e| self.err(e))?;
                let bytes = serde_json::to_vec(&*v).map_err(|e| self.err(e))?;
                table
                    .insert((v.name.as_str(), v.version), bytes.as_slice())
                    .map_err(|e| self.err(e))?;
                let drop_n = (existing.len() + 1).saturating_sub(keep.max(1));
                for old in existing.into_iter().take(drop_n) {
                    table
                        .remove((old.name.as_str(), old.version))
                        .map_err(|e| self.err(e))?;
                    dropped.push(old);
                }
            }
        }
        txn.commit().map_err(|e| self.err(e))?;
        Ok(dropped)
    }

    /// One version of `name` (the newest when `version` is `None`).
    pub fn get(
        &self,
        name: &str,
        version: Option<u64>,
    ) -> Result<Option<StripedVersion>, LedgerError> {
        let txn = self.db.begin_read().map_err(|e| self.err(e))?;
        let table = txn.open_table(STRIPED).map_err(|e| self.err(e))?;
        let found = match version {
            Some(v) => table
                .get((name, v))
                .map_err(|e| self.err(e))?
                .map(|g| self.decode(g.value()))
                .transpose()?,
            None => self.versions_of(&table, name)?.pop(),
        };
        Ok(found)
    }

    /// Every version of the names starting with `prefix`, by name and
    /// version.
    pub fn list(&self, prefix: &str) -> Result<Vec<StripedVersion>, LedgerError> {
        let txn = self.db.begin_read().map_err(|e| self.err(e))?;
        let table = txn.open_table(STRIPED).map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for entry in table.range((prefix, 0)..).map_err(|e| self.err(e))? {
            let (k, v) = entry.map_err(|e| self.err(e))?;
            if !k.value().0.starts_with(prefix) {
                break;
            }
            out.push(self.decode(v.value())?);
        }
        Ok(out)
    }

    /// Swaps, in version `version` of `name`, the pieces `dropped` (by
    /// node and name) for `added`, in one transaction; whether the
    /// version is still there to swap them in.
    pub fn swap_pieces(
        &self,
        name: &str,
        version: u64,
        dropped: &[Piece],
        added: &[Piece],
    ) -> Result<bool, LedgerError> {
        let txn = self.db.begin_write().map_err(|e| self.err(e))?;
        {
            let mut table = txn.open_table(STRIPED).map_err(|e| self.err(e))?;
            let found = table
                .get((name, version))
                .map_err(|e| self.err(e))?
                .map(|g| self.decode(g.value()))
                .transpose()?;
            let Some(mut v) = found else {
                return Ok(false);
            };
            v.pieces.retain(|p| {
                !dropped
                    .iter()
                    .any(|d| d.node == p.node && d.local == p.local)
            });
            v.pieces.extend_from_slice(added);
            let bytes = serde_json::to_vec(&v).map_err(|e| self.err(e))?;
            table
                .insert((name, version), bytes.as_slice())
                .map_err(|e| self.err(e))?;
        }
        txn.commit().map_err(|e| self.err(e))?;
        Ok(true)
    }

    /// Drops one version of `name`, or every one; those dropped.
    pub fn delete(
        &self,
        name: &str,
        version: Option<u64>,
    ) -> Result<Vec<StripedVersion>, LedgerError> {
        let txn = self.db.begin_write().map_err(|e| self.err(e))?;
        let mut dropped = Vec::new();
        {
            let mut table = txn.open_table(STRIPED).map_err(|e| self.err(e))?;
            for v in self.versions_of(&table, name)? {
                if version.is_none_or(|want| want == v.version) {
                    table
                        .remove((v.name.as_str(), v.version))
                        .map_err(|e| self.err(e))?;
                    dropped.push(v);
                }
            }
        }
        txn.commit().map_err(|e| self.err(e))?;
        Ok(dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(name: &str, node: &str) -> StripedVersion {
        StripedVersion {
            name: name.into(),
            version: 0,
            size: 10,
            created_unix_ms: 1,
            unit: 4,
            replicas: 1,
            pieces: vec![Piece {
                node: node.into(),
                local: format!(".stripes/x/{name}"),
                local_version: 1,
                stripes: vec![0, 1, 2],
            }],
        }
    }

    #[test]
    fn versions_count_up_are_kept_and_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = CheckpointLedger::open(dir.path()).unwrap();
        for _ in 0..3 {
            let mut v = [version("run/a", "n0")];
            let dropped = ledger.commit(&mut v, 2).unwrap();
            assert_eq!(dropped.len(), usize::from(v[0].version == 3));
        }
        let mut b = [version("run/b", "n1"), version("other", "n1")];
        ledger.commit(&mut b, 2).unwrap();
        drop(ledger);
        let ledger = CheckpointLedger::open(dir.path()).unwrap();
        let listed: Vec<(String, u64)> = ledger
            .list("run/")
            .unwrap()
            .into_iter()
            .map(|v| (v.name, v.version))
            .collect();
        assert_eq!(
            listed,
            [
                ("run/a".into(), 2),
                ("run/a".into(), 3),
                ("run/b".into(), 1)
            ]
        );
        assert_eq!(ledger.get("run/a", None).unwrap().unwrap().version, 3);
        assert!(ledger.get("run/a", Some(1)).unwrap().is_none());
        // A piece swapped for others, as a move off a node does.
        let moved = Piece {
            node: "n9".into(),
            local: "l2".into(),
            local_version: 1,
            stripes: vec![0, 1, 2],
        };
        let old = ledger.get("run/a", Some(3)).unwrap().unwrap().pieces;
        assert!(
            ledger
                .swap_pieces("run/a", 3, &old, std::slice::from_ref(&moved))
                .unwrap()
        );
        assert_eq!(
            ledger.get("run/a", Some(3)).unwrap().unwrap().pieces,
            std::slice::from_ref(&moved)
        );
        assert!(!ledger.swap_pieces("run/a", 1, &old, &[moved]).unwrap());
        // A deleted name's numbers are not reused.
        assert_eq!(ledger.delete("run/a", None).unwrap().len(), 2);
        let mut again = [version("run/a", "n0")];
        ledger.commit(&mut again, 2).unwrap();
        assert_eq!(again[0].version, 4);
    }

    #[test]
    fn a_stripe_is_found_in_each_piece_that_holds_it() {
        let mut v = version("a", "n0");
        v.pieces.push(Piece {
            node: "n1".into(),
            local: "l".into(),
            local_version: 1,
            stripes: vec![1, 2],
        });
        let at: Vec<(&str, u64)> = v
            .holders(2)
            .into_iter()
            .map(|(p, o)| (p.node.as_str(), o))
            .collect();
        assert_eq!(at, [("n0", 8), ("n1", 4)]);
        assert!(v.holders(3).is_empty());
    }
}
