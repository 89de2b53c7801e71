//! How sluice spawns work: every task says who owns it.
//!
//! A bare `tokio::spawn` hands back a handle whose drop leaves the task
//! running, so a reader that went away would leave its windows decoding
//! for nobody. `clippy.toml` refuses it everywhere; work starts through one
//! of these three, chosen for what the work is:
//!
//! - [`SpawnedTask`] (DataFusion's): **owned** by its handle, aborted when
//!   the handle drops. The default: a window being fetched, a stream's
//!   reader, a benchmark's workers.
//! - [`to_end`]: **runs to its end** even if its handle drops, and the
//!   handle still says how it ended. For work that must not stop in the
//!   middle once started: a device write whose buffer the kernel holds, a
//!   read that other scans wait on through the cache.
//! - [`detach`]: **owns itself**; nothing waits for it. For loops that end
//!   by themselves (their `Weak` is gone, their connection closed, their
//!   process stopping): a reaper, a heartbeat, a connection's driver.
//!
//! Work meant for another runtime (a node's CPU pool, an
//! [`Executor`](crate::Executor)'s, or a job's) goes through [`to_end_on`]
//! and [`detach_on`], the same two kinds on that runtime's handle;
//! `Handle::spawn` is refused beside `tokio::spawn`.

use std::future::Future;

pub use datafusion_common_runtime::SpawnedTask;
use tokio::task::JoinHandle;

/// Spawns `work` on the current runtime; it runs to its end whether or
/// not the handle is kept (see the module docs).
pub fn to_end<F>(work: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    #[expect(
        clippy::disallowed_methods,
        reason = "the one place work that must finish is spawned"
    )]
    tokio::spawn(work)
}

/// Spawns `work` on the current runtime, owned by nothing: it must end by
/// itself (see the module docs).
pub fn detach<F>(work: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    #[expect(
        clippy::disallowed_methods,
        reason = "the one place self-owning work is spawned"
    )]
    drop(tokio::spawn(work));
}

/// [`to_end`] on the runtime of `handle`.
pub fn to_end_on<F>(handle: &tokio::runtime::Handle, work: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    #[expect(
        clippy::disallowed_methods,
        reason = "the one place work that must finish is spawned on another runtime"
    )]
    handle.spawn(work)
}

/// [`detach`] on the runtime of `handle`.
pub fn detach_on<F>(handle: &tokio::runtime::Handle, work: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    #[expect(
        clippy::disallowed_methods,
        reason = "the one place self-owning work is spawned on another runtime"
    )]
    drop(handle.spawn(work));
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use super::*;

    async fn flag_after(flag: Arc<AtomicBool>) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        flag.store(true, Ordering::SeqCst);
    }

    #[tokio::test]
    async fn an_owned_task_stops_with_its_handle_the_others_run_on() {
        let (owned, finished, detached) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        drop(SpawnedTask::spawn(flag_after(Arc::clone(&owned))));
        drop(to_end(flag_after(Arc::clone(&finished))));
        detach(flag_after(Arc::clone(&detached)));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!owned.load(Ordering::SeqCst), "aborted when dropped");
        assert!(finished.load(Ordering::SeqCst), "ran to its end");
        assert!(detached.load(Ordering::SeqCst), "ran, owned by nothing");
    }

    #[tokio::test]
    async fn work_on_another_runtime_runs_there() {
        let other = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("sluice-test-other")
            .enable_time()
            .build()
            .unwrap();
        let name = || std::thread::current().name().map(str::to_string);
        assert_eq!(
            to_end_on(other.handle(), async move { name() })
                .await
                .unwrap()
                .as_deref(),
            Some("sluice-test-other")
        );
        let flag = Arc::new(AtomicBool::new(false));
        detach_on(other.handle(), flag_after(Arc::clone(&flag)));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(flag.load(Ordering::SeqCst));
        other.shutdown_background();
    }

    #[tokio::test]
    async fn a_kept_handle_says_how_the_work_ended() {
        assert_eq!(to_end(async { 7 }).await.unwrap(), 7);
        assert_eq!(SpawnedTask::spawn(async { 8 }).join().await.unwrap(), 8);
    }
}
