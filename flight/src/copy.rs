//! Moving replicas between storage nodes, as it travels between the
//! coordinator and a node: a node's new version of a dataset built from
//! rows it keeps and rows another node sends (re-replication, drain,
//! rebalance), and the retirement of versions a node no longer needs to
//! hold.
//!
//! - A DoPut whose descriptor's command is a [`CopyIn`] (JSON), followed
//!   by rows in the dataset's table schema (every metadata column, then
//!   `data`), as read from another holder: the node writes a new version
//!   of the dataset — the rows of its version `keep` not named in `drop`,
//!   then the rows sent — and holds it uncommitted under `txn`, as a
//!   prepared ingest part (`crate::ingest`). It answers one `PutResult`
//!   whose body is a [`PreparedPart`](crate::ingest::PreparedPart); the
//!   coordinator then commits or drops it with
//!   [`FINISH_INGEST`](crate::ingest::FINISH_INGEST). Each row's bytes are
//!   checked against the crc32c it carries before they are written.
//! - [`RETIRE`] with a [`Retire`]: the node deletes the dataset's versions
//!   up to one (all of them: it then holds nothing of the dataset); their
//!   chunks are free at once. It answers a [`Retired`].

use serde::{Deserialize, Serialize};

/// The action that retires versions ([`Retire`] → [`Retired`]).
pub const RETIRE: &str = "retire";

/// A node's new version of a dataset, from rows it keeps and rows sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CopyIn {
    /// The coordinator's id of this move: the new version is committed or
    /// dropped by it.
    pub txn: String,
    /// The dataset (a new version of it on this node).
    pub dataset: String,
    /// The node's version whose rows it keeps; `None`: it keeps none (a
    /// node that did not hold the dataset).
    #[serde(default)]
    pub keep: Option<u64>,
    /// Row ids of `keep` left out (parts moved elsewhere).
    #[serde(default)]
    pub drop: Vec<u32>,
    /// Where the rows sent come from, for the version's record (e.g.
    /// `parts [1] from http://10.0.0.12:50051`).
    pub from: String,
}

/// Which versions of a dataset a node no longer holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Retire {
    /// The dataset.
    pub dataset: String,
    /// Every version up to and including this one; `None`: every version.
    #[serde(default)]
    pub through: Option<u64>,
}

/// What a retirement freed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retired {
    /// The versions deleted.
    pub versions: Vec<u64>,
    /// Their objects' bytes.
    pub bytes: u64,
    /// Device chunks freed.
    pub chunks: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_refuse_unknown_fields_and_round_trip() {
        let c = CopyIn {
            txn: "t".into(),
            dataset: "pets".into(),
            keep: Some(3),
            drop: vec![1, 4],
            from: "parts [0] from a".into(),
        };
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<CopyIn>(&json).unwrap(), c);
        assert!(serde_json::from_str::<CopyIn>(&json.replacen('{', r#"{"x":1,"#, 1)).is_err());
        let r: Retire = serde_json::from_str(r#"{"dataset":"pets"}"#).unwrap();
        assert_eq!(r.through, None);
    }
}
