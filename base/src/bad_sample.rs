//! [`BadSample`]: a sample a stage refused (a corrupt image, a truncated
//! video, a decoder that panicked or overran), by the stage's name, the
//! sample's key and the reason.
//!
//! Under the `skip` and `null` policies it is recorded and the batch goes
//! on; under `fail` it is the batch's error, and every service answers it
//! as the `bad_sample` kind ([`crate::fault`]), naming the sample. It lives
//! here, beside the rest of the error vocabulary, so that the crates that
//! report bad samples and the ones that answer them share one type.

use datafusion_common::DataFusionError;
use serde::{Deserialize, Serialize};

/// A sample that was skipped or nulled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BadSample {
    /// The UDF that refused it.
    pub udf: String,
    /// The sample key (or `row N` when no key was in scope).
    pub key: String,
    /// Why.
    pub reason: String,
}

impl std::fmt::Display for BadSample {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: sample '{}': {}", self.udf, self.key, self.reason)
    }
}

/// A bad sample is the error of a batch under the `fail` policy.
impl std::error::Error for BadSample {}

impl BadSample {
    /// The error that fails a batch on this sample (under `fail`): the
    /// services answer it as `bad_sample`, naming the sample.
    pub fn into_error(self) -> DataFusionError {
        DataFusionError::External(Box::new(self))
    }
}
