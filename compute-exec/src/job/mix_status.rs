//! What a job's status says of its mixture ([`MixStatus`]): the rule,
//! the epoch's length, and each part's weight, samples and the share of
//! the latest epoch's delivered positions it has taken (counted by
//! `crate::job::run`'s `mix_shares`).

use serde::{Deserialize, Serialize};

use super::mix::MixEpoch;

/// A mixture as it runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MixStatus {
    /// What ends its epochs.
    #[schema(value_type = Object)]
    pub rule: MixEpoch,
    /// Positions in each epoch.
    pub epoch_samples: u64,
    /// The epoch the realised shares are of: the latest one read.
    pub epoch: u64,
    /// Its parts, in order.
    pub parts: Vec<MixPartStatus>,
}

/// A mixture's part as it runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MixPartStatus {
    /// Its name (its rows' `source`).
    pub name: String,
    /// Its weight.
    pub weight: f64,
    /// Its samples.
    pub samples: u64,
    /// Positions of `epoch` delivered from it.
    pub delivered: u64,
    /// Its share of `epoch`'s delivered positions (0 before any).
    pub share: f64,
}
