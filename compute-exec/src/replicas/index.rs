//! [`SampleIndex`]: a job's samples, resolved once, at submit, into row ids
//! of the dataset versions it pins.
//!
//! Each storage node holding the dataset is asked once for the rows of
//! its pinned version that pass the job's filters (a take of every row,
//! [`Take::index`], answering each row's key and row id). The rows of all
//! nodes are sorted by key — so the order of an epoch depends on the seed
//! and the epoch only, not on how the dataset is spread — and a key held by
//! more than one node is one sample with several holders: its replicas
//! (`crate::ingest` writes each part to R nodes). Then the keys are
//! dropped: the job keeps, per sample, its first holder (one byte) and its
//! row id there (four), and per other holder five bytes more and a
//! four-byte offset per sample (none at all when no key is replicated).
//!
//! A window's takes ([`SampleIndex::takes`]) read each sample from one
//! holder: of those not in the window's [`Avoid`] set (nodes lost, or a
//! replica found corrupt), one of its `k` live holders chosen by a hash
//! of `s` (`spread`), so
//! the reads of a replicated dataset spread evenly over its holders, and a
//! lost node's samples over the nodes left.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Schema, SchemaRef, UInt32Type};
use datafusion::logical_expr::Expr;
use futures::TryStreamExt;
use serde::{Deserialize, Serialize};
use sluice_flight::StorageEndpoint;
use sluice_planner::fragment::slot_field;
use sluice_planner::fragment::{DatasetScanExec, Take};
use sluice_udfs::UdfEnv;

pub use super::holders::MAX_HOLDERS;
use super::holders::{Avoid, Unheld, spread};
use crate::error::JobError;
use crate::plan_feeds::Takes;
use sluice_flight::endpoint::endpoint_id;

/// The dataset column holding each sample's key.
pub const KEY: &str = "key";

/// A dataset version a job reads on one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pin {
    /// The node's name (its URL, or the in-process node's name).
    pub node: String,
    /// The version.
    pub version: u64,
}

/// See the module docs.
#[derive(Debug)]
pub struct SampleIndex {
    pins: Vec<Pin>,
    endpoints: Vec<usize>,
    /// The part (of a mixture; 0 otherwise) each pin's rows belong to.
    pin_parts: Vec<u8>,
    /// Each part's first sample: a mixture's parts, one after another.
    bases: Vec<u64>,
    /// Each sample's first holder (a pin) and its row id there.
    nodes: Vec<u8>,
    rows: Vec<u32>,
    /// Its other holders: sample `s`'s are `others[more[s]..more[s + 1]]`;
    /// `more` is empty when no sample has one.
    more: Vec<u32>,
    others: Vec<(u8, u32)>,
}

impl SampleIndex {
    /// Lists the rows of `table` (whose schema is `schema`) passing
    /// `filters` on each node of `pins`, at its pinned version. A node
    /// that cannot be reached is left out when `whole` says the nodes
    /// listed (by name) hold every part of the version (replicas: its
    /// samples are all held elsewhere); otherwise it is the error.
    pub async fn build(
        table: &str,
        schema: &SchemaRef,
        filters: &[Expr],
        pins: &[(Arc<dyn StorageEndpoint>, u64)],
        whole: &(dyn Fn(&[&str]) -> bool + Sync),
    ) -> Result<Self, JobError> {
        if pins.len() > MAX_HOLDERS {
            return Err(JobError::InvalidOptions(format!(
                "dataset {table} is spread over {} nodes; a job reads at most {MAX_HOLDERS}",
                pins.len()
            )));
        }
        let key = schema
            .index_of(KEY)
            .map_err(|_| JobError::NotAPipeline(format!("dataset {table} has no {KEY} column")))?;
        let out = Arc::new(Schema::new(vec![schema.field(key).clone(), slot_field()]));
        let mut listed: Vec<(u8, Vec<RecordBatch>)> = Vec::with_capacity(pins.len());
        let mut lost: Vec<JobError> = Vec::new();
        for (n, (endpoint, version)) in pins.iter().enumerate() {
            let scan = DatasetScanExec::new(
                table.to_string(),
                Some(vec![key, schema.fields().len()]),
                filters.to_vec(),
                None,
                Arc::clone(&out),
            )
            .with_take(Some(Take::index(*version)));
            let udfs = UdfEnv::new(Default::default());
            let batches: Result<Vec<RecordBatch>, JobError> = async {
                crate::on_node::run_fragment(endpoint, table, Arc::new(scan), udfs)
                    .await
                    .map_err(JobError::link)?
                    .try_collect()
                    .await
                    .map_err(|e| JobError::running(&e))
            }
            .await;
            match batches {
                Ok(batches) => listed.push((n as u8, batches)),
                Err(e @ JobError::Unavailable { .. }) => lost.push(e),
                Err(e) => return Err(e),
            }
        }
        if let Some(first) = lost.into_iter().next() {
            let names: Vec<&str> = listed
                .iter()
                .map(|(n, _)| pins[usize::from(*n)].0.name())
                .collect();
            if !whole(&names) {
                return Err(first);
            }
            tracing::warn!("{first}; its samples are listed from their other holders");
        }
        let mut all: Vec<(&str, u8, u32)> = Vec::new();
        for (node, batches) in &listed {
            for b in batches {
                let keys = b.column(0);
                if keys.data_type() != &DataType::Utf8 {
                    return Err(JobError::Internal(format!(
                        "the keys of {table} are {}, not Utf8",
                        keys.data_type()
                    )));
                }
                let keys = keys.as_string::<i32>();
                let rows = b.column(1).as_primitive::<UInt32Type>();
                for i in 0..b.num_rows() {
                    all.push((keys.value(i), *node, rows.value(i)));
                }
            }
        }
        all.sort_unstable_by(|a, b| a.0.cmp(b.0).then(a.1.cmp(&b.1)));
        let mut index = Self {
            pins: pins
                .iter()
                .map(|(e, v)| Pin {
                    node: e.name().to_string(),
                    version: *v,
                })
                .collect(),
            endpoints: pins.iter().map(|(e, _)| endpoint_id(e)).collect(),
            pin_parts: vec![0; pins.len()],
            bases: vec![0],
            nodes: Vec::with_capacity(all.len()),
            rows: Vec::with_capacity(all.len()),
            more: Vec::new(),
            others: Vec::new(),
        };
        for run in all.chunk_by(|a, b| a.0 == b.0) {
            index.push(run[0].1, run[0].2, run[1..].iter().map(|s| (s.1, s.2)));
        }
        index.seal();
        Ok(index)
    }

