//! What a trainer is given to move the stripes of a cluster checkpoint
//! between itself and the storage nodes directly, the coordinator only
//! beginning, committing and saying where the stripes are (DAOS's
//! client-side striping):
//!
//! - [`Direct`], to write: stripe *s* of `unit` bytes goes to nodes
//!   *s … s+R−1* (mod *n*), each at its place in that node's piece, as the
//!   coordinator would place it (`sluice_compute::checkpoints::stripes`),
//!   with each node's upload pass;
//! - [`DirectRead`], to read: each piece of a committed version, the
//!   stripes it holds (after moves off lost nodes, not always the
//!   placement's) and a read pass for it (`sluice_access::read_pass`).

use serde::{Deserialize, Serialize};

/// See the module docs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Direct {
    /// Bytes per stripe.
    pub unit: u64,
    /// Nodes holding each stripe.
    pub replicas: u32,
    /// The nodes striped over, in the striping's order.
    pub nodes: Vec<DirectNode>,
}

/// One storage node of a [`Direct`] write.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirectNode {
    /// Its Flight URL, as the coordinator dials it.
    pub url: String,
    /// Its piece's upload there.
    pub upload: String,
    /// The pass that writes that upload's parts (never logged).
    pub pass: String,
}

impl std::fmt::Debug for DirectNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectNode")
            .field("url", &self.url)
            .field("upload", &self.upload)
            .field("pass", &"…")
            .finish()
    }
}

/// See the module docs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirectRead {
    /// Bytes per stripe.
    pub unit: u64,
    /// The pieces whose nodes gave a read pass: every stripe is in one
    /// of them at least.
    pub pieces: Vec<DirectPiece>,
}

/// One piece of a [`DirectRead`].
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirectPiece {
    /// Its node's Flight URL, as the coordinator dials it.
    pub url: String,
    /// The piece's name there.
    pub piece: String,
    /// Its version there.
    pub version: u64,
    /// The stripes it holds, ascending: stripe `stripes[i]` starts at
    /// `i × unit` in the piece.
    pub stripes: Vec<u64>,
    /// The pass that reads it (never logged).
    pub pass: String,
}

impl std::fmt::Debug for DirectPiece {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectPiece")
            .field("url", &self.url)
            .field("piece", &self.piece)
            .field("version", &self.version)
            .field("stripes", &self.stripes.len())
            .field("pass", &"…")
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_is_not_shown_in_debug_output() {
        let n = DirectNode {
            url: "http://n:1".into(),
            upload: "u".into(),
            pass: "secret-pass".into(),
        };
        assert!(!format!("{n:?}").contains("secret-pass"));
        let d = Direct {
            unit: 4,
            replicas: 1,
            nodes: vec![n],
        };
        let back: Direct = serde_json::from_str(&serde_json::to_string(&d).unwrap()).unwrap();
        assert_eq!(back, d);
        let p = DirectPiece {
            url: "http://n:1".into(),
            piece: ".stripes/u/a".into(),
            version: 1,
            stripes: vec![0, 2],
            pass: "secret-read-pass".into(),
        };
        assert!(!format!("{p:?}").contains("secret-read-pass"));
    }
}
