//! [`RankRoutes`]: which compute nodes each rank of a job was sent to.
//!
//! A coordinator answers a trainer's `GetFlightInfo` (or a REST status)
//! with the compute node that serves each rank (`super::cluster`). It
//! notes each such answer here, and takes a node's progress report for a
//! rank only from a node the rank was sent to (`super::report`): a node
//! of the cluster cannot report, and so finish, ranks it never served. A
//! rank that moved (its node lost, its trainer resumed elsewhere) keeps
//! its earlier nodes too, so that their last reports still count; the
//! most recent [`MAX_PER_RANK`] are kept. The routes are saved with the
//! job's record, so that reports after a coordinator restart still count.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Nodes kept per rank, most recent last.
pub const MAX_PER_RANK: usize = 8;

/// See the module docs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankRoutes(BTreeMap<u64, Vec<String>>);

impl RankRoutes {
    /// Notes that `rank` was sent to `node`; whether that was new.
    pub fn note(&mut self, rank: u64, node: &str) -> bool {
        let nodes = self.0.entry(rank).or_default();
        if nodes.last().is_some_and(|n| n == node) {
            return false;
        }
        nodes.retain(|n| n != node);
        nodes.push(node.to_string());
        if nodes.len() > MAX_PER_RANK {
            nodes.remove(0);
        }
        true
    }

    /// Whether no rank was sent anywhere.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `rank` was ever sent to `node` (of the most recent kept).
    pub fn sent(&self, rank: u64, node: &str) -> bool {
        self.0
            .get(&rank)
            .is_some_and(|n| n.iter().any(|x| x == node))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_is_reported_only_by_the_nodes_it_was_sent_to() {
        let mut r = RankRoutes::default();
        assert!(!r.sent(0, "grpc://a:1"));
        assert!(r.note(0, "grpc://a:1"));
        assert!(!r.note(0, "grpc://a:1"), "the same answer again is not new");
        assert!(r.note(0, "grpc://b:1"));
        assert!(r.sent(0, "grpc://a:1") && r.sent(0, "grpc://b:1"));
        assert!(!r.sent(1, "grpc://a:1"));
        for i in 0..MAX_PER_RANK {
            r.note(0, &format!("grpc://n{i}:1"));
        }
        assert!(!r.sent(0, "grpc://a:1"), "only the most recent are kept");
        let back: RankRoutes = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }
}
