//! [`MemoryBudget`]: the memory every query and job of a process shares.
//!
//! A query's limit (`--query-memory`) bounds one query; it does not bound
//! the process. Ten queries under their limits, or one expression that
//! allocates outside any pool (`repeat('x', 1e9)`, constant-folded at
//! planning, copied by each rewrite), took a server past 4 GB. So one
//! DataFusion [`MemoryPool`] is made per process, of `--memory-limit`
//! bytes (default: half the memory available at start), and:
//!
//! - every query and every stream of a job runs in a [`QueryPool`]: its
//!   own limit, inside the process's pool. Operators that account their
//!   memory (sorts, aggregates such as `array_agg` and `string_agg`,
//!   joins) spill or fail with `ResourcesExhausted` when either is full,
//!   naming the largest consumers ([`TrackConsumersPool`]);
//! - the functions whose output a literal can blow up
//!   ([`crate::bounded`]: `repeat`, `range`, `lpad` …, and `||`) reserve
//!   what their batch's output will take, [`COPIES`] times over, before
//!   they allocate, for as long as they run: a call that does not fit what
//!   is left of the budget is refused by name. Their output then leaves
//!   the pool's view (it becomes an Arrow array like any other), so the
//!   reservation bounds how much such work runs at once, and the copies
//!   counted cover what the planner's constant folding and the encoders
//!   make of it.
//!
//! One query over the budget fails with an error that says so; the
//! process and its other streams go on.

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::{
    GreedyMemoryPool, MemoryConsumer, MemoryLimit, MemoryPool, MemoryReservation,
    TrackConsumersPool,
};

/// How many times a bounded function's output is counted against the
/// budget (the value, a constant-folded copy, an encoded copy).
pub const COPIES: u64 = 3;

/// See the module docs.
#[derive(Debug)]
pub struct MemoryBudget {
    pool: OnceLock<Arc<dyn MemoryPool>>,
}

static GLOBAL: MemoryBudget = MemoryBudget {
    pool: OnceLock::new(),
};

impl MemoryBudget {
    /// The process's budget.
    pub fn global() -> &'static Self {
        &GLOBAL
    }

    /// Sizes the budget to `bytes` (once, at start; later calls keep the
    /// first). Returns the size in force.
    pub fn configure(&self, bytes: u64) -> usize {
        let pool = self.pool.get_or_init(|| new_pool(bytes));
        limit_of(pool.as_ref())
    }

    /// The default size: half the memory available now (1 GiB where that
    /// cannot be read).
    pub fn default_size() -> u64 {
        match crate::lru::available_memory() {
            0 => 1 << 30,
            available => available / 2,
        }
    }

    /// The process's pool (sized by default if never configured).
    pub fn pool(&self) -> Arc<dyn MemoryPool> {
        Arc::clone(self.pool.get_or_init(|| new_pool(Self::default_size())))
    }

    /// Bytes the budget holds in all.
    pub fn size(&self) -> usize {
        limit_of(self.pool().as_ref())
    }

    /// Bytes reserved now.
    pub fn reserved(&self) -> usize {
        self.pool().reserved()
    }

    /// Reserves `bytes` for `what` (a function's output, say) until the
    /// reservation is dropped; an error naming `what` and the budget when
    /// they do not fit.
    pub fn reserve(&self, what: &str, bytes: u64) -> Result<MemoryReservation> {
        let pool = self.pool();
        let r = MemoryConsumer::new(what).register(&pool);
        let size = self.size();
        r.try_grow(usize::try_from(bytes).unwrap_or(usize::MAX))
            .map_err(|_| {
                DataFusionError::ResourcesExhausted(format!(
                    "{what}: {bytes} bytes do not fit in what is left of the process's \
                     memory budget ({} of {size} bytes reserved; --memory-limit)",
                    pool.reserved()
                ))
            })?;
        Ok(r)
    }
}

fn new_pool(bytes: u64) -> Arc<dyn MemoryPool> {
    let bytes = usize::try_from(bytes.max(64 << 20)).unwrap_or(usize::MAX);
    let top = NonZeroUsize::new(3).unwrap_or(NonZeroUsize::MIN);
    Arc::new(TrackConsumersPool::new(GreedyMemoryPool::new(bytes), top))
}

