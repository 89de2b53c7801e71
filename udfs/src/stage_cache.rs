//! [`StageCache`]: a node's cache of the deterministic decode stages under
//! a random pipeline, keyed by what they read.
//!
//! A job whose plan is random (a crop or flip that changes every epoch)
//! cannot keep its output rows from one epoch to the next, but the part
//! of each expression that decodes and is the same every epoch —
//! `random_horizontal_flip(decode_resize(data, 256, 256))`'s
//! `decode_resize` — can be kept. [`cache_plan`] wraps each such part of a
//! projection in a [`CachedExpr`]:
//!
//! ```text
//!  a batch ─► the part's input column (the raw bytes) ─► per row: key =
//!     blake3 keyed by (the part as planned, the decoding limits), of the bytes
//!  ─► lookup ─► hits: the cached value (a row of its own)
//!           └► misses: the part evaluated on those rows alone ─► their values
//!                      (not NULL: a bad sample is computed, and reported, again)
//!                      copied into rows of their own and cached
//!  ─► the batch's values, in its order (one `interleave`)
//! ```
//!
//! - **Which parts**: the largest subexpressions that call a decoder
//!   (`decode_*`, `npy`, `npz`), call nothing random or volatile, and
//!   read exactly one column, of bytes (besides the `key` a decoder is
//!   handed to name its bad samples, which is no input of its value). A job asks for it in its UDF
//!   options ([`crate::UdfOptions::cache_stages`]), set when its plan is
//!   random (a deterministic job's whole rows are kept by the compute
//!   node's output cache instead); each side wraps the plan it runs, so
//!   where the cut between storage and compute falls does not matter.
//! - **The key is the content**, not the sample's name: the same bytes
//!   under the same part and limits decode to the same value on any node,
//!   in any job and any version of a dataset. A stricter limit is another
//!   key, so no value decoded under looser limits reaches a job that
//!   would refuse it. blake3 makes a collision as unlikely as a forged
//!   checksum.
//! - **Results are the same bytes** with the cache on, off, full or
//!   empty: a hit is the value the part computed for those bytes.
//! - **What it costs** a job that misses: one blake3 pass over each input
//!   (GB/s, against a decode's tens of MB/s) and the copy of each value it
//!   caches, once.
//! - **Budget and eviction**: [`Lru`], the node caches' scan-resistant
//!   policy; the process's cache is [`StageCache::global`], sized at start
//!   (`--stage-cache-memory`), off until then.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, UInt32Array};
use arrow::compute::{interleave, take, take_record_batch};
use arrow::datatypes::{DataType, FieldRef, Schema};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{ColumnarValue, Volatility};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};

use crate::env::Limits;
use crate::lru::{Lru, insert_owned};
use crate::panic_guard::only_child;
use crate::rewrite::KEY_COLUMN;
use crate::udf::spec;

/// A row's key: blake3 of its input bytes, keyed by the part and limits.
type Key = [u8; 32];

/// Counters of the cache, for `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct StageCacheStats {
    /// Bytes it may hold.
    pub budget: u64,
    /// Bytes its values count.
    pub bytes: u64,
    /// Values it holds.
    pub values: u64,
    /// Rows served from it.
    pub hits: u64,
    /// Rows looked up and computed.
    pub misses: u64,
    /// Values evicted to stay within the budget.
    pub evictions: u64,
}

/// See the module docs.
#[derive(Debug)]
pub struct StageCache {
    values: Mutex<Lru<Key, ArrayRef>>,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
}

static GLOBAL: LazyLock<Arc<StageCache>> = LazyLock::new(|| Arc::new(StageCache::new(0)));

