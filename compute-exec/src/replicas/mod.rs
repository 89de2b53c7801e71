//! The replicas floor: where each sample of a dataset spread over several
//! storage nodes is, and who reads it. Above the data plane (`engine`,
//! `remote`, `on_node`, `plan_feeds`), below the queries and the jobs that
//! read through it.
//!
//! - [`ledger`]: `PartLedger`, the parts of datasets this cluster wrote, by
//!   node, and each dataset's `PartLayout` (its parts and their holders);
//! - [`index`]: `SampleIndex`, every key of a job's or a query's datasets
//!   with its row id on each holder, and the takes that read each key once;
//! - [`holders`]: a sample's holders as a window reads them: the nodes it
//!   must avoid, the samples left with none, and which holder reads;
//! - [`key_owners`]: `KeyOwners`, a query over a dataset spread over
//!   several nodes reading each key once.

pub mod holders;
pub mod index;
pub mod key_owners;
pub mod ledger;
