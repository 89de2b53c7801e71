//! [`Executor`]: the named pool of threads a process computes on.
//!
//! A node's CPU work — a storage fragment's scan and decode, a job's
//! windows and their compute stages, SQL queries and their planning — runs
//! on one executor: a multi-threaded tokio runtime of one thread per core
//! the node is given, whose threads are named after it (`top -H` and
//! `perf` show them by that name). The runtime that answers REST, Flight
//! control calls and `/healthz` is another one, so those never wait behind
//! a decode, and device I/O has threads of its own (`io_uring`'s
//! completion thread, SPDK's reactor).
//!
//! Roles in one process share one executor: `sluice serve` over its own
//! data dir hands the same executor to its in-process storage node and to
//! its jobs, so the two sides the planner splits a pipeline between run on
//! the machine's cores once — as many busy threads as cores, where two
//! runtimes of one thread per core each would put twice as many on them,
//! and the kernel would time-slice decodes against each other.
//!
//! Work spawned on an executor belongs to its caller: a job's windows are
//! aborted when their stream goes (a `SpawnedTask`, see [`crate::task`]), a fragment's
//! task ends when its receiver does. What stops work never waits for one
//! of its threads: they may all be inside a UDF batch (one poll of many
//! decodes), so a cancel or a departed reader sets the UDFs' cancel flag
//! where it happens (`sluice_udfs::env::Cancel`), and the tasks that would
//! notice later only tidy up. Dropping the last handle to an
//! executor shuts its runtime down in the background (dropping a runtime
//! blocks, which a runtime's own task must not).

use std::sync::Arc;

use tokio::runtime::{Handle, Runtime};

/// Stack of each thread: planning and decoding fragments recurse over
/// expressions, and deep ones need room.
pub const STACK_BYTES: usize = 16 << 20;

/// See the module docs.
#[derive(Debug)]
pub struct Executor {
    name: String,
    threads: usize,
    runtime: Option<Runtime>,
    handle: Handle,
}

impl Executor {
    /// An executor of `threads` threads (at least one) named `name`.
    pub fn new(name: &str, threads: usize) -> std::io::Result<Arc<Self>> {
        let threads = threads.max(1);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name(name)
            .thread_stack_size(STACK_BYTES)
            .enable_all()
            .build()?;
        Ok(Arc::new(Self {
            name: name.to_owned(),
            threads,
            handle: runtime.handle().clone(),
            runtime: Some(runtime),
        }))
    }

    /// The name its threads carry.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its threads: the cores its work can use at once.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Where to spawn its work.
    pub fn handle(&self) -> &Handle {
        &self.handle
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn its_threads_carry_its_name_and_its_work_runs_there() {
        let ex = Executor::new("sluice-test-cpu", 2).unwrap();
        assert_eq!((ex.name(), ex.threads()), ("sluice-test-cpu", 2));
        let names = ex.handle().block_on(async {
            let mut names = Vec::new();
            for _ in 0..4 {
                let name =
                    crate::task::to_end(async { std::thread::current().name().map(str::to_owned) })
                        .await
                        .unwrap();
                names.push(name);
            }
            names
        });
        assert!(
            names
                .iter()
                .all(|n| n.as_deref() == Some("sluice-test-cpu")),
            "{names:?}"
        );
    }

    #[test]
    fn at_least_one_thread() {
        assert_eq!(Executor::new("sluice-test-none", 0).unwrap().threads(), 1);
    }

    #[tokio::test]
    async fn dropped_inside_another_runtime_it_does_not_block_or_panic() {
        let ex = Executor::new("sluice-test-drop", 1).unwrap();
        let pending = crate::task::to_end_on(ex.handle(), std::future::pending::<()>());
        drop(ex);
        assert!(pending.await.unwrap_err().is_cancelled());
    }
}
