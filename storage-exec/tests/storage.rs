//! The storage side's integration tests, linked as one test binary (one
//! link and one copy of DataFusion on disk instead of three;
//! `autotests = false`). `spdk` compiles only with the `spdk` feature.

mod checkpoints;
mod scan;
mod spdk;
