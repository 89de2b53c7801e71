//! A mixture as it runs: its parts' weights and sizes, and the share of
//! the latest epoch's delivered positions each has taken — counted over
//! the positions delivered (each rank's spans mapped to the epoch's
//! global sequence), so the realised proportions are what the trainers
//! received, not what was planned.

use super::{Inner, Ready, Source};
use crate::job::coverage::RankSpans;
use crate::job::mix::MixLayout;
use crate::job::mix_status::{MixPartStatus, MixStatus};

/// The status of the mixture of `sources` (its parts) whose job's state
/// is `inner` (`None`: not a mixture, or not started).
pub(super) fn status(sources: &[Source], inner: &Inner) -> Option<MixStatus> {
    let ready = inner.ready.as_ref()?;
    let mix = ready.mix()?;
    let (epoch, delivered) = match inner.progress.latest_epoch() {
        Some((epoch, spans)) => (epoch, realised(ready, mix, epoch, &spans)),
        None => (ready.first_epoch(), vec![0; mix.sizes.len()]),
    };
    let total: u64 = delivered.iter().sum();
    let parts = sources
        .iter()
        .zip(&mix.sizes)
        .zip(delivered)
        .map(|((s, &samples), delivered)| MixPartStatus {
            name: s.name.clone(),
            weight: s.weight,
            samples,
            delivered,
            share: if total == 0 {
                0.0
            } else {
                delivered as f64 / total as f64
            },
        })
        .collect();
    Some(MixStatus {
        rule: mix.rule,
        epoch_samples: ready.epoch_len(),
        epoch,
        parts,
    })
}

/// A mixture's status as EXPLAIN shows it: its rule, then a line a part.
pub(super) fn lines(status: Option<MixStatus>) -> Vec<String> {
    let Some(m) = status else {
        return Vec::new();
    };
    let weights: f64 = m.parts.iter().map(|p| p.weight).sum();
    let rule = serde_json::to_string(&m.rule).unwrap_or_default();
    let mut lines = vec![format!(
        "{}, {} positions an epoch; shares of epoch {} delivered so far",
        rule.trim_matches('"'),
        m.epoch_samples,
        m.epoch
    )];
    lines.extend(m.parts.iter().map(|p| {
        format!(
            "{}: weight {} ({:.3} planned), {} samples, {} delivered ({:.3})",
            p.name,
            p.weight,
            p.weight / weights,
            p.samples,
            p.delivered,
            p.share
        )
    }));
    lines
}

/// Positions of `epoch` delivered from each part, over the ranks' spans.
fn realised(ready: &Ready, mix: &MixLayout, epoch: u64, spans: &[RankSpans<'_>]) -> Vec<u64> {
    let layout = ready.layout_of(epoch);
    let order = ready.order(epoch);
    let n = order.len() as u64;
    let bases = ready.index.bases();
    let mut counts = vec![0; mix.sizes.len()];
    if n == 0 {
        return counts;
    }
    let world = layout.world_size.max(1);
    for &(rank, ranges) in spans {
        for &(from, to) in ranges {
            for i in from..to {
                let id = order[((layout.start + i * world + rank) % n) as usize];
                counts[MixLayout::source_of(bases, id)] += 1;
            }
        }
    }
    counts
}
