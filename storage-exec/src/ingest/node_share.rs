//! [`NodeShare`]: one of N storage nodes' part of a source.
//!
//! A dataset spread over N storage nodes is N ingests of the same source,
//! one per node, each keeping every N-th sample of the source's sorted
//! enumeration (`--shard I/N` keeps those at positions ≡ I mod N). A
//! source of shard files with at least N files is split by file instead
//! (`shard_files::enumerate`): each node reads only its own files. The
//! parts are disjoint, together they are the whole source, and each keeps
//! the keys and user columns (an ImageFolder's `label`) the source would
//! have given it whole, so a query over the N nodes returns the rows the
//! embedded default returns over one data dir.
//!
//! With R replicas (`replicas`), part *p* is held by nodes *p … p+R−1*
//! (mod N): node I keeps the parts I, I−1, …, I−R+1. Every node then
//! holds R parts and every part R nodes, whatever the source; the parts
//! are still disjoint, and a node's rows of one part are those of any
//! other holder (the same keys, objects and user columns).

use std::fmt;
use std::str::FromStr;

/// Node `index` of `count` (`0 <= index < count`), holding `replicas`
/// parts (`1 <= replicas <= count`; see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeShare {
    /// Which node, from 0 (with one replica: which part).
    pub index: u32,
    /// How many parts (and nodes).
    pub count: u32,
    /// How many nodes hold each part.
    pub replicas: u32,
}

impl FromStr for NodeShare {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let bad = || format!("bad shard {s:?}: expected I/N with 0 <= I < N, e.g. 0/2");
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let index: u32 = i.trim().parse().map_err(|_| bad())?;
        let count: u32 = n.trim().parse().map_err(|_| bad())?;
        if count == 0 || index >= count {
            return Err(bad());
        }
        Ok(Self {
            index,
            count,
            replicas: 1,
        })
    }
}

impl fmt::Display for NodeShare {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)?;
        if self.replicas > 1 {
            write!(f, ", {} replicas", self.replicas)?;
        }
        Ok(())
    }
}

impl NodeShare {
    /// Node `index` of `count`, holding `replicas` parts; an error names
    /// what is out of range.
    pub fn new(index: u32, count: u32, replicas: u32) -> Result<Self, String> {
        if count == 0 || index >= count {
            return Err(format!("bad shard {index}/{count}"));
        }
        if replicas == 0 || replicas > count {
            return Err(format!(
                "bad replicas {replicas}: each part goes to 1 to {count} distinct nodes"
            ));
        }
        Ok(Self {
            index,
            count,
            replicas,
        })
    }

    /// The part the sample (or shard file) at `position` of the
    /// enumeration belongs to.
    pub fn part_of(count: u32, position: usize) -> u32 {
        (position % count as usize) as u32
    }

    /// Whether the sample at `position` of the enumeration is one of this
    /// node's parts.
    pub fn keeps(&self, position: usize) -> bool {
        let part = Self::part_of(self.count, position);
        sluice_flight::ingest::holds(self.index, part, self.count, self.replicas)
    }

    /// Of shard `files` (in name order), those `part` reads, and whether
    /// that is its part only: with at least N files, the files at
    /// positions this node keeps; with fewer, all of them (every node
    /// then keeps every N-th sample).
    pub(crate) fn own_files<T>(part: Option<Self>, files: Vec<T>) -> (Vec<T>, bool) {
        let part_only = part.is_some_and(|p| files.len() >= p.count as usize);
        match part.filter(|_| part_only) {
            Some(p) => (
                files
                    .into_iter()
                    .enumerate()
                    .filter(|(i, _)| p.keeps(*i))
                    .map(|(_, f)| f)
                    .collect(),
                true,
            ),
            None => (files, false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_parse_and_refuse_nonsense() {
        assert_eq!(
            "1/3".parse::<NodeShare>().unwrap(),
            NodeShare {
                index: 1,
                count: 3,
                replicas: 1
            }
        );
        for bad in ["3/3", "0/0", "1", "a/2", "-1/2", "1/2/3"] {
            let e = bad.parse::<NodeShare>().unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
    }

    #[test]
    fn the_parts_are_disjoint_and_whole() {
        let n = 3;
        let mut seen = vec![0; 10];
        for index in 0..n {
            let s = NodeShare::new(index, n, 1).unwrap();
            for (p, hits) in seen.iter_mut().enumerate() {
                if s.keeps(p) {
                    *hits += 1;
                }
            }
        }
        assert!(seen.iter().all(|&h| h == 1), "{seen:?}");
    }

    #[test]
    fn with_replicas_each_part_is_on_r_distinct_nodes_and_each_node_holds_r_parts() {
        for (n, r) in [(2, 2), (3, 2), (4, 3), (5, 1)] {
            let nodes: Vec<NodeShare> = (0..n).map(|i| NodeShare::new(i, n, r).unwrap()).collect();
            for p in 0..40usize {
                let holding: Vec<u32> = nodes
                    .iter()
                    .filter(|s| s.keeps(p))
                    .map(|s| s.index)
                    .collect();
                let part = NodeShare::part_of(n, p);
                let named: Vec<u32> = {
                    let mut h: Vec<u32> = sluice_flight::ingest::holders(part, n, r).collect();
                    h.sort_unstable();
                    h
                };
                assert_eq!(holding, named, "sample {p} of {n} nodes × {r}");
            }
            for s in &nodes {
                let parts = (0..n as usize).filter(|&p| s.keeps(p)).count();
                assert_eq!(parts, r as usize, "node {s}");
            }
        }
        assert!(NodeShare::new(0, 2, 3).unwrap_err().contains("replicas 3"));
        assert!(NodeShare::new(0, 2, 0).is_err());
    }
}
