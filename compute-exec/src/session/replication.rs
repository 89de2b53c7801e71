//! A dataset spread over several nodes as the session sees it: the reads
//! that take each key once (`crate::replicas::key_owners`), and the replication
//! health of the cluster's last ingest of it — per part, which holders
//! are live.
//!
//! A holder is live when the node is known, not removed, answered the
//! last refresh, and still lists the version the ingest wrote there.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use serde::{Deserialize, Serialize};
use sluice_flight::StorageEndpoint;

use super::ComputeSession;
use crate::remote::ReplicaReads;
use crate::replicas::key_owners::KeyOwners;
use crate::replicas::ledger::PartLayout;

/// A dataset's replication, as `GET /v1/datasets/{name}` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Replication {
    /// How many nodes the ingest put each part on.
    pub replicas: u32,
    /// Parts of the version.
    pub parts: usize,
    /// Parts with every holder live.
    pub full: usize,
    /// Parts with some, not all, holders live.
    pub under: usize,
    /// Parts with no live holder: unreadable until one comes back.
    pub lost: usize,
    /// The parts not fully replicated, with their holders.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub degraded: Vec<PartHealth>,
}

/// One part that is not fully replicated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PartHealth {
    /// The part.
    pub part: usize,
    /// Its holders.
    pub holders: Vec<String>,
    /// Those of them live.
    pub live: Vec<String>,
}

impl Replication {
    /// The health of `layout` where `live(node)` says which holders are.
    pub fn of(layout: &PartLayout, live: impl Fn(&str) -> bool) -> Self {
        let mut out = Self {
            replicas: layout.replicas,
            parts: layout.holders.len(),
            full: 0,
            under: 0,
            lost: 0,
            degraded: Vec::new(),
        };
        for (part, holders) in layout.holders.iter().enumerate() {
            let up: Vec<String> = holders.iter().filter(|h| live(h)).cloned().collect();
            match up.len() {
                n if n == holders.len() && n >= layout.replicas as usize => {
                    out.full += 1;
                    continue;
                }
                0 => out.lost += 1,
                _ => out.under += 1,
            }
            out.degraded.push(PartHealth {
                part,
                holders: holders.clone(),
                live: up,
            });
        }
        out
    }
}

impl ComputeSession {
    /// Each dataset's table schema, by name, as last listed.
    pub async fn table_schemas(&self) -> HashMap<String, SchemaRef> {
        self.datasets()
            .await
            .into_iter()
            .map(|(name, schema, _)| (name, schema))
            .collect()
    }

    /// For each table of `holders` (a dataset, or `dataset@N`) held by
    /// more than one node, the reads that take each key once
    /// (`crate::replicas::key_owners`), at the versions a job would pin.
    pub(super) async fn replica_reads(
        &self,
        holders: &HashMap<String, Vec<Arc<dyn StorageEndpoint>>>,
        schemas: &BTreeMap<String, SchemaRef>,
    ) -> HashMap<String, Arc<dyn ReplicaReads>> {
        let mut out = HashMap::new();
        for (name, nodes) in holders.iter().filter(|(_, n)| n.len() > 1) {
            // `pets@1` reads version 1 of `pets`'s nodes, each key once too.
            let base = name.split('@').next().unwrap_or(name);
            let Some(schema) = schemas.get(name).or_else(|| schemas.get(base)) else {
                continue;
            };
            let pins = self
                .pins(name)
                .await
                .into_iter()
                .filter(|(e, _)| nodes.iter().any(|n| n.name() == e.name()))
                .collect();
            let reads = KeyOwners::new(
                base.to_string(),
                Arc::clone(schema),
                pins,
                self.ledger().layout(base),
            );
            out.insert(name.clone(), Arc::new(reads) as Arc<dyn ReplicaReads>);
        }
        out
    }

    /// The replication health of `dataset`'s last cluster ingest, if the
    /// cluster made one (see the module docs).
    pub async fn replication(&self, dataset: &str) -> Option<Replication> {
        let layout = self.ledger().layout(dataset)?;
        let known = self.known.lock().await;
        let endpoints = self.indexed();
        let holding = known.datasets.get(dataset);
        let live = |name: &str| {
            let Some(i) = endpoints.iter().position(|e| e.name() == name) else {
                return false;
            };
            !self.is_removed(&endpoints[i])
                && !known.unreachable.contains(&i)
                && holding.is_some_and(|h| {
                    h.parts
                        .iter()
                        .any(|p| p.node == i && layout.wrote(name, p.version))
                })
        };
        Some(Replication::of(&layout, live))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_full_under_or_lost_by_their_live_holders() {
        let layout = PartLayout {
            replicas: 2,
            holders: vec![
                vec!["a".into(), "b".into()],
                vec!["b".into(), "c".into()],
                vec!["c".into(), "a".into()],
            ],
            versions: Default::default(),
        };
        let all = Replication::of(&layout, |_| true);
        assert_eq!((all.full, all.under, all.lost), (3, 0, 0));
        assert!(all.degraded.is_empty());
        let no_c = Replication::of(&layout, |n| n != "c");
        assert_eq!((no_c.full, no_c.under, no_c.lost), (1, 2, 0));
        assert_eq!(no_c.degraded[0].part, 1);
        assert_eq!(no_c.degraded[0].live, ["b"]);
        let only_a = Replication::of(&layout, |n| n == "a");
        assert_eq!((only_a.full, only_a.under, only_a.lost), (0, 2, 1));
        assert_eq!(only_a.degraded[1].part, 1);
        assert!(only_a.degraded[1].live.is_empty());
    }
}
