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
//! Accounting is approximate: an accumulator reports its string's length,
//! not the capacity its doublings left, and batches are copied on their way
//! in (`string_agg` over a cast held twice what it accounted). So the pool
//! also holds the process's resident memory to the budget: a reservation
//! is refused when the process already holds the budget less what it asks
//! ([`Resident`], read from `/proc/self/statm` at most every
//! [`RESIDENT_EVERY`]). Before refusing, freed memory that the allocator
//! kept is given back to the system (`malloc_trim`), so memory a failed
//! query freed does not refuse the next one.
//!
//! One query over the budget fails with an error that says so; the
//! process and its other streams go on.

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

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
        match crate::host_memory::available() {
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
    Arc::new(BudgetPool {
        limit: bytes,
        accounted: TrackConsumersPool::new(GreedyMemoryPool::new(bytes), top),
        resident: Resident::default(),
    })
}

/// How stale a reading of the process's resident memory may be.
pub const RESIDENT_EVERY: Duration = Duration::from_millis(10);

/// The process's resident memory, read at most every [`RESIDENT_EVERY`].
#[derive(Debug)]
pub struct Resident {
    bytes: AtomicU64,
    /// Microseconds since `epoch` of the last reading (0: never).
    read_at: AtomicU64,
    epoch: Instant,
}

impl Default for Resident {
    fn default() -> Self {
        Self {
            bytes: AtomicU64::new(0),
            read_at: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }
}

impl Resident {
    /// Bytes resident now (0 where `/proc` cannot be read).
    pub fn now(&self) -> u64 {
        let at = self.epoch.elapsed().as_micros() as u64 + 1;
        let last = self.read_at.load(Ordering::Relaxed);
        if last != 0 && at.saturating_sub(last) < RESIDENT_EVERY.as_micros() as u64 {
            return self.bytes.load(Ordering::Relaxed);
        }
        self.read()
    }

    /// Reads it afresh.
    pub fn read(&self) -> u64 {
        let bytes = resident_bytes();
        self.bytes.store(bytes, Ordering::Relaxed);
        self.read_at.store(
            self.epoch.elapsed().as_micros() as u64 + 1,
            Ordering::Relaxed,
        );
        bytes
    }
}

/// The resident set of this process, from `/proc/self/statm`.
fn resident_bytes() -> u64 {
    // SAFETY: sysconf reads a constant of the system; it has no
    // preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let page = u64::try_from(page).unwrap_or(4096);
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * page)
}

/// The process's pool: accounted reservations under the limit, and the
/// resident memory too (see the module docs).
#[derive(Debug)]
struct BudgetPool {
    limit: usize,
    accounted: TrackConsumersPool<GreedyMemoryPool>,
    resident: Resident,
}

impl BudgetPool {
    /// Whether `additional` more bytes leave the process under its limit,
    /// once memory the allocator kept is given back if need be.
    fn resident_room(&self, additional: usize) -> Result<()> {
        let fits = |held: u64| held.saturating_add(additional as u64) <= self.limit as u64;
        if fits(self.resident.now()) {
            return Ok(());
        }
        // SAFETY: malloc_trim only returns free heap memory to the
        // system; it may be called from any thread at any time.
        unsafe {
            libc::malloc_trim(0);
        }
        let held = self.resident.read();
        if fits(held) {
            return Ok(());
        }
        Err(DataFusionError::ResourcesExhausted(format!(
            "the process holds {held} bytes: {additional} more would take it past its \
             memory budget of {} bytes",
            self.limit
        )))
    }
}

impl std::fmt::Display for BudgetPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (resident: {} bytes)",
            self.accounted,
            self.resident.now()
        )
    }
}

impl MemoryPool for BudgetPool {
    fn name(&self) -> &str {
        "memory budget"
    }

    fn register(&self, consumer: &MemoryConsumer) {
        self.accounted.register(consumer);
    }

    fn unregister(&self, consumer: &MemoryConsumer) {
        self.accounted.unregister(consumer);
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.accounted.grow(reservation, additional);
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.accounted.shrink(reservation, shrink);
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> Result<()> {
        self.resident_room(additional)?;
        self.accounted.try_grow(reservation, additional)
    }

    fn reserved(&self) -> usize {
        self.accounted.reserved()
    }

    fn memory_limit(&self) -> MemoryLimit {
        MemoryLimit::Finite(self.limit)
    }
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
        const MIB: usize = 1 << 20;
        let shared = new_pool(1000 << 20);
        let a: Arc<dyn MemoryPool> = Arc::new(QueryPool::new(800 * MIB, Arc::clone(&shared)));
        let b: Arc<dyn MemoryPool> = Arc::new(QueryPool::new(800 * MIB, Arc::clone(&shared)));
        let ra = MemoryConsumer::new("sort a").register(&a);
        ra.try_grow(700 * MIB).unwrap();
        let e = ra.try_grow(200 * MIB).unwrap_err().to_string();
        assert!(e.contains("its limit"), "{e}");
        let rb = MemoryConsumer::new("sort b").register(&b);
        let e = rb.try_grow(400 * MIB).unwrap_err().to_string();
        assert!(e.contains("memory budget"), "{e}");
        assert_eq!(b.reserved(), 0, "a refused grow takes nothing");
        rb.try_grow(300 * MIB).unwrap();
        assert_eq!(shared.reserved(), 1000 * MIB);
        drop(ra);
        assert_eq!(shared.reserved(), 300 * MIB);
        assert_eq!(a.reserved(), 0);
    }

    #[test]
    fn the_resident_memory_is_read_and_held_to_the_limit() {
        let r = Resident::default();
        let now = r.now();
        assert!(now > 1 << 20, "{now}");
        // Under a limit below what the process holds already, nothing fits.
        let pool = BudgetPool {
            limit: (now / 2) as usize,
            accounted: TrackConsumersPool::new(GreedyMemoryPool::new(1 << 40), NonZeroUsize::MIN),
            resident: Resident::default(),
        };
        let pool: Arc<dyn MemoryPool> = Arc::new(pool);
        let e = MemoryConsumer::new("x")
            .register(&pool)
            .try_grow(1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("the process holds"), "{e}");
    }

    #[test]
    fn a_reservation_that_does_not_fit_names_what_asked() {
        let budget = MemoryBudget {
            pool: OnceLock::new(),
        };
        assert_eq!(budget.configure(1000 << 20), 1000 << 20);
        assert_eq!(
            budget.configure(1 << 40),
            1000 << 20,
            "the first size holds"
        );
        let held = budget.reserve("repeat", 600 << 20).unwrap();
        let e = budget.reserve("lpad", 600 << 20).unwrap_err().to_string();
        assert!(e.contains("lpad") && e.contains("memory budget"), "{e}");
        drop(held);
        assert!(budget.reserve("lpad", 600 << 20).is_ok());
    }
}
