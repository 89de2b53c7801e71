//! The storage fragment, defined once: what the planner's cut sends to
//! the nodes that hold a dataset, whatever carries it there (the
//! distributed engine for queries, sluice's feeds for a job's windows, a
//! direct call to a node in this process).
//!
//! - [`StorageFragment`]: the fragment as planned, a logical plan over one
//!   dataset (the cut's output, `crate::Placement`).
//! - [`scan`]: its leaf as the compute side plans it, [`DatasetScanExec`]
//!   (which dataset, columns, metadata filters, limit), and a job's
//!   [`Take`] of rows by row id, each with the slot it comes back in.
//! - [`leaf`]: the fragment as one leaf, [`StorageFragmentExec`]: the
//!   dataset, the node that runs it (the URL it is dialled at), what that
//!   node reads ([`NodeReads`]), the physical plan and its UDF options.
//!   On the node it runs through the session's [`FragmentRunner`] (the
//!   node itself); anywhere else executing it is an error that says so.
//! - [`report`]: what the fragment met ([`FragmentReport`]: bad samples by
//!   name, stage times, rows, bytes), in band: the leaf's output is the
//!   fragment's rows with every column nullable plus [`REPORT`], null on
//!   data rows, then **one report row** carrying the report as JSON. The
//!   accounting travels in order with the rows, whatever the transport;
//!   [`split_report`] takes it off on the receiving side, so nothing above
//!   the cut sees it.
//! - [`windows`]: a job stream's windows on one node, fed to the
//!   fragment as they are asked for ([`WindowsExec`]; each window's rows,
//!   then its report row), the leaf of a job's stage on the distributed
//!   engine and the one module of this crate that names the engine's types.
//! - [`codec`]: the wire form ([`SluiceCodec`] over datafusion-proto): the
//!   node decodes a fragment in a session of its own, where sluice's UDFs
//!   resolve and bind to the node's options and limits.

pub mod codec;
pub mod leaf;
pub mod report;
pub mod scan;
pub mod windows;

use datafusion::logical_expr::LogicalPlan;

pub use codec::{SluiceCodec, decode_fragment, encode_fragment};
pub use leaf::{
    FragmentPlan, FragmentRunner, LocalRunner, NodeReads, Reported, StorageFragmentExec,
};
pub use report::{
    FailedWith, FragmentReport, REPORT, Received, link_bytes, report_batch, reported_schema,
    split_report, with_report_column,
};
pub use scan::{DatasetScanExec, SLOT, Take, filter_pushdown, slot_field, with_take};
pub use windows::{WindowSource, WindowUnit, WindowsExec};

/// A plan storage runs: a projection over a dataset scan.
#[derive(Debug, Clone)]
pub struct StorageFragment {
    /// Its index in the placement.
    pub id: usize,
    /// The dataset it reads.
    pub dataset: String,
    /// The plan.
    pub plan: LogicalPlan,
}