impl StageCache {
    /// A cache of at most `budget` bytes (0: disabled).
    pub fn new(budget: u64) -> Self {
        Self {
            values: Mutex::new(Lru::new(budget)),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    /// The process's cache, shared by its storage and compute sides: off
    /// until [`StageCache::configure`].
    pub fn global() -> &'static Arc<StageCache> {
        &GLOBAL
    }

    /// Gives the cache a budget of `budget` bytes (0: off), emptying it.
    pub fn configure(&self, budget: u64) {
        *self.lock() = Lru::new(budget);
    }

    /// The default budget: an eighth of the memory available now.
    pub fn default_budget() -> u64 {
        crate::host_memory::available() / 8
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lru<Key, ArrayRef>> {
        self.values.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether it holds anything ever.
    pub fn enabled(&self) -> bool {
        self.lock().budget() > 0
    }

    /// The value of each key, if cached (each a hit or a miss).
    fn lookup(&self, keys: &[Option<Key>]) -> Vec<Option<ArrayRef>> {
        let mut lru = self.lock();
        let found: Vec<_> = keys
            .iter()
            .map(|k| k.as_ref().and_then(|k| lru.touch(k).cloned()))
            .collect();
        drop(lru);
        let hits = found.iter().flatten().count() as u64;
        self.hits.fetch_add(hits, Ordering::Relaxed);
        self.misses
            .fetch_add(keys.len() as u64 - hits, Ordering::Relaxed);
        found
    }

    /// Caches row `i` of `values` under `key` for each `(key, i)` admitted
    /// (see [`insert_owned`]), each copied into an array of its own outside
    /// the lock.
    fn insert(&self, values: &ArrayRef, rows: Vec<(Key, usize)>) {
        let share = (values.get_array_memory_size() / values.len().max(1)) as u64;
        let items = rows.into_iter().map(|(key, i)| (key, i, share));
        let evicted = insert_owned(&self.values, items, |i| {
            match take(values.as_ref(), &UInt32Array::from(vec![i as u32]), None) {
                Ok(one) => {
                    let len = one.get_array_memory_size() as u64;
                    Some((one, len))
                }
                Err(e) => {
                    // The value is served as it is; only its caching is lost.
                    tracing::warn!("stage cache: a value not cached: {e}");
                    None
                }
            }
        });
        self.evictions.fetch_add(evicted, Ordering::Relaxed);
    }

    /// Its counters now.
    pub fn stats(&self) -> StageCacheStats {
        let lru = self.lock();
        StageCacheStats {
            budget: lru.budget(),
            bytes: lru.bytes(),
            values: lru.len() as u64,
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
        }
    }
}

/// `plan` with each cacheable part of its projections' expressions (see
/// the module docs) wrapped in a [`CachedExpr`] over `cache`, keyed under
/// `limits`; a plan with none, or a disabled cache, is returned as it is.
pub fn cache_plan(
    plan: Arc<dyn ExecutionPlan>,
    cache: &Arc<StageCache>,
    limits: &Limits,
) -> Result<Arc<dyn ExecutionPlan>> {
    if !cache.enabled() {
        return Ok(plan);
    }
    plan.transform_up(|node| {
        let Some(p) = node.downcast_ref::<ProjectionExec>() else {
            return Ok(Transformed::no(node));
        };
        let schema = p.input().schema();
        let mut changed = false;
        let exprs = p
            .expr()
            .iter()
            .map(|e| {
                let wrapped = wrap(Arc::clone(&e.expr), &schema, cache, limits)?;
                changed |= wrapped.transformed;
                Ok(ProjectionExpr::new(wrapped.data, e.alias.clone()))
            })
            .collect::<Result<Vec<_>>>()?;
        if !changed {
            return Ok(Transformed::no(node));
        }
        let rebuilt: Arc<dyn ExecutionPlan> =
            Arc::new(ProjectionExec::try_new(exprs, Arc::clone(p.input()))?);
        Ok(Transformed::yes(rebuilt))
    })
    .map(|t| t.data)
}

/// `expr` with its largest cacheable parts wrapped (top-down: a wrapped
/// part is not entered again).
fn wrap(
    expr: Arc<dyn PhysicalExpr>,
    schema: &Schema,
    cache: &Arc<StageCache>,
    limits: &Limits,
) -> Result<Transformed<Arc<dyn PhysicalExpr>>> {
    expr.transform_down(|e| {
        if e.downcast_ref::<CachedExpr>().is_some() {
            return Ok(Transformed::new(e, false, TreeNodeRecursion::Jump));
        }
        match cacheable(&e, schema)? {
            Some(input) => {
                let cached = CachedExpr::new(e, input, Arc::clone(cache), limits);
                Ok(Transformed::new(
                    Arc::new(cached) as _,
                    true,
                    TreeNodeRecursion::Jump,
                ))
            }
            None => Ok(Transformed::no(e)),
        }
    })
}

/// The one column of bytes `expr` reads, when it is a cacheable part: a
/// call that decodes somewhere inside, calls nothing random or volatile,
/// and reads that column alone.
fn cacheable(expr: &Arc<dyn PhysicalExpr>, schema: &Schema) -> Result<Option<Column>> {
    if expr.downcast_ref::<ScalarFunctionExpr>().is_none() {
        return Ok(None);
    }
    let (mut decodes, mut varies, mut columns) = (false, false, Vec::<Column>::new());
    // The `key` a decoder is handed names its bad samples; it is no input
    // of its value.
    let mut naming: Vec<*const ()> = Vec::new();
    expr.apply(|e| {
        if let Some(call) = e.downcast_ref::<ScalarFunctionExpr>() {
            let name = call.fun().name();
            decodes |= name.starts_with("decode_") || name == "npy" || name == "npz";
            varies |= spec(name).is_some_and(|s| s.seed_index().is_some())
                || call.fun().signature().volatility == Volatility::Volatile;
            if spec(name).is_some_and(|s| s.keyed) {
                let keys = call.args().iter().filter(|a| {
                    a.downcast_ref::<Column>()
                        .is_some_and(|c| c.name() == KEY_COLUMN)
                });
                naming.extend(keys.map(|a| Arc::as_ptr(a) as *const ()));
            }
        } else if let Some(c) = e.downcast_ref::<Column>()
            && !naming.contains(&(Arc::as_ptr(e) as *const ()))
            && !columns.contains(c)
        {
            columns.push(c.clone());
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    let [column] = columns.as_slice() else {
        return Ok(None);
    };
    let bytes = matches!(
        schema.field(column.index()).data_type(),
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView
    );
    Ok((decodes && !varies && bytes).then(|| column.clone()))
}

/// A cacheable part of an expression, served from a [`StageCache`] (see
/// the module docs).
#[derive(Debug)]
pub struct CachedExpr {
    inner: Arc<dyn PhysicalExpr>,
    input: Column,
    cache: Arc<StageCache>,
    /// The blake3 key of the rows' hashes: the part as planned and the limits.
    id: Key,
}

impl CachedExpr {
    /// `inner`, which reads the column `input`, served from `cache` under `limits`.
    pub fn new(
        inner: Arc<dyn PhysicalExpr>,
        input: Column,
        cache: Arc<StageCache>,
        limits: &Limits,
    ) -> Self {
        let id = *blake3::hash(format!("{inner}\n{limits:?}").as_bytes()).as_bytes();
        Self {
            inner,
            input,
            cache,
            id,
        }
    }

    /// Each row's key: its input bytes' hash (none for a NULL).
    fn keys(&self, batch: &RecordBatch) -> Result<Vec<Option<Key>>> {
        let input = self.input.evaluate(batch)?.into_array(batch.num_rows())?;
        let key = |bytes: &[u8]| *blake3::keyed_hash(&self.id, bytes).as_bytes();
        Ok(match input.data_type() {
            DataType::Binary => input
                .as_binary::<i32>()
                .iter()
                .map(|v| v.map(key))
                .collect(),
            DataType::LargeBinary => input
                .as_binary::<i64>()
                .iter()
                .map(|v| v.map(key))
                .collect(),
            DataType::BinaryView => input.as_binary_view().iter().map(|v| v.map(key)).collect(),
            other => {
                return Err(DataFusionError::Internal(format!(
                    "the stage cache keys bytes, not {other}"
                )));
            }
        })
    }
}

impl fmt::Display for CachedExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

impl PartialEq for CachedExpr {
    fn eq(&self, other: &Self) -> bool {
        self.inner.as_ref() == other.inner.as_ref() && self.id == other.id
    }
}

impl Eq for CachedExpr {}

impl Hash for CachedExpr {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.inner.as_ref().hash(state);
        self.id.hash(state);
    }
}

impl PhysicalExpr for CachedExpr {
    fn return_field(&self, input_schema: &Schema) -> Result<FieldRef> {
        self.inner.return_field(input_schema)
    }

    fn evaluate(&self, batch: &RecordBatch) -> Result<ColumnarValue> {
        let n = batch.num_rows();
        let keys = self.keys(batch)?;
        let found = self.cache.lookup(&keys);
        let missed: Vec<u32> = (0..n as u32)
            .filter(|&i| found[i as usize].is_none())
            .collect();
        let computed = if missed.len() == n {
            Some(self.inner.evaluate(batch)?.into_array(n)?)
        } else if missed.is_empty() {
            None
        } else {
            let rows = take_record_batch(batch, &UInt32Array::from(missed.clone()))?;
            Some(self.inner.evaluate(&rows)?.into_array(missed.len())?)
        };
        if let Some(values) = &computed {
            // NULL is a bad sample (or no input): computed, and reported, again.
            let fresh = missed
                .iter()
                .enumerate()
                .filter_map(|(j, &i)| Some((keys[i as usize]?, j)))
                .filter(|&(_, j)| values.is_valid(j))
                .collect();
            self.cache.insert(values, fresh);
            if missed.len() == n {
                return Ok(ColumnarValue::Array(Arc::clone(values)));
            }
        }
        // Array 0 is the computed rows (when any), then each hit's own.
        let mut arrays: Vec<&dyn Array> = computed.iter().map(|a| a.as_ref()).collect();
        let mut next_miss = 0;
        let mut at = Vec::with_capacity(n);
        for hit in &found {
            match hit {
                Some(value) => {
                    at.push((arrays.len(), 0));
                    arrays.push(value.as_ref());
                }
                None => {
                    at.push((0, next_miss));
                    next_miss += 1;
                }
            }
        }
        debug_assert_eq!(next_miss, missed.len());
        Ok(ColumnarValue::Array(interleave(&arrays, &at)?))
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        vec![&self.inner]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn PhysicalExpr>>,
    ) -> Result<Arc<dyn PhysicalExpr>> {
        Ok(Arc::new(Self {
            inner: only_child(children, "a cached part")?,
            input: self.input.clone(),
            cache: Arc::clone(&self.cache),
            id: self.id,
        }))
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt_sql(f)
    }
}
