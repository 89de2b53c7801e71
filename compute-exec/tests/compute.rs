//! The compute side's integration tests over real in-process storage
//! nodes, linked as one test binary (one link and one copy of DataFusion
//! on disk instead of four; `autotests = false`).

mod common;

mod engine;
mod jobs;
mod moves;
mod sharded_ingest;
