//! The two-phase ingest of a dataset spread over storage nodes, as it
//! travels between the coordinator and each node (Flight actions whose
//! bodies are JSON).
//!
//! 1. [`PREPARE_INGEST`] with an [`IngestPart`]: the node ingests its part
//!    of the source (`shard`), writes every object and the version's
//!    metadata, and holds the version uncommitted under the coordinator's
//!    transaction id; it answers a [`PreparedPart`].
//! 2. [`FINISH_INGEST`] with a [`FinishIngest`]: `commit` makes the part
//!    visible (one catalog transaction) and answers an [`IngestedPart`];
//!    otherwise the part is dropped and leaves nothing behind.
//!
//! The coordinator commits only when every node has prepared; a node that
//! fails or goes away while preparing makes it abort the others. A node
//! drops a part that no word reaches within [`PREPARED_TTL`] (the
//! coordinator died), and a node that dies drops its own by dying.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The action that prepares a part ([`IngestPart`] → [`PreparedPart`]).
pub const PREPARE_INGEST: &str = "prepare_ingest";

/// The action that commits or drops a prepared part ([`FinishIngest`] →
/// [`IngestedPart`], or nothing when dropped).
pub const FINISH_INGEST: &str = "finish_ingest";

/// How long a node holds a prepared part with no word from its
/// coordinator before it drops it.
pub const PREPARED_TTL: Duration = Duration::from_secs(600);

/// One node's part of an ingest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IngestPart {
    /// The coordinator's id of this ingest, the same on every node: a
    /// part is committed or dropped by it, even one whose prepare reply
    /// was lost.
    pub txn: String,
    /// The dataset (a new version of it on this node).
    pub dataset: String,
    /// The source directory or manifest, as a path on the node's host
    /// (the nodes read a filesystem they share), under the node's own
    /// ingest roots.
    pub path: String,
    /// A manifest under `path`, if the source is one.
    #[serde(default)]
    pub manifest: Option<String>,
    /// Unreadable objects: `skip` or `fail`.
    pub on_error: String,
    /// This node's part: `(index, count)`, every `count`-th object of the
    /// sorted source from the `index`-th; `None`: the whole source.
    #[serde(default)]
    pub shard: Option<(u32, u32)>,
    /// How many nodes hold each part: with `R`, this node (`index`) keeps
    /// the parts `index, index−1, …, index−R+1` (mod `count`), so part
    /// `p` is on the nodes `p … p+R−1`.
    #[serde(default = "one")]
    pub replicas: u32,
}

fn one() -> u32 {
    1
}

/// The placement rule of replicated parts: part `part` of `nodes` with
/// `replicas` copies is held by the nodes `part, part+1, …` (mod `nodes`),
/// the first being the one it is named after.
pub fn holders(part: u32, nodes: u32, replicas: u32) -> impl Iterator<Item = u32> {
    (0..replicas.min(nodes)).map(move |k| (part + k) % nodes)
}

/// Whether node `node` holds part `part` under [`holders`]' rule.
pub fn holds(node: u32, part: u32, nodes: u32, replicas: u32) -> bool {
    (node + nodes - part) % nodes < replicas
}

/// What a node prepared: the version it will commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedPart {
    /// The version number on this node.
    pub version: u64,
    /// Samples it holds.
    pub samples: u64,
    /// Bytes of their objects.
    pub bytes: u64,
}

/// The coordinator's word on a prepared part.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FinishIngest {
    /// The ingest ([`IngestPart::txn`]).
    pub txn: String,
    /// Commit it (`true`) or drop it.
    pub commit: bool,
}

/// An object a node left out of its part, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedObject {
    /// The key it would have had.
    pub key: String,
    /// Why it was refused.
    pub reason: String,
}

/// A committed part.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IngestedPart {
    /// The dataset.
    pub dataset: String,
    /// Its version on this node.
    pub version: u64,
    /// Samples committed.
    pub samples: u64,
    /// Bytes of their objects.
    pub bytes: u64,
    /// Device chunks they fill.
    pub chunks: u64,
    /// Objects left out.
    pub skipped: Vec<SkippedObject>,
    /// Seconds the node spent on its part.
    pub seconds: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_refuse_unknown_fields_and_round_trip() {
        let part = IngestPart {
            txn: "t-1".into(),
            dataset: "pets".into(),
            path: "/data/pets".into(),
            manifest: None,
            on_error: "skip".into(),
            shard: Some((1, 2)),
            replicas: 2,
        };
        let json = serde_json::to_string(&part).unwrap();
        assert_eq!(serde_json::from_str::<IngestPart>(&json).unwrap(), part);
        let extra = json.replacen('{', r#"{"rogue":1,"#, 1);
        assert!(serde_json::from_str::<IngestPart>(&extra).is_err());
    }
}
