//! [`Delivery`]: a job's last stage, run as its batches are written out,
//! costed on the compute side of every candidate cut.
//!
//! A job defers an output's last elementwise stage (normalize) out of its
//! window plan: the windows make that stage's input, and the stage runs as
//! each batch is written into the trainer's slot (see compute-exec's
//! `job::finish`). The window plan's pipeline is then the query's less its
//! last level, and planned alone it would cost that stage nowhere, and
//! find no calibration (calibrations are kept under the query's pipeline).
//! [`Planner::deferring`](crate::Planner::deferring) derives both from the
//! query:
//!
//! ```text
//!  query:   read ─ decode_rrc ─ flip ─ normalize      calibrated: cuts 0..=3
//!  window:  read ─ decode_rrc ─ flip                  cuts 0..=2 of the query's
//!  delivery:                           normalize      level 3's cost, paid by
//!                                                     every cut's compute side
//! ```

use serde::{Deserialize, Serialize};

/// The stages a job runs at delivery, and their compute CPU per sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Delivery {
    /// The UDFs of the deferred level.
    pub stages: Vec<String>,
    /// The cost model's CPU per sample, ns.
    pub estimated_ns: f64,
    /// Measured on the dataset's own objects (the query's calibration),
    /// ns; `None` where the query was not calibrated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibrated_ns: Option<f64>,
}

impl Delivery {
    /// What the planner charges per sample: the measured cost where there
    /// is one.
    pub fn ns(&self) -> f64 {
        self.calibrated_ns.unwrap_or(self.estimated_ns)
    }
}
