//! [`Striping`]: where each stripe of a cluster checkpoint goes — a pure
//! function of the stripe's index, the node count and the replicas.
//!
//! A checkpoint is cut into stripes of `unit` bytes (the last one
//! shorter). Stripe *s* is held by nodes *s, s+1, …, s+R−1* (mod *n*),
//! the placement rule of a dataset's parts (`sluice_flight::ingest`), so
//! consecutive stripes go to different nodes and a write or a read of a
//! few stripes keeps every node busy at once. Each node keeps its stripes
//! as one blob of its own, in stripe order: stripe *s* sits at
//! [`Striping::local_offset`] there, which does not depend on the
//! checkpoint's size, so a stripe can be sent before the size is known
//! (a `torch.save` streams).

/// See the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Striping {
    /// Bytes per stripe.
    pub unit: u64,
    /// Nodes the checkpoint is striped over.
    pub nodes: u32,
    /// Nodes holding each stripe (at most `nodes`).
    pub replicas: u32,
}

impl Striping {
    /// The stripe holding byte `offset`.
    pub fn stripe_of(&self, offset: u64) -> u64 {
        offset / self.unit
    }

    /// The nodes (indices) holding stripe `s`, the first one first.
    pub fn holders(&self, s: u64) -> impl Iterator<Item = u32> + use<> {
        let first = (s % u64::from(self.nodes)) as u32;
        sluice_flight::ingest::holders(first, self.nodes, self.replicas)
    }

    /// The residues (stripe mod nodes) node `k` holds, ascending.
    fn residues(&self, k: u32) -> Vec<u32> {
        let mut r: Vec<u32> = (0..self.replicas)
            .map(|j| (k + self.nodes - j % self.nodes) % self.nodes)
            .collect();
        r.sort_unstable();
        r.dedup();
        r
    }

    /// Where stripe `s` starts in node `k`'s blob (`None`: `k` does not
    /// hold it).
    pub fn local_offset(&self, k: u32, s: u64) -> Option<u64> {
        let n = u64::from(self.nodes);
        let residues = self.residues(k);
        let at = residues.iter().position(|&r| u64::from(r) == s % n)?;
        Some(((s / n) * residues.len() as u64 + at as u64) * self.unit)
    }

    /// Stripes of a checkpoint of `size` bytes.
    pub fn stripes(&self, size: u64) -> u64 {
        size.div_ceil(self.unit)
    }

    /// Bytes of stripe `s` in a checkpoint of `size` bytes.
    pub fn stripe_len(&self, s: u64, size: u64) -> u64 {
        size.saturating_sub(s * self.unit).min(self.unit)
    }

    /// The stripes node `k` holds of a checkpoint of `size` bytes, in
    /// order (the order of its blob).
    pub fn held(&self, k: u32, size: u64) -> Vec<u64> {
        (0..self.stripes(size))
            .filter(|&s| self.holders(s).any(|h| h == k))
            .collect()
    }

    /// The size of node `k`'s blob for a checkpoint of `size` bytes.
    pub fn local_size(&self, k: u32, size: u64) -> u64 {
        self.held(k, size)
            .into_iter()
            .map(|s| self.stripe_len(s, size))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn consecutive_stripes_go_to_every_node_in_turn() {
        let s = Striping {
            unit: 4,
            nodes: 3,
            replicas: 2,
        };
        let holders: Vec<Vec<u32>> = (0..4).map(|i| s.holders(i).collect()).collect();
        assert_eq!(holders, [vec![0, 1], vec![1, 2], vec![2, 0], vec![0, 1]]);
        // Node 0 holds stripes 0, 2, 3, 5, …: residues 0 and 2.
        assert_eq!(s.held(0, 24), [0, 2, 3, 5]);
        assert_eq!(s.local_offset(0, 3), Some(8));
        assert_eq!(s.local_offset(0, 1), None);
        assert_eq!(s.local_size(0, 22), 4 + 4 + 4 + 2);
    }

    proptest! {
        /// Every byte is on exactly `replicas` nodes, each node's blob is
        /// its stripes back to back, and the blobs add up to the
        /// checkpoint `replicas` times over.
        #[test]
        fn every_stripe_is_on_its_replicas_and_the_blobs_are_dense(
            nodes in 1u32..6,
            extra in 0u32..6,
            unit in 1u64..9,
            size in 0u64..200,
        ) {
            let s = Striping { unit, nodes, replicas: 1 + extra % nodes };
            let mut total = 0;
            for k in 0..nodes {
                let mut next = 0;
                for st in s.held(k, size) {
                    prop_assert_eq!(s.local_offset(k, st), Some(next));
                    next += s.stripe_len(st, size);
                }
                prop_assert_eq!(next, s.local_size(k, size));
                total += next;
            }
            prop_assert_eq!(total, size * u64::from(s.replicas));
            for st in 0..s.stripes(size) {
                let mut h: Vec<u32> = s.holders(st).collect();
                h.sort_unstable();
                h.dedup();
                prop_assert_eq!(h.len() as u32, s.replicas);
            }
        }
    }
}