fn limit_of(pool: &dyn MemoryPool) -> usize {
    match pool.memory_limit() {
        MemoryLimit::Finite(n) => n,
        MemoryLimit::Infinite | MemoryLimit::Unknown => usize::MAX,
    }
}

/// One query's pool: its own limit, inside the process's budget (see the
/// module docs). Every reservation is made in both.
#[derive(Debug)]
pub struct QueryPool {
    limit: usize,
    used: AtomicUsize,
    shared: Arc<dyn MemoryPool>,
}

impl QueryPool {
    /// A pool of `limit` bytes inside `shared`.
    pub fn new(limit: usize, shared: Arc<dyn MemoryPool>) -> Self {
        Self {
            limit,
            used: AtomicUsize::new(0),
            shared,
        }
    }
}

impl std::fmt::Display for QueryPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "query pool (used: {}, limit: {}) in {}",
            self.used.load(Ordering::Relaxed),
            self.limit,
            self.shared
        )
    }
}

impl MemoryPool for QueryPool {
    fn name(&self) -> &str {
        "query pool"
    }

    fn register(&self, consumer: &MemoryConsumer) {
        self.shared.register(consumer);
    }

    fn unregister(&self, consumer: &MemoryConsumer) {
        self.shared.unregister(consumer);
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.used.fetch_add(additional, Ordering::Relaxed);
        self.shared.grow(reservation, additional);
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.used.fetch_sub(shrink, Ordering::Relaxed);
        self.shared.shrink(reservation, shrink);
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> Result<()> {
        let limit = self.limit;
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(additional).filter(|&n| n <= limit)
            })
            .map_err(|used| {
                DataFusionError::ResourcesExhausted(format!(
                    "{}: {additional} more bytes would take the query past its limit of \
                     {limit} bytes ({used} in use; --query-memory)",
                    reservation.consumer().name()
                ))
            })?;
        if let Err(e) = self.shared.try_grow(reservation, additional) {
            self.used.fetch_sub(additional, Ordering::Relaxed);
            return Err(DataFusionError::ResourcesExhausted(format!(
                "the process's memory budget is full (--memory-limit): {e}"
            )));
        }
        Ok(())
    }

    fn reserved(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn memory_limit(&self) -> MemoryLimit {
        MemoryLimit::Finite(self.limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_is_held_by_its_limit_and_by_the_budget() {
        let shared = new_pool(100 << 20);
        let a: Arc<dyn MemoryPool> = Arc::new(QueryPool::new(80 << 20, Arc::clone(&shared)));
        let b: Arc<dyn MemoryPool> = Arc::new(QueryPool::new(80 << 20, Arc::clone(&shared)));
        let ra = MemoryConsumer::new("sort a").register(&a);
        ra.try_grow(70 << 20).unwrap();
        let e = ra.try_grow(20 << 20).unwrap_err().to_string();
        assert!(e.contains("its limit"), "{e}");
        let rb = MemoryConsumer::new("sort b").register(&b);
        let e = rb.try_grow(40 << 20).unwrap_err().to_string();
        assert!(e.contains("memory budget"), "{e}");
        assert_eq!(b.reserved(), 0, "a refused grow takes nothing");
        rb.try_grow(30 << 20).unwrap();
        assert_eq!(shared.reserved(), 100 << 20);
        drop(ra);
        assert_eq!(shared.reserved(), 30 << 20);
        assert_eq!(a.reserved(), 0);
    }

    #[test]
    fn a_reservation_that_does_not_fit_names_what_asked() {
        let budget = MemoryBudget {
            pool: OnceLock::new(),
        };
        assert_eq!(budget.configure(100 << 20), 100 << 20);
        assert_eq!(budget.configure(1 << 40), 100 << 20, "the first size holds");
        let held = budget.reserve("repeat", 60 << 20).unwrap();
        let e = budget.reserve("lpad", 60 << 20).unwrap_err().to_string();
        assert!(e.contains("lpad") && e.contains("memory budget"), "{e}");
        drop(held);
        assert!(budget.reserve("lpad", 60 << 20).is_ok());
    }
}
