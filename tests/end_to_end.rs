//! sluice's end-to-end tests against the real `sluice` binary, linked as
//! one test binary: each of these links DataFusion, arrow and tonic, about
//! 300 MB apiece in a debug build, so one binary instead of five saves a
//! test run four links and gigabytes of disk (`autotests = false`).

mod common;

mod cli;
mod crash;
mod datadir;
mod placement;
mod udfs;