    /// Appends a sample held first by pin `node` at `row`, and by `others`.
    fn push(&mut self, node: u8, row: u32, others: impl Iterator<Item = (u8, u32)>) {
        let sample = self.nodes.len();
        self.nodes.push(node);
        self.rows.push(row);
        let before = self.others.len();
        self.others.extend(others);
        if self.others.len() > before && self.more.is_empty() {
            // The first replicated sample: every earlier one had none.
            self.more = vec![0; sample + 1];
        }
        if !self.more.is_empty() {
            self.more.push(self.others.len() as u32);
        }
    }

    /// Ends the offsets: `more` has one per sample and one past the last.
    fn seal(&mut self) {
        if !self.more.is_empty() {
            self.more
                .resize(self.nodes.len() + 1, self.others.len() as u32);
        }
    }

    /// A mixture's index: `parts`' samples one after another (part `j`'s
    /// sample `s` is `bases()[j] + s`), each part's rows taken at its own
    /// pins.
    pub fn concat(parts: Vec<SampleIndex>) -> Result<Self, JobError> {
        let pins: usize = parts.iter().map(|p| p.pins.len()).sum();
        if pins > MAX_HOLDERS {
            return Err(JobError::InvalidOptions(format!(
                "a mixture's parts are spread over {pins} (part, node) pairs; a job reads at \
                 most {MAX_HOLDERS}"
            )));
        }
        let mut out = Self {
            pins: Vec::new(),
            endpoints: Vec::new(),
            pin_parts: Vec::new(),
            bases: Vec::new(),
            nodes: Vec::new(),
            rows: Vec::new(),
            more: Vec::new(),
            others: Vec::new(),
        };
        for (j, p) in parts.into_iter().enumerate() {
            let first = out.pins.len() as u8;
            out.bases.push(out.rows.len() as u64);
            out.pin_parts
                .extend(std::iter::repeat_n(j as u8, p.pins.len()));
            for s in 0..p.nodes.len() {
                let others = p.others_of(s).iter().map(|&(n, r)| (n + first, r));
                out.push(p.nodes[s] + first, p.rows[s], others);
            }
            out.pins.extend(p.pins);
            out.endpoints.extend(p.endpoints);
        }
        out.seal();
        Ok(out)
    }

    /// Each part's first sample (one part, at 0, unless a mixture).
    pub fn bases(&self) -> &[u64] {
        &self.bases
    }

    /// Samples of each part.
    pub fn part_sizes(&self) -> Vec<u64> {
        let mut ends: Vec<u64> = self.bases[1..].to_vec();
        ends.push(self.rows.len() as u64);
        self.bases.iter().zip(ends).map(|(b, e)| e - b).collect()
    }

