//! SQL over datasets: the table provider and the zero-copy scan.
//!
//! ```text
//!  DatasetSchema (SchemaProvider)  ── "imagenet", "imagenet@3" ──►  DatasetTable (TableProvider)
//!                                                                     │ scan(projection, filters, limit)
//!                                                                     ▼
//!                                               DataSourceExec ─ ExtentSource (DataSource)
//!   per partition (a range of Parquet row groups):
//!     metadata rows ─► exact filters ─► limit ─► plan_reads (coalesce by device position)
//!       ─► device reads (bounded in flight) ─► crc32c check ─► RecordBatch { …, data: Binary }
//! ```
//!
//! The `data` column's values buffer *is* the device read buffer: the read
//! lands in a pooled aligned buffer, which becomes an Arrow buffer without a
//! copy, and the offsets come from the metadata. A query that does not
//! project `data` issues no device read at all.
//!
//! A job's scan is a *take* ([`take`]): the rows it names, by row id of the
//! version it pinned, in its order, sliced from the version's metadata
//! held in memory, through the same reads and checks.
//!
//! Modules:
//! - `options`: `ScanOptions`: how a scan reads the device;
//! - `partition`: one partition's stream: metadata read and filtered, its
//!   device reads issued and checked, output batches cut;
//! - `reads`: turning a batch of extents into device reads;
//! - `schema`: `DatasetSchema`: the catalog's datasets as DataFusion tables;
//! - `source`: `ExtentSource`: the zero-copy scan of a dataset version, as a
//!   DataFusion `DataSource` behind `DataSourceExec`;
//! - `table`: `DatasetTable`: one dataset version as a DataFusion table;
//! - `version`: `DatasetVersion`: one dataset version opened for reading.

mod options;
mod partition;
mod reads;
mod schema;
mod source;
mod table;
mod take;
mod version;

pub use options::ScanOptions;
pub use partition::SHARED_OBJECT;
pub use reads::{ReadPlan, Run, plan_reads};
pub use schema::{DatasetSchema, parse_table};
pub use source::{ExtentSource, ScanColumns};
pub use table::DatasetTable;
pub use take::{INDEXES_KEPT, IndexCache, TakePart, VersionIndex};
pub use version::DatasetVersion;
