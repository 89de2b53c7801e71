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

mod reads;
mod schema;
mod source;
mod table;
mod take;

pub use reads::{ReadPlan, Run, plan_reads};
pub use schema::{DatasetSchema, parse_table};
pub use source::{ExtentSource, SHARED_OBJECT, ScanColumns, ScanOptions};
pub use table::{DatasetTable, DatasetVersion};
pub use take::{INDEXES_KEPT, IndexCache, TakePart, VersionIndex};
