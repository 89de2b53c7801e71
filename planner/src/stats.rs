//! [`DatasetStats`]: what the planner knows about a dataset before running
//! anything — counts and sizes from the catalog, and the probed dimensions
//! of an evenly spaced sample of its objects.

use serde::{Deserialize, Serialize};
use sluice_udfs::cost::SampleStats;

/// Statistics of one dataset (on one storage node, or merged over several).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct DatasetStats {
    /// Samples in the dataset.
    pub samples: u64,
    /// Total object bytes.
    pub bytes: u64,
    /// Statistics of an evenly spaced sample of its objects (at most a few
    /// hundred), in device order: object bytes and probed width, height,
    /// channels, frames and array elements.
    pub sample: Vec<SampleStats>,
}

impl DatasetStats {
    /// Merges the statistics of the parts of a dataset held by several
    /// storage nodes: counts add up, and each part's sample is weighted by
    /// its share of the samples.
    pub fn merge(parts: &[DatasetStats]) -> DatasetStats {
        let samples: u64 = parts.iter().map(|p| p.samples).sum();
        let bytes = parts.iter().map(|p| p.bytes).sum();
        let budget = parts.iter().map(|p| p.sample.len()).max().unwrap_or(0);
        let mut sample = Vec::new();
        for p in parts {
            if p.sample.is_empty() || samples == 0 {
                continue;
            }
            let share = p.samples as f64 / samples as f64;
            let take = ((budget as f64 * share).round() as usize).clamp(1, p.sample.len());
            sample.extend((0..take).map(|i| p.sample[i * p.sample.len() / take]));
        }
        DatasetStats {
            samples,
            bytes,
            sample,
        }
    }

    /// The mean object size, from the catalog's totals.
    pub fn mean_bytes(&self) -> f64 {
        if self.samples == 0 {
            0.0
        } else {
            self.bytes as f64 / self.samples as f64
        }
    }

    /// The sample to cost with: the probed sample, or one object of the
    /// mean size when nothing was probed.
    pub fn rows(&self) -> Vec<SampleStats> {
        if self.sample.is_empty() {
            vec![SampleStats {
                bytes: self.mean_bytes(),
                ..SampleStats::default()
            }]
        } else {
            self.sample.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(samples: u64, bytes: f64, n: usize) -> DatasetStats {
        DatasetStats {
            samples,
            bytes: samples * bytes as u64,
            sample: vec![
                SampleStats {
                    bytes,
                    ..SampleStats::default()
                };
                n
            ],
        }
    }

    #[test]
    fn merge_weights_parts_by_samples() {
        let m = DatasetStats::merge(&[part(300, 10.0, 100), part(100, 1000.0, 100)]);
        assert_eq!(m.samples, 400);
        assert_eq!(m.bytes, 300 * 10 + 100 * 1000);
        let small = m.sample.iter().filter(|s| s.bytes == 10.0).count();
        let large = m.sample.iter().filter(|s| s.bytes == 1000.0).count();
        assert_eq!((small, large), (75, 25));
    }

    #[test]
    fn rows_fall_back_to_the_mean() {
        let s = DatasetStats {
            samples: 4,
            bytes: 400,
            sample: vec![],
        };
        assert_eq!(s.rows()[0].bytes, 100.0);
    }
}
