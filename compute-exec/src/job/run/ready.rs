//! [`Ready`]: what a job holds once its samples are listed — their row
//! ids (the index), the layout of its epochs (from where a resumed job
//! begins, for its first), a mixture's parts, and the orders of the last
//! few epochs.

use std::sync::{Arc, Mutex};

use crate::job::failover::Failover;
use crate::job::mix::MixLayout;
use crate::job::order::{EpochShape, Worker};
use crate::job::pipeline::windows::Span;
use crate::job::spec::JobSpec;
use crate::job::status::ResumedEpoch;
use crate::replicas::index::SampleIndex;

/// What a running job holds: its samples' row ids and its layout.
#[derive(Debug)]
pub struct Ready {
    /// Where each sample is.
    pub index: SampleIndex,
    /// Storage nodes its windows found lost (or a replica corrupt), and
    /// the windows that ran again on other holders.
    pub failover: Failover,
    /// A whole epoch's layout.
    pub layout: EpochShape,
    /// The first epoch the job reads, and its layout: from the position
    /// it resumes at (see `crate::job::order`), or whole.
    first: (u64, EpochShape),
    /// A mixture's parts (see `crate::job::mix`).
    mix: Option<MixLayout>,
    orders: Mutex<Vec<(u64, Arc<Vec<u64>>)>>,
}

impl Ready {
    /// `spec`'s epochs over the samples of `index`.
    pub(super) fn new(spec: &JobSpec, index: SampleIndex) -> Self {
        let mix = spec.mix.as_ref().map(|parts| MixLayout {
            sizes: index.part_sizes(),
            weights: parts.iter().map(|p| p.weight).collect(),
            rule: spec.mix_epoch.unwrap_or_default(),
            shuffle: spec.shuffle,
        });
        let first = spec.first_epoch();
        let (samples, order) = match &mix {
            Some(m) => {
                let order = m.epoch_order(first);
                (order.len() as u64, Some(order))
            }
            None => (index.len() as u64, None),
        };
        let ready = Self {
            index,
            failover: Failover::default(),
            layout: spec.layout(samples, first + 1),
            first: (first, spec.layout(samples, first)),
            mix,
            orders: Mutex::new(Vec::new()),
        };
        if let Some(order) = order {
            ready.keep_order(first, Arc::new(order));
        }
        ready
    }

    /// Samples in an epoch: of a mixture, the positions its rule gives.
    pub fn epoch_len(&self) -> u64 {
        self.layout.samples
    }

    /// A mixture's parts, if it is one.
    pub fn mix(&self) -> Option<&MixLayout> {
        self.mix.as_ref()
    }

    /// The layout of `epoch` (from where it resumes, for the first).
    pub fn layout_of(&self, epoch: u64) -> EpochShape {
        if epoch == self.first.0 {
            self.first.1
        } else {
            self.layout
        }
    }

    /// Whether `span` is its rank's whole epoch, read by one reader (what
    /// the read-ahead begins and a reader may take over).
    pub fn whole_epoch(&self, span: &Span) -> bool {
        span.worker == Worker::ALL
            && span.from == 0
            && span.to == self.layout_of(span.epoch).per_rank()
    }

    /// The first epoch read (0, unless the job resumes a later one).
    pub fn first_epoch(&self) -> u64 {
        self.first.0
    }

    /// The epoch a resumed job begins in (`None`: not resumed).
    pub fn resumed(&self) -> Option<ResumedEpoch> {
        let (epoch, layout) = self.first;
        (epoch > 0 || layout.start > 0).then(|| ResumedEpoch {
            epoch,
            start: layout.start,
            samples_per_rank: layout.per_rank(),
        })
    }

    /// Positions all ranks read in the epochs `first..epochs`.
    pub fn positions(&self, epochs: u64) -> u64 {
        let (first, resumed) = self.first;
        let whole = self.layout.per_rank() * epochs.saturating_sub(first + 1);
        (resumed.per_rank() + whole) * self.layout.world_size
    }

    /// The order of `epoch` (the last few are kept).
    pub fn order(&self, epoch: u64) -> Arc<Vec<u64>> {
        let orders = self.orders.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, o)) = orders.iter().find(|(e, _)| *e == epoch) {
            return Arc::clone(o);
        }
        drop(orders);
        let o = Arc::new(match &self.mix {
            Some(m) => m.epoch_order(epoch),
            None => self.layout.epoch_order(epoch),
        });
        self.keep_order(epoch, Arc::clone(&o));
        o
    }

    fn keep_order(&self, epoch: u64, order: Arc<Vec<u64>>) {
        let mut orders = self.orders.lock().unwrap_or_else(|e| e.into_inner());
        if !orders.iter().any(|(e, _)| *e == epoch) {
            orders.push((epoch, order));
        }
        if orders.len() > 4 {
            orders.remove(0);
        }
    }
}
