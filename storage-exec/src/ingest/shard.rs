//! [`Shard`]: one of N storage nodes' part of a source.
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

use std::fmt;
use std::str::FromStr;

/// Part `index` of `count` (`0 <= index < count`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// Which part, from 0.
    pub index: u32,
    /// How many parts.
    pub count: u32,
}

impl FromStr for Shard {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let bad = || format!("bad shard {s:?}: expected I/N with 0 <= I < N, e.g. 0/2");
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let index: u32 = i.trim().parse().map_err(|_| bad())?;
        let count: u32 = n.trim().parse().map_err(|_| bad())?;
        if count == 0 || index >= count {
            return Err(bad());
        }
        Ok(Self { index, count })
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl Shard {
    /// Whether the sample at `position` of the enumeration is this part's.
    pub fn keeps(&self, position: usize) -> bool {
        position % self.count as usize == self.index as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_parse_and_refuse_nonsense() {
        assert_eq!(
            "1/3".parse::<Shard>().unwrap(),
            Shard { index: 1, count: 3 }
        );
        for bad in ["3/3", "0/0", "1", "a/2", "-1/2", "1/2/3"] {
            let e = bad.parse::<Shard>().unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
    }

    #[test]
    fn the_parts_are_disjoint_and_whole() {
        let n = 3;
        let mut seen = vec![0; 10];
        for index in 0..n {
            let s = Shard { index, count: n };
            for (p, hits) in seen.iter_mut().enumerate() {
                if s.keeps(p) {
                    *hits += 1;
                }
            }
        }
        assert!(seen.iter().all(|&h| h == 1), "{seen:?}");
    }
}
