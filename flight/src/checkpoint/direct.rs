//! [`Direct`]: what a trainer is given to write the stripes of a cluster
//! checkpoint to the storage nodes itself, the coordinator only beginning
//! and committing the version (DAOS's client-side striping). Stripe *s*
//! of `unit` bytes goes to nodes *s … s+R−1* (mod *n*), each at its place
//! in that node's piece, as the coordinator would place it
//! (`sluice_compute::checkpoints::stripes`).

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
    }
}
