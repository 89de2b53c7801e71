//! sluice's preprocessing verbs as DataFusion scalar UDFs.
//!
//! Every UDF is a [`ScalarUDFImpl`](datafusion::logical_expr::ScalarUDFImpl)
//! in its own file under [`udf`]; the pixel, frame and array work it does is
//! a plain function under [`kernels`], so that benchmarks and tests call the
//! same code the SQL runs.
//!
//! | UDF | result |
//! |---|---|
//! | `decode_image(data[, mode])` | image (mode `'RGB'` default, `'L'`, `'RGBA'`) |
//! | `resize(img, h, w[, filter])` | image h×w (`'bilinear'` default, `'nearest'`, `'bicubic'`, `'lanczos3'`) |
//! | `center_crop(img, h, w)` | image h×w (zero-padded when the image is smaller) |
//! | `random_resized_crop(img, h, w[, scale_min, scale_max, ratio_min, ratio_max])` | image h×w |
//! | `random_horizontal_flip(img[, p])` | image |
//! | `normalize(img, mean, std)` | float32 tensor [C, H, W] |
//! | `to_tensor(img)` / `to_tensor(arr[, dtype])` | tensor [H, W, C] uint8 / array shape |
//! | `decode_resize(data, h, w[, filter, mode])` | image h×w, JPEG DCT-domain downscaling |
//! | `decode_random_resized_crop(data, h, w[, …])` | image h×w, DCT-domain downscaling |
//! | `decode_video(data, num_frames, h, w[, stride \| 'uniform'])` | uint8 tensor [T, H, W, 3] |
//! | `npy(data)`, `npz(data, name)` | array |
//! | `crop3d(arr, z, y, x, d, h, w)` | array |
//! | `resize3d(arr, d, h, w)` | float32 array d×h×w×… |
//!
//! # Representations
//!
//! * An **image** is a struct `{height: UInt32, width: UInt32, channels:
//!   UInt8, pixels: LargeBinary}` with pixels row-major, interleaved (HWC),
//!   one byte per channel. Sizes vary per row after `decode_image`; after
//!   `resize` or a crop with constant sizes the field carries the metadata
//!   `sluice.shape = "H,W,C"`, which is how `to_tensor` and `normalize` know
//!   their fixed output shape when the query is planned.
//! * An **array** (from `npy`/`npz`) is a struct `{dtype: Utf8, shape:
//!   List<UInt32>, data: LargeBinary}` with `dtype` in NumPy's spelling
//!   (`uint8`, `float32` …) and `data` little-endian, C order.
//! * A **tensor** of fixed shape is Arrow's canonical
//!   `arrow.fixed_shape_tensor` extension type: a `FixedSizeList<T>` of the
//!   product of the shape, with `ARROW:extension:metadata = {"shape": […]}`.
//!   pyarrow reads it as `pa.FixedShapeTensorArray`, whose `to_numpy_ndarray`
//!   is a view over the Arrow buffer.
//!
//! # Randomness
//!
//! The random UDFs take no randomness from the thread they run on. The
//! [`rewrite::SluiceRewrite`] analyzer rule appends hidden arguments to
//! their calls: the job's seed and epoch (literals) and the sample's `key`
//! column; every draw comes from [`random::SampleRng`] seeded by those three
//! and the UDF's name. The same row gives the same bytes on any thread,
//! node or side of the planner's cut.
//!
//! # Bad samples and limits
//!
//! UDFs that parse bytes (decoders, `npy`, `npz`) follow the session's
//! [`OnError`] policy per sample: `fail` (the query fails with an error
//! naming the key and the reason), `null` (the result is NULL), or `skip`
//! (NULL, and the rewrite filters the row out). Skipped and nulled samples
//! are recorded in the [`UdfEnv`]'s [`ErrorLog`]. [`Limits`] bound what a
//! sample may decode to (pixels, frames, bytes) and are checked from headers
//! before any decoding, so a 100k×100k JPEG header costs nothing.
//!
//! Modules:
//! - `arg_sizes`: what a function's arguments hold, row by row, measured
//!   without expanding a scalar;
//! - [`args`]: argument specifications: what each UDF accepts;
//! - [`bounded`]: DataFusion's built-in functions whose output is not bounded
//!   by their input, under a size limit;
//! - [`calibrate`]: measuring the cost profiles on the machine at hand;
//! - [`concat_operator`]: the `||` operator on strings and bytes, under the
//!   size limit;
//! - [`cost`]: cost profiles: CPU time and result size of each UDF, from
//!   sample statistics;
//! - [`env`]: what the UDFs of one session share: options, limits, the log of
//!   bad samples and the clock of their stages;
//! - [`host_memory`]: `available`: the memory this process may still use;
//! - [`lru`]: `Lru`: a map under a byte budget, the eviction policy of the
//!   node's caches;
//! - [`memory_budget`]: `MemoryBudget`: the memory every query and job of a
//!   process shares;
//! - [`panic_guard`]: a panic in any function of a projection, as one named
//!   sample;
//! - [`probe`]: cheap facts about an object, read from its header at ingest;
//! - [`rebind`]: a placed plan bound to another stream's `UdfEnv`;
//! - [`stage_cache`]: `StageCache`: a node's cache of the deterministic
//!   decode stages under a random pipeline;
//! - [`stage_clock`]: where a pipeline's time goes: every UDF call is timed,
//!   per stage;
//! - [`tensor`]: Arrow representations of images, arrays and fixed-shape
//!   tensors.

mod arg_sizes;
pub mod args;
pub mod bounded;
pub mod calibrate;
pub mod concat_operator;
pub mod cost;
pub mod env;
pub mod host_memory;
pub mod kernels;
pub mod lru;
pub mod memory_budget;
pub mod panic_guard;
pub mod probe;
pub mod random;
pub mod rebind;
pub mod rewrite;
pub mod stage_cache;
pub mod stage_clock;
pub mod tensor;
pub mod udf;

use std::sync::Arc;

use datafusion::logical_expr::ScalarUDF;
use datafusion::prelude::SessionContext;

pub use env::{ErrorLog, Limits, OnError, UdfEnv, UdfOptions};
pub use rewrite::SluiceRewrite;
pub use stage_clock::{Site, StageClock, StageTiming, Tier};

/// Every sluice UDF, bound to `env`.
pub fn all(env: &Arc<UdfEnv>) -> Vec<ScalarUDF> {
    udf::all(env)
}

/// Registers the UDFs and the rewrite rule in `ctx`.
pub fn register(ctx: &SessionContext, env: &Arc<UdfEnv>) {
    for f in all(env) {
        ctx.register_udf(f);
    }
    bounded::register(ctx, env);
    ctx.add_analyzer_rule(Arc::new(SluiceRewrite::new(Arc::clone(env))));
}
