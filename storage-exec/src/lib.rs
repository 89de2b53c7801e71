//! # sluice-storage: the storage side of sluice
//!
//! Owns everything between a block device and an Arrow record batch:
//!
//! ```text
//!   sluice ingest ──► ingest ──► ExtentWriter ──► Device (uring │ file)
//!                        │                           ▲
//!                        ▼                           │ read_at(AlignedBuf)
//!              metadata (Parquet) + catalog (redb)   │
//!                        │                           │
//!   SQL ──► DatasetSchema ─► DatasetTable ─► ExtentSource ─► RecordBatch { …, data: Binary }
//!                                                      (values buffer = read buffer)
//! ```
//!
//! - [`device`]: the [`Device`](device::Device) trait, its io_uring and file
//!   backends and their conformance suite;
//! - [`buffer`]: aligned pooled buffers that become Arrow buffers without a copy;
//! - [`alloc`], [`catalog`], [`metadata`], [`layout`], [`store`]: the extent store;
//! - [`space`]: the free chunks every writer allocates from;
//! - [`cache`]: the node-wide cache of raw objects every scan reads
//!   through (later epochs of a dataset that fits come from memory);
//! - [`ingest`]: atomic ingest of directories, manifests, shards and
//!   object stores (`s3://`, `gs://`, `az://`, `http(s)://`);
//! - [`checkpoint`]: named, versioned checkpoints on the same device, and
//!   the Flight protocol trainers write and read them with;
//! - [`scan`]: the table provider and the zero-copy `ExtentSource`.
//!
//! - [`stats`]: a dataset's statistics for the planner;
//! - [`node`]: the storage node, which binds storage fragments to local
//!   scans and runs them on its own cores; `node_endpoint`: the same node
//!   as the compute side of its own process reaches it;
//! - [`engine`]: the node as a worker of the distributed engine, where
//!   every fragment from another host runs (a query's, a job stream's
//!   windows, a move's or a repair's read); [`flight_service`]: its
//!   control plane over Arrow Flight (datasets, node info, calibration,
//!   ingest, copies, scrubs);
//! - [`node_feed`]: a job stream's fragment bound once and run for each of
//!   its windows (in this process, or as an engine task);
//! - `error`: the storage crate's error type;
//! - `resume_tables`: the catalog's tables of what failed ingests kept for
//!   their re-runs;
//! - [`scrub`]: scrub and repair: a node reads back its objects against the
//!   checksums recorded at ingest;
//! - `session`: a DataFusion session whose tables are a store's datasets and
//!   whose functions include sluice's UDFs.
//!
//! This crate does not decide what runs where (that is `sluice-planner`);
//! it runs the fragments it is sent.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use sluice_storage::{ingest, IngestOptions, IngestSource, Store, StoreOptions};
//!
//! let store = Store::open(&StoreOptions::new("./sluice-data"))?;
//! ingest(&store, "pets", IngestSource::Directory("./pets".into()), IngestOptions::default()).await?;
//! let ctx = sluice_storage::session_context(Arc::clone(&store));
//! ctx.sql("SELECT label, count(*) FROM pets GROUP BY label").await?.show().await?;
//! # Ok(()) }
//! ```

pub mod alloc;
pub mod buffer;
pub mod cache;
pub mod catalog;
pub mod checkpoint;
pub mod device;
pub mod engine;
mod error;
pub mod flight_service;
pub mod ingest;
pub mod layout;
pub mod metadata;
pub mod node;
mod node_endpoint;
pub mod node_feed;
mod resume_tables;
pub mod scan;
pub mod scrub;
mod session;
pub mod space;
pub mod stats;
pub mod store;

pub use error::{Result, StorageError};
pub use flight_service::StorageFlightService;
pub use ingest::{IngestOptions, IngestReport, IngestSource, NodeShare, OnError, ingest};
pub use node::StorageNode;
pub use session::{session_context, session_context_with};
pub use store::{GcReport, OrphanReport, Store, StoreOptions};