    /// Samples in the job's dataset.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether it has none.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The versions pinned.
    pub fn pins(&self) -> &[Pin] {
        &self.pins
    }

    /// Samples held by more than one node (replicas).
    pub fn replicated(&self) -> usize {
        match self.more.is_empty() {
            true => 0,
            false => self.more.windows(2).filter(|w| w[1] > w[0]).count(),
        }
    }

    /// Sample `s`'s holders after the first.
    fn others_of(&self, s: usize) -> &[(u8, u32)] {
        match self.more.get(s..s + 2) {
            Some(&[a, b]) => &self.others[a as usize..b as usize],
            _ => &[],
        }
    }

    /// Every holder of sample `s`: its pin and its row id there, the
    /// first holder first.
    pub fn holders(&self, s: u64) -> impl Iterator<Item = (u8, u32)> + '_ {
        let i = s as usize;
        std::iter::once((self.nodes[i], self.rows[i])).chain(self.others_of(i).iter().copied())
    }

    /// Whether each pin holds a sample of the index: `false` for a node
    /// left out of the listing because it did not answer.
    pub fn listed(&self) -> Vec<bool> {
        let mut out = vec![false; self.pins.len()];
        for &n in &self.nodes {
            out[usize::from(n)] = true;
        }
        for &(n, _) in &self.others {
            out[usize::from(n)] = true;
        }
        out
    }

    /// The pins whose node is named `node`.
    pub fn pins_of(&self, node: &str) -> Avoid {
        let mut out = Avoid::default();
        for (i, p) in self.pins.iter().enumerate() {
            if p.node == node {
                out.insert(i as u8);
            }
        }
        out
    }

    /// Whether any of `samples` is held by a pin in `pins`.
    pub fn touches(&self, samples: &[u64], pins: &Avoid) -> bool {
        samples.iter().any(|&s| {
            let s = s as usize;
            pins.contains(self.nodes[s]) || self.others_of(s).iter().any(|o| pins.contains(o.0))
        })
    }

    /// Where sample `s` is: its node's name, version and row id.
    pub fn locate(&self, s: u64) -> Option<(&str, u64, u32)> {
        let i = usize::try_from(s).ok()?;
        let pin = &self.pins[*self.nodes.get(i)? as usize];
        Some((&pin.node, pin.version, self.rows[i]))
    }

    /// Each of `samples`' place, as one number: its node (of the pins) and
    /// its row id there (the key of its row in the output cache).
    pub fn keys(&self, samples: &[u64]) -> Vec<u64> {
        samples
            .iter()
            .map(|&s| (u64::from(self.nodes[s as usize]) << 32) | u64::from(self.rows[s as usize]))
            .collect()
    }

    /// The rows each node reads for `samples` (indices into the sorted
    /// samples), slot `i` being `samples[i]`'s: of each part, in order.
    /// Each sample is read from one of its holders not in `avoid` (see
    /// the module docs); samples with none are an [`Unheld`].
    pub fn takes(&self, samples: &[u64], avoid: &Avoid) -> Result<Vec<Takes>, Unheld> {
        let mut per: HashMap<u8, (Vec<u32>, Vec<u32>)> = HashMap::new();
        let mut unheld: Vec<usize> = Vec::new();
        let mut live: Vec<(u8, u32)> = Vec::new();
        for (slot, &s) in samples.iter().enumerate() {
            let i = s as usize;
            live.clear();
            live.extend(
                std::iter::once((self.nodes[i], self.rows[i]))
                    .chain(self.others_of(i).iter().copied())
                    .filter(|(n, _)| !avoid.contains(*n)),
            );
            let Some(&(node, row)) = live.get(spread(s, live.len())) else {
                unheld.push(i);
                continue;
            };
            let e = per.entry(node).or_default();
            e.0.push(row);
            e.1.push(slot as u32);
        }
        if !unheld.is_empty() {
            let mut nodes: Vec<String> = unheld
                .iter()
                .flat_map(|&i| {
                    std::iter::once(self.nodes[i])
                        .chain(self.others_of(i).iter().map(|o| o.0))
                        .map(|n| self.pins[usize::from(n)].node.clone())
                })
                .collect();
            nodes.sort_unstable();
            nodes.dedup();
            return Err(Unheld {
                samples: unheld.len(),
                nodes,
            });
        }
        let mut parts: Vec<HashMap<usize, Take>> = vec![HashMap::new(); self.bases.len()];
        for (node, (rows, slots)) in per {
            let pin = &self.pins[node as usize];
            let take = Take {
                version: pin.version,
                rows: Some(Arc::from(rows)),
                slots: Arc::from(slots),
            };
            parts[usize::from(self.pin_parts[node as usize])]
                .insert(self.endpoints[node as usize], take);
        }
        Ok(parts.into_iter().map(Arc::new).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Samples 0..n of two pins: sample `s` first on pin `s % 2`, and on
    /// the other pin too when `replicated`; row ids `s` and `100 + s`.
    fn index(n: u32, replicated: bool) -> SampleIndex {
        let mut out = SampleIndex {
            pins: ["a", "b"]
                .map(|node| Pin {
                    node: node.into(),
                    version: 1,
                })
                .to_vec(),
            endpoints: vec![10, 11],
            pin_parts: vec![0, 0],
            bases: vec![0],
            nodes: Vec::new(),
            rows: Vec::new(),
            more: Vec::new(),
            others: Vec::new(),
        };
        for s in 0..n {
            let first = (s % 2) as u8;
            let others = replicated.then_some((1 - first, 100 + s));
            out.push(first, s, others.into_iter());
        }
        out.seal();
        out
    }

    fn read_from(takes: &[Takes], endpoint: usize) -> Vec<u32> {
        takes[0]
            .get(&endpoint)
            .map_or_else(Vec::new, |t| t.rows.as_deref().unwrap_or_default().to_vec())
    }

    #[test]
    fn replicated_samples_spread_over_their_holders_and_fail_over_to_the_one_left() {
        let idx = index(8, true);
        assert_eq!((idx.len(), idx.replicated()), (8, 8));
        let all: Vec<u64> = (0..8).collect();
        let takes = idx.takes(&all, &Avoid::default()).unwrap();
        let (a, b) = (read_from(&takes, 10), read_from(&takes, 11));
        assert_eq!(a.len() + b.len(), 8);
        // Each holder's row ids: a holds s at s (even) or 100 + s (odd).
        assert!(a.iter().all(|&r| (r < 100) == (r % 2 == 0)), "{a:?}");
        // Over many samples the reads split evenly.
        let many = index(10_000, true);
        let all_many: Vec<u64> = (0..10_000).collect();
        let t = many.takes(&all_many, &Avoid::default()).unwrap();
        let on_a = read_from(&t, 10).len();
        assert!((4_800..=5_200).contains(&on_a), "{on_a} of 10000 on a");
        // Node a lost: every sample from b, in slot order.
        let lost_a = idx.pins_of("a");
        assert!(idx.touches(&all, &lost_a));
        let takes = idx.takes(&all, &lost_a).unwrap();
        assert!(read_from(&takes, 10).is_empty());
        assert_eq!(read_from(&takes, 11), [100, 1, 102, 3, 104, 5, 106, 7]);
        assert_eq!(&*takes[0][&11].slots, &[0, 1, 2, 3, 4, 5, 6, 7]);
        // Both lost: the samples are named unheld, with their nodes.
        let mut both = lost_a;
        both.extend(&idx.pins_of("b"));
        let u = idx.takes(&all, &both).unwrap_err();
        assert_eq!((u.samples, u.nodes), (8, vec!["a".into(), "b".into()]));
        // The cache's keys stay the first holder's, whoever reads.
        assert_eq!(idx.keys(&[3]), [(1 << 32) | 3]);
    }

    #[test]
    fn without_replicas_a_lost_node_leaves_its_samples_unheld() {
        let idx = index(6, false);
        assert_eq!(idx.replicated(), 0);
        assert!(idx.more.is_empty(), "no offsets without replicas");
        let u = idx.takes(&[0, 1, 2, 3], &idx.pins_of("b")).unwrap_err();
        assert_eq!((u.samples, u.nodes), (2, vec!["b".to_string()]));
        // A window of a's samples only is untouched by b.
        assert!(!idx.touches(&[0, 2, 4], &idx.pins_of("b")));
    }

    #[test]
    fn a_mixture_keeps_every_parts_holders() {
        let joined = SampleIndex::concat(vec![index(3, false), index(4, true)]).unwrap();
        assert_eq!((joined.len(), joined.replicated()), (7, 4));
        assert_eq!(joined.bases(), [0, 3]);
        // Part 1's pins are 2 and 3 ("a" and "b" again): losing "a"
        // leaves part 0's samples 0 and 2 unheld, part 1's all served.
        let lost = joined.pins_of("a");
        let u = joined.takes(&[0, 1, 2], &lost).unwrap_err();
        assert_eq!(u.samples, 2);
        let takes = joined.takes(&[3, 4, 5, 6], &lost).unwrap();
        assert!(takes[0].is_empty());
        assert_eq!(takes[1][&11].rows.as_deref().unwrap(), [100, 1, 102, 3]);
        assert_eq!(&*takes[1][&11].slots, &[0, 1, 2, 3]);
    }
}
